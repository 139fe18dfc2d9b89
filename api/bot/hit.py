"""A bot request the local cache answers: one look-up in the node's page log in this process
(``api/bot/page_reader.py``), then pure shaping (``prerender_ray.serving.answer``). What the cache cannot
answer goes to ``api/bot/miss.py``.
"""

from __future__ import annotations

import xxhash

from prerender_ray import metrics
from prerender_ray.api.bot.counters import Counters
from prerender_ray.api.bot.markdown import Converted, Converter, Skipped
from prerender_ray.api.bot.page_reader import PageReader
from prerender_ray.api.bot.pages import StoredPage, UnreadablePage
from prerender_ray.config.model import Config
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.serving.answer import Reply, prepare, prepared_reply, verdict
from prerender_ray.serving.classify import BotRequest
from prerender_ray.serving.framing import framed_reply, sends_stored_coding, sent_coding
from prerender_ray.serving.markdown import (
    TRANSIENT,
    MarkdownPolicy,
    charset_of,
    convert_page,
    markdown_link,
    markdown_meta,
)
from prerender_ray.serving.negotiation import Body, EncodingError, add_vary
from prerender_ray.serving.responses import debug_headers
from prerender_ray.storage.pages import PageMeta

_FRESHNESS = (b"cache-control", b"expires")


class Outcome:
    """What happened to one bot request, for debug headers and metrics."""

    __slots__ = ("cache_status", "indexable", "last_cached", "markdown", "page", "render_now", "source",
                 "via_staging")

    def __init__(self, cache_status: str, source: str = "origin") -> None:
        self.cache_status = cache_status
        self.source = source
        self.last_cached: int | None = None
        self.indexable: bool | None = None
        self.via_staging = False
        self.render_now: str | None = None  # hit | timeout (render-now), on-miss (render.onMiss)
        # our conversion answered: its content-type is in the prepared reply's encoded headers, which
        # the middleware's look at ``reply.headers`` does not see
        self.markdown = False
        # the cached page answered as HTML with no Markdown asked for: what the hit memo keys on
        # (``api/bot/memo.py``)
        self.page: StoredPage | None = None


def _form(meta: PageMeta, body: Body, accept_encoding: str | None) -> str:
    """What alone tells ``prepare``'s answers for different Accept-Encoding values apart: the coding
    sent (an empty body is sent uncoded, whatever the value)."""
    return sent_coding(meta.content_encoding, accept_encoding) if len(body) else "identity"


class Hit:
    """Reads and shapes stored pages under one config (built per config by ``api/bot/replica.py``)."""

    def __init__(self, cfg: Config, keys: KeyFormat, pages: PageReader, counters: Counters, converter: Converter):
        self.keys = keys
        self.pages = pages
        self.counters = counters
        self.converter = converter
        self.swr_ttl = cfg.page.swr_ttl
        self.max_html_bytes = cfg.server.max_html_bytes
        self.markdown = MarkdownPolicy.from_config(cfg.markdown)
        # the user agent can choose Markdown over HTML (markdown.forBots / forClasses)
        self.markdown_by_agent = self.markdown.enabled and bool(self.markdown.bots or self.markdown.classes)

    async def look(self, req: BotRequest, now: int, *, skip: bool) -> tuple[str, StoredPage | None]:
        """The cache status of ``req`` (``verdict``, or ``unreadable``) and the page found, if any:
        what the store holds now, a write it answered before this request included."""
        found = None
        if not skip:
            try:
                found = await self.pages.read(req.cache_key)
            except UnreadablePage as e:
                self._unreadable(e)
                return "unreadable", None
        return verdict(found, now, self.swr_ttl, skip=skip), found

    def cached(self, req: BotRequest, page: StoredPage, now: int, headers: dict[str, str], out: Outcome,
               debug: bool) -> Reply | None:
        """A stored page as the reply, or None when it cannot be served (counted). A framed page
        taken in its stored coding is answered from its frame; otherwise the negotiated form is kept
        with the page for the next request negotiated to the same coding."""
        out.last_cached = page.last_cached
        out.indexable = page.is_indexable
        accept = headers.get("accept-encoding")
        frame = page.frame
        if frame is not None and not debug and sends_stored_coding(frame, accept):
            return framed_reply(frame, page.body, last_cached=page.last_cached, now=now, request_headers=headers,
                                head=req.method == "HEAD")
        try:
            meta = page.meta
        except UnreadablePage as e:
            self._unreadable(e)
            return None
        form = _form(meta, page.body, accept)
        prepared = page.variants.get(form)
        if prepared is None:
            try:
                prepared = prepare(meta, page.body, accept, self.max_html_bytes)
            except EncodingError as e:
                self.counters.child(metrics.serve_errors, "page-encoding").inc()
                self.counters.warn_sometimes("page-encoding", "stored page cannot be re-coded; serving the origin",
                                             key=req.cache_key, error=str(e))
                return None
            self.pages.decoded.add_variant(req.cache_key, page, form, prepared)
        if meta.status_code != 200:  # a status page (prerender_ray/queue/status_pages.py) or another stored status
            self.counters.child(metrics.status_pages_served, str(meta.status_code)).inc()
        return prepared_reply(prepared, last_cached=meta.last_cached, now=now, request_headers=headers,
                              head=req.method == "HEAD", debug=self.debug(req, out) if debug else None)

    async def answer(self, req: BotRequest, page: StoredPage, now: int, headers: dict[str, str], out: Outcome,
                     debug: bool, markdown: bool) -> Reply | None:
        """A rendered page, cached or found by the miss path: as Markdown when the request wants it
        (``markdown.wants``), else as ``html``."""
        reply = (await self.as_markdown(req, page, now, headers, out, debug) if markdown
                 else self.html(req, page, now, headers, out, debug))
        if reply is not None and page.status_code == 200 and self.markdown_by_agent:
            reply.headers["vary"] = add_vary(reply.headers.get("vary"), "User-Agent")
        return reply

    def html(self, req: BotRequest, page: StoredPage, now: int, headers: dict[str, str], out: Outcome,
             debug: bool) -> Reply | None:
        """``cached``, with ``Vary: Accept`` on a 200 while Markdown is on (the same URL answers
        Markdown to another Accept) and a ``Link`` to that Markdown (``markdown_link``); second
        field lines, so the frame's headers stay as written (a stored ``link`` is never served)."""
        reply = self.cached(req, page, now, headers, out, debug)
        if reply is not None and self.markdown.enabled and page.status_code == 200:
            reply.headers["vary"] = "Accept"
            if reply.status == 200:  # not on a 304: Link is not among the fields it repeats
                reply.headers["link"] = markdown_link(req.url)
        return reply

    async def as_markdown(self, req: BotRequest, page: StoredPage, now: int, headers: dict[str, str],
                          out: Outcome, debug: bool) -> Reply | None:
        """The page as Markdown (docs/serving.md#markdown-for-agents), or its HTML with
        ``x-harper-markdown-skipped`` saying why not; None as ``cached``."""
        if page.status_code != 200:  # a status page or redirect is answered as it is stored
            return self.html(req, page, now, headers, out, debug)
        try:
            meta = page.meta
        except UnreadablePage as e:
            self._unreadable(e)
            return None
        key = (req.cache_key, page.etag or xxhash.xxh64_hexdigest(page.body))
        limits, url, charset = self.markdown.limits, req.url, charset_of(meta.headers.get("content-type"))

        def convert() -> Converted:  # in the converter's pool: nothing here touches the event loop
            body = convert_page(page.body, meta.content_encoding, limits, base_url=url, charset=charset)
            return Converted(markdown_meta(meta, body), body)

        entry = await self.converter.get(key, convert, self.markdown.timeout_s)
        if isinstance(entry, Skipped):
            reply = self.html(req, page, now, headers, out, debug)
            if reply is not None:
                reply.headers["x-harper-markdown-skipped"] = entry.reason
                if entry.reason not in TRANSIENT:  # this version has no Markdown to point to
                    reply.headers.pop("link", None)
                if entry.reason in TRANSIENT:  # a shared cache must not keep it for the agents' Accept
                    reply.encoded = [(k, v) for k, v in reply.encoded if k not in _FRESHNESS]
                    reply.headers.pop("expires", None)
                    reply.headers["cache-control"] = "no-store"
            return reply
        accept = headers.get("accept-encoding")
        form = _form(entry.meta, entry.body, accept)
        prepared = entry.variants.get(form)
        if prepared is None:
            try:
                prepared = prepare(entry.meta, entry.body, accept, limits.max_output_bytes)
            except EncodingError as e:  # gzip we wrote ourselves: not expected
                self.counters.child(metrics.serve_errors, "markdown-encoding").inc()
                self.counters.warn_sometimes("markdown-encoding", "markdown cannot be re-coded; serving HTML",
                                             key=req.cache_key, error=str(e))
                return self.html(req, page, now, headers, out, debug)
            self.converter.cache.grow(key, entry, form, prepared)
        out.markdown = True
        return prepared_reply(prepared, last_cached=page.last_cached, now=now, request_headers=headers,
                              head=req.method == "HEAD", debug=self.debug(req, out) if debug else None)

    def _unreadable(self, e: UnreadablePage) -> None:
        self.counters.child(metrics.serve_errors, "page-unreadable").inc()
        self.counters.warn_sometimes("page-unreadable", "unreadable page; serving the origin", error=str(e))

    def debug(self, req: BotRequest, out: Outcome) -> dict[str, str]:
        keys = self.keys
        bypass = not req.cacheable  # a bypass never names a cache key (docs/serving.md#cache-statuses)
        return debug_headers(
            cache_status=out.cache_status, source=out.source, cache_key=None if bypass else req.cache_key,
            url=None if bypass else req.url, device_type=req.device, route_class=req.route_class,
            route=req.route, last_cached=out.last_cached, is_indexable=out.indexable,
            via_staging=out.via_staging, delimiter=keys.delimiter, attributes=keys.attributes,
        )
