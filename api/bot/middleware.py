"""The bot path: a raw ASGI middleware in front of the FastAPI routers.

Every HTTP request is first put to the ingress decision (``prerender_ray.serving.classify``). Our own endpoints
and anything that is not a bot request go on to the routers; a bot request is answered here without
FastAPI's routing, validation or Request/Response objects, which on a cache hit would cost more than
the whole serve (bench/bench_serving.py measures the path).

A cache hit is ``api/bot/hit.py``; everything else (origin fetch, render-now, peer rescue, discovery)
is ``api/bot/miss.py``. Both come with the replica's state (``api/bot/replica.py``), read once per
request: a config change mid-request does not reach it.
"""

from __future__ import annotations

from typing import Any

from prerender_ray import logs, metrics
from prerender_ray.api.bot.hit import Outcome
from prerender_ray.api.bot.memo import Tape, request_shape
from prerender_ray.api.bot.replica import ReplicaState, open_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.serving.answer import Reply, error_reply, route_label
from prerender_ray.serving.bot_policy import UNCHECKED, VERIFIED, Decision
from prerender_ray.serving.bots import OTHER
from prerender_ray.serving.classify import BadBotRequest, BotRequest, NotBot
from prerender_ray.serving.dates import Dater
from prerender_ray.serving.negotiation import add_vary
from prerender_ray.serving.origin_rules import serving_policy
from prerender_ray.serving.responses import debug_requested
from prerender_ray.timeutil import now_ms

log = logs.get("bot")
SHAPE = "prerender.memo_shape"  # the scope's key for the request shape the HTTP protocol computed


async def serve(state: ReplicaState, req: BotRequest, headers: dict[str, str], scope: dict,
                receive: Any, tape: Tape | None = None) -> Reply:
    """The answer to a bot request. ``tape`` (``api/bot/memo.py``) takes the counts and stats in
    place of the replica's own and writes them down, with what the answer depended on."""
    now = now_ms()
    services = state.services
    counters: Any = services.counters if tape is None else tape
    name = services.bots.name_for(headers)
    verification, method = UNCHECKED, "none"
    signed = None
    claimed = services.bots.class_of(name)
    if services.web_bot_auth is not None:  # CPU only: keys held, never a fetch on this path
        signed = services.web_bot_auth.check(req.method, req.url, headers, name)
        if signed is not None:
            counters.count(metrics.bot_signatures, signed.reason)
            if signed.reason != "bad-tag":  # not a web-bot-auth signature: as if unsigned
                _verified(services, tape, claimed, "signature", signed.reason)
            verification = signed.state
            if verification == VERIFIED:
                method = "signature"
    verifier = services.verifier
    if verification != VERIFIED and verifier is not None and (how := verifier.method(name)) is not None:
        client = _client(services, scope, headers)
        verification, why = await verifier.check_why(name, client)
        method = how
        _verified(services, tape, claimed, how, why)
        if tape is not None:
            tape.checked = (name, client, verification, why)
    site = None
    if services.signals_on:
        if tape is not None:
            tape.sites = services.signals.sites
        site = services.signals.of(req.url)
    decision = state.policies.decide(name, verification, site, signed=method == "signature")
    record = state.analytics and (name != OTHER or state.record_unmatched)
    bot = services.bot_label(name)
    if record:
        counters.count(metrics.bot_requests, bot, req.device)
    if services.report_unrouted and req.route_class != "prerender":
        if tape is None:
            _unrouted(services, now, req.route_class, _path_of(req.url))
        else:
            tape.at(_unrouted, now, req.route_class, _path_of(req.url))
    debug = debug_requested(headers, state.debug_key)
    serve_as = decision.serve
    if serve_as == "deny":  # nothing is read or fetched
        reply, out = state.policies.deny_reply(), Outcome("denied", "policy")
        if req.method == "HEAD":
            reply.body = b""
        if debug:
            reply.headers.update(state.hit.debug(req, out))
    elif not req.cacheable:
        reply, out = await state.miss.bypass(req, headers, scope, receive, debug)
    elif serve_as == "origin":  # the origin's answer, as a miss gets it, without reading the cache
        out = Outcome("policy")
        reply = await state.miss.from_origin(req, headers, debug, out, reason="policy",
                                             discover=decision.discover)
    else:
        reply, out = await _cacheable(state, req, headers, now, debug, name, decision)
    if debug:
        reply.headers.update({"x-harper-bot": name[:100], "x-harper-bot-class": decision.bot_class,
                              "x-harper-bot-verification": verification, "x-harper-bot-policy": serve_as,
                              "x-harper-bot-policy-source": decision.source})
        if signed is not None:
            reply.headers["x-harper-bot-signature"] = signed.reason
    if out.render_now:
        reply.headers["x-harper-render-now"] = out.render_now
    if decision.withheld and out.source == "origin" and req.cacheable and req.route_class == "prerender":
        counters.count(metrics.discovery_refused, decision.withheld)  # a miss its policy lets discover
    if serve_as != "deny" and (named := state.ingress.device_vary):  # the device chose the answer
        reply.headers["vary"] = add_vary(reply.headers.get("vary"), named)
    if record:
        # ours (out.markdown), or the origin's own Markdown relayed
        markdown = out.markdown or reply.headers.get("content-type", "").startswith("text/markdown")
        _record(state, req, bot, out, now, decision, method, markdown, tape)
    if tape is not None:
        tape.now, tape.out, tape.plain = now, out, not debug and signed is None
    return reply


def _verified(services: Any, tape: Tape | None, cls: str, method: str, outcome: str) -> None:
    (services.counters if tape is None else tape).count(metrics.bot_verifications, cls, method, outcome)
    (services.class_stats if tape is None else tape).verified(cls, method, outcome)


def _unrouted(services: Any, now: int, route_class: str, path: str) -> None:
    bucket = services.unrouted.record(route_class, path, now)
    if bucket is not None:
        services.counters.count(metrics.unrouted, route_class, bucket)


async def _cacheable(state: ReplicaState, req: BotRequest, headers: dict[str, str], now: int,
                     debug: bool, bot: str, decision: Decision) -> tuple[Reply, Outcome]:
    policy = serving_policy(state.cfg.render_now, route_class=req.route_class, method=req.method,
                            request_headers=headers)
    hit = state.hit
    status, found = await hit.look(req, now, skip=policy.skip_cache)
    # a node that holds no copy asks the holders, and so does a holder when another holds it too
    if found is None and status == "miss" and not policy.skip_cache and state.miss.holders.elsewhere(req.url):
        status, found = await state.miss.look_holders(req, now)
    markdown = hit.markdown.wants(headers.get("accept"), bot, decision.bot_class)
    if found is not None and (status == "hit" or status == "swr"):
        out = Outcome(status, "cache")
        reply = await hit.answer(req, found, now, headers, out, debug, markdown)
        if reply is not None:
            if not markdown:
                out.page = found
            return reply, out
        status = "unreadable"
    return await state.miss.not_served(req, headers, now, debug, policy, status, found, discover=decision.discover,
                                       markdown=markdown)


def _record(state: ReplicaState, req: BotRequest, bot: str, out: Outcome, now: int, decision: Decision,
            method: str, markdown: bool, tape: Tape | None = None) -> None:
    services = state.services
    counters: Any = services.counters if tape is None else tape
    counters.count(metrics.bot_serves, out.source, out.cache_status, bot)
    cls = decision.bot_class
    counters.count(metrics.bot_class_serves, cls, decision.verification, method, decision.serve, out.cache_status)
    (services.class_stats if tape is None else tape).served(cls, decision.verification, method, out.cache_status,
                                                            markdown)
    if markdown:
        counters.count(metrics.bot_markdown_served, cls)
    if out.cache_status == "miss":
        services.misses.record(cls, req.url, bot, now)
    label = route_label(req.route.path if req.route else None, req.route_class)
    counters.count(metrics.route_serves, label, out.cache_status, req.device)
    if out.source == "cache" and out.last_cached is not None:
        if tape is None:
            _page_age(services, now, out.last_cached, req.device, cls, bot)
        else:
            tape.at(_page_age, now, out.last_cached, req.device, cls, bot)


def _page_age(services: Any, now: int, last_cached: int, device: str, cls: str, bot: str) -> None:
    counters = services.counters
    age = now - last_cached
    if age < 0:  # clock skew between the node that rendered and this one
        counters.count(metrics.page_age_negative, bot, device)
    else:
        counters.observe(metrics.page_age_seconds, age / 1000, device)
        counters.observe(metrics.bot_page_age_seconds, age / 1000, cls, bot)


def _client(services: Any, scope: dict, headers: dict[str, str]) -> str | None:
    peer = scope.get("client")
    return services.proxies.client(peer[0] if peer else None, headers.get("x-forwarded-for"))


def _path_of(url: str) -> str:
    rest = url.partition("://")[2]
    slash = rest.find("/")
    return rest[slash:].partition("?")[0] if slash >= 0 else "/"


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

    def wire(self, scope: dict, dater: Dater, close: bool) -> list[Any] | None:
        """A memo hit answered by the HTTP protocol itself (``api.connections.GuardedHttp``), for the
        ``scope`` uvicorn built: what to write (``HitMemo.wire``), the entry's counts done again; None,
        nothing done: the request takes the ASGI path (a replica not opened yet opens there)."""
        state = self.ctx.state
        if type(state) is not ReplicaState:
            return None
        memo = state.services.memo
        if memo is None or state.services.pages.log is None:
            return None
        shape = scope[SHAPE] = request_shape(scope)  # the app's turn, if it comes, does not make it again
        return None if shape is None else memo.wire(shape, state, now_ms(), dater, close)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = self.ctx.state
        if type(state) is not ReplicaState:
            state = open_replica(self.ctx)
        memo = state.services.memo
        shape = None
        if memo is not None and state.services.pages.log is not None:  # the hit memo (api/bot/memo.py)
            shape = scope[SHAPE] if SHAPE in scope else request_shape(scope)
            if shape is not None and await memo.answer(shape, state, now_ms(), send):
                return
        raw = scope.get("raw_path")
        # The raw path: canonicalization must see the escapes the bot sent, not decoded ones.
        path = raw.decode("utf-8", "surrogateescape").partition("?")[0] if raw else scope["path"]
        headers = _request_headers(scope)
        query = scope.get("query_string", b"").decode("utf-8", "surrogateescape")
        key_file = state.services.index_now_key  # IndexNow's /<key>.txt of a configured host, to anyone
        if key_file is not None and scope["method"] in ("GET", "HEAD") and key_file.asked(
                state.ingress.mode, state.ingress.prefix, state.ingress.host_header, path, query, headers):
            await send_reply(send, key_file.reply(scope["method"]))
            return
        llms = state.services.llms  # /llms.txt of a configured site: before the page decision
        if llms is not None and (site := llms.site_of(state.ingress, scope["method"], path, query, headers)):
            await send_reply(send, await llms.answer(site, scope["method"], headers))
            return
        decision = state.resolve(scope["method"], path, query, headers)
        if type(decision) is NotBot:
            if decision.detail:
                state.services.counters.warn_sometimes(decision.reason, "not a bot request",
                                                       detail=decision.detail)
            await self.app(scope, receive, send)
            return
        if type(decision) is BadBotRequest:
            status = 403 if decision.reason == "host-not-allowed" else 400
            await send_reply(send, error_reply(status, decision.message, reason=decision.reason))
            return
        tape = Tape(state.services) if memo is not None and shape is not None and memo.admits(shape) else None
        try:
            reply = await serve(state, decision, headers, scope, receive, tape)
        except Exception as e:  # the worker stays up; the bot gets a bounded answer
            state.services.counters.child(metrics.serve_errors, "exception").inc()
            log.exception("bot request failed", url=decision.url, error=repr(e))
            reply, tape = error_reply(500, "internal error"), None
        asgi_headers = reply.asgi_headers()
        if tape is not None and memo is not None and shape is not None:
            memo.keep(shape, state, tape, reply, asgi_headers)
        await send({"type": "http.response.start", "status": reply.status, "headers": asgi_headers})
        await send({"type": "http.response.body", "body": reply.body})
