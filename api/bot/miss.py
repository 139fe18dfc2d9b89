"""The bot path when the local cache cannot answer: peer rescue, render-now, the origin fetch, bypass
for other methods, and discovery (docs/serving.md#what-is-served-when).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from prerender_ray import logs, metrics
from prerender_ray.api.auth import proxies_of
from prerender_ray.api.bot.counters import Counters
from prerender_ray.api.bot.hit import Hit, Outcome
from prerender_ray.api.bot.holders import HolderReader
from prerender_ray.api.bot.origin import OriginClient, OriginError
from prerender_ray.api.bot.page_reader import PageReader
from prerender_ray.api.bot.pages import StoredPage
from prerender_ray.api.bot.peer import NOT_HELD, PeerClient
from prerender_ray.api.context import NodeContext
from prerender_ray.api.outbound import public_host
from prerender_ray.config.model import Config
from prerender_ray.identity.urls import UrlError
from prerender_ray.queue.discovery import BUSY, RateBudget, site_of
from prerender_ray.serving.answer import Reply, error_reply, origin_reply, verdict
from prerender_ray.serving.classify import PROXIED_METHODS, BotRequest
from prerender_ray.serving.markdown import markdown_negotiated, wants_markdown
from prerender_ray.serving.negotiation import add_vary
from prerender_ray.serving.origin_policy import origin_of
from prerender_ray.serving.origin_rules import (
    ServingPolicy,
    is_prerender_candidate,
    origin_request_headers,
    relay_headers,
    shared_fetch_key,
    staging_ip,
)
from prerender_ray.timeutil import now_ms

log = logs.get("bot")
RENDER_NOW_CALL_S = 5.0  # the owner keeper's render_now call
DISCOVERY_CALL_S = 10.0
DISCOVERY_MEMO = 10_000  # URLs known to have a target (or just put), per replica
DISCOVERY_MEMO_TTL_S = 600.0
DISCOVERY_TASKS = 64  # discoveries in flight per replica; over it, refused (busy)
# What the origin served may predate a delete (a redirect's result retiring its source, an operator's
# DELETE) by an origin fetch and a discovery call: a target deleted this recently is not re-created.
DISCOVERY_AFTER_DELETE_MS = 120_000
LOGGED_KEY_CHARS = 200  # of a cache key in a warning line (a bot chooses the URL: up to ~8 KB)


class Miss:
    """Answers what the cache cannot, under one config (built per config by ``api/bot/replica.py``;
    the clients, the page reader, the counters and the discovery memo outlive it)."""

    def __init__(self, ctx: NodeContext, cfg: Config, *, hit: Hit, pages: PageReader, origin: OriginClient,
                 peer: PeerClient, holders: HolderReader, counters: Counters, discovery: Discovery):
        self.ctx = ctx
        self.cfg = cfg
        self.hit = hit
        self.pages = pages
        self.origin = origin
        self.peer = peer
        self.holders = holders
        self.counters = counters
        self.discovery = discovery
        self.swr_ttl = cfg.page.swr_ttl
        self.debug_key = cfg.debug_header.key.strip().lower()
        self.on_miss = cfg.render.on_miss
        self._waits: dict[str, asyncio.Task] = {}  # cache key -> the one wait of its concurrent misses

    # ------------------------------------------------------------------------------ not held here

    async def look_holders(self, req: BotRequest, now: int) -> tuple[str, StoredPage | None]:
        """``Hit.look`` for a URL this node does not hold: its page as a holder has it."""
        got = await self.holders.get(req.cache_key, req.url)
        return verdict(got.page, now, self.swr_ttl), got.page

    async def _look_fresh(self, req: BotRequest) -> StoredPage | None:
        """What the store holds now for ``req`` (a render-now waiter's poll): the local store, or a
        holder's when this node holds no copy."""
        if self.holders.applies(req.url):
            return (await self.holders.get(req.cache_key, req.url, cached=False)).page
        try:
            return await self.pages.read(req.cache_key)
        except Exception:
            return None

    # ----------------------------------------------------------------------------- not servable

    async def not_served(self, req: BotRequest, headers: dict[str, str], now: int, debug: bool,
                         policy: ServingPolicy, status: str,
                         found: StoredPage | None, *, discover: bool = True,
                         markdown: bool = False) -> tuple[Reply, Outcome]:
        """``discover`` False (the bot's policy, ``bots``): no new target and no on-miss render come
        of this request. ``markdown``: the request wants Markdown (``Hit.markdown.wants``), which a
        rendered page this path finds is served as, as a cache hit is; the origin's answer never is."""
        if found is None and status in ("miss", "unreadable") and self.ctx.holds(req.url):
            # not here (yet), or not readable here (a node that holds no copy asked the holders already)
            rescued = await self._peer_rescue(req, headers, now, debug, markdown)
            if rescued is not None:
                return rescued
        render_now = policy.authorized and policy.miss_mode == "prerender"
        on_miss = discover and found is None and status == "miss" and self.on_miss.enabled and req.method == "GET" \
            and req.route_class == "prerender"
        if (render_now or on_miss) and await self._renderable(req):
            if render_now:
                return await self._render_now(req, headers, debug, status, found, discover, markdown)
            rendered = await self._on_miss(req, headers, debug, status, markdown)
            if rendered is not None:
                return rendered
        out = Outcome(status)
        return await self.from_origin(req, headers, debug, out, reason=status, discover=discover), out

    async def _renderable(self, req: BotRequest) -> bool:
        """Whether a miss may ask the fleet to render ``req``'s URL. With ``allowAnyDomain`` off loopback
        anyone names the host, and no client of ours connects to it before the fleet's browser does:
        only a host of public addresses (``api/outbound.py``); the origin fetch then refuses the rest."""
        if not self.origin.policy.public_only:
            return True
        origin = origin_of(req.url)
        if origin is None:
            return False
        _, host, port = origin
        if await public_host(host.strip("[]"), port, self.cfg.origin.connect_timeout_ms / 1000):
            return True
        self.counters.count(metrics.serve_errors, "render-refused")
        return False

    # ------------------------------------------------------------------------------ peer rescue

    async def _peer_rescue(self, req: BotRequest, headers: dict[str, str], now: int,
                           debug: bool, markdown: bool) -> tuple[Reply, Outcome] | None:
        """A page the owner holds but this node has not received yet (replication lag)."""
        peer = self.peer
        if not peer.active:
            return None
        owner = self.ctx.owner_of(req.url)
        info = self.ctx.peers.get(owner)
        if owner == self.ctx.node.name or info is None:
            return None
        t0 = time.perf_counter()
        got = await peer.fetch(owner, info.url, req.cache_key)
        if isinstance(got, str):
            if got == NOT_HELD:  # not cached there either: no failure, the origin answers
                return None
            self.counters.child(metrics.serve_errors, "peer-rescue").inc()
            # once a minute per kind ("peer responded 500", "peer fetch failed", ...), not per miss
            self.counters.warn_sometimes(f"peer-rescue {got.split(':', 1)[0]}", "peer rescue failed",
                                         key=req.cache_key[:LOGGED_KEY_CHARS], owner=owner, error=got)
            return None
        if verdict(got.meta, now, self.swr_ttl) not in ("hit", "swr"):
            return None
        out = Outcome("peer-rescue", "cache")
        reply = await self.hit.answer(req, StoredPage(b"", got.meta, got.body), now, headers, out, debug, markdown)
        if reply is None:
            return None
        ms = round((time.perf_counter() - t0) * 1000, 1)
        log.info("peer rescue", key=req.cache_key, owner=owner, ms=ms)
        return reply, out

    # ------------------------------------------------------------------------------- render-now

    async def _render_now(self, req: BotRequest, headers: dict[str, str], debug: bool, status: str,
                          found: StoredPage | None, discover: bool, markdown: bool) -> tuple[Reply, Outcome]:
        """Make the key due now on its owner, then watch the local page store for a page cached
        after this request began, until the deadline; then ``renderNow.fallback``."""
        rn = self.cfg.render_now
        fresh = await self._rendered_within(req, rn.timeout_ms / 1000)
        if fresh is not None:
            out = Outcome(status, "rendered")
            out.render_now = "hit"
            reply = await self.hit.answer(req, fresh, now_ms(), headers, out, debug, markdown)
            if reply is not None:
                return reply, out
        out = Outcome(status)
        out.render_now = "timeout"
        if rn.fallback == "error":
            reply = error_reply(504, "the page was not rendered in time")
            if debug:
                reply.headers.update(self.hit.debug(req, out))
            return reply, out
        if rn.fallback == "stale" and found is not None:
            out.source = "cache"
            reply = await self.hit.answer(req, found, now_ms(), headers, out, debug, markdown)
            if reply is not None:
                return reply, out
            out.source = "origin"
        return await self.from_origin(req, headers, debug, out, reason="render-timeout", discover=discover), out

    async def _rendered_within(self, req: BotRequest, wait_s: float) -> StoredPage | None:
        """Make the key due now on its owner, then watch the local page store for a page cached
        after this began, for ``wait_s``; None when none came (or the owner is away)."""
        since = now_ms()
        deadline = time.monotonic() + wait_s
        try:
            keeper = await self.ctx.keeper_of(req.url)
            await keeper.within(min(RENDER_NOW_CALL_S, wait_s)).render_now(req.cache_key)
        except Exception as e:  # the owner is away: no render is coming, fall back at once
            self.counters.child(metrics.serve_errors, "render-now-call").inc()
            log.warning("render-now call failed", key=req.cache_key, error=repr(e))
            return None
        poll_s = self.cfg.render_now.poll_interval_ms / 1000
        while time.monotonic() < deadline:
            await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            fresh = await self._look_fresh(req)
            if fresh is not None and fresh.last_cached is not None and fresh.last_cached >= since:
                return fresh
        return None

    async def _on_miss(self, req: BotRequest, headers: dict[str, str], debug: bool,
                       status: str, markdown: bool) -> tuple[Reply, Outcome] | None:
        """``render.onMiss``: the first bot to miss a never-cached page gets its render when it comes
        within ``waitMs``; concurrent misses of the key wait on the same render (one render-now)."""
        key = req.cache_key
        wait = self._waits.get(key)
        if wait is None:
            if not self.discovery.admits_render(req.url):
                return None  # the origin answers, as on any miss
            wait = self._waits[key] = asyncio.get_running_loop().create_task(
                self._rendered_within(req, self.on_miss.wait_ms / 1000))
            wait.add_done_callback(lambda done: self._waits.pop(key, None) if self._waits.get(key) is done else None)
        fresh = await asyncio.shield(wait)  # one bot hanging up does not cancel the others' wait
        if fresh is None:
            return None
        out = Outcome(status, "rendered")
        out.render_now = "on-miss"
        reply = await self.hit.answer(req, fresh, now_ms(), headers, out, debug, markdown)
        return None if reply is None else (reply, out)

    # ----------------------------------------------------------------------------------- origin

    def _forward(self, req: BotRequest, headers: dict[str, str], *, strip_validators: bool,
                 client: str | None = None) -> list[tuple[str, str]]:
        """Repeated request fields arrive joined by ", ", which RFC 9110 section 5.3 makes equivalent."""
        return origin_request_headers(headers.items(), device_type=req.device, origin=self.cfg.origin,
                                      debug_key=self.debug_key, render_now=self.cfg.render_now,
                                      strip_validators=strip_validators, client=client)

    def _client(self, scope: dict, headers: dict[str, str]) -> str | None:
        """The bot's address as we know it (``api/auth.py``'s ``client_address``): the TCP peer, or
        behind a trusted proxy the client it forwards for; None when the peer is unknown."""
        peer = scope.get("client")
        client = proxies_of(self.ctx).client(peer[0] if peer else None, headers.get("x-forwarded-for"))
        return None if client == "unknown" else client

    async def from_origin(self, req: BotRequest, headers: dict[str, str], debug: bool, out: Outcome, *,
                          reason: str, discover: bool = True) -> Reply:
        """GET the canonical URL (a HEAD too: one fetch serves both), shared by concurrent misses
        of the same key that send the origin the same headers. Validators are not forwarded: the
        origin sends the full page, and a bot's If-None-Match is answered here against it."""
        pin = staging_ip(self.cfg.origin.staging, headers)
        forward = self._forward(req, headers, strip_validators=True)
        client = self.origin
        # The origin may shape its answer by any header it gets (Accept: Cloudflare's Markdown for
        # Agents answers Markdown to it; X-Forwarded-Host; Accept-Language): a fetch is shared only by
        # misses it cannot tell apart, so no bot is handed an answer another bot's headers shaped; but
        # for a request id (cf-ray ...), or a CDN would leave nothing to share. It carries no client
        # address (X-Forwarded-For ...): it is made for every bot that waits on it, so no one bot's
        # address is true of it, and keyed by address (which a CDN's every request has its own of)
        # misses would share nothing.
        asks_markdown = wants_markdown(headers.get("accept"))
        try:
            answer, leader = await client.collapsed(
                (req.cache_key, pin, shared_fetch_key(forward)),
                lambda: client.fetch("GET", req.url, forward, reason=reason, pin=pin))
            if answer.status == 206:  # we never ask for a range: a part of the page is not the page
                raise OriginError(502, "protocol", "the origin answered 206 to a request without Range")
        except OriginError as e:
            return self._origin_failed(req, e, debug, out)
        out.via_staging = answer.via_staging
        if discover and leader and req.route_class == "prerender":
            relayed = relay_headers(answer.status, answer.headers)
            if asks_markdown and markdown_negotiated(relayed):  # an HTML page stands behind it
                relayed["content-type"] = "text/html"
            if is_prerender_candidate(answer.status, relayed):
                self.discovery.discover(req.url)
        reply = origin_reply(answer.status, answer.headers, answer.body, request_headers=headers,
                             head=req.method == "HEAD", debug=self.hit.debug(req, out) if debug else None,
                             max_bytes=self.cfg.server.max_html_bytes)
        if answer.status == 200 and req.route_class == "prerender" and self.hit.markdown.enabled:
            # Once rendered, this URL answers Markdown to an agent's Accept (``Hit.answer`` says so on a
            # hit): a shared cache must not hand this HTML to an agent, nor the origin's Markdown to a bot.
            reply.headers["vary"] = add_vary(reply.headers.get("vary"), "Accept")
            if self.hit.markdown_by_agent:  # and to the bots and classes markdown.forBots/forClasses name
                reply.headers["vary"] = add_vary(reply.headers["vary"], "User-Agent")
        return reply

    def _origin_failed(self, req: BotRequest, e: OriginError, debug: bool, out: Outcome) -> Reply:
        self.counters.child(metrics.serve_errors, f"origin-{e.kind}").inc()
        self.counters.warn_sometimes(f"origin-{e.kind}", "origin fetch failed", url=req.url, error=str(e))
        reply = error_reply(e.status, str(e), reason=f"origin-{e.kind}")
        if debug:
            reply.headers.update(self.hit.debug(req, out))
        return reply

    async def bypass(self, req: BotRequest, headers: dict[str, str], scope: dict, receive: Any,
                     debug: bool) -> tuple[Reply, Outcome]:
        """Methods other than GET/HEAD: those of ``PROXIED_METHODS`` proxied as they came, body included
        (``bypass``: docs/serving.md#cache-statuses); never cached, collapsed or discovered, and the
        origin handles their validators. Any other method (TRACE, which an origin may reflect with the
        token in it; CONNECT; one we do not know) is a 405, as is every one with ``proxyOtherMethods`` off."""
        out = Outcome("bypass")
        proxied = self.cfg.origin.proxy_other_methods
        if not (proxied and req.proxiable):  # nothing sent: the token never rides a bot's write
            allowed = ("GET", "HEAD", *PROXIED_METHODS) if proxied else ("GET", "HEAD")
            reply = error_reply(405, f"{req.method} is not served to bots here; "
                                     f"{', '.join(allowed[:-1])} and {allowed[-1]} are")
            reply.headers["allow"] = ", ".join(allowed)
            return reply, out
        cap = self.cfg.server.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and not declared.isdigit():
            return error_reply(400, "content-length is not a number"), out
        if declared is not None and int(declared) > cap:  # refused before a byte is read or sent
            return error_reply(413, f"request body is larger than {cap} bytes"), out
        pin = staging_ip(self.cfg.origin.staging, headers)
        forward = self._forward(req, headers, strip_validators=False, client=self._client(scope, headers))
        body: bytes | AsyncIterator[bytes] = b""
        if (declared is not None and declared != "0") or "transfer-encoding" in headers:
            body = _streamed(receive, cap)
            if declared is not None:  # the origin gets the framing the bot chose, not chunks
                forward.append(("content-length", declared))
        if not self.origin.take_bypass():  # nothing sent: the pool's other connections are the misses'
            self.counters.count(metrics.serve_errors, "bypass-busy")
            reply = error_reply(503, "too many requests of other methods than GET and HEAD in flight",
                                reason="bypass-busy")
            reply.headers["retry-after"] = "1"
            return reply, out
        try:
            answer = await self.origin.fetch(req.method, req.url, forward, reason="bypass", body=body,
                                             pin=pin)
        except BodyRefused as e:
            return error_reply(e.status, str(e)), out
        except OriginError as e:
            return self._origin_failed(req, e, debug, out), out
        finally:
            self.origin.give_bypass()
        out.via_staging = answer.via_staging
        return origin_reply(answer.status, answer.headers, answer.body, request_headers=headers,
                            conditional=False, debug=self.hit.debug(req, out) if debug else None,
                            max_bytes=self.cfg.server.max_html_bytes), out


class Discovery:
    """Makes targets of pages the origin served on prerender routes, within the discovery budget
    (``prerender_ray.queue.discovery``: the rate here, the ceiling on the URL's owner keeper); its
    memo, budget and tasks live as long as the replica. A refusal changes nothing a bot is served."""

    def __init__(self, ctx: NodeContext, counters: Counters):
        self.ctx = ctx
        self.counters = counters
        self._known: dict[str, float] = {}  # url -> monotonic time it was found or put
        self._tasks: set[asyncio.Task] = set()
        budget = ctx.cfg.bots.discovery  # read at start (not a live option)
        # the node's rate, split over its replicas (a bot's requests spread over them)
        self.rate = RateBudget(budget.per_minute / ctx.cfg.server.replicas)

    def stop(self) -> None:
        for t in self._tasks:
            t.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def discover(self, url: str) -> None:
        """A prerender-route page the origin served as indexable HTML: make it a target, unless one
        exists (a suppressed one included: it must not be revived by bot traffic)."""
        now = time.monotonic()
        seen = self._known.get(url)
        if seen is not None and now - seen < DISCOVERY_MEMO_TTL_S:
            return
        if len(self._tasks) >= DISCOVERY_TASKS:  # a flood of new URLs waits for none of them
            self._refused(BUSY)
            return
        if len(self._known) >= DISCOVERY_MEMO:
            self._known.clear()
        self._known[url] = now  # also keeps a burst of misses to one check
        self._spawn(self._put_target(url))

    def admits_render(self, url: str) -> bool:
        """Whether a bot's miss of ``url`` may cost a render now (``render.onMiss``): it takes from
        the site's discovery rate as a new target does, or anyone asking for new paths would keep the
        fleet rendering them (a refusal is counted as discovery's)."""
        refused = self.rate.take(site_of(url), time.monotonic() * 1000)
        if refused is not None:
            self._refused(refused)
            return False
        return True

    def _refused(self, reason: str, url: str | None = None) -> None:
        if url is not None:
            self._known.pop(url, None)  # a later miss may try again
        self.counters.count(metrics.discovery_refused, reason)

    async def _put_target(self, url: str) -> None:
        try:
            canonical = self.ctx.rules.canonical(url)
            if self.ctx.rules.route_class(canonical) != "prerender":
                return
            [existing] = await self.ctx.read_from_holders(
                canonical, lambda store: store.get_targets([canonical]), DISCOVERY_CALL_S)
            if existing is not None:  # known URLs cost nothing
                return
            refused = self.rate.take(site_of(canonical), time.monotonic() * 1000)
            if refused is not None:
                self._refused(refused, url)
                return
            keeper = await self.ctx.keeper_of(canonical)
            # the owner counts the site's unrendered discoveries (the ceiling) and puts absent-only
            answer = await keeper.within(DISCOVERY_CALL_S).discover_target(canonical, DISCOVERY_AFTER_DELETE_MS)
            if answer.get("refused"):  # counted by the keeper
                self._known.pop(url, None)
                return
            if not answer.get("written"):
                return
            metrics.discovered.inc()
            log.info("discovered", url=canonical, owner=self.ctx.owner_of(canonical))
        except UrlError:
            return
        except Exception as e:  # try again on a later miss
            self._known.pop(url, None)
            self.counters.child(metrics.serve_errors, "discovery").inc()
            log.warning("discovery failed", url=url, error=repr(e))


class BodyRefused(Exception):
    """A bot request's body that must not reach the origin: over the cap, or cut short."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def _streamed(receive: Any, cap: int) -> AsyncIterator[bytes]:
    """The request body as uvicorn hands it over, relayed to the origin chunk by chunk: never held
    whole, so the bytes a replica buffers for bodies stay bounded by its connections (uvicorn stops
    reading a connection whose unread body passes 64 KiB). Raising aborts the origin request
    mid-body, so a body cut short or over ``cap`` never arrives at the origin looking complete."""
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyRefused(400, "the client went away before its request body ended")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise BodyRefused(413, f"request body is larger than {cap} bytes")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return
