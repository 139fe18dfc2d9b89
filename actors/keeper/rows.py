"""The keeper's rows: every schedule row this node owns, in RocksDB and in the ranking, and the one
funnel that writes them (RocksDB first, then memory). Also the load walk, the hourly verification
walk and the repair of the published head: each compares memory with the store, and the store wins.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from prerender_ray import metrics
from prerender_ray.compiled import CompiledConfig
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.flow import Flow
from prerender_ray.queue.job_options import RouteOptions
from prerender_ray.queue.ranking import Ranking
from prerender_ray.queue.results import Planner
from prerender_ray.queue.schedule import ScheduleRow, UnreadableRow, encode_many
from prerender_ray.queue.targets import Rules
from prerender_ray.storage.rocks import Store
from prerender_ray.timeutil import now_ms

LOAD_CHUNK = 20_000
HEAD_REPAIR = 64
FLOWS = ("added", "rescheduled", "removed", "granted", "results")


class CurrentConfig:
    """The config the keeper's parts run on (the file's plus live overrides), compiled once per
    version; a live change swaps it for all of them in one step."""

    def __init__(self, cfg: Config):
        self.swap(cfg)

    def swap(self, cfg: Config) -> None:
        self.compiled = CompiledConfig(cfg)

    @property
    def cfg(self) -> Config:
        return self.compiled.cfg

    @property
    def rules(self) -> Rules:
        return self.compiled.rules

    @property
    def planner(self) -> Planner:
        return self.compiled.planner

    @property
    def job_options(self) -> RouteOptions:
        return self.compiled.job_options


class Rows:
    def __init__(self, db: Store, conf: CurrentConfig, ownership: Ownership, node: str, log: Any):
        self.db = db
        self.conf = conf
        self.ownership = ownership
        self.node = node
        self.log = log
        keys = conf.rules.keys  # the key layout cannot change while running
        self._delimiter = keys.delimiter
        self._appends = keys.appends  # <url><delimiter><device>: the URL ends at the last one
        self._variants = keys.variant_delimiter  # device variants share a prefix
        self.ranking = Ranking(self.cadence_for, boost=conf.cfg.queue.ready.sitemap_boost)
        self.flows = Flow(FLOWS)
        self.on_due: Callable[[], None] = lambda: None  # due work written: publish soon
        self.on_unowned: Callable[[], None] = lambda: None  # rows another node owns were written: hand them over
        self.touched: set[str] | None = set()  # keys written while a walk runs (load or verify)
        self.head_checked: dict[str, float] = {}
        self.phase = "loading"
        self.exact = True
        self.unreadable = 0
        self.load_ms: float | None = None
        self.verify_report: dict | None = None

    def __len__(self) -> int:
        return len(self.ranking)

    @property
    def live(self) -> bool:
        return self.phase == "live"

    def flow(self, name: str, n: int) -> None:
        self.flows.add(name, n, now_ms())

    # --------------------------------------------------------------------------------- identity

    def cadence_for(self, route: Any) -> int:
        if route is not None and route.mode == "prerender" and route.render_interval:
            return route.render_interval
        return self.conf.cfg.render.default_interval

    def route_of(self, key: str) -> Any:
        """The route of a row's URL (its class's cadence). Called for every URL the keeper loads,
        so it slices the key instead of parsing it: the URL half ends at the last delimiter (a delimiter
        may occur inside URLs; device names never hold it)."""
        rules = self.conf.rules
        if self._appends:
            cut = key.rfind(self._delimiter)
            url = key[:cut] if cut >= 0 else key
        else:
            url = rules.url_of(key)
        host_end = url.find("/", url.find("//") + 2)
        if host_end < 0:
            return rules.router.first_match("/")
        return rules.router.first_match(url[host_end:].partition("?")[0])

    def owns(self, key: str) -> bool:
        return len(self.ownership.names) <= 1 or self.ownership.owner(self.conf.rules.url_of(key)) == self.node

    def _owned(self, rows: list) -> list:
        """The rows of ``rows`` this node owns (device variants of one URL arrive together: the owner
        is asked once per URL)."""
        url_of, owner, node = self.conf.rules.url_of, self.ownership.owner, self.node
        last, mine, out = None, False, []
        for r in rows:
            url = url_of(r[0])
            if url != last:
                last, mine = url, owner(url) == node
            if mine:
                out.append(r)
        return out

    def reclassify(self) -> int:
        """After a live config change: every row held moves to the class of its new route and cadence."""
        return self.ranking.reclassify(self.cadence_for, route_of=self.route_of,
                                       boost=self.conf.cfg.queue.ready.sitemap_boost)

    # ----------------------------------------------------------------------------------- writes

    def write(self, rows: list[ScheduleRow] | list[tuple], route_of: Any = None) -> None:
        """The one funnel for schedule writes: RocksDB first, then memory. Rows are ``ScheduleRow``s or
        plain tuples in its field order (a bulk put builds no objects); ``route_of`` overrides
        ``self.route_of`` when the caller already knows the routes."""
        if not rows:
            return
        self.db.write(encode_many(rows))
        now = now_ms()
        if len(self.ownership.names) > 1:
            # A writer decided on ownership before an await (a rebuild's scan, a store call, a lagging
            # sender) and the membership changed since: such rows are kept out of memory, so they are
            # never granted here, and the hand-off carries them from the store to their owner.
            owned = self._owned(rows)
            if len(owned) < len(rows):
                self.on_unowned()
                rows = owned
        # upsert_many asks for the route once per URL (device variants arrive together)
        self.ranking.upsert_many(rows, route_of or self.route_of, delimiter=self._variants)
        if self.touched is not None:
            self.touched.update(r[0] for r in rows)
        if any(r[1] is not None and r[1] <= now for r in rows):
            self.on_due()
        self.flow("rescheduled", len(rows))

    def delete(self, keys: list[str]) -> None:
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

    def _upsert(self, truth: ScheduleRow) -> None:
        self.ranking.upsert(truth.cache_key, truth.next_render_time, truth.from_sitemap,
                            truth.effective_interval, self.route_of(truth.cache_key))

    # ------------------------------------------------------------------------------------ walks

    async def load(self) -> int:
        """Walk the store into memory (claims are served from the first chunk on); rows written while
        the walk runs are newer than what it reads. Answers how many rows await their owner."""
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
            elif self.touched is None or r.cache_key not in self.touched:
                chunk.append((r.cache_key, r.next_render_time, r.from_sitemap, r.effective_interval))
            if len(chunk) >= LOAD_CHUNK:
                self.ranking.upsert_many(chunk, self.route_of, delimiter=self._variants)
                chunk = []
                await asyncio.sleep(0)  # serve claims while loading
        self.ranking.upsert_many(chunk, self.route_of, delimiter=self._variants)
        self.touched = None
        self.exact = self.unreadable == 0
        return unowned

    def repair_head(self, ready: list[str]) -> None:
        """Point-read the head of the published set (each key at most once a minute) and fix any row
        held wrongly. Expected never to find anything; counted when it does."""
        stamp = time.monotonic()
        for key in ready[:HEAD_REPAIR]:
            if stamp - self.head_checked.get(key, -1e9) < 60:
                continue
            self.head_checked[key] = stamp
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
                    self._upsert(truth)
        if len(self.head_checked) > 10_000:
            self.head_checked = {k: t for k, t in self.head_checked.items() if stamp - t < 60}

    async def verify(self) -> dict:
        """Walk the store; wherever it differs from memory, the store wins (except keys written
        during the walk). Every correction is counted (expected: none)."""
        t0 = time.perf_counter()
        touched: set[str] = set()
        self.touched = touched
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
                if truth.cache_key in touched or not self.owns(truth.cache_key):
                    continue  # written during the walk, or waiting to be handed to its owner
                mine = self.row(truth.cache_key)
                if mine != truth:
                    if mine is None:
                        missing += 1
                    else:
                        mismatched += 1
                    self._upsert(truth)
                if i % 5000 == 4999:
                    await asyncio.sleep(0)
            extra = [h.key for h in self.ranking.rows() if h.key not in seen and h.key not in touched]
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

    def unowned(self) -> dict[str, list[ScheduleRow]]:
        """Stored rows another node owns now, by owner (the hand-off's work)."""
        by_owner: dict[str, list[ScheduleRow]] = defaultdict(list)
        if len(self.ownership.names) <= 1:
            return by_owner
        for k, v in self.db.items():
            key = k.decode()
            if not self.owns(key):
                try:
                    by_owner[self.ownership.owner(self.conf.rules.url_of(key))].append(ScheduleRow.decode(key, v))
                except (UnreadableRow, ValueError):
                    continue
        return by_owner

    def forget_stored(self, keys: Iterable[str]) -> None:
        """Rows their new owner acknowledged: gone from this node's store (they left memory before)."""
        self.db.write((k.encode(), None) for k in keys if not self.owns(k))
