"""Membership changes for the keeper (a mixin of ``QueueKeeper``).

When a node joins, every keeper stops serving the rows it no longer owns at once (they leave the
ranking), then hands them over to their new owner with their leases: the rows keep their due times
(nothing is re-jittered) and a key in flight stays leased on its new owner (never granted twice
across the move). Rows are deleted here only after the new owner acknowledged them. When a node
dies, its rows died with it: the new owners rebuild them from the replicated targets (reconcile of
the departed slice, keys without a cached page first).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.common import call
from prerender_ray.identity.nodes import CONTROLLER, NAMESPACE, Ownership
from prerender_ray.queue.schedule import ScheduleRow, UnreadableRow

HANDOFF_BATCH = 1_000
HANDOFF_DEADLINE_S = 30.0


class KeeperHandoff:
    def init_handoff(self) -> None:
        self.previous_ownership: Ownership | None = None
        self.handoff_task: asyncio.Task | None = None
        self.handoff_report: dict[str, Any] = {"handedOff": 0, "adopted": 0, "pending": False}

    def owns(self, key: str) -> bool:
        return len(self.ownership.names) <= 1 or self.ownership.owner(self.rules.url_of(key)) == self.node

    async def fetch_membership(self) -> None:
        """On a (re)start: the controller's current node list, which may be newer than our arguments."""
        import ray

        try:
            controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
            nodes = await call(controller.nodes_info.remote(), 10)
            self.ownership.update([n["name"] for n in nodes])
        except Exception as e:
            self.log.info("membership from arguments (controller not reachable)", error=type(e).__name__)

    async def set_membership(self, names: list[str]) -> dict:
        before = Ownership(self.ownership.names)
        changed = self.ownership.update(names)
        await self.keepers.renew([n for n in self.ownership.names if n != self.node])
        if not changed:
            return {"changed": False}
        self.previous_ownership = before
        departed = [n for n in before.names if n not in self.ownership.names]
        released = self.ranking.drop_where(lambda k: not self.owns(k))  # stop granting them now
        self.log.info("membership", nodes=list(self.ownership.names), departed=departed, releasing=released)
        self.kick_handoff()
        if departed and self.phase == "live":
            asyncio.get_running_loop().create_task(self._rebuild(departed))
        return {"changed": True, "releasing": released, "departed": departed}

    async def _rebuild(self, departed: list[str]) -> None:
        while self.reconciling:  # a running pass may predate the change: run ours after it
            await asyncio.sleep(1)
        try:
            await self.reconcile(departed=departed)
        except Exception as e:
            metrics.loop_errors.labels("rebuild").inc()
            self.log.error("rebuilding a departed node's slice failed", departed=departed, error=repr(e))

    def kick_handoff(self) -> None:
        if self.handoff_task is None or self.handoff_task.done():
            self.handoff_task = asyncio.get_running_loop().create_task(self._handoff())

    def _unowned(self) -> dict[str, list[ScheduleRow]]:
        by_owner: dict[str, list[ScheduleRow]] = defaultdict(list)
        if len(self.ownership.names) <= 1:
            return by_owner
        for k, v in self.db.items():
            key = k.decode()
            if not self.owns(key):
                try:
                    by_owner[self.ownership.owner(self.rules.url_of(key))].append(ScheduleRow.decode(key, v))
                except (UnreadableRow, ValueError):
                    continue
        return by_owner

    async def _handoff(self) -> None:
        """Hand unowned rows to their owners until none are left; retried while an owner is away."""
        backoff = 1.0
        self.handoff_report["pending"] = True
        try:
            while True:
                pending = self._unowned()
                if not pending:
                    return
                try:
                    for owner, rows in pending.items():
                        keeper = self.keepers.get(owner)
                        for i in range(0, len(rows), HANDOFF_BATCH):
                            batch = rows[i:i + HANDOFF_BATCH]
                            keys = [r.cache_key for r in batch]
                            leases = await call(self.leases.export_keys.remote(keys), HANDOFF_DEADLINE_S)
                            await call(keeper.adopt.remote(batch, leases), HANDOFF_DEADLINE_S)
                            self.db.write((k.encode(), None) for k in keys if not self.owns(k))
                            await call(self.leases.forget.remote(keys), HANDOFF_DEADLINE_S)
                            self.handoff_report["handedOff"] += len(batch)
                            await asyncio.sleep(0)
                    backoff = 1.0
                except Exception as e:
                    self.log.warning("hand-off incomplete; retrying", error=repr(e), retry_s=backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
        finally:
            self.handoff_report["pending"] = False

    async def adopt(self, rows: list[ScheduleRow], leases: list) -> int:
        """Rows handed over by their previous owner: their due times kept, their leases with them."""
        if leases:
            await call(self.leases.adopt.remote(leases), HANDOFF_DEADLINE_S)
            for key, rec in leases:
                self.mirror[key] = max(self.mirror.get(key, 0), int(rec[0]))
        self.write_rows(rows)
        self.handoff_report["adopted"] += len(rows)
        return len(rows)
