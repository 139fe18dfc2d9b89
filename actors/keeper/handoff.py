"""Membership changes for the keeper.

When a node joins, every keeper stops serving the rows it no longer owns at once (they leave the
ranking), then hands them over to their new owner with their leases: the rows keep their due times
(nothing is re-jittered) and a key in flight stays leased on its new owner (never granted twice
across the move). Rows are deleted here only after the new owner acknowledged them. When a node
dies, its rows died with it: the new owners rebuild them from the replicated targets (reconcile of
the departed slice, keys without a cached page first). A node whose view lagged may hand over
rows their receiver no longer owns: the receiver passes them on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prerender_ray.actors.common import Sometimes
from prerender_ray.actors.keeper.claims import Claims
from prerender_ray.actors.keeper.rows import Rows
from prerender_ray.identity.membership import (
    MEMBERSHIP_TRUST_MS,
    NOBODY,
    Membership,
    MembershipView,
    StaleEpoch,
)
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.rpc import LeaseApi, Peers
from prerender_ray.storage.keys import KEEPER_EPOCH
from prerender_ray.tasks import Tasks

HANDOFF_BATCH = 4_000  # rows per adopt: a join of 1M targets hands ~170,000 per old node (~250 KB a call)
MAX_BACKOFF_S = 30.0


class MembershipMoved(Exception):
    """The membership changed under a hand-off pass: the pass starts over against the new one."""


class Handoff:
    def __init__(self, rows: Rows, claims: Claims, leases: LeaseApi, peers: Peers, view: MembershipView,
                 node: str, log: Any, tasks: Tasks, members: Callable[[], Awaitable[Membership]] | None = None):
        self.rows = rows
        self.claims = claims
        self.leases = leases
        self.peers = peers
        self.view = view
        self.node = node
        self.log = log
        self.tasks = tasks  # the keeper's: a pass is ended before its rows' db closes
        self.members = members  # the controller's membership (None: membership comes by push only)
        self._unasked = Sometimes()
        self._refusals: set[tuple[str, int]] = set()  # (peer, its epoch) refusals said once each
        self._released = 0
        self._told = NOBODY  # the epoch whose done the others were last told
        self.checked_at: int | None = None  # when the controller last answered a check (epoch ms)
        self.confirmed_at: int | None = None  # when a check answered listing this node was sent (epoch ms)
        self._unconfirmed = Sometimes()
        self.previous: Membership | None = None  # the membership before the last change
        self.task: asyncio.Task | None = None
        self._again = False  # kicked while a pass runs: it walks the store once more
        self._backoff = 1.0  # before a failed pass is tried again (s)
        self.report: dict[str, Any] = {"handedOff": 0, "adopted": 0, "pending": False, "staleRefusals": 0}
        # rebuild their slice: the departed nodes and the membership they were part of
        self.on_departed: Callable[[list[str], Membership], None] = lambda departed, before: None
        view.listen(self._changed)

    async def fetch_membership(self) -> bool:
        """The controller's current membership, applied if newer (the one path, ``set_membership``).
        On a (re)start it may be newer than our arguments: rows adopted under the arguments'
        membership while the store caught up must leave the ranking, or no later check would move
        them. False when the controller did not answer."""
        if self.members is None:
            return False
        sent = self.rows.clock.now_ms()  # the answer is true as of no earlier than this (``trusted``)
        try:
            m = await self.members()
        except Exception as e:
            if self._unasked.due():
                self.log.warning("the controller's membership could not be read", error=repr(e)[:200])
            return False
        self.checked_at = self.rows.clock.now_ms()
        if m.epoch > self.view.epoch:
            await self.set_membership(m)
        if self.node in m.names and m.epoch >= self.view.epoch:
            self.confirmed_at = sent if self.confirmed_at is None else max(self.confirmed_at, sent)
        return True

    def trusted(self, now: int) -> bool:
        """May this keeper grant now? Only while the controller confirmed, lately, that it is a member.
        A keeper cut off from the controller may have been dropped from the membership while it still
        runs, its keys given to others; theirs wait out a lease's length plus ``MEMBERSHIP_TRUST_MS``
        (``fence``), and this keeper stops granting within the latter. Pushes do not confirm: when a
        push was sent is unknown. Without a controller (a node alone, in tests) always."""
        if self.members is None:
            return True
        ok = self.confirmed_at is not None and now - self.confirmed_at < MEMBERSHIP_TRUST_MS
        if not ok and self._unconfirmed.due():
            self.log.warning("not granting: the controller has not confirmed this node's membership lately",
                             confirmed_at=self.confirmed_at, checked_at=self.checked_at)
        return ok

    async def check_membership(self) -> dict | None:
        """The periodic check: pushes can be lost, so the controller is asked every few seconds
        (None: it did not answer)."""
        before = self.view.epoch
        if not await self.fetch_membership():
            return None
        return {"changed": self.view.epoch != before}

    async def set_membership(self, m: Membership) -> dict:
        """The one path by which the membership changes, whatever brought it (push, start-up read,
        check): adopted only when its epoch is higher than the one held (a late push of an older
        list is ignored). The change takes effect synchronously, in ``_changed``."""
        if not self.view.offer(m):
            return {"changed": False, "epoch": self.view.epoch}
        departed = [n for n in (self.previous.names if self.previous else ()) if n not in m.names]
        answer = {"changed": True, "epoch": m.epoch, "releasing": self._released, "departed": departed}
        await self.peers.renew([n for n in m.names if n != self.node])
        return answer

    def _changed(self, before: Membership, after: Membership) -> None:
        """All of it before any await: a call cut off at its deadline leaves no half."""
        self.previous = before
        departed = [n for n in before.names if n not in after.names]
        owns = self.rows.owner_test(after)
        self._released = self.rows.ranking.drop_where(lambda k: not owns(k))  # stop granting them now
        self.log.info("membership", epoch=after.epoch, nodes=list(after.names), departed=departed,
                      releasing=self._released)
        self.kick()
        self.fence(before)
        self.rows.db.put(KEEPER_EPOCH, str(after.epoch).encode())
        if departed and before.epoch >= 0:
            self.on_departed(departed, before)

    def fence(self, before: Membership | None) -> None:
        """Keys gained now are not granted until their previous owner's hand-off is done, or a
        lease's length passed after the previous owner stopped granting (``Rows.fence``, ``trusted``); ``before`` None: this keeper starts among others and
        cannot know who owned what."""
        m = self.view.current
        if len(m.names) > 1:
            before = before if before is not None and before.epoch != NOBODY else None
            until = self.rows.clock.now_ms() + self.rows.conf.cfg.queue.job_lease_time + MEMBERSHIP_TRUST_MS
            self.rows.fence(until, before, m.epoch)

    async def handoff_done(self, sender: str, epoch: int, fence: list | None = None) -> list | None:
        """``sender`` holds no row (and so no lease) that another node owns under ``epoch``: the keys
        it owned before are no longer fenced here, unless its own fence (``fence``) still waits on
        the node that owned them before it (a fence it handed on with a row came with the row).
        Answers our own done the same way ([epoch, fence], None while our hand-off is not done): a
        keeper that restarted forgot what it was told, and learns it back here."""
        if self.rows.said_done(sender, epoch, fence):
            self.rows.on_due()  # fenced keys may be grantable now: publish soon
        idle = self.task is None or self.task.done()
        if not idle or self._told != self.view.epoch:
            return None
        return [self._told, self.rows.fence_summary(self.rows.clock.now_ms())]

    async def _tell_done(self, m: Membership) -> None:
        """Every other member learns that this node's hand-off under ``m`` is done (best effort:
        one that misses it waits out its fence)."""
        fence = self.rows.fence_summary(self.rows.clock.now_ms())

        async def tell(node: str) -> None:
            try:
                theirs = await (await self.peers.of(node)).handoff_done(self.node, m.epoch, fence)
                if isinstance(theirs, list) and len(theirs) == 2 and isinstance(theirs[0], int):
                    if self.rows.said_done(node, theirs[0], theirs[1] if isinstance(theirs[1], list) else None):
                        self.rows.on_due()
            except Exception as e:
                self.log.info("hand-off done not told", peer=node, error=type(e).__name__)

        await asyncio.gather(*(tell(n) for n in m.names if n != self.node))

    async def moved_past(self, epoch: int) -> bool:
        """After a peer refused a call made under ``epoch`` as stale: read the controller's
        membership; True when ours is now newer, so the call can be routed again under it."""
        await self.fetch_membership()
        return self.view.epoch > epoch

    async def accept(self, epoch: int, what: str) -> None:
        """A call that moves or writes owned data, made under ``epoch``. A caller on a newer epoch
        means ours is behind: refresh first (bounded), then decide. A caller on an older one is
        refused (``StaleEpoch``): it refreshes and retries."""
        if epoch > self.view.epoch:
            await self.fetch_membership()
        self.view.check(epoch, what)

    def refused(self, peer: str, e: StaleEpoch) -> None:
        """A peer refused our call as stale: said once per peer and epoch, with both epochs."""
        self.report["staleRefusals"] += 1
        if (peer, e.receiver) not in self._refusals:
            self._refusals.add((peer, e.receiver))
            if len(self._refusals) > 1024:
                self._refusals.clear()
            self.log.info("a peer is on a newer membership; refreshing", peer=peer, ours=e.caller,
                          theirs=e.receiver)

    def close(self) -> None:
        """A pass still running would write to a store about to close."""
        if self.task is not None:
            self.task.cancel()

    def kick(self) -> None:
        self._again = True  # a pass running now looks at the store once more before it ends
        if self.task is None or self.task.done():
            self.task = self.tasks.spawn(self.run())

    async def run(self) -> None:
        """Hand unowned rows to their owners until none are left; retried while an owner is away."""
        self._backoff = 1.0
        self.report["pending"] = True
        try:
            while True:
                m = self.view.current  # this pass's snapshot: a change starts a new pass
                self._again = False
                pending = self.rows.unowned(m)
                if pending and not await self._hand(m, pending):
                    continue
                if self._again or self.view.epoch != m.epoch:
                    continue  # rows another node owns were written meanwhile (the kick found this pass running)
                # every row the walk found was acknowledged and deleted, and none was written since:
                # the store holds no row another node owns (no second walk to see it)
                if self._told == m.epoch:
                    return
                await self._tell_done(m)
                self._told = m.epoch
                if not self._again and self.view.epoch == m.epoch:
                    return
        finally:
            self.report["pending"] = False

    async def _hand(self, m: Membership, pending: dict[str, list[tuple]]) -> bool:
        """Hand ``pending`` (rows by owner, from the walk under ``m``) over; False when the pass
        must start over (the membership moved, or a batch failed: after a pause, backed off)."""
        try:
            for owner, rows in pending.items():
                keeper = await self.peers.of(owner)
                for i in range(0, len(rows), HANDOFF_BATCH):
                    if self.view.epoch != m.epoch:
                        raise MembershipMoved()
                    batch = rows[i:i + HANDOFF_BATCH]
                    keys = [r[0] for r in batch]
                    leases = await self.leases.export_keys(keys)
                    now = self.rows.clock.now_ms()
                    fences = [[k, *f] for k in keys for f in self.rows.fence_of(k, now)]
                    try:
                        await keeper.adopt(batch, leases, m.epoch, fences)
                    except StaleEpoch as e:  # the owner is on a newer membership than ours
                        self.refused(owner, e)
                        if not await self.moved_past(m.epoch):
                            raise  # the controller did not tell us more: retried after a pause
                        raise MembershipMoved() from None
                    self.rows.forget_stored(keys, m)
                    await self.leases.forget(keys)
                    self.report["handedOff"] += len(batch)
                    await asyncio.sleep(0)
            self._backoff = 1.0
            return True
        except MembershipMoved:
            return False  # against the new snapshot, at once
        except Exception as e:
            self.log.warning("hand-off incomplete; retrying", error=repr(e), retry_s=self._backoff)
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
            return False

    async def adopt(self, rows: list[ScheduleRow] | list[tuple], leases: list, epoch: int,
                    fences: list | None = None) -> int:
        """Rows handed over by their previous owner under ``epoch``: their due times kept, their
        leases with them. A sender on an older membership is refused before anything is written."""
        await self.accept(epoch, "adopt")
        if leases:
            await self.leases.adopt(leases)
            self.claims.note_adopted(leases)
        # Where the sender's view lagged ours, the write funnel keeps what we do not own out of the
        # ranking and kicks the hand-off: passed on now (no later membership change may come to move them).
        self.rows.write(rows, leased={key for key, _ in leases})
        if fences:  # what the sender still waited on for these keys waits here now
            # a key comes once per node it waits on
            self.rows.carry(fences[:len(rows) * len(self.view.current.names)], self.rows.clock.now_ms())
        self.report["adopted"] += len(rows)
        return len(rows)
