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
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.rpc import LeaseApi, Peers
from prerender_ray.timeutil import now_ms

HANDOFF_BATCH = 1_000
MAX_BACKOFF_S = 30.0


class Handoff:
    def __init__(self, rows: Rows, claims: Claims, leases: LeaseApi, peers: Peers, ownership: Ownership,
                 node: str, log: Any, members: Callable[[], Awaitable[list[str]]] | None = None):
        self.rows = rows
        self.claims = claims
        self.leases = leases
        self.peers = peers
        self.ownership = ownership
        self.node = node
        self.log = log
        self.members = members  # the controller's node list (None: membership comes by push only)
        self._unasked = Sometimes()
        self.checked_at: int | None = None  # when the controller last answered a check (epoch ms)
        self.previous: Ownership | None = None  # the membership before the last change
        self.task: asyncio.Task | None = None
        self.report: dict[str, Any] = {"handedOff": 0, "adopted": 0, "pending": False}
        # rebuild their slice: the departed nodes and the membership they were part of
        self.on_departed: Callable[[list[str], Ownership], None] = lambda departed, before: None

    async def fetch_membership(self) -> None:
        """On a (re)start: the controller's current node list, which may be newer than our arguments.
        Applied like any change (``set_membership``): rows adopted under the arguments' membership
        while the store caught up must leave the ranking, or no later check would move them."""
        if self.members is None:
            return
        try:
            names = await self.members()
        except Exception as e:
            self.log.info("membership from arguments (controller not reachable)", error=type(e).__name__)
            return
        if names:
            await self.set_membership(names)

    async def check_membership(self) -> dict | None:
        """The controller's node list applied as a push is (None: the controller did not answer).
        Pushes are not ordered: one delivered late to an actor that was starting replaced a newer
        membership, and nothing corrected it (seen in CI: a restarted node kept a two-node view
        for minutes while the controller had three, and held the third node's rows). The
        controller is the truth; a keeper that checks it every few seconds converges."""
        if self.members is None:
            return None
        try:
            names = await self.members()
        except Exception as e:  # said: a check that never answers hides a stale view
            if self._unasked.due():
                self.log.warning("the controller's membership could not be read", error=repr(e)[:200])
            return None
        self.checked_at = now_ms()
        if not names or tuple(sorted(set(names))) == self.ownership.names:
            return {"changed": False}
        self.log.warning("membership differs from the controller's; applying it", held=list(self.ownership.names),
                         controller=sorted(set(names)))
        return await self.set_membership(names)

    async def set_membership(self, names: list[str]) -> dict:
        before = Ownership(self.ownership.names)
        changed = self.ownership.update(names)
        answer: dict[str, Any] = {"changed": False}
        if changed:  # all of it before the first await: a call cut off at its deadline leaves no half
            self.previous = before
            departed = [n for n in before.names if n not in self.ownership.names]
            released = self.rows.ranking.drop_where(lambda k: not self.rows.owns(k))  # stop granting them now
            self.log.info("membership", nodes=list(self.ownership.names), departed=departed, releasing=released)
            self.kick()
            if departed:
                self.on_departed(departed, before)
            answer = {"changed": True, "releasing": released, "departed": departed}
        await self.peers.renew([n for n in self.ownership.names if n != self.node])
        return answer

    def kick(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        """Hand unowned rows to their owners until none are left; retried while an owner is away."""
        backoff = 1.0
        self.report["pending"] = True
        try:
            while True:
                pending = self.rows.unowned()
                if not pending:
                    return
                try:
                    for owner, rows in pending.items():
                        keeper = await self.peers.of(owner)
                        for i in range(0, len(rows), HANDOFF_BATCH):
                            batch = rows[i:i + HANDOFF_BATCH]
                            keys = [r.cache_key for r in batch]
                            leases = await self.leases.export_keys(keys)
                            await keeper.adopt(batch, leases)
                            self.rows.forget_stored(keys)
                            await self.leases.forget(keys)
                            self.report["handedOff"] += len(batch)
                            await asyncio.sleep(0)
                    backoff = 1.0
                except Exception as e:
                    self.log.warning("hand-off incomplete; retrying", error=repr(e), retry_s=backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            self.report["pending"] = False

    async def adopt(self, rows: list[ScheduleRow], leases: list) -> int:
        """Rows handed over by their previous owner: their due times kept, their leases with them."""
        if leases:
            await self.leases.adopt(leases)
            self.claims.note_adopted(leases)
        # Where the sender's view lagged ours, the write funnel keeps what we do not own out of the
        # ranking and kicks the hand-off: passed on now (no later membership change may come to move them).
        self.rows.write(rows)
        self.report["adopted"] += len(rows)
        return len(rows)
