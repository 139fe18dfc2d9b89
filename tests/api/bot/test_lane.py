"""The spread lane (api/bot/lane.py) on a node's real ingress without Ray (``tests.localnode``): the
same crawls played through the HTTP protocol with the lane off, then on (every memo emptied first):
the bytes received and every count must be the same, and the lane must have answered. Pages rendered
at different moments (so each has its own age and page-age count) and one page past its freshness in
the middle of a crawl. Time is the bot path's clock (``middleware.now_ms``) and the app's Dater."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from prerender_ray.api.bot.lane import ClassKey, Lane
from prerender_ray.api.bot.memo import HOT_MS, Tape
from prerender_ray.identity.routes import Route
from prerender_ray.serving import framing
from prerender_ray.serving.answer import Reply
from prerender_ray.serving.classify import BotRequest
from prerender_ray.storage.pagelog import key_hash
from prerender_ray.storage.pages import decode_head
from prerender_ray.storage.replication import payload_view
from tests.api.bot import test_memo_protocol
from tests.api.bot.test_memo import (
    GOOGLE,
    Tally,
    _call,
    delta,
    services,
    stats,
)
from tests.api.bot.test_memo_protocol import one, play, rendered, req
from tests.localnode import LocalNode
from tests.support import wait_for

PLAIN = {"user-agent": GOOGLE, "accept-encoding": "gzip"}


def key(name: str) -> ClassKey:
    """A class key of the lane's shape (the compiled lane checks it)."""
    return (0, 0, 0, name, "", "", "")


def route(path: str = "/") -> Route:
    return Route("prefix", path, "prerender", ())


def bot_request(route: Route | None, url: str = "https://x.example/a") -> BotRequest:
    """A request of the lane's own type (the compiled lane checks it); its route compared by identity."""
    return BotRequest("GET", url, "desktop", f"{url}|desktop", "prerender", route, (), "prefix")
controlled = test_memo_protocol.controlled  # the bot path's clock and the app's Dater, set by the test


@pytest.fixture(scope="module")
def node(tmp_path_factory, site) -> Iterator[LocalNode]:
    d = LocalNode.start(
        tmp_path_factory.mktemp("lane") / "data",
        {"domains": [f"127.0.0.1:{site.port}"], "page": {"swrTtl": 60_000}, "server": {"keepAliveTimeout": "500ms"}},
    )
    wait_for(lambda: services(d, 0).pages.log is not None, what="the replica on the log")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def pages(node, site) -> list[str]:
    """Six pages, rendered one after another (each its own last_cached; a first render expires at
    its URL's own slot)."""
    return rendered(node, [f"{site.base}/page/lane-{c}" for c in "abcdef"], "lane")


@pytest.fixture(scope="module")
def v1_pages(node, site) -> list[str]:
    """Pages framed as page logs written before the header lines were stored hold them (framing
    version 1: NUL-joined pairs, written as lines at each hit)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "wire_block", lambda pairs, size: None)
        return rendered(node, [f"{site.base}/page/lane-v1-{c}" for c in "abc"], "lane-v1")


def frame_version(node: LocalNode, path: str) -> int:
    hit = services(node, 0).pages.log.get(key_hash(path.removeprefix("/p/") + "|desktop"))
    assert hit is not None
    payload = payload_view(hit.data)
    assert payload is not None
    return decode_head(payload).frame[0]


def crawls(port: int, pages: list[str], etag: str) -> dict[str, tuple[list, bool]]:
    """name -> (script, whether the lane answers some of it)."""
    def crawl(headers: dict[str, str], method: str = "GET") -> list:
        last = req(port, pages[0], {**headers, "connection": "close"}, method)
        return [[*(one(req(port, p, headers, method)) for p in pages), one(last)]]

    return {
        "gzip": (crawl(PLAIN), True),
        "head": (crawl(PLAIN, "HEAD"), True),
        "http/1.0": ([[one(req(port, p, PLAIN, version="1.0"))] for p in pages], True),
        "br and gzip": (crawl({**PLAIN, "accept-encoding": "br, gzip"}), True),
        "mobile": (crawl({**PLAIN, "x-device-type": "mobile"}), True),
        # the third page's ETag: a 304 there, a 200 on every other page
        "if-none-match": (crawl({**PLAIN, "if-none-match": etag}), False),
        "if-modified-since": (crawl({**PLAIN, "if-modified-since": "Tue, 01 Jan 2019 00:00:00 GMT"}), False),
    }


def compare(node: LocalNode, script: list, tally: Tally, name: str) -> tuple[list, int]:
    """The script played with the lane off, then on: (what was received, the lane's hits) when on."""
    s = services(node, 0)
    lane = s.lane
    seen = []
    for on in (False, True):
        s.lane = lane if on else None
        s.memo.clear()
        s.decisions.clear()
        lane.clear()
        tally.reset()
        before, hits = stats(node, 0), lane.hits
        received = play(node.info.port, script)
        served = node.ingress[0]
        wait_for(lambda: not served.server.server_state.tasks, interval=0.01, what="every request's task done")
        seen.append((received, tally.totals(), delta(stats(node, 0), before)))
    s.lane = lane
    assert seen[1] == seen[0], name
    return seen[1][0], lane.hits - hits


@pytest.fixture
def tally(node, monkeypatch) -> Tally:
    counters = services(node, 0).counters
    node.run(_call(counters.flush))
    t = Tally(counters)
    monkeypatch.setattr(counters, "sink", t.take)
    return t


def test_a_crawl_through_the_lane_is_answered_and_counted_as_the_full_path(node, pages, controlled, tally) -> None:
    port = node.info.port
    third = play(port, [[one(req(port, pages[2], {**PLAIN, "connection": "close"}))]])[0]
    etag = next(line.partition(b": ")[2] for line in third.split(b"\r\n") if line.startswith(b"etag: "))
    for name, (script, answered) in crawls(port, pages, etag.decode()).items():
        received, hits = compare(node, script, tally, name)
        assert (hits > 0) == answered, (name, hits)
        assert all(r.startswith(b"HTTP/1.") for r in received), name


def test_a_page_asked_again_later_is_answered_by_the_lane_and_soon_after_is_kept_whole(
        node, pages, controlled) -> None:
    """A crawl that asks a page again now and then is no hot page: its repeat is answered as its first
    sight was, not by a full serve that keeps an entry (memo.HOT_MS); asked again at once, it is kept."""
    s = services(node, 0)
    s.memo.clear()
    s.decisions.clear()
    s.lane.clear()
    port = node.info.port
    crawl = [[*(one(req(port, p, PLAIN)) for p in pages), one(req(port, pages[0], {**PLAIN, "connection": "close"}))]]
    play(port, crawl)  # the lane learns the class on the first page, answers the rest
    kept, hits = s.memo.kept, s.lane.hits
    controlled.now += HOT_MS
    play(port, crawl)
    assert (s.memo.kept, s.lane.hits - hits) == (kept, len(pages))  # the last asks as another client
    play(port, crawl)  # at once: each request seen again soon, kept whole
    assert (s.memo.kept - kept, s.lane.hits - hits) == (len(pages) + 1, len(pages))


def test_pages_framed_before_the_header_lines_were_stored_are_answered_as_the_full_path(
        node, pages, v1_pages, controlled, tally) -> None:
    assert {frame_version(node, p) for p in pages} == {framing.WIRE_VERSION}
    assert {frame_version(node, p) for p in v1_pages} == {framing.FRAME_VERSION}
    port = node.info.port
    for name in ("gzip", "head", "br and gzip"):
        _, hits = compare(node, crawls(port, v1_pages, '"none"')[name][0], tally, name)
        assert hits > 0, name


def test_a_page_past_its_freshness_mid_crawl_takes_the_full_path(node, pages, controlled, tally) -> None:
    """The clock just past the first page's expiry (in its SWR window), before every other's."""
    log = services(node, 0).pages.log
    by_expiry = sorted(pages, key=lambda p: log.get(key_hash(p[len("/p/"):] + "|desktop")).expires_at)
    stale, h0, h1, h2, h3 = by_expiry[:5]
    first, second = (log.get(key_hash(p[len("/p/"):] + "|desktop")).expires_at for p in (stale, h0))
    assert first + 1 < second
    controlled.now = first + 1
    port = node.info.port
    order = [h0, h1, h2, stale, h3]
    script = [[*(one(req(port, p, PLAIN)) for p in order), one(req(port, h0, {**PLAIN, "connection": "close"}))]]
    _, hits = compare(node, script, tally, "stale between")
    # h0 tells the bot apart, h1 makes the entry, h2 and h3 are the lane's, the stale page is not, and
    # h0 again was seen (the full path keeps its answer whole)
    assert hits == 2


def test_learning_refuses_a_serve_that_timed_anything_but_the_page_age() -> None:
    lane = Lane()
    page = SimpleNamespace(frame=SimpleNamespace(headers=[]), stamp=b"s", status_code=200, last_cached=5)
    tape = Tape(SimpleNamespace())
    tape.out = SimpleNamespace(page=page, source="cache", cache_status="hit", markdown=False, render_now=None)
    tape.plain = True

    def page_age() -> None: ...

    def unrouted() -> None: ...

    state = SimpleNamespace(services=SimpleNamespace(signals_on=False, pages=SimpleNamespace(log=object())))
    req = bot_request(None)
    reply = Reply(200, {"age": "1"}, b"", page.frame.headers)
    tape.timed = [(unrouted, ("prerender", "/a"))]
    assert not lane.learn(key("k"), state, object(), None, req, {}, tape, reply, page_age)  # type: ignore[arg-type]
    tape.timed = [(page_age, (5, "desktop", "search", "Googlebot"))]
    assert lane.learn(key("k"), state, object(), None, req, {}, tape, reply, page_age)  # type: ignore[arg-type]
    conditional = {"if-none-match": '"x"'}  # each page's validators decide: never the class's
    assert not lane.learn(key("k"), state, object(), None, req, conditional, tape, reply, page_age)  # type: ignore[arg-type]
    reply.headers["x-url"] = req.url  # a header made of this URL's: not the class's
    assert not lane.learn(key("k"), state, object(), None, req, {}, tape, reply, page_age)  # type: ignore[arg-type]


def test_a_new_config_forgets_every_entry() -> None:
    lane = Lane()
    page = SimpleNamespace(frame=SimpleNamespace(headers=[]), stamp=b"s", status_code=200, last_cached=None)
    tape = Tape(SimpleNamespace())
    tape.out = SimpleNamespace(page=page, source="cache", cache_status="hit", markdown=False, render_now=None)
    tape.plain = True
    reply = Reply(200, {}, b"", page.frame.headers)
    req = bot_request(None)
    log = object()
    old, new = (SimpleNamespace(services=SimpleNamespace(signals_on=False, pages=SimpleNamespace(log=log)))
                for _ in range(2))
    assert lane.learn(key("old"), old, "who", None, req, {}, tape, reply, None)  # type: ignore[arg-type]
    assert lane.learn(key("new"), new, "who", None, req, {}, tape, reply, None)  # type: ignore[arg-type]
    assert len(lane) == 1 and lane.find(key("new"), new, "who", None, req, 0) is not None  # type: ignore[arg-type]


def test_an_entry_answers_only_under_what_it_was_made_with() -> None:
    """Its moment (the TTL from the serve that made it), the content-signals table, the page log, the
    identity entry, the site and the route: each compared by identity; one that differs lets it go."""
    page = SimpleNamespace(frame=SimpleNamespace(headers=[]), stamp=b"s", status_code=200, last_cached=None)
    tape = Tape(SimpleNamespace())
    tape.out = SimpleNamespace(page=page, source="cache", cache_status="hit", markdown=False, render_now=None)
    tape.plain, tape.now = True, 1_000
    reply = Reply(200, {}, b"", page.frame.headers)
    site, who = object(), object()
    req = bot_request(route())
    services = SimpleNamespace(signals_on=True, signals=SimpleNamespace(sites=object()),
                               pages=SimpleNamespace(log=object()))
    state = SimpleNamespace(services=services)

    def made() -> Lane:
        lane = Lane()
        assert lane.learn(key("k"), state, who, site, req, {}, tape, reply, None)  # type: ignore[arg-type]
        return lane

    assert made().find(key("k"), state, who, site, req, 1_999) is not None  # type: ignore[arg-type]
    assert made().find(key("k"), state, who, site, req, 2_000) is None  # type: ignore[arg-type]  # its TTL
    assert made().find(key("k"), state, object(), site, req, 1_500) is None  # type: ignore[arg-type]
    assert made().find(key("k"), state, who, object(), req, 1_500) is None  # type: ignore[arg-type]
    other_route = bot_request(route())
    assert made().find(key("k"), state, who, site, other_route, 1_500) is None  # type: ignore[arg-type]
    for changed in ("sites", "log"):
        lane = made()
        if changed == "sites":
            services.signals = SimpleNamespace(sites=object())  # a new content-signals table
        else:
            services.pages = SimpleNamespace(log=object())  # the page log rebuilt
        assert lane.find(key("k"), state, who, site, req, 1_500) is None, changed  # type: ignore[arg-type]
        assert len(lane) == 0, changed


@pytest.mark.parametrize("url", ["https://x.com/a?b=c%20d", "https://x.com/caf\u00e9", "https://x.com/\u2603",
                                 "https://x.com/a\tb", "https://x.com/a\r\nx-injected: 1", ""])
def test_the_links_line_is_what_the_full_path_writes(url: str) -> None:
    from prerender_ray.api.bot.lane import link_line
    from prerender_ray.api.bot.wire import header_lines
    from prerender_ray.serving.answer import asgi_headers
    from prerender_ray.serving.markdown import markdown_link

    general = header_lines(asgi_headers({"link": markdown_link(url)}))
    assert link_line(url) == (None if general is None else general[0])
