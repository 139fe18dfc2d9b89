"""A bot operator's published ranges read from the URL the operator configured
(``bots.verify.ranges``; ``api/bot/replica.fetch_ranges``), against a site on 127.0.0.1: bounded in
size and time, never redirected, and a failed read keeps the last good ranges."""

from __future__ import annotations

import ipaddress
import json

import pytest

from prerender_ray.api.bot.replica import fetch_ranges
from prerender_ray.config.loading import ConfigError, parse
from prerender_ray.serving.verification import RangeError, RangeStore
from tests.sitemap_server import SitemapSite

PUBLISHED = json.dumps({"creationTime": "2026-11-30T00:00:00", "prefixes": [
    {"ipv4Prefix": "66.249.64.0/27"}, {"ipv6Prefix": "2001:4860:4801:10::/64"}]}).encode()


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.close()


def store(url: str, max_bytes: int = 4096) -> RangeStore:
    return RangeStore({"Googlebot": [url]}, max_bytes=max_bytes, max_prefixes=100, fetch=fetch_ranges)


def test_ranges_are_read_from_the_operators_url(site) -> None:
    site.put("/googlebot.json", PUBLISHED, ctype="application/json")
    ranges = store(site.url("/googlebot.json"))
    assert ranges.reload() == []
    assert ipaddress.ip_address("66.249.64.5") in ranges.sets["Googlebot"]
    assert ipaddress.ip_address("66.249.65.5") not in ranges.sets["Googlebot"]


@pytest.mark.parametrize("case", ["too-large", "not-found", "redirect", "garbage"])
def test_a_bad_read_is_an_error_line_and_keeps_the_last_good_ranges(site, case) -> None:
    site.put(f"/{case}.json", PUBLISHED, ctype="application/json")
    ranges = store(site.url(f"/{case}.json"))
    assert ranges.reload() == []
    if case == "too-large":
        site.put(f"/{case}.json", b"#" * 100_000, ctype="text/plain")
    elif case == "not-found":
        site.put(f"/{case}.json", b"gone", status=404, ctype="text/plain")
    elif case == "redirect":  # never followed: the operator named this URL, not where it points
        site.put("/elsewhere.json", PUBLISHED, ctype="application/json")
        site.redirect(f"/{case}.json", site.url("/elsewhere.json"))
    else:
        site.put(f"/{case}.json", b"\x00\xff not ranges", ctype="text/plain")
    [error] = ranges.reload()
    assert f"/{case}.json" in error
    assert ipaddress.ip_address("66.249.64.5") in ranges.sets["Googlebot"]


def test_a_read_stops_at_the_size_bound(site) -> None:
    site.put("/endless.txt", b"10.0.0.0/8\n" * 200_000, ctype="text/plain")
    assert len(fetch_ranges(site.url("/endless.txt"), 1024)) <= 1024 + 64 * 1024  # one chunk past the bound at most
    with pytest.raises(RangeError, match="ConnectError"):
        fetch_ranges("http://127.0.0.1:9/none.json", 1024)  # nothing listens on the discard port


@pytest.mark.parametrize("source, ok", [
    ("https://developers.google.com/search/apis/ipranges/googlebot.json", True),
    ("/etc/prerender/gptbot.json", True),
    ("gptbot.json", False),
    ("https://user:secret@example.com/ranges.json", False),
    ("https:///ranges.json", False),
])
def test_a_range_source_is_an_absolute_path_or_an_http_url(source, ok) -> None:
    raw = {"bots": {"verify": {"enabled": True, "ranges": {"GPTBot": [source]}}}}
    if ok:
        assert parse(raw).config.bots.verify.ranges == {"GPTBot": [source]}
    else:
        with pytest.raises(ConfigError, match="range"):
            parse(raw)
