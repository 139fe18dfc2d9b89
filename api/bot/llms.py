"""llms.txt in the ingress: a site's document built from what the cluster holds, kept per site, and
rebuilt in the background (docs/serving.md#llmstxt; the document itself: ``serving/llms_txt.py``).

A build reads the site's targets (one key-range scan of ``t:<origin>/`` on each node that holds a
share; this node alone while every node holds everything), which carry their sitemap, and keeps those
it may list (not suppressed, in a listed section, not made only by a bot's miss unless
``llmsTxt.includeDiscovered``); then, in URL order and in batches, the page of each target for the
first device (this node's page log for what it holds, one ``stored_pages`` call per holder for the
rest), and takes the title and description from the first ``HEAD_BYTES`` of each page's HTML in a
thread. It stops once it has more pages than the document may list. Bounds: targets kept
(``SCAN_FACTOR`` x ``maxEntries``) and records read per node (``SKIP_FACTOR`` times that: anyone's bot
misses make targets, and those passed over must not crowd the real pages out of what a build reads),
pages read likewise, the build's deadline (``llmsTxt.buildTimeout``), one build per site and
``MAX_BUILDS`` per replica.

Requests never wait for a rebuild: a document is served until a newer one is built. Only a site's
first request waits (for that site's one build, with its deadline; a 503 past it). A document is
rebuilt when a request finds it older than ``maxAge``, or older than ``minAge`` with the node's page
store written since it was built (a new render here, or a replicated one); a flood of requests while
it builds costs that one build.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import xxhash

from prerender_ray import logs, metrics
from prerender_ray.api.bot.counters import Counters
from prerender_ray.api.bot.page_reader import PageReader
from prerender_ray.api.bot.pages import UnreadablePage, decode_page
from prerender_ray.api.context import NodeContext
from prerender_ray.config.model import Config
from prerender_ray.decoding import DecodeError
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.devices import Devices
from prerender_ray.serving.answer import Reply, error_reply
from prerender_ray.serving.classify import Ingress
from prerender_ray.serving.llms_txt import (
    CONTENT_TYPE,
    Entry,
    LlmsPolicy,
    head_fields,
    render,
    requested_site,
)
from prerender_ray.serving.markdown import charset_of
from prerender_ray.storage.keys import TARGET
from prerender_ray.storage.registry import RecordError, Target

log = logs.get("bot")
MAX_SITES = 64  # documents kept per replica (least recently asked for dropped first)
MAX_BUILDS = 2  # builds at once per replica, all sites together
SCAN_PAGE = 1000  # targets per scan call
SCAN_FACTOR = 4  # targets kept per build, in maxEntries: pages not rendered yet are passed over
SKIP_FACTOR = 16  # records read per node and build, in targets kept: the ones not listed are passed over
READ_BATCH = 64  # pages read, then parsed in a thread, at a time: what a build holds at once
RETRY_S = 5.0  # after a failed build the site's next one waits this long (its requests get the old copy)


@dataclass(frozen=True, slots=True)
class Document:
    body: bytes
    etag: str
    built: float  # monotonic
    writes: int | None  # the page store's write mark when the build began
    entries: int


class _Site:
    __slots__ = ("doc", "retry_at", "task")

    def __init__(self) -> None:
        self.doc: Document | None = None
        self.task: asyncio.Task[Document] | None = None
        self.retry_at = 0.0


class LlmsTxt:
    """A replica's llms.txt documents. Outlives a config change (``replica.Services``): none of what it
    reads is a live option."""

    def __init__(self, ctx: NodeContext, cfg: Config, pages: PageReader, counters: Counters,
                 clock: Callable[[], float] = time.monotonic):
        self.ctx = ctx
        self.pages = pages
        self.counters = counters
        self.clock = clock
        opts = cfg.llms_txt
        self.policy = LlmsPolicy.from_config(cfg.domains, opts)
        self.max_age_s = opts.max_age / 1000
        self.min_age_s = opts.min_age / 1000
        self.timeout_s = opts.build_timeout / 1000
        self.keys = KeyFormat.from_config(cfg)
        self.device = Devices.from_config(cfg).fallback
        self._sites: OrderedDict[str, _Site] = OrderedDict()
        self._building = 0

    # ---------------------------------------------------------------------------------- requests

    def site_of(self, ingress: Ingress, method: str, path: str, query: str, headers: Mapping[str, str]) -> str | None:
        """The origin whose llms.txt this request asks for, when it is one this replica serves; None
        sends the request the bot path's way (a host outside ``domains`` is answered as it is today)."""
        if method not in ("GET", "HEAD"):
            return None
        site = requested_site(ingress.mode, ingress.prefix, ingress.keys, ingress.devices, ingress.device_from_path,
                              ingress.host_header, ingress.proto_header, ingress.default_protocol, path, query, headers)
        return site if site is not None and self.policy.serves(site) else None

    async def answer(self, site: str, method: str, headers: Mapping[str, str]) -> Reply:
        entry = self._entry(site)
        doc = entry.doc
        if doc is None:
            task = self._start(site, entry)
            if task is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(task), self.timeout_s + 1)
                except Exception:  # logged and counted once, by _built
                    pass
            doc = entry.doc
            if doc is None:
                reply = error_reply(503, "llms.txt is not built yet; try again", reason="llms-txt-unavailable")
                reply.headers["retry-after"] = str(int(RETRY_S))
                return reply
        elif self._stale(doc):
            self._start(site, entry)
        return _reply(doc, method, headers, self.min_age_s)

    async def settled(self, site: str) -> Document | None:
        """The site's document once its build in flight (if any) ended (tests and tools)."""
        entry = self._sites.get(site)
        if entry is None:
            return None
        if entry.task is not None:
            await asyncio.wait([entry.task], timeout=self.timeout_s + 1)
        return entry.doc

    def close(self) -> None:
        for entry in self._sites.values():
            if entry.task is not None:
                entry.task.cancel()

    # ------------------------------------------------------------------------------------ cache

    def _entry(self, site: str) -> _Site:
        entry = self._sites.get(site)
        if entry is not None:
            self._sites.move_to_end(site)
            return entry
        entry = self._sites[site] = _Site()
        if len(self._sites) > MAX_SITES:  # the oldest not building goes
            for old, held in self._sites.items():
                if held.task is None and old != site:
                    del self._sites[old]
                    break
        return entry

    def _stale(self, doc: Document) -> bool:
        age = self.clock() - doc.built
        return age >= self.max_age_s or (age >= self.min_age_s and self.pages.writes() != doc.writes)

    def _start(self, site: str, entry: _Site) -> asyncio.Task[Document] | None:
        if entry.task is not None:
            return entry.task
        if self.clock() < entry.retry_at:
            return None
        if self._building >= MAX_BUILDS:
            self.counters.count(metrics.llms_txt_builds, "busy")
            return None
        self._building += 1
        writes = self.pages.writes()  # before the build: a write during it makes the next request rebuild
        task = entry.task = asyncio.get_running_loop().create_task(self._timed(site, writes))
        task.add_done_callback(lambda t: self._built(site, entry, t))
        return task

    def _built(self, site: str, entry: _Site, task: asyncio.Task[Document]) -> None:
        self._building -= 1
        entry.task = None
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            entry.doc = task.result()
            self.counters.count(metrics.llms_txt_builds, "built")
            return
        entry.retry_at = self.clock() + RETRY_S
        outcome = "timeout" if isinstance(error, TimeoutError) else "failed"
        self.counters.count(metrics.llms_txt_builds, outcome)
        log.warning("llms.txt not built; serving the last one", site=site, outcome=outcome,
                    error=f"{type(error).__name__}: {str(error)[:300]}")

    # ------------------------------------------------------------------------------------ build

    async def _timed(self, site: str, writes: int | None) -> Document:
        async with asyncio.timeout(self.timeout_s):
            return await self.build(site, writes)

    async def build(self, site: str, writes: int | None = None) -> Document:
        policy = self.policy
        want = policy.max_entries + 1  # one more than listed: the document then says it is cut
        candidates, more = await self._targets(site, policy.max_entries * SCAN_FACTOR)
        # the home page names the document, listed or not
        home = self.keys.canonicalize(site + "/")
        [found] = await asyncio.to_thread(_heads, [(home, None)], await self._read([home]))
        title, summary = (found.title, found.description) if found is not None else ("", "")
        entries: list[Entry] = []
        for i in range(0, len(candidates), READ_BATCH):
            batch = candidates[i:i + READ_BATCH]
            raws = await self._read([url for url, _ in batch])
            entries += [e for e in await asyncio.to_thread(_heads, batch, raws) if e is not None]
            if len(entries) >= want:
                break
        body, listed = render(site, title, summary, entries, policy, more)
        return Document(body, f'"{xxhash.xxh64_hexdigest(body)}"', self.clock(), writes, listed)

    async def _targets(self, site: str, limit: int) -> tuple[list[tuple[str, str | None]], bool]:
        """The site's targets the document may list, as (URL, sitemap), key (URL) order, at most
        ``limit``; and whether there are more (or a node did not answer, or had more records than a
        build reads: the list may be short)."""
        ctx = self.ctx
        prefix = TARGET + f"{site}/".encode()
        names = ctx.ownership.names
        nodes = [ctx.node.name] if ctx.cfg.cluster.replicas >= len(names) else list(names)
        most = limit * SKIP_FACTOR

        async def scan(node: str) -> tuple[dict[bytes, str | None], bool]:
            store = await ctx.store_at(node)
            out: dict[bytes, str | None] = {}
            start: bytes | None = None
            read = 0
            while len(out) <= limit:  # one past the limit: the caller sees that there are more
                if read >= most:
                    return out, True
                ask = min(SCAN_PAGE, most - read)
                got = await store.scan(prefix, start, ask)
                read += len(got)
                for key, payload in got:
                    if (target := self._listed(key, payload)) is not None:
                        out[key] = target.sitemap_url
                if len(got) < ask:
                    break
                start = got[-1][0] + b"\x00"
            return out, False

        answers = await asyncio.gather(*(scan(n) for n in nodes), return_exceptions=True)
        merged: dict[bytes, str | None] = {}
        more = False
        for node, answer in zip(nodes, answers):
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                more = True
                log.info("llms.txt: a node's targets not read", node=node, error=type(answer).__name__)
                continue
            listed, cut = answer
            merged.update(listed)  # each URL from each of its holders: the same record
            more = more or cut
        keys = sorted(merged)
        return ([(k[len(TARGET):].decode("utf-8", "replace"), merged[k]) for k in keys[:limit]],
                more or len(keys) > limit)

    def _listed(self, key: bytes, payload: bytes) -> Target | None:
        """The target of a record when the document may list its page."""
        try:
            target = Target.decode(key[len(TARGET):].decode("utf-8", "replace"), payload)
        except RecordError:
            return None
        if target.suppressed or not self.policy.lists(target.sitemap_url, target.discovered):
            return None
        return target

    async def _read(self, urls: list[str]) -> list[bytes | None]:
        """Each URL's page record for the first device: from this node's page log when it holds the
        URL, else one call per holder for the batch (the next holder when one fails)."""
        ctx = self.ctx
        keys = [self.keys.key(u, self.device) for u in urls]
        out: list[bytes | None] = [None] * len(urls)
        elsewhere: dict[tuple[str, ...], list[int]] = {}
        for i, url in enumerate(urls):
            if ctx.holds(url):
                out[i] = await self.pages.record(keys[i])
            else:
                elsewhere.setdefault(ctx.read_order(url), []).append(i)
        for order, idx in elsewhere.items():
            for holder in order:
                try:
                    store = await ctx.store_at(holder)
                    got = await store.stored_pages([keys[i] for i in idx])
                except Exception as e:  # the next holder holds the same records
                    log.info("llms.txt: a holder's pages not read", holder=holder, error=type(e).__name__)
                    ctx.forget_remote()
                    continue
                for i, (raw, _touch) in zip(idx, got):
                    out[i] = raw
                break
        return out


def _heads(batch: list[tuple[str, str | None]], raws: list[bytes | None]) -> list[Entry | None]:
    """An entry per page that is a rendered, indexable 200 (in a thread: decoding and parsing)."""
    out: list[Entry | None] = []
    for (url, sitemap), raw in zip(batch, raws):
        entry = None
        if raw is not None:
            try:
                page = decode_page(url, raw, None)
                if page is not None and page.status_code == 200 and page.is_indexable is not False:
                    meta = page.meta
                    title, description = head_fields(page.body, meta.content_encoding,
                                                     charset_of(meta.headers.get("content-type")))
                    entry = Entry(url, sitemap, title, description)
            except (UnreadablePage, DecodeError, ValueError) as e:
                log.info("llms.txt: a page not read", url=url, error=str(e)[:200])
        out.append(entry)
    return out


def _reply(doc: Document, method: str, headers: Mapping[str, str], max_age_s: float) -> Reply:
    common = {"etag": doc.etag, "cache-control": f"max-age={int(max_age_s)}"}
    if doc.etag in [t.strip() for t in (headers.get("if-none-match") or "").split(",")]:
        return Reply(304, common)
    return Reply(200, {"content-type": CONTENT_TYPE, "content-length": str(len(doc.body)), **common},
                 b"" if method == "HEAD" else doc.body)
