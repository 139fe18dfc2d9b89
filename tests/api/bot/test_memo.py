"""The hit memo (api/bot/memo.py) on a node's real ingress without Ray (``tests.localnode``): two
replicas over one page log, pages produced as the fleet produces them (claim, post a result). Replica 0
answers repeated plain hits from its memo; replica 1 has it off and takes the full path every time:
every answer and every count must be the same. Time is the bot path's clock (``middleware.now_ms``),
set by the test."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from prerender_ray import metrics
from prerender_ray.api.bot import middleware
from prerender_ray.api.bot.memo import HOT_MS, HitMemo, Tape
from prerender_ray.api.bot.replica import reconfigure
from prerender_ray.serving.answer import Reply
from tests.localnode import LocalNode
from tests.support import post_result, put_target, take, wait_for

MEMO, FULL = 0, 1
GOOGLE = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BING = "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"
GPT = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko); compatible; GPTBot/1.2; +https://openai.com/gptbot"
CCBOT = "CCBot/2.0 (https://commoncrawl.org/faq/)"  # denied by the node's config
BROWSER = "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0"
HTML = (
    b"<!doctype html><html><head><title>memo</title></head><body>" + b"<p>kept</p>" * 60 + b"</body></html>"
)
PLAIN = {"user-agent": GOOGLE, "accept-encoding": "gzip"}
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(
        tmp_path_factory.mktemp("memo") / "data",
        {
            "domains": [f"127.0.0.1:{site.port}"],
            "page": {"swrTtl": 60_000},
            # a first render's next one (the page's freshness) on the cadence, not on the URL's slot,
            # which with the site's random port could fall within the minutes of fake time the tests
            # walk through: its pages would turn stale part way through a comparison of hits
            "render": {"firstRender": "staggered"},
            "bots": {"named": {"CCBot": {"serve": "deny"}}},
        },
        replicas=2,
    )
    services(d, FULL).memo = None
    wait_for(
        lambda: all(services(d, i).pages.log is not None for i in (MEMO, FULL)),
        what="both replicas on the log",
    )
    yield d
    d.stop()


def services(node: LocalNode, replica: int) -> Any:
    return node.ingress[replica].ctx.state.services


def memo(node: LocalNode) -> HitMemo:
    found = services(node, MEMO).memo
    assert found is not None
    return found


class Clock:
    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(middleware, "now_ms", c)
    return c


class Tally:
    """A replica's counts and observations, taken where ``Counters.flush`` would write them (the
    counters' ``sink``)."""

    def __init__(self, counters: Any) -> None:
        self.counters = counters
        self.counts: Counter = Counter()
        self.observed: dict[tuple, list[float]] = {}

    def take(self, pending: dict, observed: dict) -> None:
        self.counts.update(pending)
        for key, values in observed.items():
            self.observed.setdefault(key, []).extend(values)

    def flush(self) -> None:
        self.counters.flush()

    def reset(self) -> None:
        self.flush()
        self.counts.clear()
        self.observed.clear()

    def totals(self) -> tuple[dict, dict]:
        self.flush()
        return dict(self.counts), {k: sorted(v) for k, v in self.observed.items()}


@pytest.fixture
def tallies(node, monkeypatch) -> list[Tally]:
    out = []
    for replica in (MEMO, FULL):
        counters = services(node, replica).counters
        tally = Tally(counters)
        node.run(_call(counters.flush))  # what came before goes where it always goes
        monkeypatch.setattr(counters, "sink", tally.take)
        out.append(tally)
    return out


async def _call(fn: Callable[[], Any]) -> Any:
    return fn()


def render(node: LocalNode, url: str, html: bytes = HTML) -> None:
    """Put ``url`` due now, claim its jobs and post a result for each, as the fleet does."""
    keys = put_target(node.url, url, nextRenderTime=1)["cacheKeys"]
    jobs = take(node.url, keys)
    for key in keys:
        assert post_result(jobs[key], html=html, encoding="gzip").status_code == 204


def ask(node: LocalNode, replica: int, method: str, target: str, headers: dict[str, str]) -> Answer:
    return node.run(_ask(node, replica, method, target, headers))


async def _ask(node: LocalNode, replica: int, method: str, target: str, headers: dict[str, str]) -> Answer:
    """The answer as sent, but its Date (the wall clock's, not the bot path's)."""
    app = node.ingress[replica].app
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=node.url) as client:
        client.headers = httpx.Headers()  # exactly the headers asked for (and Host)
        async with client.stream(method, target, headers=headers) as r:
            body = b"".join([chunk async for chunk in r.aiter_raw()])
    return r.status_code, [h for h in r.headers.raw if h[0] != b"date"], body


def debug_status(node: LocalNode, target: str) -> str | None:
    _, headers, _ = ask(node, MEMO, "GET", target, {**PLAIN, "x-harper-prerender-debug": "1"})
    return dict(headers).get(b"x-harper-cache", b"").decode() or None


def warm(node: LocalNode, target: str, headers: dict[str, str] = PLAIN) -> Answer:
    """An empty memo, then ``target`` asked twice: seen, then kept (the answer of the second)."""
    memo(node).clear()
    ask(node, MEMO, "GET", target, headers)
    kept = memo(node).kept
    answer = ask(node, MEMO, "GET", target, headers)
    assert memo(node).kept == kept + 1
    return answer


def header(answer: Answer, name: bytes) -> bytes | None:
    return dict(answer[1]).get(name)


def stats(node: LocalNode, replica: int) -> dict:
    return services(node, replica).class_stats.snapshot()


def delta(after: Any, before: Any) -> Any:
    if isinstance(after, dict):
        return {
            k: delta(v, before.get(k, 0) if isinstance(v, int) else before.get(k, {}))
            for k, v in after.items()
        }
    return after - before


@pytest.fixture(scope="module")
def pages(node, site) -> dict[str, str]:
    a, numbered = f"{site.base}/page/memo-a", f"{site.base}/page/memo-a?page=2"
    render(node, a)
    render(node, numbered)
    for url in (a, numbered):
        wait_for(lambda url=url: debug_status(node, f"/p/{url}") == "hit", what=f"a hit for {url}")
    return {"a": f"/p/{a}", "numbered": f"/p/{numbered}"}


# -------------------------------------------------------------------------------- the same answers


def shapes(
    pages: dict[str, str], site: Any, etag: str, modified: str
) -> list[tuple[str, str, dict[str, str]]]:
    a = pages["a"]
    out = [
        ("GET", a, {"user-agent": ua, **({"accept-encoding": ae} if ae else {})})
        for ua in (GOOGLE, BING, GPT, CCBOT, BROWSER)
        for ae in ("gzip", "identity", "br", None)
    ]
    out += [
        ("GET", a, {**PLAIN, "if-none-match": etag}),
        ("GET", a, {**PLAIN, "if-none-match": '"other"'}),
        ("GET", a, {**PLAIN, "if-modified-since": modified}),
        ("GET", a, {**PLAIN, "if-modified-since": "Tue, 01 Jan 2019 00:00:00 GMT"}),
        ("GET", a, {"user-agent": BING, "accept-encoding": "br", "if-none-match": f"W/{etag}"}),
        ("HEAD", a, PLAIN),
        ("HEAD", a, {**PLAIN, "accept-encoding": "br"}),
        ("HEAD", a, {**PLAIN, "if-none-match": etag}),
        ("GET", a, {**PLAIN, "x-harper-prerender-debug": "1"}),
        ("GET", a, {**PLAIN, "accept": "text/markdown"}),
        (
            "GET",
            a,
            {"user-agent": GPT, "accept": "text/markdown, text/html;q=0.5", "accept-encoding": "gzip"},
        ),
        ("GET", a, {**PLAIN, "x-device-type": "mobile"}),
        ("GET", a + "?x=1", PLAIN),  # a query key the allowlist drops: the same page
        ("GET", pages["numbered"], PLAIN),
        ("GET", pages["numbered"] + "&utm_source=x", {**PLAIN, "accept-encoding": "identity"}),
        ("GET", f"/p/{site.base}/noindex", PLAIN),  # a miss: the origin's page (noindex: not discovered)
        ("GET", f"/p/{site.base}/error", PLAIN),  # a miss the origin fails
        ("GET", "/nope", PLAIN),  # not a bot request: the routers' 404
    ]
    return out


# seen, kept (seen again soon: HOT_MS), answered from the memo (a later age, mostly); past the TTL and
# long after its first sight: seen as if anew, kept again, answered again
OFFSETS = (0, 10, 1_009, 1_100, 1_110, 1_119)


def test_every_answer_and_count_is_the_full_paths(node, site, pages, clock, tallies) -> None:
    first = ask(node, FULL, "GET", pages["a"], PLAIN)
    etag, modified = header(first, b"etag"), header(first, b"last-modified")
    assert first[0] == 200 and etag and modified
    requests = shapes(pages, site, etag.decode(), modified.decode())
    for tally in tallies:
        tally.reset()
    before = [stats(node, r) for r in (MEMO, FULL)]
    memo(node).clear()
    hits, start = memo(node).hits, clock.now
    from_memo: list[tuple[int, str, int]] = []  # (shape, its method and target, the offsets answered)
    for i, (method, target, headers) in enumerate(requests):
        before_shape = memo(node).hits
        for offset in OFFSETS:
            clock.now = start + 2_000 * i + offset
            memoized, full = (ask(node, r, method, target, headers) for r in (MEMO, FULL))
            assert memoized == full, (method, target, headers, offset)
        from_memo.append((i, f"{method} {target} {headers}", memo(node).hits - before_shape))
    # the plain hits were answered from the memo, twice each: at +1009 and +1119
    answered = memo(node).hits - hits
    # every shape but the 4 denied, debug, 2 Markdown, 2 misses, /nope; the shapes by answers if not
    assert answered == 2 * 28, (answered, from_memo)
    assert tallies[0].totals() == tallies[1].totals()
    after = [stats(node, r) for r in (MEMO, FULL)]
    assert delta(after[0], before[0]) == delta(after[1], before[1])
    assert delta(after[0], before[0])["search"]["serves"] > 0


def test_the_age_is_the_moment_s(node, pages, clock) -> None:
    page = node.run(_call(lambda: services(node, MEMO).pages.get(pages["a"][3:] + "|desktop")))
    clock.now = page.last_cached + 10_500  # 10 s old, 0.5 s into the second
    made = warm(node, pages["a"])
    hits = memo(node).hits
    clock.now += 600
    again = ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 1
    assert header(made, b"age") == b"10" and header(again, b"age") == b"11"
    assert [h for h in made[1] if h[0] != b"age"] == [h for h in again[1] if h[0] != b"age"]
    assert [h[0] for h in made[1]] == [h[0] for h in again[1]]  # age where the full path puts it


# ---------------------------------------------------------------------------------- invalidation


def test_a_new_version_is_served_at_once(node, site, clock) -> None:
    url = f"{site.base}/page/memo-new"
    render(node, url)
    wait_for(lambda: debug_status(node, f"/p/{url}") == "hit", what="the first version")
    clock.now = int(time.time() * 1000)
    identity = {"user-agent": GOOGLE, "accept-encoding": "identity"}
    warm(node, f"/p/{url}", identity)
    hits = memo(node).hits
    status, _, body = ask(node, MEMO, "GET", f"/p/{url}", identity)
    assert status == 200 and body == HTML and memo(node).hits == hits + 1
    hits += 1
    newer = HTML.replace(b"kept", b"newer")
    render(node, url, newer)  # its 204 came: the store wrote it
    status, _, body = ask(node, MEMO, "GET", f"/p/{url}", identity)
    assert status == 200 and body == newer
    assert memo(node).hits == hits  # the entry no longer held


def test_a_config_change_is_not_answered_from_the_old_memo(node, pages, clock) -> None:
    warm(node, pages["a"])
    hits, kept = memo(node).hits, memo(node).kept
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 1
    ctx = node.ingress[MEMO].ctx
    old = ctx.state
    node.run(_call(lambda: reconfigure(ctx, old.cfg)))
    assert ctx.state is not old
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 1 and memo(node).kept == kept + 1  # the full path, and a new entry
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 2


def test_past_its_freshness_the_full_path_answers(node, pages, clock, tallies) -> None:
    page = node.run(_call(lambda: services(node, MEMO).pages.get(pages["numbered"][3:] + "|desktop")))
    clock.now = page.expires_at - 500
    warm(node, pages["numbered"])
    hits = memo(node).hits
    clock.now = page.expires_at  # within the TTL of the entry, but no longer a hit: swr
    for _ in range(2):
        status, headers, _ = ask(node, MEMO, "GET", pages["numbered"], PLAIN)
        assert status == 200
    assert memo(node).hits == hits  # swr is never kept
    counts, _ = tallies[0].totals()
    assert counts[(metrics.bot_serves, ("cache", "swr", "Googlebot"))] == 2


def test_past_the_ttl_the_entry_is_made_again(node, pages, clock) -> None:
    warm(node, pages["a"])
    m = memo(node)
    hits, kept = m.hits, m.kept
    clock.now += 999
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert (m.hits, m.kept) == (hits + 1, kept)
    clock.now += 1
    ask(node, MEMO, "GET", pages["a"], PLAIN)  # its first sight long ago (HOT_MS): seen anew, not kept
    assert (m.hits, m.kept) == (hits + 1, kept)
    ask(node, MEMO, "GET", pages["a"], PLAIN)  # seen again soon: kept again
    assert (m.hits, m.kept) == (hits + 1, kept + 1)
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert m.hits == hits + 2


class Verifier:
    """What ``bots.verify`` answers (a remembered answer), for Googlebot only."""

    def __init__(self) -> None:
        self.answer: tuple[str, str] | None = ("verified", "verified")

    def method(self, name: str) -> str | None:
        return "dns" if name == "Googlebot" else None

    async def check_why(self, name: str, client: str | None) -> tuple[str, str]:
        return self.answer or ("unverified", "deadline")

    def known(self, name: str, client: str | None) -> tuple[str, str] | None:
        return self.answer


def test_a_changed_verification_or_signals_table_is_not_answered_from_the_memo(
    node, pages, clock, monkeypatch
) -> None:
    s = services(node, MEMO)
    verifier = Verifier()
    monkeypatch.setattr(s, "verifier", verifier)
    monkeypatch.setattr(s, "signals_on", True)
    warm(node, pages["a"])  # afresh: entries made without them (a replica's verifier is there from its start)
    hits, kept = memo(node).hits, memo(node).kept
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 1
    verifier.answer = ("failed", "not-confirmed")
    before = stats(node, MEMO)
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 1 and memo(node).kept == kept + 1
    served = delta(stats(node, MEMO), before)
    assert served["other"]["verification"]["failed"] == 1  # served as the failed class
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 2
    verifier.answer = None  # a lookup would start: never answered from the memo
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 2
    verifier.answer = ("verified", "verified")
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 3
    monkeypatch.setattr(s.signals, "sites", {})  # the table read again
    ask(node, MEMO, "GET", pages["a"], PLAIN)
    assert memo(node).hits == hits + 3


# ---------------------------------------------------------------------------------------- bounds


def fake_state() -> Any:
    return SimpleNamespace(services=SimpleNamespace(pages=SimpleNamespace(log=object())))


def kept(m: HitMemo, state: Any, key: str, body: Any, now: int = 1_000) -> bool:
    """Keep an answer of ``body`` for ``key``, as a plain hit's serve would hand it over."""
    page = SimpleNamespace(
        body=body,
        variants={},
        stamp=b"s",
        log_key=b"k",
        expires_at=now + 60_000,
        last_cached=None,
        status_code=200,
        cache_key=key,
    )
    out = SimpleNamespace(page=page, source="cache", cache_status="hit", markdown=False, render_now=None)
    tape = Tape(state.services)
    tape.now, tape.out, tape.plain = now, out, True
    return m.keep((hash(key), (key,)), state, tape, Reply(200, {}, body), [(b"content-type", b"text/html")])


def keys(m: HitMemo) -> list[str]:
    return [e.key[0] for e in m._entries.values()]


def test_entries_are_capped_oldest_first() -> None:
    m, state = HitMemo(max_entries=3, max_bytes=10_000), fake_state()
    for i in range(5):
        assert kept(m, state, f"k{i}", bytes(10))
    assert len(m) == 3 and keys(m) == ["k2", "k3", "k4"]
    assert m.bytes == 30


def test_bodies_are_held_within_the_byte_budget_each_record_counted_once() -> None:
    m, state = HitMemo(max_entries=100, max_bytes=250), fake_state()
    record = bytes(100)
    assert kept(m, state, "a", memoryview(record)[10:])  # a page's body: a view of its record
    assert kept(m, state, "b", memoryview(record)[20:])
    assert m.bytes == 100  # one record, two entries
    assert kept(m, state, "c", bytes(100))
    assert m.bytes == 200 and len(m) == 3
    assert kept(m, state, "d", bytes(100))  # over the budget: the oldest go until it fits
    assert m.bytes == 200 and keys(m) == ["c", "d"]
    assert not kept(m, state, "e", bytes(300))  # bigger than the whole budget: never kept
    assert kept(m, state, "f", b"")  # a 304 or a HEAD holds no body
    assert m.bytes == 200 and len(m) == 3
    assert kept(m, state, "c", bytes(50))  # made again: the old body is let go
    assert m.bytes == 150


def test_entries_past_their_ttl_go_when_another_is_made() -> None:
    m, state = HitMemo(max_entries=100, max_bytes=10_000, ttl_ms=1_000), fake_state()
    assert kept(m, state, "a", bytes(10), now=1_000)
    assert kept(m, state, "b", bytes(10), now=1_500)
    assert kept(m, state, "c", bytes(10), now=2_000)
    assert keys(m) == ["b", "c"] and m.bytes == 20


def test_a_new_state_clears_the_memo() -> None:
    m = HitMemo()
    assert kept(m, fake_state(), "a", bytes(10))
    assert kept(m, fake_state(), "b", bytes(10))
    assert keys(m) == ["b"] and m.bytes == 10


def test_a_shape_is_admitted_from_a_second_sight_soon_after_its_first() -> None:
    m = HitMemo()
    shape = (hash(("k",)), ("k",))
    assert not m.seen(shape, 0) and not m.admits(shape, 0)
    assert m.seen(shape, HOT_MS - 1) and m.admits(shape, HOT_MS - 1) and m.admits(shape, HOT_MS - 1)
    m.clear()
    assert not m.admits(shape, 0)
    # asked again later (a crawl's repeat): a first sight again, from which a soon one is admitted
    assert not m.seen(shape, HOT_MS) and not m.admits(shape, HOT_MS)
    assert not m.admits(shape, 3 * HOT_MS)
    assert m.admits(shape, 4 * HOT_MS - 1)
