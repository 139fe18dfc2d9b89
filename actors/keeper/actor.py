"""QueueKeeper: holds every schedule row this node owns in memory and is their only writer.

It loads the schedule store (serving claims from the first chunk on), publishes the ready set every
second (leased keys skipped), grants claims through the LeaseTable, applies render results and target
changes, and reports the node's queue status on change. RocksDB is the durable side: every write lands
there before it is acknowledged.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import ray

from prerender_ray import logs, metrics
from prerender_ray.actors.common import bulk_gc, call, read_overrides, untraced
from prerender_ray.actors.keeper.handoff import KeeperHandoff
from prerender_ray.actors.keeper.ops import KeeperOps
from prerender_ray.actors.keeper.repair import KeeperRepair
from prerender_ray.config.model import Config
from prerender_ray.config.overrides import LiveConfig
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.queue.ranking import Ranking
from prerender_ray.queue.results import Planner
from prerender_ray.queue.schedule import ScheduleRow, UnreadableRow, encode_many
from prerender_ray.queue.status import StatusReporter
from prerender_ray.queue.targets import Rules
from prerender_ray.storage.rocks import SCHEDULE, Store, store_path
from prerender_ray.timeutil import now_ms

LOAD_CHUNK = 20_000
STORE_SYNC_S = 300.0
FREEZE_EVERY_S = 300.0
HEAD_REPAIR = 64


@ray.remote
class QueueKeeper(KeeperOps, KeeperRepair, KeeperHandoff):
    def __init__(self, config: dict, node: dict, data_dir: str, leases: Any, store: Any,
                 members: list[str] = ()):
        untraced(self)
        cfg = Config.model_validate(config)
        self.info = NodeInfo(**node)
        logs.setup(self.info.name, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="keeper")
        self.log = logs.get("keeper")
        self.cfg = cfg
        self.live = LiveConfig(cfg)  # the file's config, and live overrides on top of it
        self.node = self.info.name
        self.leases = leases
        self.store = store
        self.rules = Rules(cfg)
        self._delimiter = self.rules.keys.delimiter
        self._appends = self.rules.keys.appends  # <url><delimiter><device>: the URL ends at the last one
        self._variants = self.rules.keys.variant_delimiter  # device variants share a prefix
        self.db = Store(store_path(data_dir, self.node, SCHEDULE), memtable_bloom=False)  # written blind
        self.ranking = Ranking(self._cadence_for, boost=cfg.queue.ready.sitemap_boost)
        self.phase = "loading"
        self.exact = True
        self.unreadable = 0
        self.load_ms: float | None = None
        self.loaded_at: float | None = None
        self._now = 0
        self._publish_pending = False
        self._frozen_at = time.monotonic()
        self.touched: set[str] | None = set()  # keys written while the load walk runs
        self.ready: list[str] = []
        self.cursor = 0
        self.published_at: float | None = None
        self.publish_ms: float | None = None
        self.mirror: dict[str, int] = {}  # key -> until: leased, in grace or held (from the LeaseTable)
        self.pending: set[str] = set()  # keys with a grant in flight
        self.head_checked: dict[str, float] = {}
        self.verify_report: dict | None = None
        self.reporter = StatusReporter()
        self.paused = False
        self.pause_source = "default"
        self.init_ops()
        self.init_handoff()
        self.ownership.update(list(members))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._load()), loop.create_task(self._publisher()),
                       loop.create_task(self._status_syncer()), loop.create_task(self._verifier())]
        self.init_repair()

    # ------------------------------------------------------------------------------------- rows

    def _cadence_for(self, route: Any) -> int:
        if route is not None and route.mode == "prerender" and route.render_interval:
            return route.render_interval
        return self.cfg.render.default_interval

    def apply_overrides(self, raw: bytes | None) -> dict:
        """Apply the stored live overrides (``o:config``) if they changed: new rules, and the rows
        held reclassified in memory (route cadences, routes, default interval, sitemap boost)."""
        cfg = self.live.changed(raw, self.log)
        if self.live.error:
            metrics.loop_errors.labels("keeper-overrides").inc()
        if cfg is None:
            return {"changed": False}
        t0 = time.perf_counter()
        self.cfg, self.rules = cfg, Rules(cfg)
        self.planner = Planner(self.rules)
        moved = self.ranking.reclassify(self._cadence_for, route_of=self._route_of,
                                        boost=cfg.queue.ready.sitemap_boost)
        if self.published_at is not None:
            self.publish()
        ms = round((time.perf_counter() - t0) * 1000, 1)
        self.log.warning("live config applied", moved=moved, rows=len(self.ranking), ms=ms, overrides=self.live.names())
        return {"changed": True, "moved": moved, "ms": ms}

    def _route_of(self, key: str) -> Any:
        """The route of a row's URL (its class's cadence). Called for every URL the keeper loads,
        so it slices the key instead of parsing it: the URL half ends at the last delimiter (a delimiter
        may occur inside URLs; device names never hold it)."""
        if self._appends:
            cut = key.rfind(self._delimiter)
            url = key[:cut] if cut >= 0 else key
        else:
            url = self.rules.url_of(key)
        host_end = url.find("/", url.find("//") + 2)
        if host_end < 0:
            return self.rules.router.first_match("/")
        return self.rules.router.first_match(url[host_end:].partition("?")[0])

    def write_rows(self, rows: list[ScheduleRow] | list[tuple], route_of: Any = None) -> None:
        """The one funnel for schedule writes: RocksDB first, then memory. Rows are ``ScheduleRow``s or
        plain tuples in its field order (a bulk put builds no objects); ``route_of`` overrides
        ``_route_of`` when the caller already knows the routes."""
        if not rows:
            return
        self.db.write(encode_many(rows))
        now = now_ms()
        # upsert_many asks for the route once per URL (device variants arrive together)
        self.ranking.upsert_many(rows, route_of or self._route_of, delimiter=self._variants)
        if self.touched is not None:
            self.touched.update(r[0] for r in rows)
        if any(r[1] is not None and r[1] <= now for r in rows):
            self.note_work()
        self.flow("rescheduled", len(rows))

    def _publish_soon(self) -> None:
        """Due work was written: publish within ~50 ms instead of at the next tick (coalesced)."""
        if self.published_at is not None and not self._publish_pending:
            self._publish_pending = True
            asyncio.get_running_loop().call_later(0.05, self._publish_now)

    def _publish_now(self) -> None:
        self._publish_pending = False
        if self.published_at is None:
            return  # not serving yet: the first publish comes with the load
        try:
            self.publish()
            self.derive_status()
        except Exception as e:
            metrics.loop_errors.labels("keeper-publish").inc()
            self.log.error("publish failed", error=repr(e))

    def delete_rows(self, keys: list[str]) -> None:
        if not keys:
            return
        self.db.write((k.encode(), None) for k in keys)
        for k in keys:
            self.ranking.remove(k)
            if self.touched is not None:
                self.touched.add(k)
        self.flow("removed", len(keys))

    def row(self, key: str) -> ScheduleRow | None:
        held = self.ranking.get(key)
        if held is None:
            return None
        return ScheduleRow(key, held.due, held.from_sitemap, int(held.interval) if held.interval else None)

    # ------------------------------------------------------------------------------------- load

    async def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            # Replicated data first: a node that joins or restarts catches up from a peer.
            sync = await call(self.store.wait_synced.remote(STORE_SYNC_S), STORE_SYNC_S + 10)
            if sync.get("state") != "synced":
                self.log.warning("loading before the store caught up", sync=sync)
            await self.fetch_membership()
            # classify the rows with the live config, not the file's
            await read_overrides(self.store, self.apply_overrides, self.log)
            await self._restore_mirror()
            chunk: list[tuple[str, Any, bool, Any]] = []
            unowned = 0
            for k, v in self.db.items():
                try:
                    r = ScheduleRow.decode(k, v)
                except UnreadableRow as e:
                    self.unreadable += 1
                    metrics.keeper_unreadable_rows.inc()
                    self.log.warning("unreadable schedule row skipped", error=str(e))
                    continue
                if not self.owns(r.cache_key):
                    unowned += 1  # handed to its owner once live
                elif r.cache_key not in self.touched:  # a write during the load is newer than the walk
                    chunk.append((r.cache_key, r.next_render_time, r.from_sitemap, r.effective_interval))
                if len(chunk) >= LOAD_CHUNK:
                    self.ranking.upsert_many(chunk, self._route_of, delimiter=self._variants)
                    chunk = []
                    await asyncio.sleep(0)  # serve claims while loading
            self.ranking.upsert_many(chunk, self._route_of, delimiter=self._variants)
        except Exception as e:
            self.phase = "failed"
            metrics.loop_errors.labels("keeper-load").inc()
            self.log.error("keeper load failed", error=repr(e))
            return
        self.touched = None
        # The rows live as long as the process: keep the cyclic GC from walking them every pass,
        # and let bulk writes (sitemaps) allocate without a collection every few hundred objects.
        gc.collect()
        gc.freeze()
        bulk_gc()
        self.load_ms = (time.perf_counter() - t0) * 1000
        self.loaded_at = time.time()
        self.exact = self.unreadable == 0
        self.phase = "live"
        metrics.keeper_rows.set(len(self.ranking))
        metrics.keeper_live.set(1)
        metrics.keeper_load_seconds.set(self.load_ms / 1000)
        self.log.info("keeper live", rows=len(self.ranking), load_ms=round(self.load_ms, 1),
                      unreadable=self.unreadable)
        self.publish()
        await self.sync_status()
        if unowned:
            self.kick_handoff()

    async def _restore_mirror(self) -> None:
        for _ in range(30):
            try:
                blocked = await asyncio.wait_for(self.leases.blocked.remote(), 10)
                self.mirror = dict(blocked)
                return
            except Exception as e:  # the lease table may still be starting
                self.log.info("waiting for the lease table", error=type(e).__name__)
                await asyncio.sleep(1)
        raise RuntimeError("the lease table did not answer")

    # ---------------------------------------------------------------------------------- publish

    def _blocked(self, key: str) -> bool:
        until = self.mirror.get(key)
        return key in self.pending or (until is not None and until > self._now)

    def publish(self) -> None:
        t0 = time.perf_counter()
        self._now = now = now_ms()
        self.mirror = {k: u for k, u in self.mirror.items() if u > now}
        self.ready = self.ranking.top_k(self.cfg.queue.ready.capacity, now, self._blocked)
        self.cursor = 0
        self.published_at = time.time()
        self.publish_ms = (time.perf_counter() - t0) * 1000
        metrics.keeper_publish_seconds.observe(self.publish_ms / 1000)
        metrics.keeper_rows.set(len(self.ranking))
        self._repair_head(now)

    def _repair_head(self, now: int) -> None:
        """Point-read the head of the published set (each key at most once a minute) and fix any row
        held wrongly. Expected never to find anything; counted when it does."""
        checked = 0
        stamp = time.monotonic()
        for key in self.ready[:HEAD_REPAIR]:
            if stamp - self.head_checked.get(key, -1e9) < 60:
                continue
            self.head_checked[key] = stamp
            checked += 1
            stored = self.db.get(key.encode())
            mine = self.row(key)
            try:
                truth = ScheduleRow.decode(key, stored) if stored is not None else None
            except UnreadableRow:
                truth = None
            if truth != mine:
                metrics.keeper_repaired.labels("head").inc()
                self.log.warning("head repair", key=key, held=mine, stored=truth)
                if truth is None:
                    self.ranking.remove(key)
                else:
                    self.ranking.upsert(key, truth.next_render_time, truth.from_sitemap,
                                        truth.effective_interval, self._route_of(key))
        if len(self.head_checked) > 10_000:
            self.head_checked = {k: t for k, t in self.head_checked.items() if stamp - t < 60}

    async def _publisher(self) -> None:
        interval = self.cfg.queue.keeper.publish_interval / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.publish()
                await self.refresh_status()
                if time.monotonic() - self._frozen_at > FREEZE_EVERY_S:
                    # rows added since the load (sitemaps, discovery): keep them out of full GC passes
                    gc.freeze()
                    self._frozen_at = time.monotonic()
            except Exception as e:
                metrics.loop_errors.labels("keeper-publish").inc()
                self.log.error("publish failed", error=repr(e))

    # ---------------------------------------------------------------------------------- verify

    async def _verifier(self) -> None:
        interval = self.cfg.queue.keeper.verify_interval / 1000
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            if self.phase != "live":
                continue
            try:
                await self.verify()
            except Exception as e:
                metrics.loop_errors.labels("keeper-verify").inc()
                self.log.error("verification walk failed", error=repr(e))

    async def verify(self) -> dict:
        """Walk the store; wherever it differs from memory, the store wins (except keys written
        during the walk). Every correction is counted (expected: none)."""
        t0 = time.perf_counter()
        self.touched = set()
        scanned = missing = mismatched = unreadable = 0
        seen: set[str] = set()
        try:
            for i, (k, v) in enumerate(self.db.items()):
                scanned += 1
                try:
                    truth = ScheduleRow.decode(k, v)
                except UnreadableRow:
                    unreadable += 1
                    continue
                seen.add(truth.cache_key)
                if truth.cache_key in self.touched or not self.owns(truth.cache_key):
                    continue  # written during the walk, or waiting to be handed to its owner
                mine = self.row(truth.cache_key)
                if mine != truth:
                    if mine is None:
                        missing += 1
                    else:
                        mismatched += 1
                    self.ranking.upsert(truth.cache_key, truth.next_render_time, truth.from_sitemap,
                                        truth.effective_interval, self._route_of(truth.cache_key))
                if i % 5000 == 4999:
                    await asyncio.sleep(0)
            extra = [h.key for h in self.ranking.rows() if h.key not in seen and h.key not in self.touched]
            for key in extra:
                self.ranking.remove(key)
        finally:
            self.touched = None
        repaired = missing + mismatched + len(extra)
        if repaired:
            metrics.keeper_repaired.labels("verify").inc(repaired)
            self.log.warning("verification repaired rows", missing=missing, mismatched=mismatched, deleted=len(extra))
        self.exact = unreadable == 0
        self.verify_report = {"scanned": scanned, "owned": len(self.ranking), "missing": missing,
                              "mismatched": mismatched, "deleted": len(extra), "unreadable": unreadable,
                              "ms": round((time.perf_counter() - t0) * 1000, 1), "at": int(time.time() * 1000)}
        return self.verify_report

    # ------------------------------------------------------------------------------------ close

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.close_ops()
        self.db.flush()
        self.db.close()
