"""LeaseTable: exclusive render leases for the keys this node owns, persisted so that a restart of
the keeper, of this actor or of the whole node never re-grants work that is in flight.

The table logic is ``prerender_ray.queue.leases``; this actor adds durability: every grant and release is
written to the node's lease store before it is acknowledged. Records outlive their lease for a
while, so a late result can be told apart from one for an id that was never granted, and a replayed
one from the first (each record holds the key's latest grant: its time, worker and whether a result
answered it).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import ray

from prerender_ray import logs, metrics
from prerender_ray.actors.client import NodeActorClient
from prerender_ray.actors.common import call, untraced
from prerender_ray.config.model import Config
from prerender_ray.queue.grants import read_record
from prerender_ray.queue.leases import Leases
from prerender_ray.storage.keys import LEASE, MISSES
from prerender_ray.storage.rocks import LEASES, Store, store_path
from prerender_ray.timeutil import SYSTEM_CLOCK, Clock

# l:<key> -> [expires, due, cadence, released, answered, written_at, lease_granted_at, grant]; grant is
# [granted_at, worker, any_worker, ends, answered] (records of the six-field form predate grants)
SWEEP_INTERVAL_S = 5.0


class DurableLeases:
    """The durable lease table, plain: the core table and the node's lease store (``rpc.LeaseApi``).
    The actor below only starts it; the keeper's tests use it as it is, without Ray."""

    def __init__(self, cfg: Config, db: Store, log: Any, clock: Clock = SYSTEM_CLOCK):
        self.log = log
        self.clock = clock  # the simulated cluster's is virtual
        self.cfg = cfg
        self.db = db
        self.table = Leases.from_config(cfg.queue, cfg.render)
        self._restore()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sweeper())

    def _restore(self) -> None:
        now = self.clock.now_ms()
        leases, grants, stale = [], [], []
        lease_time = self.table.lease_time
        for k, v in self.db.items(LEASE):
            key = k[len(LEASE):].decode()
            try:
                lease, grant = read_record(json.loads(v), lease_time)
            except (ValueError, TypeError, IndexError):
                stale.append(k)
                continue
            if max(lease[0], int(grant[3])) + self.table.remember_ms < now:
                stale.append(k)
                continue
            leases.append([key, *lease])
            grants.append([key, *grant])
        try:
            misses = json.loads(self.db.get(MISSES) or b"[]")
        except ValueError:
            misses = []
        doc = {"v": 2, "leases": leases, "grants": grants, "misses": misses}
        self.table.restore(json.dumps(doc).encode())
        self.db.write((k, None) for k in stale)
        self.log.info("lease table open", restored=len(leases), in_flight=self.table.occupancy(now))
        metrics.leases_in_flight.set(self.table.occupancy(now))

    def _record(self, key: str, now: int) -> tuple[bytes, bytes]:
        """The stored record of ``key`` as the table holds it now; a key without a lease keeps a
        released record with its grant until it ages out, so a late result is still recognised (and a
        replay still refused) after a restart."""
        lease = self.table.export(key)
        if lease is None:
            grant = self.table.grant_of(key)
            ends = grant[3] if grant is not None else now
            lease = [ends, None, None, True, True, grant[0] if grant else None, grant]
        expires, due, cadence, released, answered, at, grant = lease
        record = [expires, due, cadence, released, answered, now, at, grant]
        return LEASE + key.encode(), json.dumps(record).encode()

    # ------------------------------------------------------------------------------------ calls

    async def grant_many(self, items: list[list]) -> list[list]:
        """Exclusive grants for [key, due, cadence, worker]; each answer is [key, expiresAt or None,
        refusal] (lists: see ``Claims.grant``)."""
        now = self.clock.now_ms()
        out, ops = [], []
        for key, due, cadence, *worker in items:
            g = self.table.grant(key, now, due=due, cadence=cadence, worker=worker[0] if worker else None)
            out.append([key, g.expires_at, g.refused])
            if g.ok:
                ops.append(self._record(key, now))
        self.db.write(ops)  # durable before anyone hears of the grant
        metrics.leases_in_flight.set(self.table.occupancy(now))
        return out

    async def begin_results(self, items: list[list]) -> list[list]:
        """[verdict, granted_at] for each [key, worker]: may this result apply to the key's latest
        grant? Checked and marked in one step (no await in between), so two replays racing each other
        cannot both pass, in one call or in two."""
        now = self.clock.now_ms()
        return [[(check := self.table.begin_result(key, worker, now)).verdict, check.granted_at]
                for key, worker in items]

    async def finish_results(self, items: list[list]) -> list[bool]:
        """Results were applied: for each [key, hold, granted_at] its grant is answered and its lease
        released (``hold``, the fast retry lane: kept, and no longer a miss); a lease granted since is
        left alone. One durable write for them all, before the answer."""
        now = self.clock.now_ms()
        released = [self.table.finish_result(key, granted_at, now, hold=hold) for key, hold, granted_at in items]
        self.db.write([self._record(key, now) for key, _, _ in items])
        metrics.leases_in_flight.set(self.table.occupancy(now))
        return released

    async def abandon_results(self, items: list[list]) -> None:
        """Applying these [key, granted_at] failed: their grants stay open for the fleet's retry."""
        for key, granted_at in items:
            self.table.abandon_result(key, granted_at)

    async def reopen_answering(self) -> int:
        """The keeper (re)started: grants its predecessor was answering open again."""
        reopened = self.table.reopen_answering()
        if reopened:
            self.log.warning("grants being answered by a keeper that stopped are open again", grants=reopened)
        return reopened

    async def known(self, key: str) -> bool:
        """Was ``key`` granted recently enough that a result for it is expected?"""
        return self.table.known(key, self.clock.now_ms())

    async def blocked(self) -> list[tuple[str, int]]:
        """(key, until) for every key a grant would refuse now: the keeper's mirror."""
        now = self.clock.now_ms()
        out = []
        for key in self.table.blocked(now):
            lease = self.table.export(key)
            until = lease[0] if lease is not None else (self.table.hold_of(key, now) or now)
            out.append((key, until))
        return out

    async def lease_of(self, key: str) -> dict | None:
        now = self.clock.now_ms()
        info = self.table.lease_of(key, now)
        held = self.table.hold_of(key, now)
        if info is None and held is None:
            return None
        return {"leaseExpiresAt": info.expires_at if info else None, "dueAt": info.due if info else None,
                "heldUntil": held, "misses": self.table.misses_of(key)}

    async def export_keys(self, keys: list[str]) -> list[tuple[str, list]]:
        """The leases of keys that move to another node (their records travel with the rows). Their
        grants are answered there from now on (``Leases.hand_over``), durably before they leave."""
        now = self.clock.now_ms()
        self.table.occupancy(now)  # retire what expired first
        out = [(k, rec) for k in keys if (rec := self.table.hand_over(k)) is not None]
        self.db.write([self._record(k, now) for k, _ in out])
        return out

    async def adopt(self, leases: list[tuple[str, list]]) -> int:
        """Leases of rows handed to this node: no key in flight is granted twice across the move."""
        now = self.clock.now_ms()
        taken = [k for k, rec in leases if self.table.adopt(k, rec, now)]
        self.db.write([self._record(k, now) for k in taken])
        metrics.leases_in_flight.set(self.table.occupancy(now))
        return len(taken)

    async def forget(self, keys: list[str]) -> None:
        """Rows handed to another node: their leases go with them (see ``adopt``)."""
        now = self.clock.now_ms()
        for key in keys:
            self.table.forget(key, now)
        self.db.write((LEASE + k.encode(), None) for k in keys)

    async def status(self) -> dict:
        now = self.clock.now_ms()
        oldest = self.table.oldest(now)
        return {"live": True, "pid": os.getpid(), "inFlight": self.table.occupancy(now),
                "awaitingResults": self.table.awaiting(now), "capacity": self.table.max_leases,
                "oldest": {"key": oldest.key, "expiresAt": oldest.expires_at, "dueAt": oldest.due} if oldest else None}

    # ---------------------------------------------------------------------------------- sweeping

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                self.sweep()
            except Exception as e:
                metrics.loop_errors.labels("lease-sweep").inc()
                self.log.error("lease sweep failed", error=repr(e))

    def sweep(self) -> None:
        now = self.clock.now_ms()
        report = self.table.sweep(now)
        for hold in report.holds:
            metrics.claim_health.labels("wedged").inc()
            self.log.warning("key held back: its leases keep expiring without a result", key=hold.key,
                             misses=hold.misses, hold_leases=hold.leases, until=hold.until)
        misses = self.table.export_misses()
        self.db.write([(LEASE + k.encode(), None) for k in report.forgotten]
                      + [(MISSES, json.dumps(misses).encode())])
        metrics.leases_in_flight.set(self.table.occupancy(now))

    async def close(self) -> None:
        task = getattr(self, "_task", None)
        if task is not None:
            task.cancel()
        self.sweep()
        self.db.flush()
        self.db.close()


class LeaseTable(DurableLeases):
    """The shell, plain (the LocalNode harness runs it): ``LeaseTableActor`` is what Ray places."""

    def __init__(self, config: dict, node: str, data_dir: str):
        untraced(self)
        cfg = Config.model_validate(config)
        logs.setup(node, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="leases")
        super().__init__(cfg, Store(store_path(data_dir, node, LEASES)), logs.get("leases"))
        self.start()


LeaseTableActor = ray.remote(LeaseTable)


class LeaseClient(NodeActorClient):
    """Typed calls to a node's LeaseTable actor (``rpc.LeaseApi``), each under a deadline: the hand-off's
    bulk calls (a batch of keys moving to another node) get a longer one."""

    def __init__(self, handle: Any, deadline_s: float = 5.0, bulk_deadline_s: float = 30.0):
        self.handle = handle
        self.deadline_s = deadline_s
        self.bulk_deadline_s = bulk_deadline_s

    async def grant_many(self, items: list[list]) -> list[list]:
        return await call(self.handle.grant_many.remote(items), self.deadline_s)

    async def begin_results(self, items: list[list]) -> list[list]:
        return await call(self.handle.begin_results.remote(items), self.deadline_s)

    async def finish_results(self, items: list[list]) -> list[bool]:
        return await call(self.handle.finish_results.remote(items), self.deadline_s)

    async def abandon_results(self, items: list[list]) -> None:
        return await call(self.handle.abandon_results.remote(items), self.deadline_s)

    async def reopen_answering(self) -> int:
        return await call(self.handle.reopen_answering.remote(), self.deadline_s)

    async def blocked(self) -> list[tuple[str, int]]:
        return await call(self.handle.blocked.remote(), self.deadline_s)

    async def lease_of(self, key: str) -> dict | None:
        return await call(self.handle.lease_of.remote(key), self.deadline_s)

    async def export_keys(self, keys: list[str]) -> list[tuple[str, list]]:
        return await call(self.handle.export_keys.remote(keys), self.bulk_deadline_s)

    async def adopt(self, leases: list[tuple[str, list]]) -> int:
        return await call(self.handle.adopt.remote(leases), self.bulk_deadline_s)

    async def forget(self, keys: list[str]) -> None:
        return await call(self.handle.forget.remote(keys), self.bulk_deadline_s)

    async def status(self) -> dict:
        return await call(self.handle.status.remote(), self.deadline_s)
