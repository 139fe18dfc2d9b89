"""Markdown for agents through the real middleware, in process over ASGI, with a real page store in a
temp dir written as a result writes it (``tests/api/bot/test_hit.py``): an agent asking for
text/markdown gets the RENDERED page as Markdown; without a cached page it gets what any bot gets
(the origin's shell is never converted)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from prerender_ray import metrics
from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.markdown import Converted, MarkdownCache, Skipped
from prerender_ray.api.bot.replica import close_replica, open_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.serving.answer import Prepared
from prerender_ray.serving.framing import encode_page
from prerender_ray.storage.pages import Page, PageMeta
from prerender_ray.storage.replication import Clock, wrap
from prerender_ray.storage.rocks import PAGES, Store, store_path
from tests.api.origin_site import JS_PAGE

UA = {"user-agent": "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; ClaudeBot/1.0)"}
MD = {"accept": "text/markdown, text/html;q=0.9", "accept-encoding": "gzip"}
RENDERED = (b"<!doctype html><html><head><title>Widget</title></head><body><nav><a href='/'>Home</a></nav>"
            b"<div id=app><main><h1>The widget</h1><p>Rendered by the browser; see <a href='/specs'>the specs</a>."
            b"</p><table><tr><th>Size</th><th>Price</th></tr><tr><td>S</td><td>10</td></tr></table>"
            b"</main></div></body></html>")
WIDE_TABLE = b"<html><body><table>" + (b"<tr>" + b"<td>x</td>" * 500 + b"</tr>") * 60 + b"</table></body></html>"


class Site:
    def __init__(self, asgi, ctx: NodeContext, primary: Store, base: str):
        self.asgi, self.ctx, self.primary, self.base = asgi, ctx, primary, base
        self.clock = Clock("n1")
        self.now = int(time.time() * 1000)
        self.counted = _conversion_counts()

    def store(self, path: str, html: bytes = RENDERED, *, etag: str = '"e1"', status: int = 200,
              framed: bool = True, body: bytes | None = None) -> str:
        url = f"{self.base}{path}"
        page = Page(cache_key=f"{url}|desktop", status_code=status, is_indexable=True,
                    content=gzip.compress(html) if body is None else body, last_cached=self.now - 2_000,
                    expires_at=self.now + 60_000,
                    headers={"content-type": "text/html; charset=utf-8", "content-encoding": "gzip", "etag": etag,
                             "last-modified": "Wed, 01 Jan 2025 00:00:00 GMT", "cache-control": "max-age=60"})
        self.primary.put(page.cache_key.encode(), wrap(self.clock.now(), encode_page(page) if framed else page.encode()))
        open_replica(self.ctx).services.pages.catch_up(force=True)
        return url

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.asgi), base_url="http://t")

    def conversions(self) -> dict[str, int]:
        """The conversions counted since this site started, by outcome (the batched counts flushed)."""
        open_replica(self.ctx).services.counters.flush()
        now = _conversion_counts()
        return {k: int(n - self.counted.get(k, 0)) for k, n in now.items() if n != self.counted.get(k, 0)}


def _conversion_counts() -> dict[str, float]:
    return {sample.labels["outcome"]: sample.value for family in metrics.markdown_conversions.collect()
            for sample in family.samples if sample.name.endswith("_total")}


@contextlib.asynccontextmanager
async def serving(tmp_path, site, **markdown: object) -> AsyncIterator[Site]:
    cfg = Config.model_validate({"domains": [f"127.0.0.1:{site.port}"], "server": {"data_dir": str(tmp_path)},
                                 "markdown": markdown})
    primary = Store(store_path(tmp_path, "n1", PAGES))
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    try:
        yield Site(create_asgi(ctx), ctx, primary, site.base)
    finally:
        await close_replica(ctx)
        primary.close()


def _vary(r: httpx.Response) -> list[str]:
    """Every Vary token, over all its field lines, but the device header prefix mode names on every
    answer (tests/api/bot/test_answer_headers.py)."""
    return sorted(t.strip() for k, v in r.headers.multi_items() if k == "vary" for t in v.split(",")
                  if t.strip() != "x-device-type")


def _md(r: httpx.Response) -> str:
    assert r.headers["content-type"] == "text/markdown; charset=utf-8", r.headers
    return r.text


@pytest.mark.parametrize("framed", [True, False])
async def test_an_agent_gets_the_rendered_page_as_markdown(tmp_path, site, framed: bool) -> None:
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store("/page/md", framed=framed)
        r = await c.get(f"/p/{url}", headers={**UA, **MD})
        assert r.status_code == 200
        md = _md(r)
        assert md.startswith('---\ntitle: "Widget"\n---\n\n# The widget\n')
        assert "Rendered by the browser" in md and f"[the specs]({site.base}/specs)" in md
        assert "| Size | Price |" in md and "Home" not in md
        h = r.headers
        assert h["etag"] == '"e1-md"' and h["content-encoding"] == "gzip" and h["cache-control"] == "max-age=60"
        assert _vary(r) == ["Accept", "Accept-Encoding"]
        assert int(h["age"]) >= 2 and h["last-modified"] == "Wed, 01 Jan 2025 00:00:00 GMT"
        assert "x-harper-markdown-skipped" not in h and "link" not in h
        assert h["x-markdown-tokens"] == str(-(-len(md.encode()) // 4))  # bytes/4, rounded up
        # The HTML of the same URL says it varies by Accept too (a second field line), and where its
        # Markdown is: the same URL, asked for by Accept.
        html = await c.get(f"/p/{url}", headers={**UA, "accept": "text/html", "accept-encoding": "gzip"})
        assert html.content == RENDERED and html.headers["etag"] == '"e1"'
        assert _vary(html) == ["Accept", "Accept-Encoding"] and "x-markdown-tokens" not in html.headers
        assert html.headers["link"] == f'<{url}>; rel="alternate"; type="text/markdown"'
        # counted once, for ClaudeBot's class (the admin bots report; before: never, its content-type
        # is in the prepared reply's encoded headers)
        classes = open_replica(s.ctx).services.class_stats.snapshot()
        assert classes["ai-training"]["markdown"] == 1 and classes["ai-training"]["serves"] == 2


async def test_conditional_requests_and_head(tmp_path, site) -> None:
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store("/page/cond")
        get = await c.get(f"/p/{url}", headers={**UA, **MD})
        r = await c.get(f"/p/{url}", headers={**UA, **MD, "if-none-match": '"e1-md"'})
        assert r.status_code == 304 and r.content == b""
        assert r.headers["etag"] == '"e1-md"' and _vary(r) == ["Accept", "Accept-Encoding"]
        html = {**UA, "accept": "text/html", "accept-encoding": "gzip"}
        r = await c.get(f"/p/{url}", headers={**html, "if-none-match": '"e1"'})  # the HTML's 304 still varies
        assert r.status_code == 304 and _vary(r) == ["Accept", "Accept-Encoding"] and "link" not in r.headers
        head = await c.head(f"/p/{url}", headers=html)
        assert head.headers["link"] == (await c.get(f"/p/{url}", headers=html)).headers["link"]
        r = await c.get(f"/p/{url}", headers={**UA, **MD, "if-none-match": '"e1"'})  # the HTML's: not ours
        assert r.status_code == 200 and r.text == get.text
        head = await c.head(f"/p/{url}", headers={**UA, **MD})
        assert head.status_code == 200 and head.content == b""
        for name in ("content-type", "content-length", "content-encoding", "etag", "vary", "x-markdown-tokens"):
            assert head.headers[name] == get.headers[name]
        plain = await c.get(f"/p/{url}", headers={**UA, "accept": "text/markdown", "accept-encoding": "identity"})
        assert plain.text == get.text and "content-encoding" not in plain.headers
        assert plain.headers["etag"] == 'W/"e1-md"'  # re-coded: weak, still matches weakly
        r = await c.get(f"/p/{url}", headers={**UA, "accept": "text/markdown", "accept-encoding": "identity",
                                               "if-none-match": '"e1-md"'})
        assert r.status_code == 304


async def test_one_conversion_per_page_version_shared_by_concurrent_requests(tmp_path, site) -> None:
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store("/page/once")
        replies = await asyncio.gather(*(c.get(f"/p/{url}", headers={**UA, **MD}) for _ in range(6)))
        assert {r.text for r in replies} == {replies[0].text} and "# The widget" in replies[0].text
        await c.get(f"/p/{url}", headers={**UA, **MD})
        assert s.conversions() == {"converted": 1}
        # A new render is a new version: converted again, with its own ETag.
        s.store("/page/once", RENDERED.replace(b"The widget", b"The new widget"), etag='"e2"')
        r = await c.get(f"/p/{url}", headers={**UA, **MD})
        assert "# The new widget" in r.text and r.headers["etag"] == '"e2-md"'
        assert s.conversions() == {"converted": 2}


async def test_without_a_cached_page_an_agent_gets_the_origin_not_a_conversion_of_its_shell(tmp_path, site) -> None:
    async with serving(tmp_path, site) as s, s.client() as c:
        r = await c.get(f"/p/{site.base}/page/never-rendered", headers={**UA, **MD})
        assert r.status_code == 200 and r.content == JS_PAGE  # the shell, as any bot gets it today
        assert r.headers["content-type"].startswith("text/html")
        assert s.conversions() == {}


async def test_the_origins_answer_to_a_miss_varies_by_accept_while_markdown_is_on(tmp_path, site) -> None:
    """Once rendered, the URL answers Markdown to an agent's Accept: the origin's HTML for a miss says
    so too, or a shared cache hands it to the next agent. Merged with the origin's own Vary, never twice."""
    html = {**UA, "accept": "text/html", "accept-encoding": "gzip"}
    async with serving(tmp_path, site) as s, s.client() as c:
        r = await c.get(f"/p/{site.base}/page/miss-vary", headers=html)
        assert r.content == JS_PAGE and _vary(r) == ["Accept", "Accept-Encoding"], r.headers
        r = await c.get(f"/p/{site.base}/negotiates/miss-vary", headers=html)  # it says ``vary: accept``
        assert r.content == JS_PAGE and _vary(r) == ["Accept-Encoding", "accept"], r.headers
        assert s.conversions() == {}
    async with serving(tmp_path / "by-agent", site, forBots=["ClaudeBot"]) as s, s.client() as c:
        r = await c.get(f"/p/{site.base}/page/miss-vary", headers=html)  # the user agent chooses too
        assert _vary(r) == ["Accept", "Accept-Encoding", "User-Agent"], r.headers
    async with serving(tmp_path / "off", site, enabled=False) as s, s.client() as c:
        r = await c.get(f"/p/{site.base}/page/miss-vary", headers=html)
        assert r.content == JS_PAGE and _vary(r) == ["Accept-Encoding"], r.headers


async def test_a_status_page_is_answered_as_stored(tmp_path, site) -> None:
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store("/page/gone", b"<html><body><h1>Not found</h1></body></html>", status=404)
        r = await c.get(f"/p/{url}", headers={**UA, **MD})
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert b"Not found" in r.content and s.conversions() == {}


@pytest.mark.parametrize(("option", "html", "reason"), [
    ({"maxInputBytes": 1024}, RENDERED * 4, "too-large"),
    ({"maxOutputBytes": 1024}, RENDERED.replace(b"</main>", b"<p>" + b"many words " * 200 + b"</p></main>"),
     "output-too-large"),
])
async def test_a_page_over_a_bound_is_served_as_html_saying_why(tmp_path, site, option, html, reason) -> None:
    async with serving(tmp_path, site, **option) as s, s.client() as c:
        url = s.store("/page/big", html)
        for _ in range(2):  # remembered for the version: converted (and counted) once
            r = await c.get(f"/p/{url}", headers={**UA, **MD})
            assert r.status_code == 200 and r.content == html and r.headers["x-harper-markdown-skipped"] == reason
            assert r.headers["etag"] == '"e1"' and r.headers["content-type"].startswith("text/html")
            assert r.headers["cache-control"] == "max-age=60"  # lasting for this version: cacheable
            assert "link" not in r.headers  # this version has no Markdown to point to
        assert s.conversions() == {reason: 1}


async def test_a_page_that_does_not_convert_is_served_as_html_and_counted(tmp_path, site) -> None:
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store("/page/corrupt", framed=False, body=b"\x1f\x8b but not gzip")
        async with c.stream("GET", f"/p/{url}", headers={**UA, **MD}) as r:  # the stored bytes, as they are
            assert r.status_code == 200 and r.headers["x-harper-markdown-skipped"] == "failed"
            assert b"".join([part async for part in r.aiter_raw()]) == b"\x1f\x8b but not gzip"
        assert s.conversions() == {"failed": 1}


async def test_a_slow_conversion_stops_the_wait_and_serves_html_then_markdown_once_done(tmp_path, site) -> None:
    async with serving(tmp_path, site, timeoutMs=1, maxInputBytes=len(WIDE_TABLE) + 100) as s, s.client() as c:
        url = s.store("/page/slow", WIDE_TABLE)
        r = await c.get(f"/p/{url}", headers={**UA, **MD})
        assert r.status_code == 200 and r.headers["x-harper-markdown-skipped"] == "timeout"
        assert r.content == WIDE_TABLE and r.headers["cache-control"] == "no-store"  # not kept by a CDN
        converter = open_replica(s.ctx).services.converter
        for _ in range(600):  # the conversion goes on in its thread, and is kept
            if not converter._in_flight:
                break
            await asyncio.sleep(0.05)
        r = await c.get(f"/p/{url}", headers={**UA, **MD})
        assert _md(r).count("| x |") >= 1 and "x-harper-markdown-skipped" not in r.headers
        assert r.headers["cache-control"] == "max-age=60"
        assert s.conversions() == {"timeout": 1, "converted": 1}


async def test_too_many_conversions_in_flight_serve_html(tmp_path, site) -> None:
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store("/page/busy")
        open_replica(s.ctx).services.converter.max_in_flight = 0
        r = await c.get(f"/p/{url}", headers={**UA, **MD})
        assert r.headers["x-harper-markdown-skipped"] == "busy" and r.content == RENDERED
        assert r.headers["link"] == f'<{url}>; rel="alternate"; type="text/markdown"'  # the next try may get it
        assert [v for k, v in r.headers.multi_items() if k == "cache-control"] == ["no-store"]
        assert s.conversions() == {"busy": 1}


async def test_configured_bots_always_get_markdown_and_others_html(tmp_path, site) -> None:
    async with serving(tmp_path, site, forBots=["claudebot"]) as s, s.client() as c:
        url = s.store("/page/forced")
        r = await c.get(f"/p/{url}", headers={**UA, "accept": "text/html", "accept-encoding": "gzip"})
        assert "# The widget" in _md(r)
        r = await c.get(f"/p/{url}", headers={"user-agent": "Googlebot/2.1", "accept": "text/html"})
        assert r.content == RENDERED


async def test_configured_classes_always_get_markdown(tmp_path, site) -> None:
    """``forClasses`` takes the class the bot policy serves the request as."""
    async with serving(tmp_path, site, forClasses=["ai-search"]) as s, s.client() as c:
        url = s.store("/page/by-class")
        r = await c.get(f"/p/{url}", headers={"user-agent": "Mozilla/5.0 (compatible; OAI-SearchBot/1.0)",
                                               "accept": "text/html", "accept-encoding": "gzip"})
        assert "# The widget" in _md(r)
        r = await c.get(f"/p/{url}", headers={"user-agent": "Mozilla/5.0 (compatible; GPTBot/1.2)",
                                               "accept": "text/html"})
        assert r.content == RENDERED  # ai-training: HTML


async def test_markdown_off_serves_html_without_vary_accept(tmp_path, site) -> None:
    async with serving(tmp_path, site, enabled=False) as s, s.client() as c:
        url = s.store("/page/off")
        r = await c.get(f"/p/{url}", headers={**UA, **MD})
        assert r.content == RENDERED and _vary(r) == ["Accept-Encoding"] and "link" not in r.headers
        assert s.conversions() == {}


async def test_the_markdown_link_names_the_canonical_url_escaped(tmp_path, site) -> None:
    """The URL is the page's canonical one, whose escapes keep a hostile path inside the reference."""
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store('/page/a%3E%3Cb%22c')
        r = await c.get(f"/p/{site.base}/page/a><b\"c", headers={**UA, "accept": "text/html"})
        assert r.content == RENDERED and r.headers["link"] == f'<{url}>; rel="alternate"; type="text/markdown"'
        r = await c.get(f"/p/{url}", headers={**UA, **MD})  # what the link names answers Markdown
        assert "# The widget" in _md(r)


async def test_an_agent_and_an_html_bot_missing_at_once_never_share_the_origin_fetch(tmp_path, site) -> None:
    """The origin gets the bot's Accept and may answer Markdown to it (it says ``Vary: Accept``): a
    concurrent HTML bot must not be handed that answer, nor the agent the HTML."""
    async with serving(tmp_path, site) as s, s.client() as c:
        url = f"{site.base}/negotiates/together"
        agent, html = await asyncio.gather(c.get(f"/p/{url}", headers={**UA, **MD}),
                                           c.get(f"/p/{url}", headers={**UA, "accept": "text/html"}))
        assert agent.headers["content-type"] == "text/markdown" and agent.text == "# JS page\n"
        assert html.headers["content-type"].startswith("text/html") and html.content == JS_PAGE
        assert site.hits["/negotiates/together"] == 2


def _converted(n: int) -> Converted:
    meta = PageMeta(cache_key="k", status_code=200, headers={})
    return Converted(meta, b"m" * n)


def test_the_markdown_cache_is_bounded_by_bytes_and_keeps_one_version_per_page() -> None:
    cache = MarkdownCache(max_bytes=1000)
    cache.put(("a", "v1"), _converted(400))
    cache.put(("b", "v1"), _converted(400))
    assert cache.get(("a", "v1")) is not None  # a is now the most recent
    cache.put(("c", "v1"), _converted(400))
    assert cache.get(("b", "v1")) is None and cache.bytes == 800 and len(cache) == 2  # b was the oldest
    assert cache.get(("a", "v2")) is None and cache.get(("a", "v1")) is None  # a new version drops the old
    cache.put(("huge", "v1"), _converted(1001))
    assert cache.get(("huge", "v1")) is None and cache.bytes == 400
    entry = cache.get(("c", "v1"))
    assert isinstance(entry, Converted)
    cache.grow(("c", "v1"), entry, "identity", Prepared(200, {}, b"x" * 300, [], []))
    assert cache.bytes == 700
    cache.put(("d", "v1"), Skipped("failed"))
    cache.put(("e", "v1"), _converted(300))  # 700 + 64 + 300: the oldest (c, with its form) goes
    assert cache.get(("c", "v1")) is None and cache.bytes == 364
    off = MarkdownCache(max_bytes=0)
    off.put(("a", "v1"), Skipped("timeout"))
    assert off.get(("a", "v1")) is None


async def test_distinct_accept_encoding_values_do_not_crowd_out_the_markdowns_negotiated_forms(
        tmp_path, site, prepares) -> None:
    # Before: kept by the raw header, four an entry: past four junk values, every request re-coded.
    calls = prepares
    async with serving(tmp_path, site) as s, s.client() as c:
        url = s.store("/page/junk")
        md = {**UA, "accept": "text/markdown"}
        first = await c.get(f"/p/{url}", headers={**md, "accept-encoding": "br"})
        for i in range(1, 5):
            r = await c.get(f"/p/{url}", headers={**md, "accept-encoding": f"br, a{i}"})
            assert r.headers["content-encoding"] == "br" and r.content == first.content
        assert len(calls) == 1
        for value in ("br, a5", "identity", None, "gzip, br;q=0.5"):
            calls.clear()
            for _ in range(10):
                r = await c.get(f"/p/{url}", headers=md if value is None else {**md, "accept-encoding": value})
                assert r.status_code == 200 and _md(r) == first.text
            assert len(calls) <= 1, value
