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

from collections.abc import Awaitable
from typing import Any

from prerender_ray import logs, metrics
from prerender_ray.api.bot.decisions import Identity, identity_key
from prerender_ray.api.bot.hit import Outcome
from prerender_ray.api.bot.memo import Tape, request_shape
from prerender_ray.api.bot.pages import StoredPage, UnreadablePage
from prerender_ray.api.bot.replica import ReplicaState, open_replica
from prerender_ray.api.bot.wire import wire_reply
from prerender_ray.api.context import NodeContext
from prerender_ray.serving.answer import Reply, error_reply, route_label, verdict
from prerender_ray.serving.bot_policy import UNCHECKED, VERIFIED, Decision
from prerender_ray.serving.bots import OTHER
from prerender_ray.serving.classify import BadBotRequest, BotRequest, NotBot
from prerender_ray.serving.dates import Dater
from prerender_ray.serving.framing import sends_stored_coding
from prerender_ray.serving.indexnow import KeyFile
from prerender_ray.serving.negotiation import add_vary
from prerender_ray.serving.origin_rules import serving_policy
from prerender_ray.serving.responses import debug_requested
from prerender_ray.timeutil import now_ms

log = logs.get("bot")
SHAPE = "prerender.memo_shape"  # the scope's key for the request shape the HTTP protocol computed
REPLY = "prerender.reply"  # an answer the protocol made and counted but cannot write itself
# What a browser shows as a document of its own (Sec-Fetch-Dest), where the answer's scripts would run
DOCUMENT_DESTS = frozenset({"document", "iframe", "frame", "embed", "object"})
# What ``browser_navigation`` reads, so what a sandboxed answer varies by
NAVIGATION_HEADERS = ("Sec-Fetch-Mode", "Sec-Fetch-Dest", "Upgrade-Insecure-Requests")


async def serve(state: ReplicaState, req: BotRequest, headers: dict[str, str], scope: dict,
                receive: Any, tape: Tape | None = None, who: Identity | None = None, *,
                replay: bool = False, local_only: bool = False) -> Reply | None:
    """The answer to a bot request. ``tape`` (``api/bot/memo.py``) takes the counts and stats in
    place of the replica's own and writes them down, with what the answer depended on. ``who``: who
    asks, told apart already (``identify``); ``replay``: it comes from the decision memo
    (``api/bot/decisions.py``), and what telling it apart counted is done again. ``local_only``: only a plain hit of the local page log in its stored
    coding is answered (``local_hit``; it never waits); anything else is None, nothing done or counted."""
    now = now_ms()
    services = state.services
    counters: Any = services.counters if tape is None else tape
    if who is None:
        who = await identify(services, req, headers, scope, tape)
    name, verification, method, signed = who.name, who.verification, who.method, who.signed
    site = None
    if services.signals_on:
        if tape is not None:
            tape.sites = services.signals.sites
        site = services.signals.of(req.url)
    decision = state.policies.decide(name, verification, site, signed=method == "signature")
    debug = debug_requested(headers, state.debug_key)
    local = None
    if local_only:
        local = local_hit(state, req, headers, now, name, decision, debug)
        if local is None:
            return None
    if replay:  # what telling the bot apart counted, done again
        for fn, args in who.steps:
            fn(*args)
        if tape is not None:
            tape.steps.extend(who.steps)
            tape.checked = who.checked
    record = state.analytics and (name != OTHER or state.record_unmatched)
    bot = services.bot_label(name)
    if record:
        counters.count(metrics.bot_requests, bot, req.device)
    if services.report_unrouted and req.route_class != "prerender":
        if tape is None:
            _unrouted(services, now, req.route_class, _path_of(req.url))
        else:
            tape.at(_unrouted, now, req.route_class, _path_of(req.url))
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
        reply, out = await _cacheable(state, req, headers, now, debug, name, decision, local)
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
    if browser_navigation(headers):
        sandboxed(reply)
    if tape is not None:
        tape.now, tape.out, tape.plain = now, out, not debug and signed is None
    return reply


def browser_navigation(headers: dict[str, str]) -> bool:
    """A browser will show the answer as a page (a link followed, a frame); a crawler's fetcher sends
    neither Sec-Fetch headers nor ``Upgrade-Insecure-Requests``. Browsers send Sec-Fetch-* only to
    https and localhost (over http to a node's address, none), but ``Upgrade-Insecure-Requests: 1`` on
    every navigation, http included: it counts where no Sec-Fetch header says what the request is."""
    mode, dest = headers.get("sec-fetch-mode"), headers.get("sec-fetch-dest")
    if mode is None and dest is None:
        return headers.get("upgrade-insecure-requests", "").strip() == "1"
    return mode == "navigate" or (dest is not None and dest in DOCUMENT_DESTS)


def sandboxed(reply: Reply) -> None:
    """The bot path shares its origin with the admin console (one port): a page it relays or serves
    must not run as that origin. ``sandbox``: an opaque origin, no scripts (docs/security.md); Vary
    keeps a shared cache from giving this answer to a crawler (each header ``browser_navigation`` reads)."""
    headers = reply.headers
    policy = headers.get("content-security-policy")
    headers["content-security-policy"] = "sandbox" if policy is None else f"{policy}, sandbox"
    mode, dest, upgrade = NAVIGATION_HEADERS
    headers["vary"] = add_vary(add_vary(add_vary(headers.get("vary"), mode), dest), upgrade)


async def identify(services: Any, req: BotRequest, headers: dict[str, str], scope: dict,
                   tape: Tape | None = None) -> Identity:
    """Who asks: the bot's registry name, its verification (a Web Bot Auth signature, or the
    verifier's look-up of the client) and the method, from the request's headers and client (and, for
    a signature, its URL); the counts and stats it makes are written down in the identity, and on
    ``tape`` too when one is given."""
    own = Tape(services)
    name = services.bots.name_for(headers)
    verification, method = UNCHECKED, "none"
    signed = None
    claimed = services.bots.class_of(name)
    if services.web_bot_auth is not None:  # CPU only: keys held, never a fetch on this path
        signed = services.web_bot_auth.check(req.method, req.url, headers, name)
        if signed is not None:
            own.count(metrics.bot_signatures, signed.reason)
            if signed.reason != "bad-tag":  # not a web-bot-auth signature: as if unsigned
                _verified(own, claimed, "signature", signed.reason)
            verification = signed.state
            if verification == VERIFIED:
                method = "signature"
    verifier = services.verifier
    if verification != VERIFIED and verifier is not None and (how := verifier.method(name)) is not None:
        client = _client(services, scope, headers)
        verification, why = await verifier.check_why(name, client)
        method = how
        _verified(own, claimed, how, why)
        own.checked = (name, client, verification, why)
    if tape is not None:
        tape.steps.extend(own.steps)
        tape.checked = own.checked
    return Identity(name, verification, method, signed, own.checked, own.steps)


def local_hit(state: ReplicaState, req: BotRequest, headers: dict[str, str], now: int, bot: str,
              decision: Decision, debug: bool) -> StoredPage | None:
    """The page ``_cacheable`` would answer as a plain hit from the local page log in its stored
    coding (its frame: nothing is decoded, re-coded or counted on the way), or None; reads only."""
    if debug or decision.serve in ("deny", "origin") or not req.cacheable:
        return None
    pages = state.services.pages
    if pages.log is None:
        return None
    policy = serving_policy(state.cfg.render_now, route_class=req.route_class, method=req.method,
                            request_headers=headers)
    if policy.skip_cache:
        return None
    hit = state.hit
    try:
        page = pages.read_log(req.cache_key)
    except UnreadablePage:
        return None
    if page is None or page.status_code != 200 or verdict(page, now, hit.swr_ttl) != "hit":
        return None
    frame = page.frame
    if frame is None or not sends_stored_coding(frame, headers.get("accept-encoding")):
        return None
    if hit.markdown.wants(headers.get("accept"), bot, decision.bot_class):
        return None
    return page


def _verified(tape: Tape, cls: str, method: str, outcome: str) -> None:
    tape.count(metrics.bot_verifications, cls, method, outcome)
    tape.verified(cls, method, outcome)


def _unrouted(services: Any, now: int, route_class: str, path: str) -> None:
    bucket = services.unrouted.record(route_class, path, now)
    if bucket is not None:
        services.counters.count(metrics.unrouted, route_class, bucket)


async def _cacheable(state: ReplicaState, req: BotRequest, headers: dict[str, str], now: int,
                     debug: bool, bot: str, decision: Decision,
                     local: StoredPage | None = None) -> tuple[Reply, Outcome]:
    """``local``: the page ``local_hit`` found (a hit), read already."""
    policy = serving_policy(state.cfg.render_now, route_class=req.route_class, method=req.method,
                            request_headers=headers)
    hit = state.hit
    found: StoredPage | None = local
    status = "hit"
    if local is None:
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


def _shown(reply: Reply, headers: dict[str, str]) -> Reply:
    """``reply``, sandboxed if a browser will show it (``serve`` does this for its own answers)."""
    if browser_navigation(headers):
        sandboxed(reply)
    return reply


async def send_reply(send: Any, reply: Reply) -> None:
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.asgi_headers()})
    await send({"type": "http.response.body", "body": reply.body})


def _request_parts(scope: dict) -> tuple[str, str, dict[str, str]]:
    """The request's raw path (canonicalization must see the escapes the bot sent, not decoded ones),
    its query and its headers."""
    raw = scope.get("raw_path")
    path = raw.decode("utf-8", "surrogateescape").partition("?")[0] if raw else scope["path"]
    query = scope.get("query_string", b"").decode("utf-8", "surrogateescape")
    return path, query, _request_headers(scope)


def _own_file(state: ReplicaState, method: str, path: str, query: str,
              headers: dict[str, str]) -> Awaitable[Reply] | None:
    """The answer to a file we serve ourselves before any page decision, if the request asks for
    one: IndexNow's ``/<key>.txt`` of a configured host (to anyone), a configured site's
    ``/llms.txt``."""
    key_file = _key_file(state, method, path, query, headers)
    if key_file is not None:
        return _ready(key_file.reply(method))
    llms = state.services.llms
    site = _llms_site(state, method, path, query, headers)
    if llms is not None and site:
        return llms.answer(site, method, headers)
    return None


def _asks_own_file(state: ReplicaState, method: str, path: str, query: str, headers: dict[str, str]) -> bool:
    """Whether ``_own_file`` answers the request; no answer made (an llms.txt's is a coroutine)."""
    return _key_file(state, method, path, query, headers) is not None or bool(
        _llms_site(state, method, path, query, headers))


def _key_file(state: ReplicaState, method: str, path: str, query: str, headers: dict[str, str]) -> KeyFile | None:
    key_file = state.services.index_now_key
    if key_file is not None and method in ("GET", "HEAD") and key_file.asked(
            state.ingress.mode, state.ingress.prefix, state.ingress.host_header, path, query, headers):
        return key_file
    return None


def _llms_site(state: ReplicaState, method: str, path: str, query: str, headers: dict[str, str]) -> str | None:
    llms = state.services.llms
    return None if llms is None else llms.site_of(state.ingress, method, path, query, headers)


async def _ready(reply: Reply) -> Reply:
    return reply


def _request_headers(scope: dict) -> dict[str, str]:
    """Lowercase names (the server lowercases them); repeated fields joined by ", " as Node does,
    in the first one's place. Joined once per name: a string rebuilt per repeat made a head of many
    repeats quadratic (160,000 took 1.3 s of the loop)."""
    out: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    for k, v in scope["headers"]:
        name, value = k.decode("latin-1"), v.decode("latin-1")
        if name not in out:
            out[name] = value
        elif name in repeated:
            repeated[name].append(value)
        else:
            repeated[name] = [out[name], value]
    for name, values in repeated.items():
        out[name] = ", ".join(values)
    return out


class BotMiddleware:
    """ASGI: bot requests are answered here; everything else goes to ``app``."""

    def __init__(self, app: Any, ctx: NodeContext):
        self.app = app
        self.ctx = ctx

    def wire(self, scope: dict, dater: Dater, close: bool) -> list[Any] | None:
        """An answer the HTTP protocol sends itself (``api.connections.GuardedHttp``), for the
        ``scope`` uvicorn built: a memo hit (``HitMemo.wire``), or a plain local hit for a request
        whose bot the decision memo knows (``api/bot/decisions.py``), served and counted as the ASGI
        path would. None, nothing done: the request takes the ASGI path (a replica not opened yet
        opens there; an answer made here that the protocol cannot write rides on the scope)."""
        state = self.ctx.state
        if type(state) is not ReplicaState:
            return None
        services = state.services
        memo = services.memo
        if memo is None or services.pages.log is None:
            return None
        shape = scope[SHAPE] = request_shape(scope)  # the app's turn, if it comes, does not make it again
        if shape is None:
            return None
        now = now_ms()
        out = memo.wire(shape, state, now, dater, close)
        decisions = services.decisions
        if out is not None or decisions is None:
            return out
        keep = memo.seen(shape, now)  # its second sight, soon after the first: the full serve below keeps it
        key = identity_key(scope, shape[1][3])
        who = None if key is None else decisions.get(key, state, now)
        if who is None:
            return None
        path, query, headers = _request_parts(scope)
        if _asks_own_file(state, scope["method"], path, query, headers):
            return None
        req = state.resolved.resolve(scope["method"], path, query, headers)
        if type(req) is not BotRequest:
            return None
        lane, learn = services.lane, False  # the spread lane (api/bot/lane.py): its class's entry, or learn it
        if lane is not None and req.cacheable:
            site = services.signals.of(req.url) if services.signals_on else None
            lane_key = lane.key(who, site, req)
            entry = lane.find(lane_key, state, who, site, req, now)
            learn = entry is None
            if entry is not None and not keep and (
                    wired := lane.wire(entry, state, req, headers, now, dater, close)) is not None:
                memo.admits(shape, now)
                decisions.wired += 1
                return wired
        tape = Tape(services) if keep or learn else None
        run = serve(state, req, headers, scope, None, tape, who=who, replay=True, local_only=True)
        try:
            run.send(None)
        except StopIteration as done:
            reply = done.value
        else:  # local_hit reads only: it never waits
            run.close()
            raise RuntimeError("a local hit waited")
        if reply is None:
            return None
        memo.admits(shape, now)  # seen: its next sight, if soon, is kept whole
        if keep:
            assert tape is not None
            memo.keep(shape, state, tape, reply, reply.asgi_headers())
        wired = wire_reply(reply, scope["method"], dater, close)
        if wired is None:
            scope[REPLY] = reply  # served and counted: the ASGI path sends it as it is
        else:
            decisions.wired += 1
            if learn:
                assert tape is not None and lane is not None
                lane.learn(lane_key, state, who, site, req, headers, tape, reply, _page_age)
        return wired

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if REPLY in scope:
            await send_reply(send, scope.pop(REPLY))
            return
        state = self.ctx.state
        if type(state) is not ReplicaState:
            state = open_replica(self.ctx)
        services = state.services
        memo = services.memo
        shape = None
        if memo is not None and services.pages.log is not None:  # the hit memo (api/bot/memo.py)
            shape = scope[SHAPE] if SHAPE in scope else request_shape(scope)
            if shape is not None and await memo.answer(shape, state, now_ms(), send):
                return
        path, query, headers = _request_parts(scope)
        own = _own_file(state, scope["method"], path, query, headers)
        if own is not None:
            await send_reply(send, _shown(await own, headers))
            return
        decision = state.resolved.resolve(scope["method"], path, query, headers)
        if type(decision) is NotBot:
            if decision.detail:
                services.counters.warn_sometimes(decision.reason, "not a bot request", detail=decision.detail)
            await self.app(scope, receive, send)
            return
        if type(decision) is BadBotRequest:
            status = 403 if decision.reason == "host-not-allowed" else 400
            await send_reply(send, _shown(error_reply(status, decision.message, reason=decision.reason), headers))
            return
        decisions = services.decisions
        key = who = None
        if decisions is not None:  # the decision memo (api/bot/decisions.py)
            key = identity_key(scope, shape[1][3] if shape is not None else None)
            who = None if key is None else decisions.get(key, state, now_ms())
        tape = (Tape(state.services) if memo is not None and shape is not None and memo.admits(shape, now_ms())
                else None)
        try:
            replay = who is not None
            if who is None:
                who = await identify(services, decision, headers, scope, tape)
                if key is not None and decisions is not None:
                    decisions.keep(key, state, who, now_ms())
            reply = await serve(state, decision, headers, scope, receive, tape, who, replay=replay)
            assert reply is not None  # only local_only answers None
        except Exception as e:  # the worker stays up; the bot gets a bounded answer
            state.services.counters.child(metrics.serve_errors, "exception").inc()
            log.exception("bot request failed", url=decision.url, error=repr(e))
            reply, tape = _shown(error_reply(500, "internal error"), headers), None
        asgi_headers = reply.asgi_headers()
        if tape is not None and memo is not None and shape is not None:
            memo.keep(shape, state, tape, reply, asgi_headers)
        await send({"type": "http.response.start", "status": reply.status, "headers": asgi_headers})
        await send({"type": "http.response.body", "body": reply.body})
