"""The decision memo (api/bot/decisions.py) on a node's real ingress without Ray (``tests.localnode``):
two replicas over one page log. Replica 0 takes who asks from its decision memo (its hit memo off, so
every request of a crawl is a new page as far as it can tell); replica 1 has both off and tells every
bot apart anew. The same headers asked for several pages, in many shapes: every answer and every count
must be the same. Time is the bot path's clock (``middleware.now_ms``), set by the test."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from prerender_ray.api.bot.decisions import DecisionMemo, Identity, identity_key
from prerender_ray.api.bot.memo import MAX_KEY_BYTES, request_shape
from tests.api.bot.test_memo import (
    BING,
    BROWSER,
    CCBOT,
    GOOGLE,
    GPT,
    HTML,
    PLAIN,
    Clock,
    Tally,
    Verifier,
    _call,
    ask,
    debug_status,
    delta,
    header,
    render,
    services,
    stats,
)
from tests.localnode import LocalNode
from tests.support import wait_for

KNOWN, FULL = 0, 1


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(
        tmp_path_factory.mktemp("decisions") / "data",
        {
            "domains": [f"127.0.0.1:{site.port}"],
            "page": {"swrTtl": 60_000},
            "bots": {"named": {"CCBot": {"serve": "deny"}}},
        },
        replicas=2,
    )
    services(d, KNOWN).memo = None
    services(d, FULL).memo = None
    services(d, FULL).decisions = None
    wait_for(lambda: all(services(d, i).pages.log is not None for i in (KNOWN, FULL)), what="both replicas on the log")
    yield d
    d.stop()


def decisions(node: LocalNode) -> DecisionMemo:
    found = services(node, KNOWN).decisions
    assert found is not None
    return found


@pytest.fixture
def clock(monkeypatch) -> Clock:
    from prerender_ray.api.bot import middleware

    c = Clock()
    monkeypatch.setattr(middleware, "now_ms", c)
    return c


@pytest.fixture
def tallies(node, monkeypatch) -> list[Tally]:
    out = []
    for replica in (KNOWN, FULL):
        counters = services(node, replica).counters
        tally = Tally(counters)
        node.run(_call(counters.flush))
        monkeypatch.setattr(counters, "sink", tally.take)
        out.append(tally)
    return out


@pytest.fixture(scope="module")
def pages(node, site) -> list[str]:
    urls = [f"{site.base}/page/decided-{c}" for c in "abc"]
    for i, url in enumerate(urls):
        render(node, url, HTML.replace(b"kept", f"kept {i}".encode()))  # each its own ETag
    for url in urls:
        wait_for(lambda url=url: debug_status(node, f"/p/{url}") == "hit", what=f"a hit for {url}")
    return [f"/p/{url}" for url in urls]


def shapes(site: Any, etag: str) -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = [
        ("GET", {"user-agent": ua, **({"accept-encoding": ae} if ae else {})})
        for ua in (GOOGLE, BING, GPT, CCBOT, BROWSER)
        for ae in ("gzip", "identity", None)
    ]
    out += [
        ("GET", {**PLAIN, "if-none-match": etag}),  # the first page's: a 304 there, a 200 elsewhere
        ("HEAD", PLAIN),
        ("GET", {**PLAIN, "x-harper-prerender-debug": "1"}),
        ("GET", {**PLAIN, "accept": "text/markdown"}),
        ("GET", {**PLAIN, "x-device-type": "mobile"}),
        ("GET", {**PLAIN, "x-forwarded-for": "203.0.113.9"}),
    ]
    return out


# each shape: every page in turn, then the first again, a moment later, then past the memo's TTL
OFFSETS = (0, 10, 20, 500, 1_200)


def test_every_answer_and_count_is_the_full_paths(node, site, pages, clock, tallies, monkeypatch) -> None:
    for replica in (KNOWN, FULL):  # Googlebot verified (its counts are part of who asks), at once
        monkeypatch.setattr(services(node, replica), "verifier", Verifier())
    first = ask(node, FULL, "GET", pages[0], PLAIN)
    etag = header(first, b"etag")
    assert first[0] == 200 and etag
    targets = [*pages, f"/p/{site.base}/noindex", "/nope"]  # a miss between hits, and not a bot request
    for tally in tallies:
        tally.reset()
    before = [stats(node, r) for r in (KNOWN, FULL)]
    decisions(node).clear()
    used, start = decisions(node).used, clock.now
    for i, (method, headers) in enumerate(shapes(site, etag.decode())):
        for offset in OFFSETS:
            for j, target in enumerate(targets):
                clock.now = start + 2_000 * i + offset + j
                known, full = (ask(node, r, method, target, headers) for r in (KNOWN, FULL))
                assert known == full, (method, target, headers, offset)
    # every bot request but the first of each shape and those past the TTL took who asks from the memo
    assert decisions(node).used - used > 15 * len(targets) * 3
    assert tallies[0].totals() == tallies[1].totals()
    after = [stats(node, r) for r in (KNOWN, FULL)]
    assert delta(after[0], before[0]) == delta(after[1], before[1])
    assert delta(after[0], before[0])["search"]["serves"] > 0


# ---------------------------------------------------------------------------------------- the memo


def fake_state(verifier: Any = None) -> Any:
    return SimpleNamespace(services=SimpleNamespace(verifier=verifier))


def who(name: str = "Googlebot", checked: Any = None, signed: Any = None) -> Identity:
    return Identity(name, "unchecked", "none", signed, checked, [])


def key(k: str) -> tuple[int, tuple]:
    return hash((k,)), (k,)


def test_an_identity_holds_for_its_ttl_under_its_state() -> None:
    m, state = DecisionMemo(ttl_ms=1_000), fake_state()
    assert m.keep(key("a"), state, who(), now=1_000)
    assert m.get(key("a"), state, 1_999) is not None
    assert m.get(key("a"), fake_state(), 1_500) is None  # another config: let go
    assert m.get(key("a"), state, 1_500) is None
    assert m.keep(key("a"), state, who(), now=1_000)
    assert m.get(key("a"), state, 2_000) is None and len(m) == 0


def test_a_signed_request_is_never_kept() -> None:
    m, state = DecisionMemo(), fake_state()
    assert not m.keep(key("a"), state, who(signed=object()), now=0)
    assert m.get(key("a"), state, 1) is None


def test_entries_are_capped_oldest_first() -> None:
    m, state = DecisionMemo(max_entries=3), fake_state()
    for i in range(5):
        m.keep(key(f"k{i}"), state, who(), now=0)
    assert [e.key[0] for e in m._entries.values()] == ["k2", "k3", "k4"]


def test_a_changed_verifier_answer_is_decided_again() -> None:
    class Verifier:
        answer: tuple[str, str] | None = ("verified", "verified")
        methods = {"googlebot": "dns"}

        def known(self, name: str, client: str | None) -> tuple[str, str] | None:
            return self.answer

        def method(self, name: str) -> str | None:
            return self.methods.get(name.lower())

    verifier = Verifier()
    m, state = DecisionMemo(), fake_state(verifier)
    m.keep(key("a"), state, who(checked=("Googlebot", "10.0.0.1", "verified", "verified")), now=0)
    assert m.get(key("a"), state, 1) is not None
    verifier.answer = ("failed", "not-confirmed")
    assert m.get(key("a"), state, 2) is None
    # decided without the verifier (no method for the bot): again once the bot has one
    m.keep(key("b"), state, who(name="Bingbot"), now=0)
    assert m.get(key("b"), state, 1) is not None
    verifier.methods["bingbot"] = "ranges"
    assert m.get(key("b"), state, 2) is None


def test_a_request_with_a_long_head_is_answered_but_never_kept(node, pages, clock) -> None:
    headers = {**PLAIN, "cookie": "c=" + "x" * MAX_KEY_BYTES}  # hostile keys must not pin memory
    kept = decisions(node).kept
    for _ in range(3):
        assert ask(node, KNOWN, "GET", pages[1], headers) == ask(node, FULL, "GET", pages[1], headers)
    assert decisions(node).kept == kept
    scope = {"method": "GET", "path": "/", "headers": [(b"cookie", b"x" * MAX_KEY_BYTES)], "client": ("1.2.3.4", 1)}
    assert identity_key(scope) is None and request_shape(scope) is None
    scope["headers"] = [(b"cookie", b"x" * 100)]
    assert identity_key(scope) is not None and request_shape(scope) is not None
