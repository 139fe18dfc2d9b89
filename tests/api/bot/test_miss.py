"""The bot path's per-replica machinery without Ray: the app served in-process over ASGI with a real
page store in a temp dir (a RocksDB primary written as the NodeStore writes it), batched metrics and
the remembered ingress decisions."""

from __future__ import annotations

import gzip
import time
from pathlib import Path
from typing import Any

import brotli
import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram

from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.counters import _observe_many
from prerender_ray.api.bot.replica import close_replica, open_replica, reserved_of
from prerender_ray.api.context import NodeContext
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Clock, wrap
from prerender_ray.storage.rocks import PAGES, Store, store_path

URL = "https://x.example/a"
HTML = b"<html><body>" + b"<p>x</p>" * 100 + b"</body></html>"


async def origin_replica(handle: Any, tmp_path: Path, config: dict | None = None) -> tuple[Any, str, Config, NodeContext]:
    """An origin on 127.0.0.1 answering with ``handle``, and a replica's context whose ``domains``
    allow just it (``config`` merged over that, its ``server`` section too): (the origin's server,
    its host:port, the config, the context)."""
    import asyncio

    origin = await asyncio.start_server(handle, "127.0.0.1", 0)
    at = f"127.0.0.1:{origin.sockets[0].getsockname()[1]}"
    raw = {"domains": [at], **(config or {})}
    raw["server"] = {"data_dir": str(tmp_path), **raw.get("server", {})}
    cfg = Config.model_validate(raw)
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    return origin, at, cfg, ctx


@pytest.fixture
async def app(tmp_path):
    cfg = Config.model_validate({"domains": ["x.example"], "server": {"data_dir": str(tmp_path)}})
    primary = Store(store_path(tmp_path, "n1", PAGES))
    now = int(time.time() * 1000)
    page = Page(cache_key=f"{URL}|desktop", status_code=200, content=gzip.compress(HTML), last_cached=now - 2_000,
                expires_at=now + 60_000, headers={"content-type": "text/html", "content-encoding": "gzip",
                                                   "etag": '"e1"'})
    primary.put(page.cache_key.encode(), wrap(Clock("n1").now(), page.encode()))
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    asgi = create_asgi(ctx)
    yield asgi, ctx
    await close_replica(ctx)
    primary.close()


async def test_hits_and_304s_are_served_in_process_and_counted_in_batches(app) -> None:
    asgi, ctx = app
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        for _ in range(3):
            r = await c.get(f"/p/{URL}", headers={"accept-encoding": "gzip", "user-agent": "Googlebot/2.1"})
            assert r.status_code == 200 and r.content == HTML and int(r.headers["age"]) >= 2
        r = await c.get(f"/p/{URL}", headers={"if-none-match": 'W/"e1"', "accept-encoding": "gzip"})
        assert r.status_code == 304 and r.content == b""
        assert (await c.get("/p/https://elsewhere.example/")).status_code == 403
        assert (await c.get("/healthz")).status_code == 200  # not a bot request: the routers answer
    counters = open_replica(ctx).services.counters
    pending = {labels: n for (metric, labels), n in counters._pending.items() if metric._name.endswith("bot_requests")}
    assert pending[("Googlebot", "desktop")] == 3
    counters.flush()
    assert counters._pending == {} and counters._observed == {}


async def test_ingress_decisions_are_remembered_per_input(app) -> None:
    _, ctx = app
    serving = open_replica(ctx)
    one = serving.resolve("GET", f"/p/{URL}", "", {"x-device-type": "mobile"})
    assert serving.resolve("GET", f"/p/{URL}", "", {"x-device-type": "mobile", "other": "x"}) is one
    assert serving.resolve("GET", f"/p/{URL}", "", {}) is not one
    assert one.cache_key == f"{URL}|mobile"


def test_batched_observations_equal_one_by_one_observations() -> None:
    values = [0.0, 59.9, 60, 61, 3600, 86_400 * 30, 5, 600.0001]
    buckets = (60, 600, 3600, 6 * 3600)
    one, batched = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("age", "a", buckets=buckets, registry=one)
    h2 = Histogram("age", "a", buckets=buckets, registry=batched)
    for v in values:
        h1.observe(v)
    _observe_many(h2, values)
    assert [(s.name, s.labels, s.value) for m in one.collect() for s in m.samples if "created" not in s.name] == \
           [(s.name, s.labels, s.value) for m in batched.collect() for s in m.samples if "created" not in s.name]


def _peer_rescue_node(tmp_path, owner_port: int) -> tuple[NodeContext, Store]:
    """Node n1 with peer rescue on, n2 (listening on ``owner_port``) owning about half the URLs, the
    origin on port 9 (nothing listens); its page store is opened, for the caller to close."""
    cfg = Config.model_validate({"domains": ["127.0.0.1:9"], "server": {"data_dir": str(tmp_path)},
                                 "peerRescue": {"enabled": True, "token": "peer-token"}})
    primary = Store(store_path(tmp_path, "n1", PAGES))
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    ctx.ownership.update(["n1", "n2"])
    ctx.peers = {"n1": ctx.node, "n2": NodeInfo("n2", "127.0.0.1", owner_port)}
    return ctx, primary


async def test_peer_rescue_asks_only_the_owners_address_from_the_node_list(tmp_path) -> None:
    """Whatever host or forwarding headers a request carries, the peer read goes to the address the
    cluster's membership gives for the URL's owner, and the origin policy still guards the fallback."""
    import asyncio

    asked: dict[str, list[bytes]] = {"owner": [], "canary": []}

    def recorder(name: str):
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                asked[name].append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()
        return answer

    owner = await asyncio.start_server(recorder("owner"), "127.0.0.1", 0)
    canary = await asyncio.start_server(recorder("canary"), "127.0.0.1", 0)
    canary_at = f"127.0.0.1:{canary.sockets[0].getsockname()[1]}"
    ctx, primary = _peer_rescue_node(tmp_path, owner.sockets[0].getsockname()[1])
    url = next(u for u in (f"http://127.0.0.1:9/p{i}" for i in range(100)) if ctx.owner_of(u) == "n2")
    asgi = create_asgi(ctx)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            hostile = {"host": canary_at, "x-forwarded-host": canary_at, "forwarded": f"host={canary_at}",
                       "x-harper-peer": canary_at}
            r = await c.get(f"/p/{url}", headers=hostile)
        assert r.status_code == 502  # nothing listens on the origin's port 9
    finally:
        await close_replica(ctx)
        primary.close()
        owner.close()
        canary.close()
    assert len(asked["owner"]) == 1 and asked["owner"][0].startswith(b"GET /prerender_peer/page?key=")
    assert asked["canary"] == []


@pytest.mark.parametrize("mode", ["forwarded", "prefix"])
def test_every_route_of_the_built_app_is_reserved_from_the_bot_path(mode: str) -> None:
    """Derived from the app itself, so a new route cannot be forgotten: even a catch-all prerender
    route (or a bot prefix of ``/``) never turns an admin or fleet request into a bot request."""
    from fastapi.routing import iter_route_contexts

    from prerender_ray.api.app import create_app
    from prerender_ray.serving.classify import Ingress, NotBot

    cfg = Config.model_validate({"domains": ["x.example"], "ingress": {
        "mode": mode, "botPathPrefix": "/", "routes": [{"match": "prefix", "path": "/"}]}})
    ctx = NodeContext(cfg=cfg, node=NodeInfo("n1", "127.0.0.1", 1), data_dir="/nonexistent")
    app = create_app(ctx)
    ingress = Ingress(cfg, reserved_of(ctx))
    headers = {"x-forwarded-host": "x.example", "user-agent": "Googlebot/2.1"}
    routes = [(r.path, sorted(r.methods or ["GET"])) for r in iter_route_contexts(app.routes)]
    assert len(routes) > 30 and ("/render_targets", ["PUT"]) in routes
    for path, methods in routes:
        concrete = path.replace("{rest:path}", "a/b").replace("{name}", "x")
        assert "{" not in concrete, path
        for method in methods:
            assert ingress.resolve(method, concrete, "", headers) == NotBot("reserved"), (method, path)
    page = "/product/1" if mode == "forwarded" else "/https://x.example/product/1"
    assert type(ingress.resolve("GET", page, "", headers)).__name__ == "BotRequest"  # the rest is not
    app.state.sessions.close()


def _rendering_keeper(primary: Store, asked: list[str], html: bytes = HTML, coding: str = "identity"):
    """The owner's keeper: render-now asked, the fleet's render stored a moment later (``html`` as
    coded in ``coding``)."""
    import asyncio

    class Keeper:
        class render_now:  # noqa: N801 - a Ray handle's method is an attribute with .remote
            @staticmethod
            def remote(k: str):
                asked.append(k)

                async def later() -> None:
                    await asyncio.sleep(0.3)
                    headers = {"content-type": "text/html"}
                    if coding != "identity":
                        headers["content-encoding"] = coding
                    page = Page(cache_key=k, status_code=200, content=html, last_cached=int(time.time() * 1000),
                                expires_at=int(time.time() * 1000) + 60_000, headers=headers)
                    primary.put(k.encode(), wrap(Clock("n1").now(), page.encode()))

                asyncio.get_running_loop().create_task(later())

                async def answer() -> int:
                    return 0

                return answer()

    return Keeper()


def _on_miss_node(tmp_path, primary: Store, asked: list[str], html: bytes = HTML, coding: str = "identity",
                  markdown: dict | None = None, **more: dict):
    cfg = Config.model_validate({"domains": ["x.example"], "server": {"data_dir": str(tmp_path)},
                                 "render": {"onMiss": {"enabled": True, "waitMs": 5000}},
                                 "renderNow": {"pollIntervalMs": 20}, "markdown": markdown or {}, **more})
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path), keeper=_rendering_keeper(primary, asked, html, coding))
    return create_asgi(ctx), ctx


async def test_concurrent_first_visits_share_one_wait_and_one_render_now(tmp_path) -> None:
    """``render.onMiss``: three bots miss a never-cached page at once; one render-now reaches the
    owner, and all three get the page that render stores."""
    import asyncio

    primary = Store(store_path(tmp_path, "n1", PAGES))
    key = f"{URL}|desktop"
    asked: list[str] = []
    asgi, ctx = _on_miss_node(tmp_path, primary, asked)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            answers = await asyncio.gather(*(c.get(f"/p/{URL}", headers={"x-harper-prerender-debug": "1"})
                                             for _ in range(3)))
        for r in answers:
            assert r.status_code == 200 and r.content == HTML and r.headers["x-harper-render-now"] == "on-miss"
        assert asked == [key]  # one render-now for the three
    finally:
        await close_replica(ctx)
        primary.close()


async def test_on_miss_renders_take_from_the_sites_discovery_rate(tmp_path) -> None:
    """Before: every never-cached path a bot asked for cost a render, whoever asked and however many:
    a crowd of made-up paths kept the fleet busy. Now each first wait takes a token of the site's
    discovery rate (2 a minute here); past it the origin answers, as on any miss."""
    primary = Store(store_path(tmp_path, "n1", PAGES))
    asked: list[str] = []
    asgi, ctx = _on_miss_node(tmp_path, primary, asked, server={"data_dir": str(tmp_path), "replicas": 1},
                              bots={"discovery": {"perMinute": 2}})
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            answers = [await c.get(f"/p/{URL}-{i}", headers={"user-agent": "Googlebot/2.1"}) for i in range(4)]
        rendered = [r.headers.get("x-harper-render-now") for r in answers]
        assert rendered == ["on-miss", "on-miss", None, None]
        assert asked == [f"{URL}-0|desktop", f"{URL}-1|desktop"]
    finally:
        await close_replica(ctx)
        primary.close()


async def test_any_domain_off_loopback_asks_no_render_of_a_host_on_our_own_network(tmp_path, monkeypatch) -> None:
    # Before: a bot's miss of http://10.0.0.5/... made it due at once, and the fleet's browser loaded it
    # and stored what it saw for the bot (allowAnyDomain on a public listener, render.onMiss on).
    from prerender_ray.api import outbound

    async def resolve(host: str, port: int) -> list[str]:
        return {"shop.example": ["93.184.216.34"], "inside.example": ["10.0.0.5"]}.get(host, [host])

    monkeypatch.setattr(outbound, "_resolve", resolve)
    primary = Store(store_path(tmp_path, "n1", PAGES))
    asked: list[str] = []
    cfg = Config.model_validate({"domains": [], "allowAnyDomain": True,
                                 "server": {"host": "0.0.0.0", "data_dir": str(tmp_path)},
                                 "render": {"onMiss": {"enabled": True, "waitMs": 5000}},
                                 "renderNow": {"pollIntervalMs": 20}})
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path), keeper=_rendering_keeper(primary, asked))
    asgi = create_asgi(ctx)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            for url in ("http://10.0.0.5/admin", "http://inside.example/admin", "http://[::1]:8080/x",
                        "http://169.254.169.254/latest/meta-data/"):
                r = await c.get(f"/p/{url}", headers={"user-agent": "Googlebot/2.1"})
                assert r.status_code == 403 and "does not resolve to public addresses only" in r.text, (url, r.text)
                if "inside" in url:
                    assert "10.0.0.5" not in r.text  # what the node's DNS said stays with it
            assert asked == []  # no render asked: the fleet never loads them
            r = await c.get("/p/http://shop.example/a", headers={"user-agent": "Googlebot/2.1"})
            assert r.status_code == 200 and r.content == HTML  # a public host: rendered for its miss
            assert asked == ["http://shop.example/a|desktop"]
    finally:
        await close_replica(ctx)
        primary.close()


async def test_an_agent_that_asks_for_markdown_gets_the_page_rendered_for_its_miss_as_markdown(tmp_path) -> None:
    """The miss path's render (on-miss here, render-now alike) is a rendered page: an agent that
    prefers text/markdown gets it converted, as it would a cache hit; the origin's shell never is."""
    primary = Store(store_path(tmp_path, "n1", PAGES))
    page = b"<html><body><main><h1>Fresh widget</h1><p>Rendered for <b>this</b> miss.</p></main></body></html>"
    asgi, ctx = _on_miss_node(tmp_path, primary, [], page)
    md = {"accept": "text/markdown, text/html;q=0.9", "x-harper-prerender-debug": "1",
          "user-agent": "Mozilla/5.0 (compatible; ClaudeBot/1.0)"}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            r = await c.get(f"/p/{URL}", headers=md)
            assert r.status_code == 200 and r.headers["x-harper-render-now"] == "on-miss", r.headers
            assert r.headers["content-type"] == "text/markdown; charset=utf-8", r.headers
            assert "# Fresh widget" in r.text and "**this**" in r.text and "<p>" not in r.text
            assert "Accept" in r.headers["vary"].split(", ")
            assert r.headers["x-markdown-tokens"] == str(-(-len(r.content) // 4))
            r = await c.get(f"/p/{URL}", headers={**md, "accept": "text/html"})  # the same page, as HTML
            assert r.headers["content-type"].startswith("text/html") and r.content == page
            assert r.headers["link"] == f'<{URL}>; rel="alternate"; type="text/markdown"'
    finally:
        await close_replica(ctx)
        primary.close()


WIDE_TABLE = b"<html><body><table>" + (b"<tr>" + b"<td>x</td>" * 500 + b"</tr>") * 60 + b"</table></body></html>"


@pytest.mark.parametrize(("markdown", "html", "coding", "reason"), [
    ({"maxInputBytes": 4096}, gzip.compress(b"<p>" + b" " * (8 << 20) + b"</p>"), "gzip", "too-large"),  # a bomb
    ({"maxOutputBytes": 1024}, b"<main><p>" + b"many words " * 300 + b"</p></main>", "identity", "output-too-large"),
    ({"timeoutMs": 1}, WIDE_TABLE, "identity", "timeout"),
    ({}, HTML, "identity", "busy"),
])
async def test_a_hostile_render_for_a_miss_stays_within_the_conversion_caps(tmp_path, markdown, html, coding,
                                                                           reason) -> None:
    """The render an agent's miss waited for is converted under the same caps as a cached page's:
    input (decoded, a bomb included), output, the wait and conversions in flight; the agent then
    gets the rendered HTML saying why, never a 500."""
    primary = Store(store_path(tmp_path, "n1", PAGES))
    asgi, ctx = _on_miss_node(tmp_path, primary, [], html, coding, markdown)
    if reason == "busy":
        open_replica(ctx).services.converter.max_in_flight = 0
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            async with c.stream("GET", f"/p/{URL}", headers={"accept": "text/markdown", "accept-encoding": coding,
                                                             "x-harper-prerender-debug": "1"}) as r:
                raw = b"".join([part async for part in r.aiter_raw()])
            assert r.status_code == 200 and r.headers["x-harper-render-now"] == "on-miss", r.headers
            assert r.headers["x-harper-markdown-skipped"] == reason and raw == html  # as stored
            assert r.headers["content-type"] == "text/html" and "x-markdown-tokens" not in r.headers
    finally:
        await close_replica(ctx)
        primary.close()


class BodySink:
    """An origin on 127.0.0.1 that says when the first bytes of a request body arrive and whether a
    whole body did (Content-Length or chunked), then answers 200."""

    def __init__(self) -> None:
        import asyncio

        self.first = asyncio.Event()
        self.bodies: asyncio.Queue[tuple[dict[str, str], bytes, bool]] = asyncio.Queue()  # headers, bytes, complete

    async def handle(self, reader, writer) -> None:  # type: ignore[no-untyped-def]
        import asyncio

        head, data, complete = {}, b"", False
        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")[1:]
            head = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
            length = int(head.get("content-length", -1))
            while len(data) != length and not data.endswith(b"0\r\n\r\n"):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
                self.first.set()
            complete = len(data) == length or data.endswith(b"0\r\n\r\n")
            if complete:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nsunk")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        self.bodies.put_nowait((head, data, complete))
        writer.close()


async def test_a_bot_request_body_streams_to_the_origin_and_is_never_held_whole(tmp_path) -> None:
    """The bypass (methods other than GET and HEAD) relays a body as it arrives: the origin has its
    first bytes before the bot has sent the rest, and gets the bot's framing. A body over
    ``server.maxBodyBytes`` is a 413, and the origin never gets it looking complete."""
    import asyncio

    from tests.api.live_server import connect, response, serving

    sink = BodySink()
    origin, at, cfg, ctx = await origin_replica(sink.handle, tmp_path, {"server": {"maxBodyBytes": 300_000}})
    body = bytes(range(256)) * 1000
    try:
        async with serving(create_asgi(ctx), cfg) as port:
            r, w = await connect(port)
            w.write(f"POST /p/http://{at}/sink HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                    + body[:100_000])
            await asyncio.wait_for(sink.first.wait(), 15)  # before the bot sends the rest
            w.write(body[100_000:])
            assert await response(r) == (200, b"sunk")
            head, got, complete = await asyncio.wait_for(sink.bodies.get(), 15)
            assert got == body and complete and head["content-length"] == str(len(body))
            assert "transfer-encoding" not in head

            w.write(f"POST /p/http://{at}/sink HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n".encode())
            for _ in range(5):  # 5 x 64 KiB: over the cap on the fifth
                w.write(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
            status, message = await response(r)
            assert status == 413 and b"larger than 300000 bytes" in message
            _, cut, complete = await asyncio.wait_for(sink.bodies.get(), 15)
            assert not complete and len(cut) < 300_000  # cut off: never complete at the origin
            w.close()
    finally:
        await close_replica(ctx)
        origin.close()



class GatedOrigin:
    """An origin on 127.0.0.1 whose page waits for ``open`` before it answers: 206 and one byte to a
    request with a Range (``always_partial``: to every request), else 200 and the whole page. Records
    the head of every request."""

    def __init__(self, *, always_partial: bool = False) -> None:
        import asyncio

        self.always_partial = always_partial
        self.open = asyncio.Event()
        self.heads: list[dict[str, str]] = []
        self.arrived = asyncio.Event()  # a request reached the origin

    async def handle(self, reader, writer) -> None:  # type: ignore[no-untyped-def]
        import asyncio

        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")[1:]
            head = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
            self.heads.append(head)
            self.arrived.set()
            await asyncio.wait_for(self.open.wait(), 15)
            if "range" in head or self.always_partial:
                writer.write(b"HTTP/1.1 206 Partial Content\r\ncontent-type: text/html\r\n"
                             b"content-range: bytes 0-0/*\r\ncontent-length: 1\r\n\r\nX")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(HTML), HTML))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        writer.close()


async def _misses_at_once(tmp_path, origin: GatedOrigin, *extras: str) -> list[tuple[int, bytes]]:
    """One miss per ``extras`` (extra header lines), each sent once the ones before it reached the shared
    fetch (the origin client's ``collapsed``, counted by a spy); the origin answers once all have."""
    import asyncio

    from tests.api.live_server import WAIT_S, connect, request, response, serving

    server, at, cfg, ctx = await origin_replica(origin.handle, tmp_path)
    asgi = create_asgi(ctx)
    client = open_replica(ctx).services.origin
    collapsed, joined = client.collapsed, asyncio.Queue()  # type: ignore[var-annotated]

    async def spied(key, start):  # type: ignore[no-untyped-def]
        joined.put_nowait(key)
        return await collapsed(key, start)

    client.collapsed = spied  # type: ignore[method-assign]
    try:
        async with serving(asgi, cfg) as port:
            conns, answers = [], []
            for extra in extras:
                r, w = await connect(port)
                w.write(request(f"/p/http://{at}/gated", extra=f"user-agent: Googlebot/2.1\r\n{extra}"))
                conns.append((r, w))
                await asyncio.wait_for(joined.get(), WAIT_S)
            origin.open.set()
            for r, w in conns:
                answers.append(await response(r))
                w.close()
            return answers
    finally:
        await close_replica(ctx)
        server.close()


async def test_a_miss_never_gets_an_answer_shaped_by_another_bots_headers(tmp_path) -> None:
    """An attacker's ``Range: bytes=0-0`` miss in flight must not hand a Googlebot miss of the same page
    a 206 with one byte: Range never reaches the origin, and misses whose forwarded headers differ
    (here X-Forwarded-Host) fetch apart."""
    origin = GatedOrigin()
    ranged, plain = await _misses_at_once(tmp_path, origin, "range: bytes=0-0\r\n", "")
    assert plain == (200, HTML) and ranged == (200, HTML)
    assert origin.heads and all("range" not in head for head in origin.heads)

    origin = GatedOrigin()
    (tmp_path / "b").mkdir()
    evil, plain = await _misses_at_once(tmp_path / "b", origin, "x-forwarded-host: evil.example\r\n", "")
    assert evil == plain == (200, HTML)
    assert [head.get("x-forwarded-host") for head in origin.heads] == ["evil.example", None]


async def test_identical_concurrent_misses_still_share_one_origin_fetch(tmp_path) -> None:
    origin = GatedOrigin()
    answers = await _misses_at_once(tmp_path, origin, "", "", "")
    assert answers == [(200, HTML)] * 3 and len(origin.heads) == 1


async def test_misses_that_differ_only_in_who_the_client_is_share_one_origin_fetch(tmp_path) -> None:
    """Behind a CDN every request names its client (X-Forwarded-For, a trace id): still one fetch,
    which carries the first client's request id and no client address (it is made for both)."""
    origin = GatedOrigin()
    answers = await _misses_at_once(tmp_path, origin, "x-forwarded-for: 192.0.2.1\r\ncf-ray: a1\r\n",
                                    "x-forwarded-for: 192.0.2.2\r\ncf-ray: b2\r\n")
    assert answers == [(200, HTML)] * 2
    assert [(h.get("x-forwarded-for"), h.get("cf-ray")) for h in origin.heads] == [(None, "a1")]


async def test_an_origin_206_to_a_whole_page_request_is_a_502_not_a_page(tmp_path) -> None:
    """Nothing we send asks for a range: a 206 is a broken origin, and its byte is not a page."""
    origin = GatedOrigin(always_partial=True)
    [(status, body)] = await _misses_at_once(tmp_path, origin, "")
    assert status == 502 and b"origin-protocol" in body


@pytest.mark.parametrize(("status", "lines"), [(404, 0), (500, 1)])
async def test_peer_rescue_logs_no_404_and_each_other_failure_at_most_once(tmp_path, status: int, lines: int) -> None:
    """An owner's 404 is the normal answer for a URL nobody cached: before, each one logged a line with
    the whole cache key (up to ~8 KB); another failure is logged once a minute, its key clipped."""
    import asyncio

    from structlog.testing import capture_logs

    from prerender_ray.api.bot.miss import LOGGED_KEY_CHARS

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(f"HTTP/1.1 {status} No\r\ncontent-length: 0\r\n\r\n".encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    owner = await asyncio.start_server(answer, "127.0.0.1", 0)
    ctx, primary = _peer_rescue_node(tmp_path, owner.sockets[0].getsockname()[1])
    long = "q" * 4_000
    urls = [u for u in (f"http://127.0.0.1:9/p{i}/{long}" for i in range(400)) if ctx.owner_of(u) == "n2"][:100]
    assert len(urls) == 100
    asgi = create_asgi(ctx)
    try:
        with capture_logs() as logged:
            start = time.monotonic()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
                for url in urls:
                    assert (await c.get(f"/p/{url}")).status_code == 502  # the origin's port 9: nothing
            minutes = int((time.monotonic() - start) // 60)  # a slow machine may pass into the next minute
    finally:
        await close_replica(ctx)
        primary.close()
        owner.close()
    failed = [e for e in logged if e["event"] == "peer rescue failed"]
    assert lines <= len(failed) <= lines * (1 + minutes), failed
    assert all(len(e["key"]) <= LOGGED_KEY_CHARS for e in failed)


async def test_other_methods_can_be_refused_and_then_nothing_reaches_the_origin(tmp_path) -> None:
    """``origin.proxyOtherMethods: false``: a bot's POST is a 405 naming what is served, and the origin
    (which might let the security token skip its firewall) gets no connection."""

    from tests.api.live_server import connect, response, serving

    connected = []

    async def count(reader, writer) -> None:  # type: ignore[no-untyped-def]
        connected.append(await reader.read(65536))
        writer.close()

    origin, at, cfg, ctx = await origin_replica(count, tmp_path, {"origin": {"proxyOtherMethods": False}})
    try:
        async with serving(create_asgi(ctx), cfg) as port:
            r, w = await connect(port)
            for method in ("POST", "PUT", "DELETE", "OPTIONS"):
                w.write(f"{method} /p/http://{at}/sink HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\na=1".encode())
                status, message = await response(r)
                assert status == 405 and b"GET and HEAD are" in message, (method, message)
            w.close()
        assert connected == []
    finally:
        origin.close()


async def test_only_the_listed_methods_reach_the_origin_and_trace_never_does(tmp_path) -> None:
    """With ``proxyOtherMethods`` on, only POST, PUT, PATCH, DELETE and OPTIONS are proxied: an origin
    (or a balancer before it) that reflects TRACE would echo the request head, security token
    included, back to the bot. TRACE, TRACK and methods we do not proxy are a 405 naming what is
    served (or the parser's 400 for one it does not know), and the origin gets no connection; a
    proxied OPTIONS carries no Max-Forwards."""
    import asyncio

    from tests.api.live_server import serving

    heads: list[bytes] = []

    async def record(reader, writer) -> None:  # type: ignore[no-untyped-def]
        try:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nseen")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            heads.append(b"")
        writer.close()

    origin, at, cfg, ctx = await origin_replica(record, tmp_path)
    refused = {}
    try:
        async with serving(create_asgi(ctx), cfg) as port, httpx.AsyncClient() as c:
            for method in ("TRACE", "TRACK", "PROPFIND", "PURGE", "CONNECT"):
                refused[method] = await c.request(method, f"http://127.0.0.1:{port}/p/http://{at}/echo",
                                                  headers={"max-forwards": "0"})
            assert heads == []
            r = await c.options(f"http://127.0.0.1:{port}/p/http://{at}/echo", headers={"max-forwards": "0"})
            assert (r.status_code, r.content) == (200, b"seen")
    finally:
        await close_replica(ctx)
        origin.close()
    for method in ("TRACE", "PROPFIND", "PURGE", "CONNECT"):
        r = refused[method]
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
        assert r.json()["error"] == f"{method} is not served to bots here; GET, HEAD, POST, PUT, PATCH, " \
                                    "DELETE and OPTIONS are"
    assert refused["TRACK"].status_code == 400  # a method the parser does not know
    [head] = heads  # the OPTIONS alone reached the origin
    assert head.startswith(b"OPTIONS /echo ") and b"max-forwards" not in head.lower()
    assert cfg.origin.security_token.header.lower().encode() in head.lower()


async def test_bypass_requests_dripping_bodies_cannot_take_the_connections_misses_need(tmp_path) -> None:
    """Each bypass request holds a pooled origin connection while its body drips in; past the bound
    (``max_bypass``, lowered here to 2) a further one is a 503 with Retry-After at once and reaches no
    origin, and a bot's GET miss still gets the origin's page."""
    import asyncio

    from tests.api.live_server import WAIT_S, connect, request, response, serving

    heads: list[bytes] = []
    posted = asyncio.Queue()  # type: ignore[var-annotated]

    async def origin_handle(reader, writer) -> None:  # type: ignore[no-untyped-def]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            if head.startswith(b"POST "):
                posted.put_nowait(head)
                await reader.read()  # the body never completes: until the bot hangs up
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(HTML), HTML))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    origin, at, cfg, ctx = await origin_replica(origin_handle, tmp_path)
    asgi = create_asgi(ctx)
    client = open_replica(ctx).services.origin
    client.max_bypass = 2
    dripping = []
    try:
        async with serving(asgi, cfg) as port:
            for _ in range(2):
                r, w = await connect(port)
                w.write(f"POST /p/http://{at}/form HTTP/1.1\r\nhost: t\r\ncontent-length: 100000\r\n\r\n".encode()
                        + b"a=1")
                dripping.append((r, w))
                await asyncio.wait_for(posted.get(), WAIT_S)
            async with httpx.AsyncClient(timeout=2) as c:  # at once: well within the origin's deadlines
                busy = await c.post(f"http://127.0.0.1:{port}/p/http://{at}/form", content=b"a=1")
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
            assert busy.json()["reason"] == "bypass-busy"
            r, w = await connect(port)
            w.write(request(f"/p/http://{at}/page", extra="user-agent: Googlebot/2.1\r\n"))
            assert await response(r) == (200, HTML)
            w.close()
            assert [h.split(b" ", 1)[0] for h in heads] == [b"POST", b"POST", b"GET"]
            for _, w in dripping:  # the bots hang up: their slots come back
                w.close()
            async with asyncio.timeout(WAIT_S):
                while client.bypassing:
                    await asyncio.sleep(0.01)
    finally:
        await close_replica(ctx)
        origin.close()


SPOOFED_ADDRESS = ("x-forwarded-for: 203.0.113.9\r\nx-real-ip: 203.0.113.10\r\ntrue-client-ip: 203.0.113.11\r\n"
                   "cf-connecting-ip: 203.0.113.12\r\nforwarded: for=203.0.113.13\r\n")


@pytest.mark.parametrize(("trusted", "chain", "seen"), [
    ([], "", "127.0.0.1"),  # the TCP peer, whatever the bot claims
    (["127.0.0.1"], "x-forwarded-for: 198.51.100.7\r\n", "198.51.100.7"),  # the client a trusted proxy names
])
async def test_the_origin_sees_the_client_we_know_never_the_one_a_bot_claims(tmp_path, trusted, chain, seen) -> None:
    """A bot's own X-Forwarded-For, X-Real-IP, True-Client-IP, CF-Connecting-IP and Forwarded never
    reach the origin, whose rate limits and allowlists would believe them: a bypass carries the address
    we know (the peer, or behind a trusted proxy the client it forwards for), a miss (a fetch shared by
    whichever bots miss the page together) none."""
    import asyncio

    from tests.api.live_server import connect, request, response, serving

    heads: list[bytes] = []

    async def record(reader, writer) -> None:  # type: ignore[no-untyped-def]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                           if line.startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            heads.append(head.lower())
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 4\r\n\r\nseen")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    origin, at, cfg, ctx = await origin_replica(record, tmp_path, {"server": {"trustedProxies": trusted}})
    # a trusted proxy appends the address it saw to what the client sent: the claims come first
    claims = SPOOFED_ADDRESS.replace("x-forwarded-for: 203.0.113.9", "x-forwarded-for: 203.0.113.9, 198.51.100.7") \
        if chain else SPOOFED_ADDRESS
    try:
        async with serving(create_asgi(ctx), cfg) as port:
            r, w = await connect(port)
            w.write(f"POST /p/http://{at}/form HTTP/1.1\r\nhost: t\r\n{claims}content-length: 3\r\n\r\na=1".encode())
            assert await response(r) == (200, b"seen")
            w.write(request(f"/p/http://{at}/page", extra=f"user-agent: Googlebot/2.1\r\n{claims}"))
            assert await response(r) == (200, b"seen")
            w.close()
    finally:
        await close_replica(ctx)
        origin.close()
    posted, fetched = heads
    assert posted.startswith(b"post ") and fetched.startswith(b"get ")
    assert f"\r\nx-forwarded-for: {seen}\r\n".encode() in posted
    assert b"x-forwarded-for" not in fetched
    for head in heads:
        assert b"203.0.113." not in head, head
        assert not any(name in head for name in (b"x-real-ip", b"true-client-ip", b"cf-connecting-ip", b"forwarded:"))


async def test_the_origin_is_asked_for_what_the_bot_accepts_so_nothing_is_decoded_for_it(tmp_path) -> None:
    """A bot that does not accept gzip gets the origin's page as the origin coded it for identity: a
    few KB of gzip asked for every bot were decoded to up to ``server.maxHtmlBytes`` on the event loop,
    for a HEAD too. Misses in flight together that accept differently fetch apart, each its own."""
    import asyncio

    from tests.api.live_server import connect, request, response, serving

    page = b"<html><body>" + b"a" * 2_000_000 + b"</body></html>"
    zipped = gzip.compress(page, mtime=0)
    asked: list[str] = []

    async def coding(reader, writer) -> None:  # type: ignore[no-untyped-def]
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            accept = head.partition("\r\naccept-encoding: ")[2].partition("\r\n")[0]
            asked.append(accept)
            body, coded = (zipped, b"content-encoding: gzip\r\n") if "gzip" in accept else (page, b"")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\n%scontent-length: %d\r\n\r\n%s"
                         % (coded, len(body), body))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    origin, at, cfg, ctx = await origin_replica(coding, tmp_path)
    try:
        async with serving(create_asgi(ctx), cfg) as port:
            r, w = await connect(port)
            w.write(request(f"/p/http://{at}/plain", extra="user-agent: Googlebot/2.1\r\n"))
            assert await response(r) == (200, page)
            w.write(request(f"/p/http://{at}/plain", extra="user-agent: Googlebot/2.1\r\naccept-encoding: gzip\r\n"))
            assert await response(r) == (200, zipped)
            w.close()
    finally:
        await close_replica(ctx)
        origin.close()
    assert asked == ["identity", "gzip"]

    (tmp_path / "b").mkdir()
    gated = GatedOrigin()
    answers = await _misses_at_once(tmp_path / "b", gated, "accept-encoding: gzip\r\n", "", "accept-encoding: br\r\n")
    [(s1, zipped_html), (s2, plain), (s3, for_br)] = answers  # the origin answers identity: ours re-code it
    assert (s1, s2, s3) == (200, 200, 200) and gzip.decompress(zipped_html) == HTML and plain == HTML
    assert brotli.decompress(for_br) == HTML
    assert [head["accept-encoding"] for head in gated.heads] == ["gzip", "identity"]
