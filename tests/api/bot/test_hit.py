"""A cache hit in process over ASGI, with a real page store in a temp dir: a page stored with its
frame (as a result stores it) answers every request exactly as the same page stored without one."""

from __future__ import annotations

import gzip
import time

import httpx
import pytest

from prerender_ray import metrics
from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.hit import Outcome
from prerender_ray.api.bot.pages import DecodedPages
from prerender_ray.api.bot.replica import close_replica, open_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.serving.framing import encode_page
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Clock, wrap
from prerender_ray.storage.rocks import PAGES, Store, store_path
from prerender_ray.storage.touches import Touch, touch_key

FRAMED, PLAIN, BROKEN = "https://x.example/framed", "https://x.example/plain", "https://x.example/broken"
HTML = b"<html><body>" + b"<p>x</p>" * 100 + b"</body></html>"
UA = {"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"}


def _page(url: str, now: int) -> Page:
    return Page(cache_key=f"{url}|desktop", status_code=200, content=gzip.compress(HTML), last_cached=now - 2_000,
                expires_at=now + 60_000, is_indexable=True,
                headers={"content-type": "text/html", "content-encoding": "gzip", "etag": '"e1"',
                         "last-modified": "Wed, 01 Jan 2025 00:00:00 GMT", "link": "</a.js>; rel=preload"})


@pytest.fixture
async def app(tmp_path):
    cfg = Config.model_validate({"domains": ["x.example"], "server": {"data_dir": str(tmp_path)}})
    primary = Store(store_path(tmp_path, "n1", PAGES))
    now = int(time.time() * 1000)
    clock = Clock("n1")
    primary.put(f"{FRAMED}|desktop".encode(), wrap(clock.now(), encode_page(_page(FRAMED, now))))
    primary.put(f"{PLAIN}|desktop".encode(), wrap(clock.now(), _page(PLAIN, now).encode()))
    broken = encode_page(_page(BROKEN, now)).replace(b'"etag"', b'"eta\x01"')  # headers that do not decode
    primary.put(f"{BROKEN}|desktop".encode(), wrap(clock.now(), broken))
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    asgi = create_asgi(ctx)
    yield asgi, ctx, primary, clock, now
    await close_replica(ctx)
    primary.close()


def _wire(r: httpx.Response) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The answer but its Date (the moment's, which the two requests may straddle)."""
    return r.status_code, [h for h in r.headers.raw if h[0] != b"date"], r.read()


REQUESTS = [
    {"accept-encoding": "gzip"}, {"accept-encoding": "gzip, deflate, br"}, {"accept-encoding": "br"},
    {"accept-encoding": "identity"}, {}, {"accept-encoding": "*"}, {"accept-encoding": "gzip;q=0"},
    {"accept-encoding": "gzip", "if-none-match": 'W/"e1"'}, {"accept-encoding": "gzip", "if-none-match": '"e2"'},
    {"accept-encoding": "gzip", "if-modified-since": "Wed, 01 Jan 2025 00:00:00 GMT"},
    {"accept-encoding": "gzip", "x-harper-prerender-debug": "1"},
]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_a_framed_page_answers_as_the_same_page_without_a_frame(app, method: str) -> None:
    asgi, ctx, *_ = app
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        for headers in REQUESTS:
            framed = _wire(await c.request(method, f"/p/{FRAMED}", headers={**UA, **headers}))
            plain = _wire(await c.request(method, f"/p/{PLAIN}", headers={**UA, **headers}))
            # The debug headers name the URL: the one difference the two may show.
            plain = (plain[0], [(k, v.replace(b"/plain", b"/framed")) for k, v in plain[1]], plain[2])
            assert framed == plain, headers
            assert framed[0] in (200, 304)
    assert open_replica(ctx).services.pages.get(f"{FRAMED}|desktop").frame is not None


async def test_a_freshness_record_gives_a_framed_page_its_new_age(app) -> None:
    asgi, ctx, primary, clock, now = app
    key = f"{FRAMED}|desktop"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        r = await c.get(f"/p/{FRAMED}", headers={**UA, "accept-encoding": "gzip"})
        assert int(r.headers["age"]) >= 2
        primary.put(touch_key(key), wrap(clock.now(), Touch(key, '"e1"', now + 100_000, now + 200_000).encode()))
        open_replica(ctx).services.pages.catch_up(force=True)
        r = await c.get(f"/p/{FRAMED}", headers={**UA, "accept-encoding": "gzip"})
        assert r.status_code == 200 and r.headers["age"] == "0" and r.content == HTML  # cached "later" than now


async def test_a_framed_page_whose_headers_do_not_decode_is_served_from_its_frame_and_unreadable_otherwise(
        app) -> None:
    asgi, ctx, *_ = app
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        r = await c.get(f"/p/{BROKEN}", headers={**UA, "accept-encoding": "gzip"})
        assert r.status_code == 200 and r.content == HTML  # the frame was written from good headers
    state = open_replica(ctx)
    req = state.resolve("GET", f"/p/{BROKEN}", "", {"accept-encoding": "identity"})
    page = state.services.pages.get(f"{BROKEN}|desktop")
    unreadable = state.services.counters.child(metrics.serve_errors, "page-unreadable")
    before = unreadable._value.get()
    assert state.hit.cached(req, page, int(time.time() * 1000), {"accept-encoding": "identity"}, Outcome("hit"),
                            False) is None  # needs the headers: unreadable, and the origin answers
    assert unreadable._value.get() == before + 1


JUNK = [f"br, a{i}" for i in range(1, 5)]  # four distinct values that all negotiate br


@pytest.mark.parametrize("url", [PLAIN, FRAMED])
async def test_distinct_accept_encoding_values_do_not_crowd_out_a_pages_negotiated_forms(app, prepares,
                                                                                        url: str) -> None:
    # Before: the forms were kept by the raw header, four a page: after four junk values every other
    # value (no Accept-Encoding included) was decoded and re-encoded on the loop, request after request.
    asgi, *_ = app
    calls = prepares
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        for value in JUNK:
            r = await c.get(f"/p/{url}", headers={**UA, "accept-encoding": value})
            assert r.headers["content-encoding"] == "br"
        assert len(calls) == 1  # one br form, whatever the value that asked for it
        for value in ("br, a5", "identity", None, "gzip;q=0, br;q=0"):
            calls.clear()
            for _ in range(10):
                r = await c.get(f"/p/{url}", headers=UA if value is None else {**UA, "accept-encoding": value})
                assert r.status_code == 200 and r.content == HTML
            assert len(calls) <= 1, value


async def test_a_form_shared_by_accept_encoding_values_answers_as_one_negotiated_afresh(app) -> None:
    asgi, ctx, *_ = app
    values = [None, "", "br", "gzip, deflate, br", "br;q=0.5, gzip", "x-gzip", "identity", "garbage;q=x", "*",
              "gzip;q=0", "*;q=0", "deflate", "br, gzip;q=0", "BR", "identity;q=0, br"]
    pages = open_replica(ctx).services.pages
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        for url in (PLAIN, FRAMED):
            for method in ("GET", "HEAD"):
                for value in values:
                    headers = UA if value is None else {**UA, "accept-encoding": value}
                    shared = _wire(await c.request(method, f"/p/{url}", headers=headers))
                    pages.decoded = DecodedPages()  # the page read and negotiated again, for this value alone
                    fresh = _wire(await c.request(method, f"/p/{url}", headers=headers))
                    # Age is the moment's: the two requests may straddle a second.
                    assert (shared[0], [h for h in shared[1] if h[0] != b"age"], shared[2]) == \
                           (fresh[0], [h for h in fresh[1] if h[0] != b"age"], fresh[2]), (url, method, value)
