"""Memo hits answered by the HTTP protocol itself (``api.connections.GuardedHttp._memo_hit``) against
the same hits through the ASGI path: a node's real ingress (``tests.localnode``, one replica, its own
uvicorn server) driven by raw sockets. Each script is played with the protocol's path off, then on
after llhttp's callbacks, then on for simple reads taken whole (``native/request_head.c``), from an
empty memo: the bytes received and every count must be the same. Time is controlled: the bot path's
clock (``middleware.now_ms``) and the app's Dater, which both paths date by."""

from __future__ import annotations

import gzip
import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from prerender_ray.api.bot import middleware
from prerender_ray.api.connections import GuardedHttp
from prerender_ray.serving.dates import Dater, http_date
from tests.api.bot.test_memo import (
    BROWSER,
    GOOGLE,
    HTML,
    Clock,
    Tally,
    debug_status,
    delta,
    render,
    services,
    stats,
)
from tests.localnode import LocalNode
from tests.support import wait_for

# The ASGI path; the protocol's answers after llhttp's callbacks; after native/request_head.c took a simple
# read whole (where the per-URL path is compiled: else as the callbacks' path)
MODES = ("asgi", "callbacks", "simple")
KEEP_ALIVE_S = 0.5  # the node's keep-alive timeout: an idle connection closes after it
PAUSE_S = 0.03  # between the pieces of a request's head


def set_mode(monkeypatch: Any, mode: str) -> bool:
    """Serve by ``mode`` (one of ``MODES``); whether the protocol answers anything itself."""
    monkeypatch.setattr(GuardedHttp, "memo_hits", mode != "asgi")
    monkeypatch.setattr(GuardedHttp, "simple_heads", mode == "simple")
    return mode != "asgi"


@pytest.fixture(scope="module")
def node(tmp_path_factory, site) -> Iterator[LocalNode]:
    d = LocalNode.start(
        tmp_path_factory.mktemp("memo-protocol") / "data",
        {
            "domains": [f"127.0.0.1:{site.port}"],
            "page": {"swrTtl": 60_000},
            "server": {"keepAliveTimeout": f"{int(KEEP_ALIVE_S * 1000)}ms"},
        },
    )
    wait_for(lambda: services(d, 0).pages.log is not None, what="the replica on the log")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def page(node, site) -> str:
    url = f"{site.base}/page/memo-protocol"
    render(node, url)
    wait_for(lambda: debug_status(node, f"/p/{url}") == "hit", what="a hit")
    return f"/p/{url}"


class FixedSecond:
    """A Dater's clock of one second, whatever the clock says (a test moves it)."""

    def __init__(self, second: int) -> None:
        self.second = second

    def __call__(self) -> float:
        return self.second


@pytest.fixture
def controlled(node, monkeypatch) -> Clock:
    # no access log, as a replica runs (pytest adds its capture handlers to every logger, uvicorn's
    # then logs each answer and the protocol leaves every request to uvicorn's path)
    monkeypatch.setattr(logging.getLogger("uvicorn.access"), "hasHandlers", lambda: False)
    clock = Clock()
    monkeypatch.setattr(middleware, "now_ms", clock)
    monkeypatch.setattr(node.ingress[0].app, "dater", Dater(FixedSecond(clock.now // 1000)))
    return clock


# ------------------------------------------------------------------------------------- scripts


@dataclass
class Step:
    """Bytes sent (a float: a pause, in seconds), then the answers read (True: one to a HEAD)."""

    sent: list[bytes | float]
    heads: list[bool]


Script = list[list[Step]]  # connections, one after another


def req(
    port: int,
    target: str,
    headers: dict[str, str],
    method: str = "GET",
    version: str = "1.1",
    body: bytes = b"",
) -> bytes:
    lines = [
        f"{method} {target} HTTP/{version}",
        f"host: 127.0.0.1:{port}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def one(raw: bytes) -> Step:
    return Step([raw], [raw.startswith(b"HEAD ")])


def pipelined(*raws: bytes) -> Step:
    return Step([b"".join(raws)], [r.startswith(b"HEAD ") for r in raws])


def pieces(raw: bytes, n: int = 3) -> Step:
    size = len(raw) // n + 1
    sent: list[bytes | float] = []
    for i in range(0, len(raw), size):
        sent += [raw[i : i + size], PAUSE_S]
    return Step(sent[:-1], [raw.startswith(b"HEAD ")])


class Reader:
    """Answers off a socket, each as sent (a Content-Length frames every answer here)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf, self.raw = sock, b"", b""

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        self.buf += chunk
        return bool(chunk)

    def answer(self, head: bool) -> None:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"closed before an answer: {self.raw + self.buf!r}"
        end = self.buf.index(b"\r\n\r\n") + 4
        lines = self.buf[:end].split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        if not head and status not in (204, 304):
            length = next(
                (
                    int(v)
                    for k, _, v in (line.partition(b":") for line in lines[1:])
                    if k.strip().lower() == b"content-length"
                ),
                0,
            )
        while len(self.buf) < end + length:
            assert self._fill(), "closed mid-answer"
        self.raw, self.buf = self.raw + self.buf[: end + length], self.buf[end + length :]

    def rest(self) -> bytes:
        """All read, through what came until the server closed."""
        while self._fill():
            pass
        return self.raw + self.buf


def play(port: int, script: Script) -> list[bytes]:
    out = []
    for steps in script:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            reader = Reader(sock)
            for step in steps:
                for part in step.sent:
                    if isinstance(part, float):
                        time.sleep(part)
                    else:
                        sock.sendall(part)
                for head in step.heads:
                    reader.answer(head)
            out.append(reader.rest())
    return out


def scripts(port: int, page: str, site: Any, etag: str) -> dict[str, tuple[Script, int]]:
    """name -> (script, the memo hits the protocol answers of it when on). A shape is answered from
    the memo from its third sight on (seen, kept, answered); the last request of a connection asks
    for it to be closed."""
    plain = {"user-agent": GOOGLE, "accept-encoding": "gzip"}
    close = {**plain, "connection": "close"}
    get = req(port, page, plain)
    head = req(port, page, plain, "HEAD")
    end = one(req(port, page, close))

    def repeated(raw: bytes, n: int = 5, last: Step = end) -> Script:
        return [[*(one(raw) for _ in range(n)), last]]

    def alone(raw: bytes, n: int = 4) -> Script:  # one connection each (the request closes it)
        return [[one(raw)] for _ in range(n)]

    body = req(port, page, {**plain, "content-length": "5"}, body=b"hello")
    miss = req(port, f"/p/{site.base}/noindex", plain)
    old_keep = req(port, page, {**plain, "connection": "keep-alive"}, version="1.0")
    return {
        "keep-alive": (repeated(get), 3),
        "head": (repeated(head, last=one(req(port, page, close, "HEAD"))), 3),
        "http/1.0": (alone(req(port, page, plain, version="1.0")), 2),
        "http/1.0 keep-alive": (alone(old_keep), 2),
        "connection: close": (alone(req(port, page, close)), 2),
        "if-none-match": (repeated(req(port, page, {**plain, "if-none-match": etag})), 3),
        "if-none-match head": (repeated(req(port, page, {**plain, "if-none-match": etag}, "HEAD")), 3),
        "pipelined hits": ([[one(get), one(get), pipelined(get, get, get, req(port, page, close))]], 3),
        # as uvicorn, nothing read after an answer that closes is served: neither a hit nor a miss
        "pipelined after connection: close": (
            [
                *alone(req(port, page, close), 2),
                [Step([req(port, page, close) + get + miss + body], [False])],
            ],
            1,
        ),
        "pipelined after HTTP/1.0 keep-alive": (  # uvicorn closes it all the same
            [*alone(old_keep, 2), [Step([old_keep + get + old_keep + miss], [False])]],
            1,
        ),
        "pipelined behind an answer in flight": (
            [
                [
                    one(get),
                    one(get),
                    pipelined(
                        get,
                        head,
                        get,
                        miss,
                        get,
                        req(port, page, close),
                    ),
                ]
            ],
            1,  # the first; the rest wait for the HEAD (and then the miss), so the ASGI path answers them
        ),
        "a body": (repeated(body), 0),
        "content-length: 0": (repeated(req(port, page, {**plain, "content-length": "0"})), 3),
        "head in pieces": ([[*(pieces(get) for _ in range(5)), pieces(req(port, page, close))]], 3),
        "a browser on the prerender path": (repeated(req(port, page, {"user-agent": BROWSER})), 3),
        "our own endpoint": (repeated(req(port, "/healthz", plain)), 0),
        "a miss": (repeated(miss, 3), 0),
        "an unknown path": (repeated(req(port, "/nope", plain), 3), 0),
    }


# the Date an hour on, or an hour back: before the page's Last-Modified, which is then held to it
@pytest.mark.parametrize("date_offset_s", [3_600, -3_600])
def test_the_protocol_answers_memo_hits_as_the_asgi_path_does(
    node, site, page, controlled, monkeypatch, date_offset_s
) -> None:
    port = node.info.port
    served = node.ingress[0]
    served.app.dater.clock.second += date_offset_s
    memo, counters = services(node, 0).memo, services(node, 0).counters
    decisions = services(node, 0).decisions
    assert memo is not None and decisions is not None
    first = play(port, [[one(req(port, page, {"user-agent": GOOGLE, "connection": "close"}))]])[0]
    etag = next(line.partition(b": ")[2] for line in first.split(b"\r\n") if line.startswith(b"etag: "))
    node.run(_call(counters.flush))  # what came before goes where it always goes
    tally = Tally(counters)
    monkeypatch.setattr(counters, "sink", tally.take)
    for name, (script, wired) in scripts(port, page, site, etag.decode()).items():
        seen = []
        for mode in MODES:
            on = set_mode(monkeypatch, mode)
            memo.clear()
            decisions.clear()  # every bot told apart on its first request (tests spread hits below)
            tally.reset()
            before = (stats(node, 0), served.server.server_state.total_requests, memo.hits, memo.wired)
            received = play(port, script)
            wait_for(
                lambda: not served.server.server_state.tasks, interval=0.01, what="every request's task done"
            )
            after = (stats(node, 0), served.server.server_state.total_requests, memo.hits, memo.wired)
            seen.append(
                (
                    received,
                    tally.totals(),
                    delta(after[0], before[0]),
                    after[1] - before[1],
                    after[2] - before[2],
                )
            )
            assert after[3] - before[3] == (wired if on else 0), name
        assert seen[1] == seen[0] and seen[2] == seen[0], name
        assert all(r.startswith(b"HTTP/1.1 ") for r in seen[0][0]), name
        date = http_date(served.app.dater.clock.second)
        assert b"date: " + date in seen[0][0][0]
        assert (b"last-modified: " + date in seen[0][0][0]) == (date_offset_s < 0)


def test_an_answer_after_a_memo_hit_in_the_same_read_is_not_cut_by_the_keep_alive_timer(
    node, site, page, controlled
) -> None:
    """The hit arms the keep-alive timer as a response's end does; the slow request read with it
    (longer than the keep-alive timeout) must not be closed under it."""
    port, memo = node.info.port, services(node, 0).memo
    assert memo is not None
    plain = {"user-agent": GOOGLE, "accept-encoding": "gzip"}
    get = req(port, page, plain)
    memo.clear()
    wired = memo.wired
    slow = req(port, f"/p/{site.base}/slow/a", {**plain, "connection": "close"})
    started = time.monotonic()
    received = play(port, [[one(get), one(get), pipelined(get, slow)]])[0]
    assert time.monotonic() - started > KEEP_ALIVE_S
    assert memo.wired == wired + 1
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 4, received[-300:]


async def _call(fn: Any) -> Any:
    return fn()


# ------------------------------------------------------------------------------- spread hits


@pytest.fixture(scope="module")
def spread(node, site) -> list[str]:
    return rendered(node, [f"{site.base}/page/memo-spread-{c}" for c in "abcd"], "spread")


def rendered(node: LocalNode, urls: list[str], label: str) -> list[str]:
    """``urls`` rendered one after another, each page its own (``label`` and its index in the body),
    then served as hits: their bot paths."""
    for i, url in enumerate(urls):
        render(node, url, HTML.replace(b"kept", f"{label} {i}".encode()))
    for url in urls:
        wait_for(lambda url=url: debug_status(node, f"/p/{url}") == "hit", what=f"a hit for {url}")
    return [f"/p/{url}" for url in urls]


def spread_scripts(port: int, pages: list[str], site: Any, etag: str) -> dict[str, tuple[Script, int]]:
    """name -> (script, the hits the protocol answers of it with the bot taken from the decision memo
    when on). The first request of a header list tells its bot apart; a page asked again with the same
    headers takes the full path (its answer is kept whole in the hit memo)."""
    plain = {"user-agent": GOOGLE, "accept-encoding": "gzip"}
    close = {**plain, "connection": "close"}
    a, b, c, d = pages
    gets = [req(port, p, plain) for p in pages]
    miss = req(port, f"/p/{site.base}/noindex", plain)
    return {
        "a crawl": ([[*(one(g) for g in gets), one(gets[0]), one(gets[0]), one(req(port, a, close))]], 4),
        "heads": ([[*(one(req(port, p, plain, "HEAD")) for p in pages), one(req(port, a, close, "HEAD"))]], 3),
        "a connection each": ([[one(req(port, p, close))] for p in pages], 3),
        "http/1.0": ([[one(req(port, p, plain, version="1.0"))] for p in pages], 3),
        "pipelined": ([[one(gets[0]), pipelined(*gets[1:], req(port, a, close))]], 3),
        "a miss between": ([[one(gets[0]), one(miss), one(gets[1]), one(gets[2]), one(req(port, d, close))]], 2),
        # the first page's ETag: a 304 there, a 200 on every other page
        "if-none-match": ([[*(one(req(port, p, {**plain, "if-none-match": etag})) for p in (a, b, c, d, b)),
                            one(req(port, c, close))]], 4),
        "no gzip": ([[*(one(req(port, p, {"user-agent": GOOGLE})) for p in pages)]], 0),  # decoded: the app
        "markdown": ([[*(one(req(port, p, {**plain, "accept": "text/markdown"})) for p in pages)]], 0),
        "debug": ([[*(one(req(port, p, {**plain, "x-harper-prerender-debug": "1"})) for p in pages)]], 0),
        "a browser": ([[*(one(req(port, p, {"user-agent": BROWSER})) for p in pages)]], 0),
    }


def test_the_protocol_answers_spread_hits_as_the_asgi_path_does(node, site, spread, controlled, monkeypatch) -> None:
    port = node.info.port
    served = node.ingress[0]
    memo, decisions, counters = (getattr(services(node, 0), n) for n in ("memo", "decisions", "counters"))
    assert memo is not None and decisions is not None
    first = play(port, [[one(req(port, spread[0], {"user-agent": GOOGLE, "connection": "close"}))]])[0]
    etag = next(line.partition(b": ")[2] for line in first.split(b"\r\n") if line.startswith(b"etag: "))
    node.run(_call(counters.flush))
    tally = Tally(counters)
    monkeypatch.setattr(counters, "sink", tally.take)
    for name, (script, wired) in spread_scripts(port, spread, site, etag.decode()).items():
        seen = []
        play(port, script)  # what outlives the memos (the Markdown converted, a page kept decoded) made once
        for mode in MODES:
            on = set_mode(monkeypatch, mode)
            memo.clear()
            decisions.clear()
            tally.reset()
            before, memo_wired = (stats(node, 0), decisions.wired), memo.wired
            received = play(port, script)
            wait_for(lambda: not served.server.server_state.tasks, interval=0.01, what="every request's task done")
            after = (stats(node, 0), decisions.wired)
            seen.append((received, tally.totals(), delta(after[0], before[0])))
            assert after[1] - before[1] == (wired if on else 0), name
            assert memo.wired - memo_wired == (1 if on and name == "a crawl" else 0), name  # its third sight
        assert seen[1] == seen[0] and seen[2] == seen[0], name


SANDBOX = b"content-security-policy: sandbox\r\n"


@pytest.mark.parametrize("navigation", [True, False], ids=["a browser navigation", "a bot"])
def test_the_fast_paths_sandbox_a_browser_navigation_and_only_it(node, page, spread, controlled, navigation) -> None:
    """The hit memo (a page asked again) and the spread lane (a crawl) answer by request shape and
    class, both made of the header list: a browser navigation's answers keep ``sandbox`` on them,
    a bot's never get it."""
    port = node.info.port
    s = services(node, 0)
    memo, decisions, lane = s.memo, s.decisions, s.lane
    assert memo is not None and decisions is not None and lane is not None
    headers = {"user-agent": BROWSER if navigation else GOOGLE, "accept-encoding": "gzip",
               **({"sec-fetch-mode": "navigate", "sec-fetch-dest": "document", "sec-fetch-site": "none"}
                  if navigation else {})}
    memo.clear()
    decisions.clear()
    lane.clear()
    memo_wired, lane_hits = memo.wired, lane.hits
    again = [one(req(port, page, headers)) for _ in range(5)]  # seen, kept, then the memo's thrice
    crawl = [one(req(port, p, headers)) for p in spread]  # the lane's (learnt from the page's second)
    received = play(port, [[*again, *crawl, one(req(port, page, {**headers, "connection": "close"}))]])[0]
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 10, received[-300:]
    assert received.count(SANDBOX) == (10 if navigation else 0)
    assert memo.wired - memo_wired == 3
    assert lane.hits - lane_hits == 4


CHROME = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36"


def answers(received: bytes) -> list[bytes]:
    """The answers of one connection, each its status line on (no body here holds one)."""
    return [b"HTTP/1.1 " + a for a in received.split(b"HTTP/1.1 ")[1:]]


def test_a_navigation_over_plain_http_and_a_crawler_never_get_each_others_answer(
        node, site, page, spread, controlled) -> None:
    """Over http a browser sends no Sec-Fetch headers, only ``Upgrade-Insecure-Requests: 1`` on a
    navigation (before, it got the page unsandboxed: its scripts ran as the node's origin, the admin
    console's). The same headers but that one, played alternately through the hit memo (a page asked
    again), the spread lane (a crawl) and a relayed miss: each keeps its own answer."""
    port = node.info.port
    s = services(node, 0)
    memo, decisions, lane = s.memo, s.decisions, s.lane
    assert memo is not None and decisions is not None and lane is not None
    crawler = {"user-agent": CHROME, "accept": "text/html,application/xhtml+xml,*/*;q=0.8",
               "accept-encoding": "gzip"}
    browser = {**crawler, "upgrade-insecure-requests": "1"}
    memo.clear()
    decisions.clear()
    lane.clear()
    memo_wired, lane_hits = memo.wired, lane.hits
    steps, navigations = [], []
    for target in [page] * 5 + spread + [f"/p/{site.base}/noindex"]:  # seen, kept, the memo's thrice; a crawl; a miss
        for headers in (browser, crawler):
            steps.append(one(req(port, target, headers)))
            navigations.append(headers is browser)
    steps.append(one(req(port, page, {**crawler, "connection": "close"})))
    navigations.append(False)
    received = answers(play(port, [steps])[0])
    assert len(received) == len(navigations)
    for i, (answer, navigation) in enumerate(zip(received, navigations, strict=True)):
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:300]
        assert (SANDBOX in answer) == navigation, (i, answer[:600])
        vary = b", ".join(line[6:] for line in answer.split(b"\r\n\r\n")[0].split(b"\r\n") if line.startswith(b"vary: "))
        assert (b"Upgrade-Insecure-Requests" in vary) == navigation, (i, vary)
    # the crawler's miss: the origin's page, its script relayed as is, to run in Google's renderer
    assert b"<script" in gzip.decompress(received[-2].partition(b"\r\n\r\n")[2])
    assert memo.wired - memo_wired == 6  # each shape's third to fifth sight, both kinds
    assert lane.hits - lane_hits == 8  # the crawl, both kinds (each class learnt from its page's second sight)


def test_random_crawls_are_answered_by_the_protocol_as_the_asgi_path_answers_them(
    node, site, page, spread, controlled, monkeypatch
) -> None:
    """Seeded random scripts over the spread pages, a miss and a route: bots and browsers, GET and
    HEAD, HTTP/1.0 and 1.1, codings, validators, devices, Markdown, odd and repeated headers, closes.
    Each is played with the protocol's own answers off, then on (both memos emptied first): the
    bytes received and every count must be the same."""
    import random

    port = node.info.port
    served = node.ingress[0]
    memo, decisions, counters = (getattr(services(node, 0), n) for n in ("memo", "decisions", "counters"))
    assert memo is not None and decisions is not None
    etags = []
    for target in (page, *spread):
        head = play(port, [[one(req(port, target, {"user-agent": GOOGLE, "accept-encoding": "gzip",
                                                   "connection": "close"}))]])[0]
        etags += [line.partition(b": ")[2].decode() for line in head.split(b"\r\n") if line.startswith(b"etag: ")]
    node.run(_call(counters.flush))
    tally = Tally(counters)
    monkeypatch.setattr(counters, "sink", tally.take)
    targets = [page, *spread, spread[0] + "?utm_source=x", spread[1] + "?page=2", spread[2].replace("spread-", "spread%2D"),
               f"/p/{site.base}/noindex", f"/p/{site.base}/error", "/nope", "/healthz"]
    variants: list[dict[str, str]] = [
        {"user-agent": GOOGLE}, {"user-agent": BROWSER}, {"accept-encoding": "gzip"}, {"accept-encoding": "br"},
        {"accept-encoding": "identity;q=0, gzip"}, {"if-none-match": etags[0]}, {"if-none-match": etags[1]},
        {"x-device-type": "mobile"}, {"accept": "text/markdown"}, {"x-odd": "\u00e9t\u00e9"},
        {"accept-encoding": "gzip, gzip"}, {"x-harper-prerender-debug": "1"}, {"x-forwarded-for": "203.0.113.7"},
        {"x-forwarded-host": "evil.example"}, {"accept": "text/markdown;q=0.9, text/html"}, {"cookie": "a=b"},
        {"if-modified-since": "Tue, 01 Jan 2019 00:00:00 GMT"}, {"user-agent": "Mozilla/5.0 (compatible; GPTBot/1.2)"},
    ]
    stored = [node.run(_call(lambda p=p: services(node, 0).pages.get(p[3:] + "|desktop"))) for p in spread]
    expires = min(p.expires_at for p in stored)
    start = controlled.now
    # fresh, in its stale-while-revalidate window, stale (a revalidation stores the page again, due
    # from the wall clock's now: a month on it is stale still): only the first is a hit the protocol
    # may answer
    moments = (start, start, expires + 30_000, start + 30 * 86_400_000)
    rnd = random.Random(37)
    wired = 0
    for n in range(32):
        controlled.now = moments[n % len(moments)]
        base = {"user-agent": rnd.choice((GOOGLE, GOOGLE, BROWSER)), "accept-encoding": "gzip"}
        for v in rnd.sample(variants, rnd.randrange(3)):
            base.update(v)
        steps = []
        for _ in range(rnd.randrange(2, 6)):
            method = rnd.choice(("GET", "GET", "GET", "HEAD"))
            steps.append(one(req(port, rnd.choice(targets), base, method)))
        close = {**base, "connection": "close"}
        version = rnd.choice(("1.1", "1.1", "1.0"))
        script = [[*steps, one(req(port, rnd.choice(targets), close, version=version))]]
        seen = []
        play(port, script)  # what outlives the memos (conversions, decoded pages) made once
        for mode in MODES:
            on = set_mode(monkeypatch, mode)
            memo.clear()
            decisions.clear()
            tally.reset()
            before = (stats(node, 0), decisions.wired + memo.wired)
            received = play(port, script)
            wait_for(lambda: not served.server.server_state.tasks, interval=0.01, what="every request's task done")
            seen.append((received, tally.totals(), delta(stats(node, 0), before[0])))
            if on:
                wired += decisions.wired + memo.wired - before[1]
        assert seen[1] == seen[0] and seen[2] == seen[0], (n, script)
    assert wired > 10  # the protocol answered a good share itself
