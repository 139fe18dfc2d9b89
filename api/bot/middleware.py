"""The bot path: a raw ASGI middleware in front of the FastAPI routers.

Every HTTP request is first put to the ingress decision (``prerender_ray.serving.classify``). Our own endpoints
and anything that is not a bot request go on to the routers; a bot request is answered here without
FastAPI's routing, validation or Request/Response objects, which on a cache hit would cost more than
the whole serve (bench/bench_serving.py measures the path).

A cache hit is one RocksDB get in this process (``api/bot/pages.py``), then pure shaping
(``prerender_ray.serving.answer``). Everything else (origin fetch, render-now, peer rescue, discovery,
analytics) lives in ``api/bot/miss.py``.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from typing import Any

from prerender_ray import logs, metrics
from prerender_ray.api.bot.miss import Flow, Outcome
from prerender_ray.api.bot.origin import OriginClient
from prerender_ray.api.bot.pages import PageReader, StoredPage, UnreadablePage
from prerender_ray.api.context import NodeContext
from prerender_ray.api.peer import PeerClient
from prerender_ray.config.loading import findings
from prerender_ray.config.model import Config
from prerender_ray.config.overrides import LiveConfig
from prerender_ray.serving.answer import Reply, error_reply, prepare, prepared_reply, route_label, verdict
from prerender_ray.serving.bots import OTHER, BotRegistry
from prerender_ray.serving.classify import RESERVED_PATHS, BadBotRequest, BotRequest, NotBot
from prerender_ray.serving.negotiation import EncodingError
from prerender_ray.serving.origin_rules import serving_policy
from prerender_ray.serving.responses import debug_headers, debug_requested
from prerender_ray.serving.tally import LabelBudget, UnroutedTally
from prerender_ray.timeutil import now_ms

log = logs.get("bot")
BOT_LABELS = 200  # distinct bot names kept as metric labels; the rest count as ~overflow
METRICS_FLUSH_S = 1.0
RESOLVED_MEMO = 16_384  # ingress decisions remembered per replica (cleared when full)
_WARN_EVERY_S = 60.0


class Serving:
    """Per-replica state of the bot path: compiled config, the page reader, the origin and peer
    clients, the analytics tallies and cached metric children."""

    def __init__(self, ctx: NodeContext):
        cfg = ctx.cfg
        self.ctx = ctx
        self.cfg = cfg
        self.ingress = ctx.compiled.ingress(reserved_of(ctx))
        self.keys = self.ingress.keys
        self.bots = BotRegistry.from_config(cfg)
        self.pages = PageReader.for_node(ctx.data_dir, ctx.node.name, ctx.replica)
        self.origin = OriginClient(cfg)
        self.peer = PeerClient(cfg.peer_rescue, cfg.origin.max_body_bytes)
        self.swr_ttl = cfg.page.swr_ttl
        self.debug_key = cfg.debug_header.key.strip().lower()
        self.record_unmatched = cfg.analytics.record_unmatched
        self.analytics = cfg.analytics.enabled
        self.report_unrouted = cfg.ingress.report.enabled and cfg.ingress.mode == "forwarded"
        self.unrouted = UnroutedTally(cfg.ingress.report.max_buckets, cfg.ingress.report.top_n)
        self.bot_label = LabelBudget(BOT_LABELS)
        self._children: dict[tuple, Any] = {}
        self._pending: dict[tuple, int] = {}
        self._observed: dict[tuple, list[float]] = {}
        self._flush_task: asyncio.Task | None = None
        self._warned: dict[str, float] = {}
        self._resolved: dict[tuple, Any] = {}
        self.flow = Flow(self)

    def start(self) -> None:
        self.pages.start()
        self.flow.start()
        self._flush_task = asyncio.get_running_loop().create_task(self._flusher())

    async def close(self) -> None:
        self.flow.stop()
        if self._flush_task is not None:
            self._flush_task.cancel()
        self.flush()
        self.pages.close()
        await self.origin.aclose()
        await self.peer.aclose()

    def count(self, metric: Any, *labels: str) -> None:
        """Add one to a counter, batched: flushed to prometheus every second (``_flusher``), since
        a multiprocess-mode increment (a locked mmap write) costs more than the rest of a hit."""
        key = (metric, labels)
        self._pending[key] = self._pending.get(key, 0) + 1

    def observe(self, metric: Any, value: float, *labels: str) -> None:
        """A histogram observation, batched like ``count``."""
        key = (metric, labels)
        found = self._observed.get(key)
        if found is None:
            self._observed[key] = [value]
        else:
            found.append(value)

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        for (metric, labels), n in pending.items():
            self.child(metric, *labels).inc(n)
        observed, self._observed = self._observed, {}
        for (metric, labels), values in observed.items():
            _observe_many(self.child(metric, *labels), values)

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(METRICS_FLUSH_S)
            try:
                self.flush()
            except Exception as e:
                metrics.loop_errors.labels("bot-metrics").inc()
                log.error("metrics flush failed", error=repr(e))

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, memoized: the hot path increments several per request."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def resolve(self, method: str, path: str, query: str, headers: dict[str, str]) -> Any:
        """The ingress decision, remembered: it is a pure function of these inputs (the only
        headers it reads are the device, forwarded-host and forwarded-proto ones)."""
        ing = self.ingress
        key = (method, path, query, headers.get(ing.device_header), headers.get(ing.host_header),
               headers.get(ing.proto_header))
        decision = self._resolved.get(key)
        if decision is None:
            if len(self._resolved) >= RESOLVED_MEMO:
                self._resolved.clear()
            decision = self._resolved[key] = ing.resolve(method, path, query, headers)
        return decision

    def warn_sometimes(self, reason: str, message: str, **kw: Any) -> None:
        """Bots repeat themselves: one warning per reason and minute."""
        now = time.monotonic()
        if now - self._warned.get(reason, -1e9) >= _WARN_EVERY_S:
            self._warned[reason] = now
            log.warning(message, reason=reason, **kw)

    # --------------------------------------------------------------------------------- one request

    async def serve(self, req: BotRequest, headers: dict[str, str], scope: dict, receive: Any) -> Reply:
        now = now_ms()
        bot = self.bots.name_for(headers)
        record = self.analytics and (bot != OTHER or self.record_unmatched)
        bot = self.bot_label(bot)
        if record:
            self.count(metrics.bot_requests, bot, req.device)
        if self.report_unrouted and req.route_class != "prerender":
            bucket = self.unrouted.record(req.route_class, _path_of(req.url), now)
            if bucket is not None:
                self.count(metrics.unrouted, req.route_class, bucket)
        debug = debug_requested(headers, self.debug_key)
        if req.cacheable:
            reply, out = await self._cacheable(req, headers, now, debug)
        else:
            reply, out = await self.flow.bypass(req, headers, scope, receive, debug)
        if out.render_now:
            reply.headers["x-harper-render-now"] = out.render_now
        if record:
            self._record(req, bot, out, now)
        return reply

    async def _cacheable(self, req: BotRequest, headers: dict[str, str], now: int,
                         debug: bool) -> tuple[Reply, Outcome]:
        policy = serving_policy(self.cfg.render_now, route_class=req.route_class, method=req.method,
                                request_headers=headers)
        found = None
        unreadable = False
        if not policy.skip_cache:
            try:
                found = self.pages.get_after_miss(req.cache_key)
            except UnreadablePage as e:
                unreadable = True
                self.child(metrics.serve_errors, "page-unreadable").inc()
                self.warn_sometimes("page-unreadable", "unreadable page; serving the origin", error=str(e))
        status = "unreadable" if unreadable else verdict(found.meta if found is not None else None, now,
                                                          self.swr_ttl, skip=policy.skip_cache)
        if status == "hit" or status == "swr":
            out = Outcome(status, "cache")
            reply = self.cached(req, found, now, headers, out, debug)
            if reply is not None:
                return reply, out
            status = "unreadable"
        return await self.flow.not_served(req, headers, now, debug, policy, status, found)

    def cached(self, req: BotRequest, page: StoredPage, now: int, headers: dict[str, str], out: Outcome,
               debug: bool) -> Reply | None:
        """A stored page as the reply, or None when its body cannot be re-coded (counted). The
        negotiated form is kept with the page for the next request with the same Accept-Encoding."""
        meta = page.meta
        out.last_cached = meta.last_cached
        out.indexable = meta.is_indexable
        accept = headers.get("accept-encoding")
        prepared = page.variants.get(accept)
        if prepared is None:
            try:
                prepared = prepare(meta, page.body, accept, self.cfg.server.max_html_bytes)
            except EncodingError as e:
                self.child(metrics.serve_errors, "page-encoding").inc()
                self.warn_sometimes("page-encoding", "stored page cannot be re-coded; serving the origin",
                                    key=req.cache_key, error=str(e))
                return None
            self.pages.decoded.add_variant(req.cache_key, page, accept, prepared)
        return prepared_reply(prepared, last_cached=meta.last_cached, now=now, request_headers=headers,
                              head=req.method == "HEAD", debug=self.debug(req, out) if debug else None)

    def debug(self, req: BotRequest, out: Outcome) -> dict[str, str]:
        keys = self.keys
        bypass = not req.cacheable  # a bypass never names a cache key (docs/serving.md#cache-statuses)
        return debug_headers(
            cache_status=out.cache_status, source=out.source, cache_key=None if bypass else req.cache_key,
            url=None if bypass else req.url, device_type=req.device, route_class=req.route_class,
            route=req.route, last_cached=out.last_cached, is_indexable=out.indexable,
            via_staging=out.via_staging, delimiter=keys.delimiter, attributes=keys.attributes,
        )

    def _record(self, req: BotRequest, bot: str, out: Outcome, now: int) -> None:
        self.count(metrics.bot_serves, out.source, out.cache_status, bot)
        label = route_label(req.route.path if req.route else None, req.route_class)
        self.count(metrics.route_serves, label, out.cache_status, req.device)
        if out.source == "cache" and out.last_cached is not None:
            age = now - out.last_cached
            if age < 0:  # clock skew between the node that rendered and this one
                self.count(metrics.page_age_negative, bot, req.device)
            else:
                self.observe(metrics.page_age_seconds, age / 1000, req.device)


def _observe_many(child: Any, values: list[float]) -> None:
    """Many observations into one histogram child as one write per bucket touched. Uses the
    child's buckets as prometheus_client lays them out (``observe`` does the same per value);
    falls back to ``observe`` if that layout ever changes."""
    bounds, buckets, total = (getattr(child, n, None) for n in ("_upper_bounds", "_buckets", "_sum"))
    if not (bounds and buckets and total is not None and len(bounds) == len(buckets)):
        for v in values:
            child.observe(v)
        return
    counts = [0] * len(bounds)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1  # the first bucket with v <= bound, as observe
    total.inc(sum(values))
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)


def _path_of(url: str) -> str:
    rest = url.partition("://")[2]
    slash = rest.find("/")
    return rest[slash:].partition("?")[0] if slash >= 0 else "/"


# ----------------------------------------------------------------------------------------- plumbing


def open_serving(ctx: NodeContext) -> Serving:
    """Build (once) and start the replica's bot path; the replica calls it at start-up."""
    serving = ctx.extras.get("serving")
    if serving is None:
        serving = ctx.extras["serving"] = Serving(ctx)
        serving.start()
    return serving


def reserved_of(ctx: NodeContext) -> tuple[str, ...]:
    """The paths of our own routes (set by api.app when it builds the app), never bot requests."""
    return ctx.extras.get("reserved-paths", RESERVED_PATHS)


def reconfigure(ctx: NodeContext, cfg: Config) -> None:
    """Swap in a config that differs only in live options (routes, default interval, boost): what
    reads the config per request sees it at once; the bot path's route table is rebuilt."""
    ctx.compile(cfg)
    ctx.findings = findings(cfg, ctx.rules.router.compiled.prerender_count)
    serving = ctx.extras.get("serving")
    if serving is not None:
        serving.cfg = serving.flow.cfg = cfg
        serving.ingress = ctx.compiled.ingress(reserved_of(ctx))
        serving.keys = serving.ingress.keys
        serving._resolved.clear()


def live_of(ctx: NodeContext) -> LiveConfig:
    """The replica's live config (the file's plus the overrides row); set up on first use."""
    live = ctx.extras.get("live")
    if live is None:
        live = ctx.extras["live"] = LiveConfig(ctx.cfg)
    return live


def apply_overrides(ctx: NodeContext, raw: bytes | None) -> bool:
    """Apply the stored live overrides (``o:config``) to this replica if they changed."""
    live = live_of(ctx)
    cfg = live.changed(raw, log)
    if cfg is None:
        return False
    reconfigure(ctx, cfg)
    log.info("live config applied", replica=ctx.replica, overrides=live.names())
    return True


def serving_of(ctx: NodeContext) -> Serving:
    return ctx.extras.get("serving") or open_serving(ctx)


async def close_serving(ctx: NodeContext) -> None:
    serving = ctx.extras.pop("serving", None)
    if serving is not None:
        await serving.close()


async def send_reply(send: Any, reply: Reply) -> None:
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.asgi_headers()})
    await send({"type": "http.response.body", "body": reply.body})


def _request_headers(scope: dict) -> dict[str, str]:
    """Lowercase names (the server lowercases them); repeated fields joined by ", " as Node does."""
    out: dict[str, str] = {}
    for k, v in scope["headers"]:
        name, value = k.decode("latin-1"), v.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


class BotMiddleware:
    """ASGI: bot requests are answered here; everything else goes to ``app``."""

    def __init__(self, app: Any, ctx: NodeContext):
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = scope.get("raw_path")
        # The raw path: canonicalization must see the escapes the bot sent, not decoded ones.
        path = raw.decode("utf-8", "surrogateescape").partition("?")[0] if raw else scope["path"]
        serving = self.ctx.extras.get("serving") or open_serving(self.ctx)
        headers = _request_headers(scope)
        query = scope.get("query_string", b"").decode("utf-8", "surrogateescape")
        decision = serving.resolve(scope["method"], path, query, headers)
        if type(decision) is NotBot:
            if decision.detail:
                serving.warn_sometimes(decision.reason, "not a bot request", detail=decision.detail)
            await self.app(scope, receive, send)
            return
        if type(decision) is BadBotRequest:
            status = 403 if decision.reason == "host-not-allowed" else 400
            await send_reply(send, error_reply(status, decision.message, reason=decision.reason))
            return
        try:
            reply = await serving.serve(decision, headers, scope, receive)
        except Exception as e:  # the worker stays up; the bot gets a bounded answer
            serving.child(metrics.serve_errors, "exception").inc()
            log.exception("bot request failed", url=decision.url, error=repr(e))
            reply = error_reply(500, "internal error")
        await send_reply(send, reply)
