"""Keeping R copies of every URL when the membership changes (a part of ``NodeStore``).

With ``cluster.replicas`` below the node count each node holds a share: the records of the URLs whose
first R nodes (rendezvous order) it is among (``prerender_ray/storage/placement.py``). On a change
the store walks its per-URL records once:

- a record whose holder set gained a node that was already a member is pushed to it by one of the
  holders it had before (the first in rank order), since such a node does not catch up by itself; a
  node that just joined pulls its share in its own catch-up, except recent records (``JOINER_MARGIN_MS``);
- a record this node no longer holds is pushed to every holder and, once each acknowledged, dropped
  here: a local removal of the record and its bookkeeping, not a delete (nothing is shipped), and
  only if the version held is still the one every holder acknowledged.

A record that reaches a node which does not hold it (shipped by a peer that had not yet learnt of the
change, after this node's walk passed its key) is pushed on the same way: to its holders, then dropped
here once each acknowledged; else it would stay here and its new holder would never get it. That
waits ``PUSH_ON_AFTER_S`` and asks the membership of then: a stale view must not send records away.
A record written here that this node does not hold (its writer routed it under an older membership:
a keeper learns a change on its own, a result answers a grant made before it) goes the same way; so
do records written while this store knew no membership, through the walk its first one starts. A
push on lives in memory: until it is done, the placement kept on disk says a walk is owed. One that
gives up with records left (a holder down for longer, still a member) starts a walk of the membership
of then, retried until every holder answered: no change may come to walk them (a new epoch of the
same nodes starts none).

Pushes go to the peer's ``apply_remote`` directly, not through the outbox: a drop needs the ack. A
push asks first (``holding``: keys and versions, no bytes) and sends only what the peer lacks: the
holder that keeps a record has it, and a joiner pulled its share (one sender per record,
``catchup.py``); a walk asks a joiner once its catch-up is done (``JOINER_WAIT_S``), so each record
of its share reaches it once, and what it lacks still goes (written after its pull, under a view
that did not list it yet). "It holds it" is the ack a drop needs, as an applied push is. A
change while a walk runs cancels it and starts again from the membership the cancelled walk started
from (what it had not pushed yet is still owed). Each walk works against one epoch's membership and
drops nothing once the epoch moved. The membership the held records were placed under is kept on
disk (with whether a walk from it is owed), so a store that died mid-walk resumes it, and a store
that starts on another membership (it left while down and came back) walks from it. A holder that
did not answer keeps the record here and is retried by a later walk.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from prerender_ray import metrics
from prerender_ray.actors.store.members import Members
from prerender_ray.actors.store.records import Records
from prerender_ray.identity.membership import NOBODY, StaleEpoch
from prerender_ray.storage.keys import FRESHNESS, REBALANCE, RENDER_HISTORY, TARGET
from prerender_ray.storage.placement import Placement
from prerender_ray.storage.replication import LOGICAL_BITS, hlc_bytes, unwrap
from prerender_ray.tasks import Tasks
from prerender_ray.timeutil import Clock

if TYPE_CHECKING:
    from prerender_ray.actors.store.actor import StoreClient

WALK_CHUNK = 500  # records read per step of a walk
WALK_BYTES = 4 * 1024 * 1024  # and at most this many bytes of them (pages: ~30 KB each)
PUSH_TRIES = 3
RETRY_AFTER_S = 30.0  # a walk that left records behind (a holder did not answer) runs again after this
PUSH_ON_TRIES = 5  # then a walk of the membership of then takes the strays left over (``_push_on``)
# A stray is pushed on only after this, and only if it still is one: a node whose membership is stale
# (a late push applied; corrected within ~5 s) would otherwise send away records it holds.
PUSH_ON_AFTER_S = 15.0
# A holder that joined after the membership a walk starts from pulled its share when it started, but
# not what this node wrote (or received) after that pull while its view did not list the joiner yet:
# every record versioned from that membership's epoch (a controller time in ms) on, less this margin
# for clock skew, is pushed to it too.
JOINER_MARGIN_MS = 10 * 60_000
# A walk asks a joiner what it holds only once its catch-up is done (its pull brought its share), waiting
# at most this long while it answers that it is still pulling; then whatever it lacks is pushed.
JOINER_WAIT_S = 120.0
ASK_CHUNK = 1_000  # versions per ``holding`` call (the receiver takes at most ``HOLDING_MAX``)
# per-URL key ranges of each store: (prefix, start); page keys sort after every \x00 family
RANGES = {"registry": ((TARGET, None),),
          "pages": ((FRESHNESS, None), (RENDER_HISTORY, None), (b"", b"\x01"))}


class MembershipMoved(Exception):
    """The membership changed under a walk's decision: nothing of it is committed."""


class Rebalancing:
    """``records``: what is walked, pushed and dropped; ``members``: the membership walked against;
    ``stores``: the peers' stores by name; ``wall``: the time it reads; ``tasks``: the store's, which
    start its walks and pushes on (ended when it closes)."""

    def __init__(self, node: str, records: Records, members: Members, stores: Any, wall: Clock, log: Any,
                 tasks: Tasks):
        self.node = node
        self.records = records
        self.members = members
        self.stores = stores
        self.wall = wall
        self.log = log
        self.tasks = tasks
        self.rebalance_task: asyncio.Task | None = None
        self.walk_from: Placement | None = None  # the membership the unfinished walk started from
        self._walk_everyone = False  # that walk pushes to every new holder (see ``settle``)
        self._walk_since = 0  # the epoch of ``walk_from``: records from then on go to joiners too
        self.rebalance_report: dict[str, Any] = {"state": "idle"}
        self.share_moved = False  # placed under another membership than the one this store started on
        # Strays being pushed on live in memory only: while any is, or one was left unanswered, the
        # placement kept on disk says a walk is owed, so a store that dies first walks when it starts.
        self._pushing_on = 0
        self._strays_left = False
        self._left_behind = 0  # push ons that gave up with records left, ever (see ``_rebalance``)
        if members.view.epoch != NOBODY:
            self.settle(members.placement)

    async def _peer_store(self, peer: str) -> StoreClient:
        client: StoreClient = await self.stores.get(peer)
        return client

    def placed_under(self) -> tuple[Placement | None, bool]:
        """The membership the records held here were last placed under, kept on disk (None for a
        store that never kept one), and whether a walk from it is still owed: records may have come
        in under the memberships since (a store of an older release kept a bare list: owed)."""
        raw = self.records.registry.get(REBALANCE)
        if raw is None:
            return None, False
        try:
            doc = json.loads(raw)
        except ValueError:
            return None, False
        names, owed = (doc.get("placed"), bool(doc.get("owed"))) if isinstance(doc, dict) else (doc, True)
        names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
        return (self.members.placement.under(names) if names else None), owed

    def _placed(self, placement: Placement, owed: bool) -> None:
        owed = owed or self._pushing_on > 0 or self._strays_left
        doc = {"placed": list(placement.ownership.names), "owed": owed}
        self.records.registry.put(REBALANCE, json.dumps(doc).encode())

    def written_alone(self) -> None:
        """Records came in while this store knows no membership (it started alone, and its keeper
        took writes): they were placed under none, and the first membership may not list this node
        among their holders. The placement kept on disk (this node alone, for a store that kept
        none) says a walk is owed, so that membership (or a restart before it) walks them."""
        placed, owed = self.placed_under()
        if not owed and self.walk_from is None:
            self._placed(placed or self.members.placement, owed=True)

    def settle(self, current: Placement) -> None:
        """At start (or at the first membership of a store that started alone): what this store holds
        was placed under the membership it kept on disk; when that is not ``current`` (a walk left
        unfinished, or a node that left while down and came back under another membership), walk
        from it. Its new holders may have joined while this node was away and will not pull from
        it: they are pushed to, whoever they are."""
        placed, owed = self.placed_under()
        if placed is None or (placed.ownership.names == current.ownership.names and not owed):
            self._placed(current, owed=False)
            return
        self.share_moved = current.partial and placed.ownership.names != current.ownership.names  # it may hold URLs it never had: its catch-up pulls all of its share
        self._start_walk(placed, everyone=True)

    def _start_walk(self, before: Placement, everyone: bool = False, before_epoch: int = 0) -> None:
        if self.rebalance_task is not None and not self.rebalance_task.done():
            self.rebalance_task.cancel()
        if self.walk_from is None:
            self.walk_from, self._walk_everyone, self._walk_since = before, everyone, before_epoch
            self._placed(before, owed=True)
        self.rebalance_task = self.tasks.spawn(
            self._rebalance(self.walk_from, self.members.placement, self.members.view.epoch))

    def rebalance_on(self, before: Placement, after: Placement, first: bool = False, before_epoch: int = 0) -> None:
        """A new membership (``placement`` is ``after`` already: from now on records ship to their new
        holders); a walk moves what is held. ``first``: this store started alone, ``before`` is no
        placement its records were ever under; ``before_epoch``: the epoch ``before`` was placed under."""
        if first:
            self.settle(after)
            return
        if after.ownership.names == before.ownership.names and self.walk_from is None:
            return  # a new epoch of the same nodes; an unfinished walk, though, aborts on it: walked again below
        if not (before.partial or after.partial or self.walk_from is not None):
            self._placed(after, owed=False)
            return  # every node holds everything, before and after
        self._start_walk(before, before_epoch=before_epoch)

    async def _rebalance(self, before: Placement, after: Placement, epoch: int) -> None:
        """One walk against the membership of ``epoch`` (``after``): a change cancels it (and a drop
        checks the epoch again), and the next walk starts from ``before`` again."""
        t0 = self.wall.monotonic()
        left_behind = self._left_behind
        report = {"state": "running", "members": list(after.ownership.names), "epoch": epoch, "pushed": 0,
                  "dropped": 0, "unanswered": 0, "startedAt": self.wall.now_ms()}
        self.rebalance_report = report
        try:
            for name in ("registry", "pages"):
                for prefix, start in RANGES[name]:
                    await self._walk(name, prefix, start, before, after, report, epoch)
        except asyncio.CancelledError:
            report["state"] = "superseded"
            raise
        except MembershipMoved:
            report["state"] = "superseded"
        except Exception as e:
            metrics.loop_errors.labels("rebalance").inc()
            self.log.error("rebalance failed", error=repr(e))
            report["state"] = "failed"
            report["error"] = repr(e)[:300]
        else:
            report["state"] = "done" if not report["unanswered"] else "incomplete"
        report["ms"] = round((self.wall.monotonic() - t0) * 1000)
        self.log.info("rebalance", **{k: v for k, v in report.items() if k != "members"})
        if report["state"] == "done" and self.members.view.epoch == epoch:
            self.walk_from, self._walk_everyone, self._walk_since = None, False, 0
            # The walk pushed on (and dropped) every record here it does not hold, but those a push on
            # left behind once it had begun: its cursor may have passed them. Those are walked again.
            self._strays_left = self._left_behind != left_behind
            self._placed(after, owed=False)
            if self._strays_left:
                self.rebalance_task = None  # this walk ends here: the next must not cancel it
                self._start_walk(after)
        elif report["state"] in ("incomplete", "failed"):
            await asyncio.sleep(RETRY_AFTER_S)  # another change cancels this wait and walks at once
            self.rebalance_task = self.tasks.spawn(
                self._rebalance(before, self.members.placement, self.members.view.epoch))

    async def _walk(self, name: str, prefix: bytes, start: bytes | None, before: Placement, after: Placement,
                    report: dict, epoch: int) -> None:
        db = self.records.db(name)
        cursor = start
        while True:
            chunk: list[tuple[bytes, bytes]] = []
            size, full = 0, False
            for key, record in db.items(prefix, cursor):
                chunk.append((key, record))
                size += len(key) + len(record)
                if len(chunk) >= WALK_CHUNK or size >= WALK_BYTES:
                    full = True
                    break
            if not chunk:
                return
            cursor = chunk[-1][0] + b"\x00"
            await self._move(name, chunk, before, after, report, epoch, self._walk_everyone, self._walk_since)
            if not full:
                return
            await asyncio.sleep(0)

    async def _move(self, name: str, chunk: list[tuple[bytes, bytes]], before: Placement, after: Placement,
                    report: dict, epoch: int, everyone: bool = False, since_epoch: int | None = None) -> None:
        """Push what others must now hold; drop what this node no longer holds once its holders have it.
        ``after`` is the membership of ``epoch``: nothing is dropped once the epoch moved. A holder
        that joined since ``before`` pulls its share itself, unless ``everyone``, or unless the record
        is versioned from ``since_epoch`` (``before``'s; see ``JOINER_MARGIN_MS``) on."""
        sends: dict[str, list[list]] = {}
        leaving: list[tuple[bytes, bytes | None, tuple[str, ...]]] = []
        members_before = set(after.ownership.names if everyone else before.ownership.names)
        recent = None if since_epoch is None else \
            (max(0, since_epoch - JOINER_MARGIN_MS) << LOGICAL_BITS).to_bytes(8, "big")
        for key, record in chunk:
            now = after.holders(name, key)
            if now is None:
                continue  # cluster-wide: every node holds it
            was = before.holders(name, key) or ()
            if self.node not in now:
                dests = tuple(n for n in now if n != self.node)
                leaving.append((key, hlc_bytes(record), dests))
            else:
                pusher = next((n for n in now if n in was), None)
                if pusher != self.node:
                    continue
                fresh = recent is not None and (hlc_bytes(record) or b"") >= recent  # joiners may lack it
                dests = tuple(n for n in now if n not in was and (fresh or n in members_before))
            for peer in dests:
                sends.setdefault(peer, []).append([name, key, record])
        answered = set()
        for peer, records in sends.items():
            if peer not in before.ownership.names:
                await self._joiner_synced(peer, report, epoch)
            pushed = await self._push(peer, records, epoch)
            if pushed is not None:
                answered.add(peer)
                report["pushed"] += pushed
                report["held"] = report.get("held", 0) + len(records) - pushed
            else:
                report["unanswered"] += len(records)
        if self.members.view.epoch != epoch:
            raise MembershipMoved()  # decided against a membership that is gone: the next walk decides
        gone = [(key, sent) for key, sent, dests in leaving if all(d in answered for d in dests)]
        report["dropped"] += self.records.drop_local(name, gone)

    def push_on(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        """Records just received or written that this node does not hold (``items``: key, record):
        to their holders, and dropped here once each has them."""
        self._pushing_on += 1
        if self._pushing_on == 1 and self.walk_from is None:
            self._placed(self.members.placement, owed=True)
        self.tasks.spawn(self._push_on(name, items))

    async def _push_on(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        report = {"pushed": 0, "dropped": 0, "unanswered": 0}
        try:
            await self._push_on_tries(name, items, report)
        except BaseException:  # cancelled with the process (or failed): the walk owed on disk stays owed
            self._pushing_on -= 1
            self._strays_left = True
            raise
        self._pushing_on -= 1
        if report["unanswered"]:
            # A holder did not answer any try (down a while, still a member): no change may come to
            # walk these (a new epoch of the same nodes starts none), so a walk of this membership
            # takes them, retried until every holder answered; a running walk, when done (above).
            self._strays_left = True
            self._left_behind += 1
            if self.walk_from is None:
                self._start_walk(self.members.placement)
        if not self._pushing_on and self.walk_from is None and not self._strays_left:
            self._placed(self.members.placement, owed=False)
        if any(report.values()):
            self.log.info("records held elsewhere pushed on", db=name, **report)

    async def _push_on_tries(self, name: str, items: list[tuple[bytes, bytes]], report: dict) -> None:
        db = self.records.db(name)
        for attempt in range(PUSH_ON_TRIES):
            await asyncio.sleep(RETRY_AFTER_S if attempt else PUSH_ON_AFTER_S)
            # only what is still here at the version received (a newer one is pushed on by itself)
            # and still not held here under the membership of now
            epoch, placement = self.members.view.epoch, self.members.placement  # this attempt's snapshot
            held = db.get_many([key for key, _ in items])
            items = [(key, now) for (key, was), now in zip(items, held)
                     if now is not None and hlc_bytes(now) == hlc_bytes(was)
                     and not placement.holds(self.node, name, key)]
            report["unanswered"] = 0
            if not items:
                break
            try:
                await self._move(name, items, placement, placement, report, epoch)
            except MembershipMoved:
                report["unanswered"] = len(items)  # the next attempt, under the membership of then
            except Exception as e:
                self.log.warning("pushing on a record held elsewhere failed", error=repr(e)[:300])
                report["unanswered"] = len(items)
            if not report["unanswered"]:
                break

    async def _joiner_synced(self, peer: str, report: dict, epoch: int) -> None:
        """Before a walk asks a joiner what it holds (once per walk): the end of its catch-up, while it
        answers that it is still pulling (at most ``JOINER_WAIT_S``), so that what it pulled is not
        pushed to it again. One that does not answer is not waited for: the push fails or decides."""
        waited = report.setdefault("waitedFor", [])
        if peer in waited:
            return
        waited.append(peer)
        deadline = self.wall.monotonic() + JOINER_WAIT_S
        while (left := deadline - self.wall.monotonic()) > 0:
            try:
                store = await self._peer_store(peer)
                state = (await store.wait_synced(min(left, 10.0))).get("state")
            except asyncio.CancelledError:
                raise
            except Exception:
                return
            if self.members.view.epoch != epoch:
                raise MembershipMoved()
            if state != "timeout":
                return

    async def _push(self, peer: str, records: list[list], epoch: int) -> int | None:
        """``records`` (of one db) to ``peer``, but those it holds already (it is asked first, by
        version: a joiner pulled its share, a holder that keeps a record has it): how many were
        sent, None when it did not answer."""
        for attempt in range(PUSH_TRIES):
            try:
                store = await self._peer_store(peer)
                missing: list[list] = []
                for i in range(0, len(records), ASK_CHUNK):
                    part = records[i:i + ASK_CHUNK]
                    asked = []
                    for _, key, record in part:
                        version = unwrap(record)[0]
                        asked.append([key, version.hlc, version.node])
                    held = await store.holding(part[0][0], asked, epoch, self.members.wire_of(epoch))
                    missing += [r for r, has in zip(part, held) if not has]
                if missing:
                    await store.apply_remote(missing, epoch, self.members.wire_of(epoch))  # under the peer client's deadline (SHIP_DEADLINE_S)
                    metrics.replication_shipped_bytes.labels("rebalance").inc(
                        sum(len(key) + len(record) for _, key, record in missing))
                return len(missing)
            except asyncio.CancelledError:
                raise
            except StaleEpoch as e:  # the peer is on a newer membership: a walk under it pushes again
                await self.members.refused(peer, e)
                return None
            except Exception as e:
                self.log.info("rebalance push failed", peer=peer, attempt=attempt + 1, error=type(e).__name__)
                await asyncio.sleep(0.5 * (attempt + 1))
        return None
