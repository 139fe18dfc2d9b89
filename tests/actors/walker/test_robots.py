"""Fetching robots.txt from a real HTTP server on 127.0.0.1: the cut while streaming, compressed
bodies, statuses, redirects (loops, other hosts), slow origins (no Ray needed)."""

from __future__ import annotations

import gzip
import zlib
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from prerender_ray.actors.walker.fetch import Fetcher
from prerender_ray.actors.walker.robots import PIECE, fetch_robots, read_capped
from prerender_ray.config.model import Config
from prerender_ray.identity.routes import Router
from prerender_ray.sitemaps.robots import OK, UNAVAILABLE, UNREACHABLE, ParsedRobots
from prerender_ray.sitemaps.rules import canonicalizer
from tests.sitemap_server import SitemapSite

KIB = 1024


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.close()


@pytest.fixture(scope="module")
def canary():
    """Another server on another 127.0.0.1 port, outside ``domains``: it must never be asked."""
    s = SitemapSite()
    yield s
    s.close()


async def robots(url: str, site: SitemapSite, *, max_bytes: int = 500 * KIB, deadline_s: float = 3.0,
                 domains: list[str] | None = None) -> ParsedRobots:
    cfg = Config.model_validate({"domains": domains or [f"127.0.0.1:{site.port}", f"localhost:{site.port}"]})
    f = Fetcher(cfg, Router(cfg).classify, canonicalizer(cfg))
    try:
        return await fetch_robots(f, url, max_bytes=max_bytes, deadline_s=deadline_s)
    finally:
        await f.aclose()


def endless(h: BaseHTTPRequestHandler) -> None:
    """A robots.txt that claims 2 GB and streams rules until the reader hangs up."""
    h.send_response(200)
    h.send_header("content-type", "text/plain")
    h.send_header("content-length", str(2 * 1024**3))
    h.end_headers()
    h.wfile.write(b"User-agent: GPTBot\nDisallow: /\n")
    line = b"Disallow: /some/long/path/that/repeats\n" * 1000
    for _ in range(2 * 1024**3 // len(line)):
        h.wfile.write(line)


async def test_a_robots_txt_that_never_ends_is_cut_and_parsed_to_the_cut(site) -> None:
    site.handle("/endless/robots.txt", endless)
    r = await robots(site.url("/endless/robots.txt"), site, deadline_s=20)
    # ok, not unreachable: it stopped at the cut, not at the deadline
    assert r.state == OK and r.truncated and 400 * KIB < r.size <= 500 * KIB
    assert r.allows("GPTBot", "/") is False


async def test_a_gzip_bomb_is_cut_while_it_inflates(site) -> None:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = z.compress(b"User-agent: *\nDisallow: /x\n") + b"".join(
        z.compress(b"#" * 1023 + b"\n") for _ in range(200 * 1024)) + z.flush()  # 200 MB inflated
    site.put("/bomb/robots.txt", bomb, ctype="text/plain", headers={"content-encoding": "gzip"})
    r = await robots(site.url("/bomb/robots.txt"), site)
    assert r.state == OK and r.truncated and r.size <= 500 * KIB and r.allows("Bingbot", "/x") is False


async def test_reading_stops_at_the_cut_whatever_the_body_holds() -> None:
    """The body is pulled only until the cut: a 64 MB inflation is never produced, let alone held."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunks = [z.compress(b"# " + b"x" * (1024 * 1024 - 3) + b"\n") for _ in range(64)] + [z.flush()]
    pulled = []

    async def body():
        for c in chunks:
            pulled.append(len(c))
            yield c

    response = httpx.Response(200, headers={"content-encoding": "gzip"}, content=body())
    data, truncated = await read_capped(response, 500 * KIB)
    assert truncated and len(data) <= 500 * KIB + PIECE
    assert len(pulled) < len(chunks)


async def test_a_gzip_transport_encoding_is_decoded(site) -> None:
    site.put("/gz/robots.txt", gzip.compress(b"Sitemap: http://a.test/s.xml\n"), ctype="text/plain",
             headers={"content-encoding": "gzip"})
    r = await robots(site.url("/gz/robots.txt"), site)
    assert r.state == OK and r.sitemaps == ["http://a.test/s.xml"] and not r.truncated


@pytest.mark.parametrize("status,state", [(404, UNAVAILABLE), (401, UNAVAILABLE), (410, UNAVAILABLE),
                                          (429, UNREACHABLE), (500, UNREACHABLE), (503, UNREACHABLE)])
async def test_statuses_mean_what_they_mean_to_crawlers(site, status: int, state: str) -> None:
    site.put(f"/s{status}/robots.txt", b"User-agent: *\nDisallow: /\n", status=status, ctype="text/plain")
    r = await robots(site.url(f"/s{status}/robots.txt"), site)
    assert (r.state, r.status) == (state, status)
    assert r.allows("Googlebot", "/") is (True if state == UNAVAILABLE else None)


async def test_a_redirect_loop_is_unavailable(site) -> None:
    site.redirect("/loop/robots.txt", "/loop/robots.txt")
    r = await robots(site.url("/loop/robots.txt"), site)
    assert r.state == UNAVAILABLE and "redirected more than" in (r.error or "")
    assert r.allows("GPTBot", "/") is True


async def test_a_redirect_to_another_allowed_host_is_followed(site) -> None:
    site.put("/real/robots.txt", b"User-agent: GPTBot\nDisallow: /\n", ctype="text/plain")
    site.redirect("/moved/robots.txt", site.url("/real/robots.txt", host="localhost"), 301)
    r = await robots(site.url("/moved/robots.txt"), site)
    assert r.state == OK and r.final_url == site.url("/real/robots.txt", host="localhost")
    assert r.allows("GPTBot", "/") is False


async def test_a_redirect_to_a_host_outside_domains_is_never_fetched_and_knows_nothing(site, canary) -> None:
    canary.put("/robots.txt", b"User-agent: *\nAllow: /\n", ctype="text/plain")
    site.redirect("/away/robots.txt", canary.url("/robots.txt"))
    r = await robots(site.url("/away/robots.txt"), site)
    assert r.state == UNREACHABLE and "not allowed by domains" in (r.error or "")
    assert canary.hits.get("/robots.txt") is None


async def test_a_slow_origin_meets_the_deadline(site) -> None:
    site.delayed("/slow/robots.txt", b"User-agent: *\nDisallow: /\n", 5)
    r = await robots(site.url("/slow/robots.txt"), site, deadline_s=0.5)
    assert r.state == UNREACHABLE and "within 500 ms" in (r.error or "")


async def test_an_unknown_content_encoding_knows_nothing(site) -> None:
    site.put("/zz/robots.txt", b"\x00\x01garbage", ctype="text/plain", headers={"content-encoding": "zz"})
    r = await robots(site.url("/zz/robots.txt"), site)
    assert r.state == UNREACHABLE and "unreadable body" in (r.error or "")


def test_the_conflict_gauge_clears_a_bot_that_left_and_caps_its_domains() -> None:
    from prerender_ray import metrics
    from prerender_ray.actors.walker.robots import ConflictGauge

    def value(domain: str, bot: str) -> float | None:
        for family in metrics.robots_conflicts.collect():
            for s in family.samples:
                if s.labels == {"domain": domain, "bot": bot}:
                    return s.value
        return None

    gauge = ConflictGauge()
    assert gauge.update("https://g0.test", {"GPTBot", "CCBot"})
    assert gauge.update("https://g0.test", {"CCBot"})
    assert (value("https://g0.test", "GPTBot"), value("https://g0.test", "CCBot")) == (0, 1)
    for i in range(1, ConflictGauge.MAX_DOMAINS):
        assert gauge.update(f"https://g{i}.test", set())
    assert not gauge.update("https://one-too-many.test", {"GPTBot"})
    assert value("https://one-too-many.test", "GPTBot") is None
    assert gauge.update("https://g0.test", set())  # a known domain still updates
