"""One walk of one root sitemap: breadth-first over indexes, each urlset reconciled against targets.

Runs inside the node's SitemapWalker (walker/actor.py), which owns the runs, their progress rows and
takeover. The walk writes targets through the keeper of each URL's owner node, in batches of
``BATCH`` URLs, one call per owner and batch, a few batches of a document in flight at once: a batch
is created where no target exists (the owner's store checks and writes in one step), and only the
targets that exist come back for a decision and perhaps a second call. Documents are reconciled one
after another (a later document's DUPLICATE decision must see an earlier one's writes), while the
next document is already being fetched and parsed and the last one's row is being written.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.actors.walker.fetch import Document, Fetcher
from prerender_ray.config.model import Config
from prerender_ray.identity.urls import UrlError, whatwg_path
from prerender_ray.sitemaps.lastmod import changed_entries
from prerender_ray.sitemaps.refresh import RefreshResult
from prerender_ray.sitemaps.rules import (
    NO_TARGET,
    Action,
    BatchPlan,
    Classify,
    InvalidEntry,
    Partition,
    PruneScan,
    fast_actions,
    filtered_log,
    plan_batch,
)
from prerender_ray.storage.registry import (
    RecordError,
    Target,
    decode_json,
    encode_json,
    entries_key,
    sitemap_key,
)
from prerender_ray.timeutil import now_ms

BATCH = 2000  # URLs per write call (one owner)
IN_FLIGHT = 3  # batches of one document in flight: keeps the store and the keepers busy together
HEARTBEAT_S = 5.0  # a long document still bumps updatedAt this often
STORE_DEADLINE_S = 30.0  # the walker's store client (a keeper's bulk writes: keeper.client.BULK_DEADLINE_S)
_URL = itemgetter(0)  # (url, entry) pairs sort by URL


class WalkAborted(Exception):
    """The run was taken over by another walker (or cancelled): stop without touching its row."""


@dataclass
class WalkEnv:
    """What a walk needs from its walker."""

    cfg: Config
    node: str
    store: StoreClient
    owner_of: Callable[[str], str]  # canonical URL -> the owner node's name
    keeper: Callable[[str], Awaitable[KeeperClient]]  # node name -> its keeper (a handle lookup off the loop)
    fetcher: Fetcher
    classify: Classify
    log: Any
    sole_owner: Callable[[], str | None] = lambda: None  # the node when one node owns every URL, else None
    # the targets attributed to a sitemap across the cluster, up to a limit, and how many (None: the local store's)
    sitemap_urls: Callable[[str, int], Awaitable[tuple[list[str], int]]] | None = None


Progress = Callable[["Walk"], Awaitable[None]]


class Walk:
    def __init__(self, env: WalkEnv, root: str, *, revalidate: bool, progress: Progress):
        self.env = env
        self.root = root
        self.revalidate = revalidate
        self.progress = progress
        self.result = RefreshResult.from_config(env.cfg.sitemap)
        self.visited: set[str] = set()  # documents dequeued so far, failed ones included
        # documents taken into this walk, at most sitemap.maxDocuments: each is fetched once; a child
        # listed past the cap is only counted (a hostile index of indexes lists millions)
        self.discovered: set[str] = set()
        self.current: str | None = None
        self.last_progress = time.monotonic()
        self.walked_at: dict[str, int] = {}  # urlset -> when its lastmods were weighed (its row keeps it)

    # --------------------------------------------------------------------------------------- BFS

    async def run(self) -> RefreshResult:
        """Walk the root; a failing root raises, a failing child is recorded and the walk goes on."""
        cap = self.env.cfg.sitemap.max_documents
        result = self.result
        queue: deque[tuple[str, str | None]] = deque([(self.root, None)])
        self.discovered.add(self.root)
        result.sitemaps_discovered = 1
        ahead: dict[str, asyncio.Task] = {}  # the next document, fetched while this one reconciles
        finishing: asyncio.Task | None = None  # the last urlset's row, written while the next one starts
        visited = self.visited  # every document dequeued (each once: ``discovered``), failed ones too
        try:
            while queue:  # never more than the cap: only that many documents are ever discovered
                _stopped(finishing)
                url, parent = queue.popleft()
                visited.add(url)
                self.current = url
                fetching = ahead.pop(url, None) or asyncio.create_task(self.env.fetcher.fetch(url))
                try:
                    try:
                        doc = await fetching
                    finally:  # one parse at a time: two at once contend for the GIL and delay the first
                        self._fetch_next(queue, ahead)
                    _stopped(finishing)  # taken over while this one was fetched: stop before it writes
                    if doc.is_index:
                        await self._index(doc, parent, queue, cap)
                        self._fetch_next(queue, ahead)
                    else:
                        await self._urlset(doc)
                        finishing = asyncio.create_task(self._finish(url, doc, parent, finishing))
                        continue
                    error = None
                except (WalkAborted, asyncio.CancelledError):
                    raise
                except Exception as e:
                    error = e
                await self._settle(url, error)
            if finishing is not None:
                await finishing
        finally:
            pending = [*ahead.values(), *([finishing] if finishing is not None else [])]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self.current = None
        if result.sitemaps_skipped:
            self.env.log.error("sitemap walk hit sitemap.maxDocuments", root=self.root, cap=cap,
                               skipped=result.sitemaps_skipped)
        return result

    def _fetch_next(self, queue: deque, ahead: dict[str, asyncio.Task]) -> None:
        if queue and queue[0][0] not in ahead:
            ahead[queue[0][0]] = asyncio.create_task(self.env.fetcher.fetch(queue[0][0]))

    async def _finish(self, url: str, doc: Document, parent: str | None, previous: asyncio.Task | None) -> None:
        """A reconciled urlset's row, then its count and progress, after those of the document before
        it: the next document reconciles meanwhile (it neither reads nor writes this row)."""
        if previous is not None:
            await previous
        error = None
        try:
            await self._put_row(doc, parent)
        except (WalkAborted, asyncio.CancelledError):
            raise
        except Exception as e:
            error = e
        await self._settle(url, error)

    async def _settle(self, url: str, error: Exception | None) -> None:
        """A document is done: counted ok, or recorded as failed (a failing root fails the walk), then
        the progress row is bumped."""
        if error is None:
            metrics.sitemap_documents.labels("ok").inc()
        else:
            metrics.sitemap_documents.labels("failed").inc()
            if url == self.root:
                raise error
            self.result.add_failed(url, error)
            self.env.log.error("sitemap child failed", root=self.root, url=url,
                               error=self.result.failed[-1]["error"] if self.result.failed else str(error))
        self.result.sitemaps_processed += 1
        await self._progress()

    async def _progress(self) -> None:
        self.last_progress = time.monotonic()
        await self.progress(self)

    async def _index(self, doc: Document, parent: str | None, queue: deque, cap: int) -> None:
        """Children are enqueued once per walk: a repeat or a cycle is counted, never fetched again;
        past the document cap a child is counted in ``sitemapsSkipped``, never held."""
        discovered = self.discovered
        invalid: list[InvalidEntry] = []
        for entry in doc.children:
            loc = entry.loc
            if not loc:
                invalid.append(InvalidEntry(loc, "missing <loc>"))
                continue
            try:
                whatwg_path(loc)
            except UrlError:
                invalid.append(InvalidEntry(loc, "not a valid absolute http(s) URL"))
                continue
            if loc in discovered:
                self.result.repeated_children += 1
                continue
            if len(discovered) >= cap:
                self.result.sitemaps_skipped += 1
                continue
            discovered.add(loc)
            queue.append((loc, doc.url))
            self.result.sitemaps_discovered += 1
        self.result.add_invalid(doc.url, invalid)
        await self._put_row(doc, parent)

    async def _urlset(self, doc: Document) -> None:
        """Reconcile; the caller writes the row after it: a document that fails midway keeps its
        previous row."""
        part = doc.partition or Partition()
        self.result.add_partition(doc.url, part)
        line = filtered_log(doc.url, part, self.env.cfg.sitemap.filtered_warn_percent)
        if line is not None:
            getattr(self.env.log, line.level)(line.message, sitemap=doc.url)
        if part.reconciles:  # empty: no prune (docs/sitemaps.md#an-empty-urlset-prunes-nothing)
            await self._reconcile(doc.url, part)

    # ------------------------------------------------------------------------------- reconcile

    async def _reconcile(self, sitemap: str, part: Partition) -> None:
        env, result = self.env, self.result
        cap = env.cfg.scan.collect_cap
        # Phase A: the prune scan over the targets attributed to this document (no write meanwhile).
        urls, total = await (env.sitemap_urls(sitemap, cap) if env.sitemap_urls is not None
                             else env.store.urls_of_sitemap(sitemap, cap))
        scan = PruneScan(sitemap, part.incoming, env.classify, cap)
        for url in urls:
            scan.add(url)
        unexamined = total - len(urls)
        result.add_prune(scan)
        if unexamined > 0 and not scan.truncated:  # more attributed than one read returns: next walk
            result.truncated_scans.append({"sitemapUrl": sitemap, "examined": total,
                                           "collected": len(scan.departed)})
        if scan.truncated or unexamined > 0:
            env.log.error("prune scan truncated; the rest is unlinked by the next walk", sitemap=sitemap,
                          examined=total, collected=len(scan.departed))
        if scan.departed:
            await self._write_many(sitemap, [], [], [], [(u, {"sitemap_url": None}) for u in scan.departed])
            result.add_removed(scan.departed)
            metrics.sitemap_entries.labels("removed").inc(len(scan.departed))
        # Phase B: every listed URL's action; reads and writes in batches.
        renders, reads = fast_actions(part.incoming, known_keys=scan.known_keys, revalidate=self.revalidate)
        skipped = len(part.incoming) - len(reads) - len(renders)
        result.count(Action.SKIP, skipped)
        metrics.sitemap_entries.labels("skipped").inc(skipped)
        # lastmods newer than the last walk: pages to re-render once the batches have run (a revalidate
        # renders every page anyway; a target this walk creates has no page yet)
        changed: dict[str, int] = {}
        if self.revalidate:
            self.walked_at[sitemap] = now_ms()
        else:
            changed = await self._changed(sitemap, part)
        gate = asyncio.Semaphore(IN_FLIGHT)
        batches = [(reads[i:i + BATCH], True) for i in range(0, len(reads), BATCH)]
        batches += [(renders[i:i + BATCH], False) for i in range(0, len(renders), BATCH)]
        await asyncio.gather(*(self._batch(sitemap, items, read, gate, changed) for items, read in batches))
        if changed:
            await self._lastmod_due(changed)

    async def _changed(self, sitemap: str, part: Partition) -> dict[str, int]:
        """The entries whose lastmod is newer than this document's previous walk (``changed_entries``);
        the bad ones are counted."""
        [raw] = await self.env.store.get([sitemap_key(sitemap)])
        try:
            old = decode_json(raw) if raw else {}
        except RecordError:
            old = {}
        since = old.get("walkedAt", old.get("lastRefreshed"))  # a row from before walkedAt: its refresh
        checked = self.walked_at[sitemap] = now_ms()
        found = changed_entries(part.incoming, since if isinstance(since, int) else None, checked)
        self.result.lastmod_invalid += found.invalid
        self.result.lastmod_future += found.future
        return found.changed

    async def _lastmod_due(self, changed: dict[str, int]) -> None:
        """Ask each owner's keeper to make due the listed pages rendered before their lastmod, paced over
        ``sitemap.lastmodWithin``; counted in the result."""
        within = self.env.cfg.sitemap.lastmod_within
        urls = sorted(changed)
        ats = [changed[u] for u in urls]
        by_owner = self._by_owner(urls, ats, [None] * len(urls))
        keepers = await self._keepers(by_owner)
        answers = await asyncio.gather(*(keepers[owner].lastmod_due(u[i:i + BATCH], at[i:i + BATCH], within)
                                         for owner, (u, at, _) in by_owner.items() for i in range(0, len(u), BATCH)))
        due = sum(a["due"] for a in answers)
        self.result.lastmod_due += due
        metrics.sitemap_entries.labels("lastmod-due").inc(due)

    async def _batch(self, sitemap: str, items: list[tuple[str, Any]], read: bool,
                     gate: asyncio.Semaphore, changed: dict[str, int]) -> None:
        """One batch of listed URLs. Without ``read`` (revalidate) every URL is put. Otherwise every
        URL is created where it has no target, by the owner's store in the same step as its check
        (most URLs of a first walk are new: no read round trip first); the targets that exist come
        back and get their decision (skip, duplicate, reattach: docs/sitemaps.md#reconcile-actions) from what
        they hold."""
        env = self.env
        # in key order, every write of the batch is in key order too: the stores' sorts before their
        # RocksDB writes then only merge runs
        items = sorted(items, key=_URL)
        async with gate:
            at = now_ms()

            def planned(batch: list[tuple[str, Any]], existing: list | None) -> BatchPlan:
                return plan_batch(sitemap, batch, existing, visited=self.visited, revalidate=self.revalidate,
                                  page_cfg=env.cfg.page, now_ms=at)

            plan = planned(items, None)
            if not read:
                await self._write_many(sitemap, plan.urls, plan.intervals, plan.dues, plan.patches)
                counts = plan.counts
            else:
                held = await self._create_absent(sitemap, plan)
                counts = {Action.CREATE: len(items) - len(held)}
                if changed:
                    existing = {url for url, _ in held}
                    for url, _ in items:
                        if url not in existing:
                            changed.pop(url, None)  # created just now: no page to be stale
                if held:
                    entries = dict(items)
                    rest = planned([(url, entries[url]) for url, _ in held],
                                   [_attribution(url, data) for url, data in held])
                    await self._write_many(sitemap, rest.urls, rest.intervals, rest.dues, rest.patches)
                    for action, n in rest.counts.items():
                        counts[action] = counts.get(action, 0) + n
            for action, n in counts.items():
                if n:
                    self.result.count(action, n)
                    metrics.sitemap_entries.labels(action.value).inc(n)
        if time.monotonic() - self.last_progress > HEARTBEAT_S:
            await self._progress()

    async def _create_absent(self, sitemap: str, plan: BatchPlan) -> list[list]:
        """Create the targets of a plan of creates where none exists (one call per owner, all owners at
        once); returns the [url, stored payload] of those that exist, untouched."""
        by_owner = self._by_owner(plan.urls, plan.intervals, plan.dues)
        keepers = await self._keepers(by_owner)
        answers = await asyncio.gather(*(keepers[owner].put_listed(sitemap, u, iv, d, False, True)
                                         for owner, (u, iv, d) in by_owner.items()))
        return [pair for answer in answers for pair in answer["held"]]

    def _by_owner(self, urls: list[str], intervals: list[int], dues: list[int | None]
                  ) -> dict[str, tuple[list, list, list]]:
        sole = self.env.sole_owner()
        if sole is not None:
            return {sole: (urls, intervals, dues)} if urls else {}
        owner_of = self.env.owner_of
        puts: dict[str, tuple[list, list, list]] = {}
        for url, interval, due in zip(urls, intervals, dues):
            owner = owner_of(url)
            cols = puts.get(owner)
            if cols is None:
                cols = puts[owner] = ([], [], [])
            cols[0].append(url)
            cols[1].append(interval)
            cols[2].append(due)
        return puts

    async def _write_many(self, sitemap: str, urls: list[str], intervals: list[int], dues: list[int | None],
                          patches: list[tuple[str, dict]]) -> None:
        """Puts of URLs listed by ``sitemap`` (as columns) and patches: one call per owner and batch,
        all owners at once; a failed call fails the document."""
        owner_of = self.env.owner_of
        puts = self._by_owner(urls, intervals, dues)
        by_owner: dict[str, list] = {}
        for url, change in patches:
            by_owner.setdefault(owner_of(url), []).append([url, change])  # lists: msgpack, not pickle
        keepers = await self._keepers([*puts, *by_owner])
        calls = [keepers[owner].put_listed(sitemap, u[i:i + BATCH], iv[i:i + BATCH], d[i:i + BATCH])
                 for owner, (u, iv, d) in puts.items() for i in range(0, len(u), BATCH)]
        calls += [keepers[owner].patch_targets(q[i:i + BATCH])
                  for owner, q in by_owner.items() for i in range(0, len(q), BATCH)]
        if calls:
            await asyncio.gather(*calls)

    async def _keepers(self, owners: Iterable[str]) -> dict[str, KeeperClient]:
        """Each owner's keeper, looked up before any call is made (a failed lookup leaves no call
        unawaited)."""
        return {owner: await self.env.keeper(owner) for owner in dict.fromkeys(owners)}

    # ------------------------------------------------------------------------------------- rows

    async def _put_row(self, doc: Document, parent: str | None) -> None:
        """The document's row and, when its body changed, its entry chunks (stale chunks deleted)."""
        store = self.env.store
        [raw] = await store.get([sitemap_key(doc.url)])
        try:
            old = decode_json(raw) if raw else {}
        except RecordError:
            old = {}
        chunks = old.get("chunks")
        old_chunks = chunks if isinstance(chunks, int) else 0
        ops: list[tuple[bytes, bytes | None]] = []
        if old.get("digest") != doc.digest or old_chunks != len(doc.chunks):
            ops += [(entries_key(doc.url, i), chunk) for i, chunk in enumerate(doc.chunks)]
            ops += [(entries_key(doc.url, i), None) for i in range(len(doc.chunks), old_chunks)]
        row = {"url": doc.url, "isIndex": doc.is_index, "entryCount": doc.entry_count,
               "lastRefreshed": now_ms(), "parentUrl": parent, "chunks": len(doc.chunks),
               "digest": doc.digest, "bytes": doc.size,
               "compressed": doc.compressed, "fetchMs": round(doc.seconds * 1000)}
        walked = self.walked_at.pop(doc.url, old.get("walkedAt"))
        if walked is not None:  # when this urlset's lastmods were last weighed (the next walk's floor)
            row["walkedAt"] = walked
        if doc.final_url != doc.url:
            row["finalUrl"] = doc.final_url
        ops.append((sitemap_key(doc.url), encode_json(row)))
        await store.apply(ops)


def _stopped(finishing: asyncio.Task | None) -> None:
    """Raise what stopped the last document's row and progress (a takeover), once it has."""
    if finishing is not None and finishing.done():
        finishing.result()


def _attribution(url: str, data: bytes | None) -> Any:
    """A stored target's sitemapUrl (None when unattributed), NO_TARGET when absent or unreadable
    (an unreadable row is replaced by the put, as a missing one would be)."""
    if data is None:
        return NO_TARGET
    try:
        return Target.decode(url, data).sitemap_url
    except RecordError:
        return NO_TARGET
