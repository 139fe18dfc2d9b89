"""IndexNow's pure parts (prerender_ray/serving/indexnow.py) and its options: batches per host within
the protocol's 10,000, the bounded queue, the rate limit, the key file's requests, the hosts."""

from __future__ import annotations

import json

import pytest

from prerender_ray.config.loading import ConfigError, parse
from prerender_ray.serving.indexnow import KeyFile, Pending, RateLimit, backoff_s, host_of, submission

KEY = "a1b2c3d4-e5f6"


def test_a_batch_holds_one_hosts_urls_oldest_first_and_at_most_the_cap() -> None:
    p = Pending(100_000)
    for i in range(12_345):
        p.add(f"https://a.test/p{i}", "https://a.test")
        if i % 1000 == 0:
            p.add(f"https://b.test/p{i}", "https://b.test")
    assert p.full(10_000)
    origin, urls = p.take(10_000)  # type: ignore[misc]
    assert origin == "https://a.test" and len(urls) == 10_000
    assert urls[0] == "https://a.test/p0" and all(u.startswith("https://a.test/") for u in urls)
    assert not p.full(10_000)
    # then the origin whose URL now waited longest: b's were queued among a's first 10,000
    assert p.take(10_000) == ("https://b.test", [f"https://b.test/p{i}" for i in range(0, 12_345, 1000)])
    origin, urls = p.take(10_000)  # type: ignore[misc]
    assert origin == "https://a.test" and len(urls) == 2_345 and urls[0] == "https://a.test/p10000"
    assert p.take(10_000) is None and len(p) == 0


def test_a_url_changed_twice_before_a_flush_is_submitted_once() -> None:
    p = Pending(10)
    for _ in range(3):
        p.add("https://a.test/x", "https://a.test")
    assert p.take(10) == ("https://a.test", ["https://a.test/x"])


def test_the_queue_is_bounded_by_dropping_the_oldest() -> None:
    p = Pending(3)
    dropped = sum(p.add(f"https://a.test/{i}", "https://a.test") for i in range(5))
    assert dropped == 2 and len(p) == 3
    assert p.take(10) == ("https://a.test", ["https://a.test/2", "https://a.test/3", "https://a.test/4"])


def test_the_rate_limit_spaces_requests_to_one_endpoint() -> None:
    r = RateLimit(10.0)
    assert r.wait_s(100.0) == 0
    r.spent(100.0)
    assert r.wait_s(103.0) == 7.0 and r.wait_s(110.0) == 0
    assert [backoff_s(5.0, n) for n in (1, 2, 3)] == [5.0, 10.0, 20.0] and backoff_s(1.0, 50) == 64.0


def test_only_urls_of_configured_hosts_are_queued() -> None:
    hosts = frozenset({"shop.test"})
    assert host_of("https://shop.test/a?b=1", hosts) == "https://shop.test"
    assert host_of("http://shop.test:8080/a", hosts) == "http://shop.test:8080"
    assert host_of("https://other.test/a", hosts) is None
    assert host_of("https://sub.shop.test/a", hosts) is None
    assert host_of("not a url", hosts) is None


def test_a_submission_names_its_host_key_and_key_location() -> None:
    doc = json.loads(submission("https://shop.test", KEY, ["https://shop.test/a"]))
    assert doc == {"host": "shop.test", "key": KEY, "keyLocation": f"https://shop.test/{KEY}.txt",
                   "urlList": ["https://shop.test/a"]}


def test_the_key_file_is_asked_for_on_configured_hosts_only_in_both_modes() -> None:
    kf = KeyFile.of(KEY, ["shop.test"])
    prefix = "/p/"

    def asked(mode: str, path: str, host: str = "", query: str = "") -> bool:
        return kf.asked(mode, prefix, "x-forwarded-host", path, query, {"x-forwarded-host": host})

    assert asked("prefix", f"/p/https://shop.test/{KEY}.txt")
    assert asked("prefix", f"/p/http://shop.test:8080/{KEY}.txt")
    assert not asked("prefix", "/p/https://shop.test/wrong-key-1234.txt")
    assert not asked("prefix", f"/p/https://other.test/{KEY}.txt")
    assert not asked("prefix", f"/p/https://shop.test/sub/{KEY}.txt")
    assert not asked("prefix", f"/p/https://shop.test/{KEY}.txt", query="x=1")
    assert asked("forwarded", f"/{KEY}.txt", "shop.test")
    assert asked("forwarded", f"/{KEY}.txt", "SHOP.test:443")
    assert not asked("forwarded", f"/{KEY}.txt", "other.test")
    assert not asked("forwarded", "/wrong-key-1234.txt", "shop.test")
    assert not asked("forwarded", f"/{KEY}.txt", "shop.test/evil")
    reply = kf.reply("GET")
    assert reply.status == 200 and reply.body == KEY.encode()
    assert reply.headers["content-type"] == "text/plain; charset=utf-8" and kf.reply("HEAD").body == b""


def _config(index_now: dict, domains: tuple[str, ...] = ("shop.test",)) -> object:
    return parse({"domains": list(domains), "indexNow": index_now}, {}).config


def test_the_options_refuse_a_bad_key_a_host_outside_domains_and_a_plain_http_endpoint() -> None:
    ok = {"enabled": True, "key": KEY, "hosts": ["shop.test"]}
    cfg = _config(ok)
    assert cfg.index_now.endpoints == ["https://api.indexnow.org/indexnow"]  # type: ignore[attr-defined]
    assert cfg.index_now.batch_size == 10_000  # type: ignore[attr-defined]
    for bad in ({**ok, "key": "short"}, {**ok, "key": "has_underscore"}, {**ok, "key": "x" * 129},
                {**ok, "hosts": ["other.test"]}, {**ok, "batchSize": 10_001},
                {**ok, "endpoints": ["http://search.example/indexnow"]}, {"enabled": True, "key": KEY}):
        with pytest.raises(ConfigError):
            _config(bad)
    assert _config({**ok, "endpoints": ["http://127.0.0.1:9/indexnow"]})
    assert not _config({}).index_now.enabled  # type: ignore[attr-defined]
