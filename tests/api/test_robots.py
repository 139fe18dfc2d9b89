"""robots.txt end to end: POST /prerender_admin/robots/discover and GET /prerender_admin/robots over
real HTTP, the real walker, keeper and store of one node without Ray (``tests.localnode``), robots.txt and sitemaps served
by a local test server (hostile ones included)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.localnode import LocalNode
from tests.sitemap_server import SitemapSite, index, urlset
from tests.support import progress, target, wait_for

HOST = "robots.test"  # resolves nowhere: every fetch is pinned to 127.0.0.1 by origin.staging.ip


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(tmp_path_factory.mktemp("robots") / "data", {
        "domains": ["shop.test", f"{HOST}:{site.port}"],
        "origin": {"staging": {"ip": "127.0.0.1"}},
        "ingress": {"defaultProtocol": "http"},
        "sitemap": {"fetchTimeoutMs": 5000},
        "robots": {"fetchTimeoutMs": 2000, "maxSitemaps": 3},
    })
    yield d
    d.stop()


def origin(site: SitemapSite) -> str:
    return f"http://{HOST}:{site.port}"


def discover(base: str, status: int = 200, **body: object) -> dict:
    r = httpx.post(f"{base}/prerender_admin/robots/discover", json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def one(base: str, site: SitemapSite, **body: object) -> dict:
    [doc] = discover(base, domain=origin(site), **body)["domains"]
    assert doc["domain"] == origin(site)
    return doc


def report(base: str, domain: str) -> httpx.Response:
    return httpx.get(f"{base}/prerender_admin/robots", params={"domain": domain}, timeout=10)


ROBOTS = """User-agent: *
Disallow: /cart/

User-agent: GPTBot
User-agent: CCBot
Disallow: /

Sitemap: {o}/r/index.xml
Sitemap: {o}/r/pages.xml
Sitemap: https://evil.test/sitemap.xml
Sitemap: {o}/r/pages.xml
"""


def test_discovery_walks_the_listed_sitemaps_and_reports_ignored_lines_and_conflicts(node, site) -> None:
    o = origin(site)
    site.put("/r/pages.xml", urlset("https://shop.test/r/a", "https://shop.test/r/b"))
    site.put("/r/child.xml", urlset("https://shop.test/r/c"))
    site.put("/r/index.xml", index(f"{o}/r/child.xml"))
    site.put("/robots.txt", ROBOTS.format(o=o).encode(), ctype="text/plain")

    doc = one(node.url, site, refresh=True)

    robots = doc["robots"]
    assert doc["cached"] is False and robots["state"] == "ok" and robots["status"] == 200
    assert robots["sitemaps"] == [f"{o}/r/index.xml", f"{o}/r/pages.xml"]
    assert robots["sitemapsIgnored"][0]["url"] == "https://evil.test/sitemap.xml"
    assert robots["groups"] == [{"userAgents": ["*"], "allow": 0, "disallow": 1},
                                {"userAgents": ["GPTBot", "CCBot"], "allow": 0, "disallow": 1}]
    bots = {c["bot"] for c in robots["conflicts"]}
    assert {"GPTBot", "CCBot"} <= bots and "Googlebot" not in bots
    assert [w["url"] for w in doc["walks"]] == robots["sitemaps"] and all(w["queued"] for w in doc["walks"])
    assert doc["walks"][0]["progress"].startswith("/sitemap_refresh?root=")
    # Walked through the sitemap ingest path, one after the other.
    for url in ("https://shop.test/r/a", "https://shop.test/r/b", "https://shop.test/r/c"):
        wait_for(lambda u=url: target(node.url, u), timeout=60, what=f"the target {url}")
    assert progress(node.url, f"{o}/r/pages.xml")["trigger"] == "robots"
    assert site.headers["/robots.txt"]["user-agent"] == "HarperSitemapCrawler/1.0"

    # The report reads the stored row; the gauge names each conflicting bot.
    r = report(node.url, o)
    assert r.status_code == 200 and r.json()["robots"]["sitemaps"] == robots["sitemaps"]
    listing = httpx.get(f"{node.url}/prerender_admin/robots", timeout=10).json()
    assert o in {d["domain"] for d in listing["domains"]} and listing["conflicts"] >= 2
    text = httpx.get(f"{node.url}/metrics", timeout=10).text
    gauge = {(s.labels["domain"], s.labels["bot"]): s.value for f in text_string_to_metric_families(text)
             if f.name == "prerender_robots_conflicts" for s in f.samples}
    assert gauge[(o, "GPTBot")] == 1 and gauge[(o, "CCBot")] == 1 and (o, "Googlebot") not in gauge


def test_a_fresh_copy_is_reused_until_refresh_and_a_5xx_keeps_the_last_good_copy(node, site) -> None:
    site.put("/robots.txt", b"User-agent: GPTBot\nDisallow: /\n", ctype="text/plain")
    one(node.url, site, refresh=True, walk=False)
    hits = site.hits["/robots.txt"]
    cached = one(node.url, site, walk=False)
    assert cached["cached"] is True and site.hits["/robots.txt"] == hits
    site.put("/robots.txt", b"oops", status=503, ctype="text/plain")
    kept = one(node.url, site, refresh=True, walk=False)["robots"]
    assert kept["state"] == "ok" and kept["lastAttempt"]["status"] == 503
    assert "GPTBot" in {c["bot"] for c in kept["conflicts"]}
    site.put("/robots.txt", b"", status=404, ctype="text/plain")
    gone = one(node.url, site, refresh=True, walk=False)["robots"]
    assert gone["state"] == "unavailable" and gone["conflicts"] == []  # a 404 allows all


def endless(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("content-type", "text/plain")
    h.send_header("content-length", str(50 * 1024 * 1024))
    h.end_headers()
    h.wfile.write(b"User-agent: *\nAllow: /\n")
    for i in range(10_000):  # 10,000 Sitemap: lines, then filler to 50 MB
        h.wfile.write(f"Sitemap: https://shop.test/s{i}.xml\n".encode())
    line = b"# filler\n" * 10_000
    for _ in range(50 * 1024 * 1024 // len(line)):
        h.wfile.write(line)


def test_a_50_mb_robots_txt_with_10000_sitemap_lines_is_cut_and_bounded(node, site) -> None:
    site.handle("/robots.txt", endless)
    robots = one(node.url, site, refresh=True, walk=False)["robots"]
    assert robots["state"] == "ok" and robots["truncated"] is True and robots["size"] <= 500 * 1024
    assert len(robots["sitemaps"]) == 3 and robots["sitemapsOverLimit"] == robots["sitemapLines"] - 3
    assert robots["sitemapLines"] == 10_000


def test_binary_garbage_and_a_redirect_loop_are_answered_not_500(node, site) -> None:
    site.put("/robots.txt", bytes(range(256)) * 100, ctype="application/octet-stream")
    robots = one(node.url, site, refresh=True, walk=False)["robots"]
    assert robots["state"] == "ok" and robots["groups"] == [] and robots["conflicts"] == []
    site.redirect("/robots.txt", "/robots.txt")
    robots = one(node.url, site, refresh=True, walk=False)["robots"]
    assert robots["state"] == "unavailable" and "redirected more than" in robots["error"]


def test_every_domain_is_discovered_when_none_is_named(node, site) -> None:
    site.put("/robots.txt", b"User-agent: *\nAllow: /\n", ctype="text/plain")
    found = {d["domain"]: d["robots"] for d in discover(node.url, refresh=True, walk=False)["domains"]}
    assert found[origin(site)]["state"] == "ok"
    assert found["http://shop.test"]["state"] != "ok"  # pinned to 127.0.0.1:80, where no robots.txt is


@pytest.mark.parametrize("body,message", [
    ({"domain": "evil.test"}, "not allowed by domains"),
    ({"domain": "http://shop.test/robots.txt"}, "is not a host"),
    ({"domain": 5}, "domain must be"),
    ({"refresh": "yes"}, "refresh must be true or false"),
    ({"domians": "shop.test"}, "unknown key"),
])
def test_bad_input_is_a_400(node, body, message) -> None:
    assert message in discover(node.url, 400, **body)["error"]


def test_bad_reads_are_clear(node, site) -> None:
    assert report(node.url, "evil.test").status_code == 400
    r = report(node.url, "http://shop.test:8443")
    assert r.status_code == 400  # not allowed by domains (shop.test allows 80 and 443 only)
    never = report(node.url, "https://shop.test")
    assert never.status_code == 404 and "robots/discover" in never.json()["error"]
