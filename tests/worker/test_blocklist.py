"""The worker's blocklist (worker/blocklist.py): hosts and their subdomains, as CDP patterns."""

from __future__ import annotations

import pytest

from prerender_ray.worker.blocklist import DEFAULT_BLOCKED_HOSTS, MAX_HOSTS, Blocklist


@pytest.mark.parametrize("url, blocked", [
    ("https://www.googletagmanager.com/gtm.js?id=1", True),
    ("https://googletagmanager.com/x", True),
    ("http://region1.google-analytics.com/g/collect", True),
    ("https://widget.intercom.io/widget/abc", True),
    ("https://notgoogletagmanager.com/x", False),  # a suffix of the name, not a subdomain
    ("https://shop.example/gtm.js", False),
    ("https://googletagmanager.com.evil.example/x", False),
    ("not a url", False),
    ("https://[::1/x", False),
])
def test_a_listed_host_and_its_subdomains_are_blocked(url: str, blocked: bool) -> None:
    assert Blocklist.of().blocks(url) is blocked


def test_a_user_list_adds_to_or_replaces_the_default() -> None:
    added = Blocklist.of(["Tracker.Example."])
    assert added.blocks("https://cdn.tracker.example/t.js") and added.blocks("https://clarity.ms/tag")
    only = Blocklist.of(["tracker.example"], defaults=False)
    assert only.hosts == ("tracker.example",) and not only.blocks("https://clarity.ms/tag")


def test_patterns_pause_only_the_listed_hosts() -> None:
    assert [p["urlPattern"] for p in Blocklist(["a.example"]).patterns()] == [
        "*://a.example/*", "*://a.example:*/*", "*://*.a.example/*", "*://*.a.example:*/*"]
    assert len(Blocklist.of().patterns()) == 4 * len(set(DEFAULT_BLOCKED_HOSTS))


def test_a_list_is_bounded() -> None:
    with pytest.raises(ValueError, match="at most"):
        Blocklist(f"h{i}.example" for i in range(MAX_HOSTS + 1))


@pytest.mark.parametrize("host", ["*", "*.a.example", "a?.example", "a.example/x", "a example", "a.example:80"])
def test_a_host_that_would_widen_its_pattern_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        Blocklist.of([host])


def test_a_routes_hosts_add_to_the_workers_list_and_defaults_false_keeps_the_workers_own() -> None:
    worker = Blocklist.of(["own.example"])
    route = worker.for_job(("chat.example",), defaults=True)
    assert route.blocks("https://chat.example/w.js") and route.blocks("https://own.example/")
    assert route.blocks("https://clarity.ms/tag") and not worker.blocks("https://chat.example/w.js")
    bare = worker.for_job((), defaults=False)
    assert bare.hosts == ("own.example",)
    assert Blocklist.of(["own.example"], defaults=False).for_job((), defaults=True).hosts == ("own.example",)
