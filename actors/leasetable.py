"""LeaseTable: exclusive render leases for the keys this node owns, persisted so that a restart of
the keeper, of this actor or of the whole node never re-grants work that is in flight.

The table logic is ``prerender_ray.leases``; this actor adds durability: every grant and release is
written to the node's lease store before it is acknowledged. Records outlive their lease for a
while, so a late result can be told apart from one for an id that was never granted.
"""

from __future__ import annotations

import asyncio
import json
import os

import ray

from prerender_ray import logs, metrics
from prerender_ray.config import Config
from prerender_ray.leases import LeaseTable as Table
from prerender_ray.stores import LEASES, Store, store_path
from prerender_ray.timeutil import now_ms

from .common import untraced

LEASE = b"l:"  # l:<key> -> [expires, due, cadence, released, answered, granted_at]
MISSES = b"m"  # the miss histories, one JSON document (small; rewritten on each sweep)
SWEEP_INTERVAL_S = 5.0


@ray.remote
class LeaseTable:
    def __init__(self, config: dict, node: str, data_dir: str):
        untraced(self)
        cfg = Config.model_validate(config)
        logs.setup(node, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="leases")
        self.log = logs.get("leases")
        self.cfg = cfg
        self.db = Store(store_path(data_dir, node, LEASES))
        self.table = Table.from_config(cfg.queue, cfg.render)
        # Keys granted recently (lease expired or released): a late result is still accepted.
        self.recent_ms = cfg.queue.job_lease_time + 10 * 60_000
        self.granted: dict[str, int] = {}  # key -> when its latest lease ends (grace included)
        self._restore()
        self._task = asyncio.get_running_loop().create_task(self._sweeper())

    def _restore(self) -> None:
        now = now_ms()
        leases, stale = [], []
        for k, v in self.db.items(LEASE):
            key = k[len(LEASE):].decode()
            try:
                expires, due, cadence, released, answered, *_ = json.loads(v)
            except (ValueError, TypeError):
                stale.append(k)
                continue
            if expires + self.recent_ms < now:
                stale.append(k)
                continue
            self.granted[key] = expires
            leases.append([key, expires, due, cadence, released, answered])
        try:
            misses = json.loads(self.db.get(MISSES) or b"[]")
        except ValueError:
            misses = []
        self.table.restore(json.dumps({"v": 1, "leases": leases, "misses": misses}).encode())
        self.db.write((k, None) for k in stale)
        self.log.info("lease table open", restored=len(leases), in_flight=self.table.occupancy(now))
        metrics.leases_in_flight.set(self.table.occupancy(now))

    def _record(self, key: str, now: int) -> tuple[bytes, bytes]:
        """The stored record of ``key`` as the table holds it now; a key without a lease keeps a
        released record until it ages out, so a late result is still recognised after a restart."""
        lease = self.table.export(key)
        if lease is None:
            lease = [self.granted.get(key, now), None, None, True, True]
        return LEASE + key.encode(), json.dumps([*lease, now]).encode()

    # ------------------------------------------------------------------------------------ calls

    async def grant_many(self, items: list[list]) -> list[list]:
        """Exclusive grants for [key, due, cadence]; each answer is [key, expiresAt or None, refusal]
        (lists: see ``KeeperOps._grant``)."""
        now = now_ms()
        out, ops = [], []
        for key, due, cadence in items:
            g = self.table.grant(key, now, due=due, cadence=cadence)
            out.append([key, g.expires_at, g.refused])
            if g.ok:
                self.granted[key] = g.expires_at
                ops.append(self._record(key, now))
        self.db.write(ops)  # durable before anyone hears of the grant
        metrics.leases_in_flight.set(self.table.occupancy(now))
        return out

    async def release(self, key: str, hold: bool = False) -> bool:
        """A result was processed. ``hold`` (fast retry lane): keep the lease, it is not a miss."""
        now = now_ms()
        if hold:
            self.table.note_result(key, now)
            released = False
        else:
            released = self.table.release(key, now)
            lease = self.table.export(key)
            self.granted[key] = lease[0] if lease is not None else now
        self.db.write([self._record(key, now)])
        metrics.leases_in_flight.set(self.table.occupancy(now))
        return released

    async def known(self, key: str) -> bool:
        """Was ``key`` granted recently enough that a result for it is expected?"""
        ends = self.granted.get(key)
        return ends is not None and ends + self.recent_ms >= now_ms()

    async def blocked(self) -> list[tuple[str, int]]:
        """(key, until) for every key a grant would refuse now: the keeper's mirror."""
        now = now_ms()
        out = []
        for key in self.table.blocked(now):
            lease = self.table.export(key)
            until = lease[0] if lease is not None else (self.table.hold_of(key, now) or now)
            out.append((key, until))
        return out

    async def lease_of(self, key: str) -> dict | None:
        now = now_ms()
        info = self.table.lease_of(key, now)
        held = self.table.hold_of(key, now)
        if info is None and held is None:
            return None
        return {"leaseExpiresAt": info.expires_at if info else None, "dueAt": info.due if info else None,
                "heldUntil": held, "misses": self.table.misses_of(key)}

    async def export_keys(self, keys: list[str]) -> list[tuple[str, list]]:
        """The leases of keys that move to another node (their records travel with the rows)."""
        self.table.occupancy(now_ms())  # retire what expired first
        return [(k, rec) for k in keys if (rec := self.table.export(k)) is not None]

    async def adopt(self, leases: list[tuple[str, list]]) -> int:
        """Leases of rows handed to this node: no key in flight is granted twice across the move."""
        now = now_ms()
        taken = [k for k, rec in leases if self.table.adopt(k, rec, now)]
        for k, rec in leases:
            self.granted[k] = max(self.granted.get(k, 0), int(rec[0]))
        self.db.write([self._record(k, now) for k in taken])
        metrics.leases_in_flight.set(self.table.occupancy(now))
        return len(taken)

    async def forget(self, keys: list[str]) -> None:
        """Rows handed to another node: their leases go with them (see ``adopt``)."""
        now = now_ms()
        for key in keys:
            self.table.release(key, now)
            self.granted.pop(key, None)
        self.db.write((LEASE + k.encode(), None) for k in keys)

    async def status(self) -> dict:
        now = now_ms()
        oldest = self.table.oldest(now)
        return {"live": True, "pid": os.getpid(), "inFlight": self.table.occupancy(now),
                "capacity": self.table.max_leases,
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
        now = now_ms()
        report = self.table.sweep(now)
        for hold in report.holds:
            metrics.claim_health.labels("wedged").inc()
            self.log.warning("key held back: its leases keep expiring without a result", key=hold.key,
                             misses=hold.misses, hold_leases=hold.leases, until=hold.until)
        forgotten = [k for k, ends in self.granted.items() if ends + self.recent_ms < now]
        for k in forgotten:
            del self.granted[k]
        misses = self.table.export_misses()
        self.db.write([(LEASE + k.encode(), None) for k in forgotten] + [(MISSES, json.dumps(misses).encode())])
        metrics.leases_in_flight.set(self.table.occupancy(now))

    async def close(self) -> None:
        self._task.cancel()
        self.sweep()
        self.db.flush()
        self.db.close()
