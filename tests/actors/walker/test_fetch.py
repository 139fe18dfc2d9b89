"""Fetching sitemap documents from a real HTTP server on 127.0.0.1: streaming, caps, deadlines,
redirects, staging pinning, hostile bodies (no Ray needed)."""

from __future__ import annotations

import json

import pytest

from prerender_ray.actors.walker.fetch import Fetcher, SitemapFetchError
from prerender_ray.config.model import Config
from prerender_ray.identity.routes import Router
from prerender_ray.sitemaps.rules import canonicalizer
from prerender_ray.storage.registry import ENTRY_CHUNK, decode_entries
from tests.sitemap_server import BILLION_LAUGHS, HTML, XXE, SitemapSite, gzip_bomb, index, urlset


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


def fetcher(domains: list[str] | None = None, **sitemap: object) -> Fetcher:
    cfg = Config.model_validate({
        "domains": ["shop.test", "127.0.0.1:*"] if domains is None else domains,
        "sitemap": {"fetchTimeoutMs": 1500, "maxBytes": 2 * 1024 * 1024, **sitemap},
        "origin": {"securityToken": {"header": "x-bypass", "value": "s3cret"}},
    })
    return Fetcher(cfg, Router(cfg).classify, canonicalizer(cfg))


async def fetch(url: str, domains: list[str] | None = None, **sitemap: object):
    f = fetcher(domains, **sitemap)
    try:
        return await f.fetch(url)
    finally:
        await f.aclose()


async def failure(url: str, domains: list[str] | None = None, **sitemap: object) -> SitemapFetchError:
    with pytest.raises(SitemapFetchError) as e:
        await fetch(url, domains, **sitemap)
    return e.value


async def test_a_urlset_is_partitioned_and_its_entries_kept_as_chunk_rows(site) -> None:
    locs = [f"https://shop.test/p/{i}" for i in range(ENTRY_CHUNK + 5)]
    site.put("/big.xml", urlset(*locs, (None, None), "https://evil.test/x",
                                ("https://shop.test/q", "sometimes")))
    doc = await fetch(site.url("/big.xml"))
    assert doc.kind == "urlset" and doc.entry_count == len(locs) + 3
    part = doc.partition
    assert len(part.incoming) == len(locs) + 1 and part.unknown_changefreq == 1
    assert [bad.message for bad in part.invalid][0] == "missing <loc>"
    assert "evil.test is not allowed by domains" in part.invalid[1].message
    assert len(doc.chunks) == 2
    rows = decode_entries(doc.chunks[0]) + decode_entries(doc.chunks[1])
    assert rows[0] == {"loc": locs[0], "lastmod": None, "changefreq": None, "priority": None}
    assert len(rows) == doc.entry_count


async def test_the_crawler_identifies_itself_and_sends_the_security_token(site) -> None:
    site.put("/headers.xml", urlset("https://shop.test/h"))
    await fetch(site.url("/headers.xml"))
    seen = site.headers["/headers.xml"]
    assert seen["user-agent"] == "HarperSitemapCrawler/1.0" and seen["x-bypass"] == "s3cret"


async def test_staging_pins_the_connection_but_keeps_the_host(site) -> None:
    site.put("/pinned.xml", urlset("https://shop.test/pinned"))
    f = fetcher()
    pinned = Config.model_validate({"origin": {"staging": {"ip": "127.0.0.1"}}})
    f2 = Fetcher(pinned, f.classify, f.canonicalize)
    try:
        doc = await f2.fetch(site.url("/pinned.xml", host="sitemaps.invalid"))
    finally:
        await f.aclose()
        await f2.aclose()
    assert doc.entry_count == 1
    assert site.headers["/pinned.xml"]["host"] == f"sitemaps.invalid:{site.port}"


async def test_gzip_is_read_by_content_as_a_file_or_a_transport_encoding(site) -> None:
    body = urlset("https://shop.test/g1", "https://shop.test/g2")
    site.gzipped("/file.xml.gz", body)
    site.gzipped("/transport.xml", body, transport=True)
    for path in ("/file.xml.gz", "/transport.xml"):
        doc = await fetch(site.url(path))
        assert doc.compressed and len(doc.partition.incoming) == 2


async def test_an_index_gives_its_children(site) -> None:
    site.put("/index.xml", index("https://a.test/1.xml", "https://a.test/2.xml"))
    doc = await fetch(site.url("/index.xml"))
    assert doc.is_index and [c.loc for c in doc.children] == ["https://a.test/1.xml", "https://a.test/2.xml"]
    assert json.loads(doc.chunks[0]) == [["https://a.test/1.xml", None], ["https://a.test/2.xml", None]]


async def test_redirects_are_followed_only_to_http(site) -> None:
    site.put("/target.xml", urlset("https://shop.test/r"))
    site.redirect("/moved.xml", "/target.xml", 301)
    doc = await fetch(site.url("/moved.xml"))
    assert doc.final_url == site.url("/target.xml") and doc.entry_count == 1
    site.redirect("/ftp.xml", "ftp://files.test/s.xml")
    assert (await failure(site.url("/ftp.xml"))).code == "SITEMAP_BAD_REDIRECT"
    site.redirect("/loop.xml", "/loop.xml")
    assert (await failure(site.url("/loop.xml"))).code == "SITEMAP_TOO_MANY_REDIRECTS"


@pytest.mark.parametrize(("path", "setup", "code", "words"), [
    ("/missing.xml", None, "HTTP_404", "404 Not Found — <html><body>Not Found</body></html>"),
    ("/html.xml", ("put", HTML, "text/html"), "SITEMAP_NOT_SITEMAP",
     "non-sitemap response (status 200, content-type text/html)"),
    ("/laughs.xml", ("put", BILLION_LAUGHS, "application/xml"), "SITEMAP_DOCTYPE", "DOCTYPE is not allowed"),
    ("/xxe.xml", ("put", XXE, "application/xml"), "SITEMAP_DOCTYPE", "DOCTYPE is not allowed"),
    ("/empty.xml", ("put", b"", "application/xml"), "SITEMAP_NOT_XML", "non-XML or empty document"),
    ("/text.xml", ("put", b"Access Denied", "text/plain"), "SITEMAP_NOT_XML", "non-XML or empty document"),
])
async def test_unusable_documents_fail_with_a_code_and_a_readable_message(site, path, setup, code,
                                                                          words) -> None:
    if setup is not None:
        site.put(path, setup[1], ctype=setup[2])
    e = await failure(site.url(path))
    assert e.code == code and words in str(e), str(e)


async def test_a_gzip_bomb_stops_at_the_decompressed_cap(site) -> None:
    site.put("/bomb.xml.gz", gzip_bomb(64), ctype="application/x-gzip")
    e = await failure(site.url("/bomb.xml.gz"))
    assert e.code == "SITEMAP_TOO_LARGE"


async def test_an_endless_body_stops_at_the_cap_and_the_connection_is_dropped(site) -> None:
    site.endless("/endless.xml")
    e = await failure(site.url("/endless.xml"))
    assert e.code == "SITEMAP_TOO_LARGE" and "2097152 bytes" in str(e)


async def test_too_many_entries_reject_the_whole_document(site) -> None:
    site.put("/many.xml", urlset(*(f"https://shop.test/m/{i}" for i in range(30))))
    assert (await failure(site.url("/many.xml"), maxEntries=20)).code == "SITEMAP_TOO_MANY_ENTRIES"


async def test_a_child_that_hangs_fails_at_its_deadline(site) -> None:
    site.delayed("/hang.xml", urlset("https://shop.test/late"), 5)
    e = await failure(site.url("/hang.xml"))
    assert e.code == "SITEMAP_TIMEOUT" and "within 1500 ms" in str(e)


async def test_an_unknown_content_encoding_is_refused(site) -> None:
    site.put("/br.xml", b"\x0b\x02\x80", headers={"content-encoding": "br"})
    assert (await failure(site.url("/br.xml"))).code == "SITEMAP_BAD_ENCODING"


async def test_a_refused_connection_is_a_failure_not_a_crash() -> None:
    e = await failure("http://127.0.0.1:9/none.xml")
    assert "Sitemap fetch failed for http://127.0.0.1:9/none.xml" in str(e) and e.code == "ConnectError"


# ------------------------------------------------------------------------------- origin policy


async def test_a_sitemap_on_a_port_or_name_outside_domains_is_never_fetched(site, canary) -> None:
    only_site = ["shop.test", f"127.0.0.1:{site.port}"]
    canary.put("/canary.xml", urlset("https://shop.test/c"))
    site.put("/by-name.xml", urlset("https://shop.test/n"))
    e = await failure(canary.url("/canary.xml"), only_site)
    assert e.code == "SITEMAP_HOST_NOT_ALLOWED"
    assert f"127.0.0.1:{canary.port} is not allowed by domains; add '127.0.0.1:{canary.port}'" in str(e)
    e = await failure(site.url("/by-name.xml", host="localhost"), only_site)  # the same server, another name
    assert e.code == "SITEMAP_HOST_NOT_ALLOWED" and f"localhost:{site.port} is not allowed" in str(e)
    assert canary.hits == {} and "/by-name.xml" not in site.hits  # not fetched, so no token sent
    assert (await fetch(site.url("/by-name.xml"), only_site)).entry_count == 1


async def test_a_redirect_to_an_origin_outside_domains_is_refused_before_it_is_followed(site, canary) -> None:
    canary.put("/lured.xml", urlset("https://shop.test/l"))
    site.redirect("/lure.xml", canary.url("/lured.xml"))
    e = await failure(site.url("/lure.xml"), ["shop.test", f"127.0.0.1:{site.port}"])
    assert e.code == "SITEMAP_HOST_NOT_ALLOWED" and f"redirected to {canary.url('/lured.xml')}" in str(e)
    assert site.hits["/lure.xml"] == 1 and "/lured.xml" not in canary.hits


async def test_an_ipv6_literal_outside_domains_is_refused_by_the_policy(site) -> None:
    e = await failure(f"http://[::1]:{site.port}/v6.xml", ["127.0.0.1:*"])
    assert e.code == "SITEMAP_HOST_NOT_ALLOWED" and f"[::1]:{site.port} is not allowed by domains" in str(e)


async def test_any_domain_off_loopback_fetches_no_sitemap_from_our_own_network(site) -> None:
    # Before: a hostile index could name children on loopback or the node's network, and the walker
    # fetched them with the security token.
    site.put("/private.xml", urlset("https://shop.test/p"))
    cfg = Config.model_validate({"domains": [], "allowAnyDomain": True, "server": {"host": "0.0.0.0"},
                                 "origin": {"securityToken": {"header": "x-bypass", "value": "s3cret"}}})
    f = Fetcher(cfg, Router(cfg).classify, canonicalizer(cfg))
    try:
        for url in (site.url("/private.xml"), site.url("/private.xml", host="localhost")):
            with pytest.raises(SitemapFetchError) as e:
                await f.fetch(url)
            assert e.value.code == "SITEMAP_HOST_NOT_ALLOWED" and "it resolves to 127.0.0.1" in str(e.value)
    finally:
        await f.aclose()
    assert "/private.xml" not in site.hits


async def test_a_cookie_an_origin_sets_is_not_sent_back(site) -> None:
    site.put("/cookie.xml", urlset("https://shop.test/k"), headers={"set-cookie": "sid=1; Path=/"})
    site.put("/after-cookie.xml", urlset("https://shop.test/k2"))
    f = fetcher()
    try:
        await f.fetch(site.url("/cookie.xml"))
        await f.fetch(site.url("/after-cookie.xml"))
    finally:
        await f.aclose()
    assert "cookie" not in site.headers["/after-cookie.xml"]
