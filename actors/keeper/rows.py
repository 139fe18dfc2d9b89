"""The keeper's rows: every schedule row this node owns, in RocksDB and in the ranking, and the one
funnel that writes them (RocksDB first, then memory). Also the load walk, the hourly verification
walk and the repair of the published head: each compares memory with the store, and the store wins.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from prerender_ray import metrics
from prerender_ray.compiled import CompiledConfig
from prerender_ray.config.model import Config
from prerender_ray.identity.membership import Membership, MembershipView
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.flow import Flow
from prerender_ray.queue.job_options import RouteOptions
from prerender_ray.queue.ranking import Ranking
from prerender_ray.queue.results import Planner
from prerender_ray.queue.schedule import ScheduleRow, UnreadableRow, decode_many, encode_many
from prerender_ray.queue.targets import Rules
from prerender_ray.storage.keys import KEEPER_META
from prerender_ray.storage.rocks import Store
from prerender_ray.timeutil import SYSTEM_CLOCK, Clock

LOAD_CHUNK = 20_000
HEAD_REPAIR = 64
FLOWS = ("added", "rescheduled", "removed", "granted", "results")


@dataclass(frozen=True)
class Said:
    """What a node said with its hand-off's done: the epoch, and the fence on every key it still had
    then (``Rows.fence_summary``): the nodes it was taken among and those not yet clear."""

    epoch: int
    others: Ownership | None
    waiting: frozenset[str]
    fence_epoch: int


def per_url(url_of: Callable[[str], str], of_url: Callable[[str], Any]) -> Callable[[str], Any]:
    """``of_url(url_of(key))`` for a walk that meets a URL's device variants one after the other
    (the store's keys, the ranking's rows): asked once per URL, not once per key."""
    last: list = [None, None]  # the last URL and its answer

    def of_key(key: str) -> Any:
        url = url_of(key)
        if url != last[0]:
            last[0], last[1] = url, of_url(url)
        return last[1]

    return of_key


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
    def __init__(self, db: Store, conf: CurrentConfig, view: MembershipView, node: str, log: Any,
                 clock: Clock = SYSTEM_CLOCK):
        self.db = db
        self.clock = clock  # the keeper's parts read time here (the simulated cluster's is virtual)
        self.conf = conf
        self.view = view  # the process's one membership: read at each decision, never held across an await
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
        self._fences: list[tuple[int, Membership, int]] = []  # (until, before, epoch): see ``fence``
        # key -> (until, the nodes that may hold its lease, epoch)
        self.fenced: dict[str, tuple[int, tuple[str, ...], int]] = {}
        self.fence_all: tuple[int, int, Ownership] | None = None  # (until, epoch, the others): see ``fence``
        self._handed: set[str] = set()  # keys adopted while ``fence_all`` stands
        # node -> what it said last: its hand-off for that epoch is done, and the fence it still had
        self.done: dict[str, Said] = {}

    def __len__(self) -> int:
        return len(self.ranking)

    @property
    def live(self) -> bool:
        return self.phase == "live"

    def flow(self, name: str, n: int) -> None:
        self.flows.add(name, n, self.clock.now_ms())

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

    def owns(self, key: str, m: Membership | None = None) -> bool:
        """Under ``m`` (a snapshot a caller works against), else the current membership."""
        own = (m or self.view.current).ownership
        return len(own.names) <= 1 or own.owner(self.conf.rules.url_of(key)) == self.node

    def owner_test(self, m: Membership) -> Callable[[str], bool]:
        """``owns(key, m)`` for a walk that meets a URL's device variants one after the other (the
        ranking's rows, held in load order): the owner is hashed once per URL, not per key."""
        own = m.ownership
        if len(own.names) <= 1:
            return lambda key: True
        owner, node = own.owner, self.node
        return per_url(self.conf.rules.url_of, lambda url: owner(url) == node)

    def _owned(self, rows: list) -> list:
        """The rows of ``rows`` this node owns (device variants of one URL arrive together: the owner
        is asked once per URL)."""
        owner, node = self.view.current.owner, self.node
        mine = per_url(self.conf.rules.url_of, lambda url: owner(url) == node)
        return [r for r in rows if mine(r[0])]

    def reclassify(self) -> int:
        """After a live config change: every row held moves to the class of its new route and cadence."""
        return self.ranking.reclassify(self.cadence_for, route_of=self.route_of,
                                       boost=self.conf.cfg.queue.ready.sitemap_boost)

    # ----------------------------------------------------------------------------------- writes

    def write(self, rows: list[ScheduleRow] | list[tuple], route_of: Any = None,
              leased: Collection[str] = ()) -> None:
        """The one funnel for schedule writes: RocksDB first, then memory. Rows are ``ScheduleRow``s or
        plain tuples in its field order (a bulk put builds no objects); ``route_of`` overrides
        ``self.route_of`` when the caller already knows the routes. ``leased``: keys handed over with
        their leases by the node that held them (never fenced: see ``fence``)."""
        if not rows:
            return
        self.db.write(encode_many(rows))
        now = self.clock.now_ms()
        if self._fences or self.fence_all is not None or (leased and self.fenced):
            self._fence_new(rows, now, leased)
        if len(self.view.current.names) > 1:
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

    # ---------------------------------------------------------------------------------- fences

    def fence(self, until: int, before: Membership | None, epoch: int) -> None:
        """Keys this node gains at ``epoch`` may still be leased by their previous owner (one that
        was down or cut off could not hand them over with their leases). A key that arrives here by
        any other path than a hand-off (a put, a rebuild, a result's row) is not granted until its
        previous owner under ``before`` said its hand-off for ``epoch`` is done (``done``), or left,
        or ``until`` (a lease's length) passed. ``before`` None (a keeper that starts among others
        and cannot know who owned what): every key not handed over waits for every other member.
        Not only for the one that owns the key among the others: memberships this keeper never saw
        may have given it to any of them (simulation seed 20054: n4 and n3 came back together into
        {n1, n2, n3, n4}; p29, n2's under {n1, n2}, was leased by n2, down; n4 waited only on n3, the
        owner among {n1, n2, n3}, which left, and n4 granted p29 under n2's lease)."""
        now = self.clock.now_ms()
        if before is None:  # any of the others may have held any key before we came
            others = [n for n in self.view.current.names if n != self.node]
            self.fence_all = (until, epoch, Ownership(others))
            return
        self._fences = [f for f in self._fences if f[0] > now] + [(until, before, epoch)]

    def _fence_new(self, rows: list, now: int, leased: Collection[str]) -> None:
        if leased:  # their lease came with them: the lease table blocks them while it runs
            if self.fence_all is not None:
                self._handed.update(leased)
            for key in leased:
                self.fenced.pop(key, None)
        self._fences = [f for f in self._fences if f[0] > now]
        if not self._fences:
            return
        url_of, held, node = self.conf.rules.url_of, self.ranking, self.node
        members = self.view.current.names
        for r in rows:
            key = r[0]
            if key in held or key in self.fenced or key in leased:
                continue
            url = url_of(key)
            for until, before, epoch in self._fences:
                prev = before.owner(url) if before.names else node
                if prev != node and prev in members:
                    self.fenced[key] = (until, (prev,), epoch)
                    break

    def is_fenced(self, key: str, now: int) -> bool:
        if key not in self._handed and key not in self.fenced and self.is_fenced_any(now):
            return True
        entry = self.fenced.get(key)
        if entry is None:
            return False
        until, prevs, epoch = entry
        if until <= now or all(self.clear(n, epoch) for n in prevs):
            del self.fenced[key]
            return False
        return True

    def fence_test(self, now: int) -> Callable[[str], bool]:
        """``is_fenced`` at ``now`` for every key a publish walks. A keeper that starts among others is
        fenced on every key, and a publish asks about each due row: whether that fence stands is
        decided once here, not per key (per key it made a join's hand-off quadratic: 86 % of the
        joining keeper's CPU)."""
        fenced, handed = self.fenced, self._handed
        if not self.is_fenced_any(now):
            return lambda key: key in fenced and self.is_fenced(key, now)
        return lambda key: self.is_fenced(key, now) if key in handed or key in fenced else True

    def fence_only(self, now: int) -> set[str] | None:
        """A superset of the keys ``fence_test(now)`` lets through while a fence stands on every key
        (None: no such fence, any key may pass): those handed with their lease or under a fence of
        their own. A keeper that starts among others holds back every other key until all the
        others are clear; a publish asked ``fence_test`` about each due row, so while most were held
        back it walked them all on every publish (at a join of 1M targets, 53-58 % of the joiner's
        CPU, its loop too busy to take the rows handed to it). A publish still asks ``fence_test``
        about each key it takes from here."""
        if not self.is_fenced_any(now):
            return None
        only = set(self._handed)
        only.update(self.fenced)
        return only

    def clear(self, node: str, epoch: int, visited: frozenset[str] = frozenset()) -> bool:
        """Can ``node`` (a previous owner of a key as of ``epoch``) no longer hold a lease on a key
        it does not own under ``epoch``? Yes when it is us, has left, or said its hand-off for
        ``epoch`` is done while it had no fence on every key itself; if it had one (it started among
        others), each node that fence still waited on must be clear too: a lease can outlive
        several moves of its key while its holder is down (seen in the simulation)."""
        if node == self.node or node in visited or node not in self.view.current.names:
            return True
        said = self.done.get(node)
        if said is None or said.epoch < epoch:
            return False
        seen = visited | {self.node, node}
        return all(self.clear(n, said.fence_epoch, seen) for n in said.waiting)

    def _said_clean(self, node: str, epoch: int) -> bool:
        said = self.done.get(node)
        return node not in self.view.current.names or (said is not None and said.epoch >= epoch and said.others is None)

    def fence_summary(self, now: int) -> list | None:
        """This node's fence on every key (``fence_all``) while it is open, for its done: [epoch, the
        others it was taken among, those not yet clear]; None when it has none."""
        if self.fence_all is None or not self.is_fenced_any(now):
            return None
        until, epoch, others = self.fence_all
        return [epoch, list(others.names), [n for n in others.names if not self._said_clean(n, epoch)]]

    def is_fenced_any(self, now: int) -> bool:
        """Does the fence on every key (``fence_all``) stand: until every other member is clear."""
        if self.fence_all is None:
            return False
        until, epoch, others = self.fence_all
        if until <= now or all(self.clear(n, epoch) for n in others.names):
            self.fence_all, self._handed = None, set()
            return False
        return True

    def fence_report(self, now: int) -> dict:
        """For the queue state: keys held back by a fence, until when, and the nodes whose hand-off
        they wait on (a node down for long shows here until a lease's length has passed)."""
        waiting: set[str] = set()
        keys = 0
        for key in list(self.fenced):
            if self.is_fenced(key, now):
                keys += 1
                waiting.update(self.fenced[key][1])
        every = None
        if self.is_fenced_any(now):
            assert self.fence_all is not None
            until, epoch, others = self.fence_all
            every = until
            members = self.view.current.names
            waiting.update(n for n in others.names if n in members
                           and (n not in self.done or self.done[n].epoch < epoch))
        return {"keys": keys, "everyKeyUntil": every, "waitingOn": sorted(waiting)}

    def said_done(self, node: str, epoch: int, fence: list | None) -> bool:
        """``node`` said its hand-off for ``epoch`` is done (``fence``: its ``fence_summary``)."""
        said = self.done.get(node)
        if said is not None and (said.epoch > epoch or (said.epoch == epoch and said.others is None)):
            return False
        if fence is not None:
            fe, others, waiting = fence
            told = Said(epoch, Ownership([n for n in others if isinstance(n, str)][:1024]),
                        frozenset(n for n in waiting if isinstance(n, str)), int(fe))
        else:
            told = Said(epoch, None, frozenset(), epoch)
        self.done[node] = told
        return True

    @property
    def fencing(self) -> bool:
        return self.fence_all is not None or bool(self.fenced)

    def fence_of(self, key: str, now: int) -> list[tuple[int, str, int]]:
        """``key``'s open fence as (until, a node it waits on, epoch), one per node: it travels with
        the row when the key is handed on (``carry``), as its lease does. Seen in the simulation
        without it: a lease outlived two moves of its key while its holder was down, and the third
        owner granted."""
        if not self.is_fenced(key, now):
            return []
        entry = self.fenced.get(key)
        if entry is not None:
            until, prevs, epoch = entry
            return [(until, n, epoch) for n in prevs if not self.clear(n, epoch)]
        assert self.fence_all is not None
        until, epoch, others = self.fence_all
        return [(until, n, epoch) for n in others.names if not self.clear(n, epoch)]

    def carry(self, fences: list, now: int) -> None:
        """Fences that came with handed rows ([key, until, node, epoch] each, a key once per node
        it waits on)."""
        members = self.view.current.names
        for key, until, node, epoch in fences:
            if isinstance(key, str) and int(until) > now and node in members and not self.clear(node, int(epoch)):
                held = self.fenced.get(key)
                if held is None:
                    self.fenced[key] = (int(until), (node,), int(epoch))
                else:  # waits on each (the later epoch asks more of every node's done)
                    prevs = held[1] if node in held[1] else (*held[1], node)
                    self.fenced[key] = (max(held[0], int(until)), prevs, max(held[2], int(epoch)))

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
        the walk runs, or before it (a joiner adopts rows while its store catches up), are newer than
        what it reads. Answers how many rows it read await their owner (the funnel kicked the hand-off
        for those it wrote)."""
        chunk: list[tuple[str, Any, bool, Any]] = []
        unowned = 0
        for k, v in self.db.items():
            if k[:1] == KEEPER_META:
                continue
            if self.touched:  # written through the funnel (a joiner's adopted rows): held already
                try:
                    if k.decode() in self.touched:
                        continue
                except UnicodeDecodeError:
                    pass  # counted as unreadable below
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
        stamp = self.clock.monotonic()
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
                if k[:1] == KEEPER_META:
                    continue
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
                              "ms": round((time.perf_counter() - t0) * 1000, 1), "at": self.clock.now_ms()}
        return self.verify_report

    def unowned(self, m: Membership) -> dict[str, list[tuple]]:
        """Stored rows another node owns under ``m``, by owner (the hand-off's work), as plain tuples
        in ``ScheduleRow`` order: Ray pickles those at C speed, a NamedTuple through cloudpickle's
        hook (18 times slower). The walk yields keys in order, so a URL's device variants come
        together: its owner is hashed once, not once per row and again to group it."""
        pairs: dict[str, list[tuple[str, bytes]]] = defaultdict(list)
        if len(m.names) <= 1:
            return {}
        owner_of, node = per_url(self.conf.rules.url_of, m.ownership.owner), self.node
        for k, v in self.db.items():
            if k[:1] == KEEPER_META:
                continue
            key = k.decode()
            if (owner := owner_of(key)) != node:
                pairs[owner].append((key, v))
        return {o: rows for o, p in pairs.items() if (rows := list(decode_many(p)))}

    def forget_stored(self, keys: Iterable[str], m: Membership | None = None) -> None:
        """Rows their new owner acknowledged: gone from this node's store (they left memory before).
        ``m``: the membership they were handed under; while it stands none of them is ours, so no
        key is hashed again; after a change, a key we own again stays."""
        if m is not None and m.epoch == self.view.epoch:
            self.db.write((k.encode(), None) for k in keys)
        else:
            self.db.write((k.encode(), None) for k in keys if not self.owns(k))
