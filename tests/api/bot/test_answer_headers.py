"""What an answer says about itself, through the real app in process over ASGI with a real page store:
``Vary`` names every request header that chose the answer (the device header, the user agent when it
can choose Markdown), and ``Last-Modified`` is never later than ``Date`` (RFC 9110 section 8.8.2.1),
on every path: a framed hit, a prepared one, a 304, HEAD, an origin relay; over real HTTP, one Date."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import time
from collections.abc import AsyncIterator
from email.utils import formatdate, parsedate_to_datetime

import httpx
import pytest
import uvicorn

from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.replica import close_replica, open_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.api.server import server_config
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.serving.framing import encode_page
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Clock, wrap
from prerender_ray.storage.rocks import PAGES, Store, store_path
from tests.api.live_server import uvicorn_logging_kept
from tests.api.origin_site import JS_PAGE

UA = {"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"}
HTML = b"<html><head><title>t</title></head><body><p>rendered</p></body></html>"
FUTURE = "Fri, 01 Jan 2100 00:00:00 GMT"  # written by a node whose clock runs far ahead
PAST = "Wed, 01 Jan 2025 00:00:00 GMT"


class Node:
    def __init__(self, asgi, ctx: NodeContext, primary: Store, base: str):
        self.asgi, self.ctx, self.primary, self.base = asgi, ctx, primary, base
        self.clock = Clock("n1")

    def store(self, path: str, device: str = "desktop", *, modified: str = PAST, framed: bool = True) -> str:
        url = f"{self.base}{path}"
        now = int(time.time() * 1000)
        page = Page(cache_key=f"{url}|{device}", status_code=200, content=gzip.compress(HTML + device.encode()),
                    last_cached=now - 2_000, expires_at=now + 60_000, is_indexable=True,
                    headers={"content-type": "text/html; charset=utf-8", "content-encoding": "gzip",
                             "etag": f'"{device}"', "last-modified": modified})
        self.primary.put(page.cache_key.encode(), wrap(self.clock.now(), encode_page(page) if framed else page.encode()))
        open_replica(self.ctx).services.pages.catch_up(force=True)
        return url

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.asgi), base_url="http://t")


@contextlib.asynccontextmanager
async def serving(tmp_path, site, **options: object) -> AsyncIterator[Node]:
    cfg = Config.model_validate({"domains": [f"127.0.0.1:{site.port}"], "server": {"data_dir": str(tmp_path)},
                                 **options})
    primary = Store(store_path(tmp_path, "n1", PAGES))
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    try:
        yield Node(create_asgi(ctx), ctx, primary, site.base)
    finally:
        await close_replica(ctx)
        primary.close()


def _vary(r: httpx.Response) -> set[str]:
    """Every Vary token, over all its field lines, lower-cased."""
    return {t.strip().lower() for k, v in r.headers.multi_items() if k == "vary" for t in v.split(",")}


# -------------------------------------------------------------------------------------------- Vary


async def test_the_device_header_is_named_in_vary_whenever_it_chose_the_answer(tmp_path, site) -> None:
    # Before: x-device-type chose the render (the cache key's device) but Vary named only
    # Accept-Encoding, so a shared cache in front gave the desktop render to a phone.
    async with serving(tmp_path, site) as n, n.client() as c:
        url = n.store("/page/a", "desktop")
        n.store("/page/a", "mobile")
        for device in ("mobile", "desktop", None):
            headers = {**UA, "accept-encoding": "gzip", **({"x-device-type": device} if device else {})}
            r = await c.get(f"/p/{url}", headers=headers)
            assert r.status_code == 200 and r.content.endswith((device or "desktop").encode())
            assert {"x-device-type", "accept-encoding"} <= _vary(r), r.headers
            r = await c.get(f"/p/{url}", headers={**headers, "if-none-match": f'"{device or "desktop"}"'})
            assert r.status_code == 304 and "x-device-type" in _vary(r)
            r = await c.head(f"/p/{url}", headers=headers)
            assert "x-device-type" in _vary(r)
        r = await c.get(f"/p/{site.base}/page/never-stored", headers={**UA, "x-device-type": "mobile"})
        assert r.status_code == 200 and "x-device-type" in _vary(r)  # fetched with the mobile user agent


async def test_forwarded_mode_names_its_configured_device_header(tmp_path, site) -> None:
    fwd = {"x-forwarded-host": f"127.0.0.1:{site.port}", "x-forwarded-proto": "http", "cdn-device": "mobile"}
    async with serving(tmp_path, site, ingress={"mode": "forwarded", "deviceTypeHeader": "CDN-Device",
                                                "routes": [{"match": "prefix", "path": "/page/"}]}) as n, \
            n.client() as c:
        n.store("/page/f", "mobile")
        r = await c.get("/page/f", headers={**UA, **fwd})
        assert r.status_code == 200 and r.content.endswith(b"mobile")
        assert "cdn-device" in _vary(r) and "x-device-type" not in _vary(r)


@pytest.mark.parametrize("options", [
    {"ingress": {"mode": "forwarded", "deviceTypeSource": "path", "routes": [{"match": "prefix", "path": "/page/"}]}},
    {"deviceTypes": {"supported": ["desktop"], "default": ["desktop"]}},
], ids=["device-from-path", "one-device"])
async def test_no_device_header_in_vary_when_no_header_chose_the_device(tmp_path, site, options) -> None:
    fwd = {"x-forwarded-host": f"127.0.0.1:{site.port}", "x-forwarded-proto": "http"}
    async with serving(tmp_path, site, **options) as n, n.client() as c:
        by_path = options["ingress"] if "ingress" in options else None
        n.store("/page/p", "mobile" if by_path else "desktop")
        r = await (c.get("/mobile/page/p", headers={**UA, **fwd}) if by_path
                   else c.get(f"/p/{n.base}/page/p", headers={**UA, "x-device-type": "mobile"}))
        assert r.status_code == 200 and r.content.endswith(b"mobile" if by_path else b"desktop")
        assert "x-device-type" not in _vary(r) and "accept-encoding" in _vary(r)


async def test_the_user_agent_is_named_when_it_can_choose_markdown(tmp_path, site) -> None:
    async with serving(tmp_path, site, markdown={"enabled": True, "forBots": ["Googlebot"]}) as n, n.client() as c:
        url = n.store("/page/m")
        md = await c.get(f"/p/{url}", headers={**UA, "accept-encoding": "gzip"})
        assert md.headers["content-type"].startswith("text/markdown")
        html = await c.get(f"/p/{url}", headers={"user-agent": "Bingbot/2.0", "accept-encoding": "gzip"})
        assert html.headers["content-type"].startswith("text/html")
        for r in (md, html):
            assert {"user-agent", "accept"} <= _vary(r), r.headers
    async with serving(tmp_path / "plain", site, markdown={"enabled": True}) as n, n.client() as c:
        r = await c.get(f"/p/{n.store('/page/m')}", headers={**UA, "accept-encoding": "gzip"})
        assert "accept" in _vary(r) and "user-agent" not in _vary(r)  # only Accept chooses


# ------------------------------------------------------------------------------ browser navigations

NAVIGATIONS = [  # what a browser adds when it shows the answer as a document
    {"sec-fetch-mode": "navigate", "sec-fetch-dest": "document", "sec-fetch-site": "none"},
    {"sec-fetch-mode": "navigate"},
    {"sec-fetch-dest": "document"},
    {"sec-fetch-dest": "iframe", "sec-fetch-mode": "navigate", "sec-fetch-site": "cross-site"},
    {"sec-fetch-dest": "embed", "sec-fetch-mode": "no-cors"},
    # over plain http a browser sends no Sec-Fetch headers (only to https and localhost), but this
    {"user-agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0.0.0", "upgrade-insecure-requests": "1"},
    {"upgrade-insecure-requests": "1"},
]
NOT_NAVIGATIONS = [  # a crawler's fetcher sends none; a browser's image or fetch() shows nothing as a page
    {},
    {"user-agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0.0.0"},
    {"sec-fetch-dest": "image", "sec-fetch-mode": "no-cors"},
    {"sec-fetch-dest": "empty", "sec-fetch-mode": "cors"},
    {"sec-fetch-dest": "empty", "sec-fetch-mode": "cors", "upgrade-insecure-requests": "1"},  # Sec-Fetch decides
    {"upgrade-insecure-requests": "0"},
]
NAVIGATION_VARY = {"sec-fetch-mode", "sec-fetch-dest", "upgrade-insecure-requests"}


async def test_a_browser_navigation_gets_every_bot_answer_sandboxed(tmp_path, site) -> None:
    """The bot path shares the console's origin: a page relayed or cached from an allowed site, shown
    by a browser, must not run its scripts as the node's origin (they could call the admin API with the
    admin's credentials). Crawlers send neither Sec-Fetch headers nor Upgrade-Insecure-Requests and
    get the answer as before."""
    async with serving(tmp_path, site) as n, n.client() as c:
        hit = n.store("/page/nav")
        for extra in [*NAVIGATIONS, *NOT_NAVIGATIONS]:
            navigation = extra in NAVIGATIONS
            headers = {**UA, "accept-encoding": "gzip", **extra}
            for method, target, status in (
                ("GET", f"/p/{site.base}/page/js-miss", 200),  # a miss: the origin's page, its script relayed
                ("POST", f"/p/{site.base}/echo", 200),  # proxied to the origin
                ("GET", f"/p/{hit}", 200),  # a cached hit
                ("HEAD", f"/p/{hit}", 200),
                ("GET", f"/p/{site.base}/missing", 404),  # the origin's error page
                ("GET", "/p/https://not-allowed.test/x", 403),  # ours
            ):
                r = await c.request(method, target, headers=headers)
                assert r.status_code == status, (target, r.status_code)
                csp = r.headers.get_list("content-security-policy")
                assert csp == (["sandbox"] if navigation else []), (extra, method, target, r.headers)
                # a shared cache in front never gives the sandboxed answer to a crawler
                assert (NAVIGATION_VARY <= _vary(r)) == navigation, r.headers
                assert navigation or not NAVIGATION_VARY & _vary(r), r.headers  # a bot's Vary as it was
            r = await c.get(f"/p/{hit}", headers={**headers, "if-none-match": '"desktop"'})
            assert r.status_code == 304
            assert r.headers.get_list("content-security-policy") == (["sandbox"] if navigation else [])
        assert r.content == b""
        r = await c.get("/healthz", headers={**UA, **NAVIGATIONS[0]})  # not the bot path
        assert "content-security-policy" not in r.headers


# ------------------------------------------------------------------------------------------ dates


def _dated(r: httpx.Response, before: float) -> tuple[float, float | None]:
    dates = r.headers.get_list("date")
    assert len(dates) == 1, r.headers
    date = parsedate_to_datetime(dates[0]).timestamp()
    assert int(before) <= date <= time.time()
    modified = r.headers.get("last-modified")
    return date, None if modified is None else parsedate_to_datetime(modified).timestamp()


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "prepared"])
async def test_last_modified_is_never_later_than_date(tmp_path, site, framed: bool) -> None:
    # Before: Date came from uvicorn's once-a-second timer and Last-Modified from the writer's clock,
    # so 21 of 72 fresh hits were dated before they were last modified.
    async with serving(tmp_path, site) as n, n.client() as c:
        url = n.store("/page/d", modified=FUTURE, framed=framed)
        old = n.store("/page/old", modified=PAST, framed=framed)
        asks = [("GET", {}), ("HEAD", {}), ("GET", {"if-none-match": '"desktop"'}),
                ("GET", {"if-modified-since": FUTURE}), ("GET", {"x-harper-prerender-debug": "1"}),
                ("GET", {"accept-encoding": "identity"})]
        for method, extra in asks:
            before = time.time()
            r = await c.request(method, f"/p/{url}", headers={**UA, "accept-encoding": "gzip", **extra})
            assert r.status_code in (200, 304)
            date, modified = _dated(r, before)
            assert modified == date, (method, extra, r.headers)
            r = await c.request(method, f"/p/{old}", headers={**UA, "accept-encoding": "gzip", **extra})
            assert r.headers["last-modified"] == PAST  # an earlier one is kept as it is
        before = time.time()
        r = await c.get(f"/p/{site.base}/future-modified", headers=UA)  # an origin answer, relayed
        assert r.status_code == 200 and r.content == JS_PAGE
        date, modified = _dated(r, before)
        assert modified == date
        _dated(await c.get("/healthz"), before)  # every answer has its Date, the app's routes too


@pytest.fixture
def uvicorn_logging():
    with uvicorn_logging_kept():
        yield


async def test_over_real_http_there_is_one_date(tmp_path, site, uvicorn_logging) -> None:
    """uvicorn's own Date is off in the replica's server config: ours is the only one."""
    async with serving(tmp_path, site) as n:
        url = n.store("/page/h", modified=formatdate(time.time() + 3600, usegmt=True))
        server = uvicorn.Server(server_config(n.asgi, n.ctx.cfg))
        sock = socket.create_server(("127.0.0.1", 0))
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    await asyncio.sleep(0.01)
            port = sock.getsockname()[1]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
                before = time.time()
                r = await c.get(f"/p/{url}", headers={**UA, "accept-encoding": "gzip"})
                assert r.status_code == 200
                date, modified = _dated(r, before)
                assert modified == date
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)
            sock.close()
