"""The keeper's claims: the published ready set and dealing it out as exclusive grants.

Every second (and soon after due work is written) the ranking's top K due rows are published, leased
and held keys skipped; a claim takes the next candidates from that set, re-reads each row, and asks
the lease table for the grants in one call shared with concurrent claims. The mirror is the keeper's
copy of what the lease table would refuse, so a publish skips it without asking.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.keeper.rows import CurrentConfig, Rows
from prerender_ray.batching import GroupCommit
from prerender_ray.queue import job_options
from prerender_ray.queue.diagnostics import DiagnoseFlags
from prerender_ray.rpc import LeaseApi

PUBLISH_SOON_S = 0.05
REFUSED_BACKOFF_MS = 60_000  # a key the table refused is not offered again for a minute
ONLY_RANKED = 8  # fewer than 1 in 8 rows may pass the fences: rank those instead of walking (``publish``)
LONG_WALK = 20_000  # keys a walk skipped (fenced, leased) past which a fenced publish ranks ``fence_only``


class Claims:
    def __init__(self, rows: Rows, conf: CurrentConfig, leases: LeaseApi, callback_origin: str, log: Any):
        self.rows = rows
        self.conf = conf
        self.leases = leases
        self.callback_origin = callback_origin
        self.log = log
        self.ready: list[str] = []
        self.cursor = 0
        self.published_at: float | None = None
        self.publish_ms: float | None = None
        self.mirror: dict[str, int] = {}  # key -> until: leased, in grace or held (from the lease table)
        self.pending: set[str] = set()  # keys with a grant in flight
        self.diagnose = DiagnoseFlags()  # keys an admin asked to render with diagnostics
        self.paused = False
        self._now = 0
        self._publish_pending = False
        self._soon: asyncio.TimerHandle | None = None
        # Concurrent claims share one lease-table call (one actor hop, one RocksDB batch).
        self._grants: GroupCommit[list[list], list[list]] = GroupCommit(self._grant_batch)
        self.on_published: Callable[[], None] = lambda: None  # the status follows each publish
        self.on_idle: Callable[[], None] = lambda: None  # a claim found nothing grantable
        self.trusted: Callable[[int], bool] = lambda now: True  # may grant now (``Handoff.trusted``)
        self._fenced: Callable[[str], bool] | None = None  # during a publish: ``Rows.fence_test``
        self._long_walk = False  # the last walk skipped more than ``LONG_WALK`` keys while fenced

    @property
    def serving(self) -> bool:
        return self.published_at is not None

    # ---------------------------------------------------------------------------------- publish

    def blocked(self, key: str) -> bool:
        until = self.mirror.get(key)
        if key in self.pending or (until is not None and until > self._now):
            return True
        if self._fenced is not None:  # a publish: the fences decided once for all its keys
            return self._fenced(key)
        return self.rows.fencing and self.rows.is_fenced(key, self._now)

    def publish(self) -> None:
        t0 = time.perf_counter()
        self._now = now = self.rows.clock.now_ms()
        self.mirror = {k: u for k, u in self.mirror.items() if u > now}
        self._fenced = self.rows.fence_test(now) if self.rows.fencing else None
        # a walk that met too many held-back keys before the capacity filled: decide the fence for
        # every key once per change of it instead (``Rows.fence_only``), and rank what may pass
        only = self.rows.fence_only(now) if self._fenced is not None and self._long_walk else None
        try:
            capacity, ranking = self.conf.cfg.queue.ready.capacity, self.rows.ranking
            if only is None:
                skipped = 0

                def blocked(key: str) -> bool:
                    nonlocal skipped
                    if self.blocked(key):
                        skipped += 1
                        return True
                    return False

                self.ready = ranking.top_k(capacity, now, blocked)
                self._long_walk = self._fenced is not None and skipped > LONG_WALK
            elif len(only) * ONLY_RANKED < len(ranking):  # a few may pass: rank just those
                self.ready = ranking.top_k_of(only, capacity, now, self.blocked)
            else:  # many may: the walk stops at the capacity, and skips the rest by a set look-up
                self.ready = ranking.top_k(capacity, now, lambda key: key not in only or self.blocked(key))
        finally:
            self._fenced = None
        self.cursor = 0
        self.published_at = self.rows.clock.time()
        self.publish_ms = (time.perf_counter() - t0) * 1000
        metrics.keeper_publish_seconds.observe(self.publish_ms / 1000)
        metrics.keeper_rows.set(len(self.rows))
        self.rows.repair_head(self.ready)

    def publish_now(self) -> None:
        """Publish and derive the status at once (one key made due: the answer says who woke)."""
        self._publish_pending = False
        if self.published_at is None:
            return  # not serving yet: the first publish comes with the load
        try:
            self.publish()
            self.on_published()
        except Exception as e:
            metrics.loop_errors.labels("keeper-publish").inc()
            self.log.error("publish failed", error=repr(e))

    def publish_soon(self) -> None:
        """Due work was written: publish within ~50 ms instead of at the next tick (coalesced)."""
        if self.published_at is not None and not self._publish_pending:
            self._publish_pending = True
            self._soon = asyncio.get_running_loop().call_later(PUBLISH_SOON_S, self.publish_now)

    async def settle(self, timeout_s: float) -> bool:
        """After a pause: wait (bounded) until no grant is on its way to the lease table, so what the
        table counts afterwards is every lease this keeper will hand out. True when none is."""
        deadline = self.rows.clock.monotonic() + timeout_s
        while self.pending and self.rows.clock.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return not self.pending

    def close(self) -> None:
        """No publish after the keeper closed its store."""
        if self._soon is not None:
            self._soon.cancel()

    def restore_mirror(self, blocked: list[tuple[str, int]]) -> None:
        self.mirror = dict(blocked)

    def note_released(self, key: str, until: int) -> None:
        self.mirror[key] = until

    def note_adopted(self, leases: list) -> None:
        for key, rec in leases:
            self.mirror[key] = max(self.mirror.get(key, 0), int(rec[0]))

    # ----------------------------------------------------------------------------------- claims

    async def claim(self, limit: int, workers: list[str | None] | None = None) -> list[dict]:
        """Grant up to ``limit`` due jobs in rank order; every grant is exclusive (lease table)."""
        return [job for job in await self.claim_slots(limit, workers) if job is not None]

    async def claim_json(self, limits: list[int], workers: list[str | None] | None = None) -> list[bytes]:
        """Claims from several requests at once (an ingress groups concurrent ones): one ranked pass
        for their sum, dealt out in request order (each request's jobs granted to its worker), each
        answer the JSON array the fleet receives."""
        per_slot = [w for limit, w in zip(limits, workers or [None] * len(limits)) for _ in range(limit)]
        slots = await self.claim_slots(sum(limits), per_slot)
        out, at = [], 0
        for limit in limits:
            jobs = [job for job in slots[at:at + limit] if job is not None]
            out.append(json.dumps(jobs, ensure_ascii=False, separators=(",", ":")).encode())
            at += limit
        return out

    async def claim_slots(self, limit: int, workers: list[str | None] | None) -> list[dict | None]:
        """``limit`` slots, slot i for ``workers[i]`` (the claiming x-worker-id: each grant records its
        worker, so a result from another worker is told apart); a slot left empty is None."""
        slots: list[dict | None] = [None] * limit
        if self.paused or self.published_at is None:
            return slots
        workers = workers if workers is not None else [None] * limit
        self._now = now = self.rows.clock.now_ms()
        if not self.trusted(now):
            metrics.claim_health.labels("unconfirmed").inc()
            if self.rows.live:
                self.on_idle()
            return slots
        rules = self.conf.rules
        jobs: list[dict] = []
        for _ in range(3):
            if self.paused:  # paused (a stop drains) while an earlier round was being granted
                break
            free = [i for i, job in enumerate(slots) if job is None]
            want = len(free)
            if self.cursor >= len(self.ready) and self._refill_allowed():
                self.publish()  # a full set drained inside a second: more due rows are waiting
            cands: list[Any] = []
            while self.cursor < len(self.ready) and len(cands) < want:
                key = self.ready[self.cursor]
                self.cursor += 1
                if self.blocked(key):
                    continue
                held = self.rows.ranking.get(key)
                if held is None or held.due is None or held.due > now:
                    metrics.claim_health.labels("stale").inc()
                    continue
                cands.append(held)
            if not cands:
                break
            keys = [h.key for h in cands]
            self.pending.update(keys)
            try:
                answers = await self.grant(
                    [[h.key, h.due, int(h.interval) if h.interval else self.rows.cadence_for(h.route),
                      workers[slot]] for h, slot in zip(cands, free)])
            finally:
                self.pending.difference_update(keys)
            full = False
            for (key, expires, refused), h, slot in zip(answers, cands, free):
                if expires is not None:
                    self.mirror[key] = expires
                    job = {"id": key, "url": rules.url_of(key), "deviceType": rules.device_of(key),
                           "expiresAt": expires, "callbackOrigin": self.callback_origin,
                           "isFromSitemap": h.from_sitemap}
                    options = self.conf.job_options.for_route(h.route)
                    if options is not None:
                        job[job_options.FIELD] = dict(options)
                    if self.diagnose.wanted(key, now):
                        job.setdefault(job_options.FIELD, {})["diagnostics"] = True
                    slots[slot] = job
                    jobs.append(job)
                else:
                    self.mirror[key] = now + REFUSED_BACKOFF_MS
                    metrics.claim_health.labels(refused or "refused").inc()
                    full = full or refused == "full"
            if full or len(jobs) >= limit:
                break
        if jobs:
            metrics.claims.inc(len(jobs))
            self.rows.flow("granted", len(jobs))
        elif self.rows.live:  # nothing grantable now: the fleet idles until a publish finds work
            self.on_idle()
        return slots

    def _refill_allowed(self) -> bool:
        capacity = self.conf.cfg.queue.ready.capacity
        return len(self.ready) >= capacity > 0 and self.rows.clock.time() - (self.published_at or 0) > 0.1

    async def grant(self, items: list[list]) -> list[list]:
        """Exclusive grants for ``items``; the table decides them, grouped with concurrent claims.
        Lists, not tuples, on the wire: Ray packs arguments with msgpack in strict mode, where every
        tuple falls back to pickle (measured 3x the cost of a list for 2,000 pairs)."""
        return await self._grants.submit(items)

    async def _grant_batch(self, groups: list[list[list]]) -> list[list[list]]:
        answers = await self.leases.grant_many([i for items in groups for i in items])
        out, at = [], 0
        for items in groups:
            out.append(answers[at:at + len(items)])
            at += len(items)
        return out
