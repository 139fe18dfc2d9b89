"""Answers the protocol writes itself are held to the end of the loop's turn (api/connections.py,
"corked"): together with the other connections' answers, and never out of order with anything else
written or closed on the same connection. The replica's protocol over fake transports, its bot path
stubbed: ``/a...`` is answered by the protocol, anything else by uvicorn's ASGI path; each with a
simple read taken whole (``native/request_head.c``) and with every read through llhttp's callbacks."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from prerender_ray.api import connections
from prerender_ray.api.connections import CORK_BYTES, MAX_HEAD_BYTES, MAX_HEADERS
from prerender_ray.api.server import guarded_protocol
from tests.support import FakeTransport

Log = list[tuple[int, bytes | str]]


class Transport(FakeTransport):
    """Appends what is written (and when it closes) to a log shared by every connection."""

    def __init__(self, n: int, log: Log) -> None:
        super().__init__(5000 + n)
        self.n, self.log = n, log

    def write(self, data: Any) -> None:
        if not self.closing:
            self.log.append((self.n, bytes(data)))

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(bytes(part) for part in lines))

    def close(self) -> None:
        if not self.closing:
            super().close()
            self.log.append((self.n, "closed"))


CARRIED: list[Any] = []  # what the app finds the bot path left on each scope (``carried``)


async def app(scope: dict, receive: Any, send: Any) -> None:
    CARRIED.append(scope.get("carried"))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
    await send({"type": "http.response.body", "body": b"asgi"})


def answer(path: str, size: int = 0) -> list[Any]:
    body = path.encode() + b"." * size
    return [b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body), memoryview(body)]


def stub_wire(scope: dict, dater: Any, close: bool) -> list[Any] | None:
    path = scope["path"]
    if not path.startswith("/a"):
        return None  # uvicorn's path
    return answer(path, 30_000 if path.startswith("/abig") else 0)


@pytest.fixture(params=[False, True], ids=["callbacks", "simple"])
def server(monkeypatch, request) -> Any:
    # no access log, as a replica runs (pytest gives every logger handlers)
    monkeypatch.setattr(logging.getLogger("uvicorn.access"), "hasHandlers", lambda: False)
    monkeypatch.setattr(connections, "CORK_HOLD_S", 60.0)  # a slow machine's turn is not cut short here
    config = uvicorn.Config(app, loop="none", lifespan="off", log_config=None, access_log=False,
                            http=guarded_protocol(header_timeout_s=10, max_connections=100))
    config.load()
    log: Log = []
    state = ServerState()

    def connect(n: int) -> Any:
        proto = config.http_protocol_class(config=config, server_state=state, app_state={},
                                           _loop=asyncio.get_running_loop())
        proto.connection_made(Transport(n, log))
        proto._dated = SimpleNamespace(bot=SimpleNamespace(wire=stub_wire), dater=None)
        # simple reads taken whole (native/request_head.c, where built), or every read through llhttp
        proto._simple = request.param and connections._simple_head is not None
        return proto

    return SimpleNamespace(connect=connect, log=log, state=state)


def get(path: str, close: bool = False, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: t\r\n%s%s\r\n" % (path.encode(), b"connection: close\r\n" if close else b"", extra)


def answers(log: Log, n: int) -> list[bytes | str]:
    """Connection ``n``'s answers in the order its bytes went out (each framed by its
    Content-Length), ``closed`` where it closed."""
    out: list[bytes | str] = []
    stream = b""
    for conn, what in log + [(n, "end")]:
        if conn != n:
            continue
        if isinstance(what, bytes):
            stream += what
            continue
        while stream:
            head, _, rest = stream.partition(b"\r\n\r\n")
            size = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            out.append(head.split(b"\r\n")[0][9:12] + b" " + rest[:size])
            stream = rest[size:]
        if what == "closed":
            out.append(what)
    return out


def writes(log: Log) -> list[int]:
    """The connection of each write, in order."""
    return [n for n, what in log if isinstance(what, bytes)]


async def settle(server: Any) -> None:
    for _ in range(20):
        await asyncio.sleep(0)
    while server.state.tasks:
        await asyncio.sleep(0.001)


async def test_the_answers_of_one_turn_go_out_together_when_it_ends(server) -> None:
    one, two = server.connect(1), server.connect(2)
    one.data_received(get("/a1"))
    two.data_received(get("/a2"))
    one.data_received(get("/a3"))
    assert server.log == []  # held: nothing written during the turn
    await asyncio.sleep(0)
    assert writes(server.log) == [1, 2]  # one write a connection, when the turn ended
    assert answers(server.log, 1) == [b"200 /a1", b"200 /a3"] and answers(server.log, 2) == [b"200 /a2"]


async def test_an_answer_that_closes_sends_what_was_held_first(server) -> None:
    one = server.connect(1)
    one.data_received(get("/a1") + get("/a2") + get("/a3", close=True))
    assert answers(server.log, 1) == [b"200 /a1", b"200 /a2", b"200 /a3", "closed"]


async def test_uvicorns_path_answers_after_what_was_held(server) -> None:
    one = server.connect(1)
    one.data_received(get("/a1") + get("/other") + get("/a2"))
    await settle(server)
    # the third waits behind the ASGI answer in flight, so uvicorn's path answers it too
    assert answers(server.log, 1) == [b"200 /a1", b"200 asgi", b"200 asgi"]


async def test_a_malformed_request_after_an_answer_gets_its_400_after_it(server) -> None:
    one = server.connect(1)
    one.data_received(get("/a1") + b"NOT HTTP AT ALL\r\n\r\n")
    await settle(server)
    assert answers(server.log, 1) == [b"200 /a1", b"400 Invalid HTTP request received.", "closed"]


async def test_a_head_too_large_after_an_answer_gets_its_431_after_it_and_no_memo_answer(server) -> None:
    """The bounds on a request's head hold where the protocol answers itself (a memo hit)."""
    one = server.connect(1)
    one.data_received(get("/a1") + b"GET /a2 HTTP/1.1\r\nx: " + b"v" * MAX_HEAD_BYTES + b"\r\n\r\n" + get("/a3"))
    await settle(server)
    status, _, body = answers(server.log, 1)[1].partition(b" ")
    assert answers(server.log, 1)[0] == b"200 /a1" and status == b"431" and b"request head" in body
    assert answers(server.log, 1)[2:] == ["closed"]
    two = server.connect(2)
    two.data_received(get("/a4", extra=b"x: y\r\n" * MAX_HEADERS))
    assert answers(server.log, 2)[0].startswith(b"431 ") and answers(server.log, 2)[1:] == ["closed"]


async def test_an_end_of_file_read_with_the_request_does_not_lose_its_answer(server) -> None:
    one = server.connect(1)
    one.data_received(get("/a1"))
    assert not one.eof_received()  # so the transport closes itself, in this turn
    one.transport.close()
    await settle(server)
    assert answers(server.log, 1) == [b"200 /a1", "closed"]


async def test_a_shutdown_sends_what_was_held_before_it_closes(server) -> None:
    one = server.connect(1)
    one.data_received(get("/a1"))
    one.shutdown()
    assert answers(server.log, 1) == [b"200 /a1", "closed"]


async def test_a_connection_holds_back_at_most_cork_bytes(server) -> None:
    """A client pipelining many requests in one read: the answers go out as they pass the bound,
    not all at the turn's end."""
    one = server.connect(1)
    n = 40
    one.data_received(b"".join(get(f"/abig{i}") for i in range(n)))
    written = sum(len(w) for _, w in server.log if isinstance(w, bytes))
    total = sum(len(b"".join(bytes(p) for p in answer(f"/abig{i}", 30_000))) for i in range(n))
    assert total - CORK_BYTES <= written < total
    await asyncio.sleep(0)
    assert sum(len(w) for _, w in server.log if isinstance(w, bytes)) == total


async def test_a_closed_connection_drops_what_it_held(server) -> None:
    one, two = server.connect(1), server.connect(2)
    one.data_received(get("/a1"))
    two.data_received(get("/a2"))
    one.connection_lost(None)
    await asyncio.sleep(0)
    assert answers(server.log, 1) == ["closed"] and answers(server.log, 2) == [b"200 /a2"]


async def test_a_long_turn_sends_what_it_held_once_its_first_answer_waited_long_enough(server, monkeypatch) -> None:
    monkeypatch.setattr(connections, "CORK_HOLD_S", 0.05)
    one, two, three = server.connect(1), server.connect(2), server.connect(3)
    one.data_received(get("/a1"))
    two.data_received(get("/a2"))
    assert server.log == []
    time.sleep(0.06)  # the turn goes on (another request's work, a stall)
    three.data_received(get("/a3"))
    assert writes(server.log) == [1, 2, 3]  # all of them, before the turn ends
    one.data_received(get("/a4"))
    assert writes(server.log) == [1, 2, 3]  # a new batch: held again
    await asyncio.sleep(0)
    assert writes(server.log) == [1, 2, 3, 1]


async def test_a_transport_that_fails_to_write_does_not_hold_back_the_others(server) -> None:
    one, two = server.connect(1), server.connect(2)
    one.data_received(get("/a1"))
    two.data_received(get("/a2"))

    def broken(lines: Any) -> None:
        raise RuntimeError("broken transport")

    one.transport.writelines = broken
    await asyncio.sleep(0)
    assert answers(server.log, 1) == ["closed"] and answers(server.log, 2) == [b"200 /a2"]


class Feeds:
    """A protocol's parser, counting the reads fed to it."""

    def __init__(self, parser: Any) -> None:
        self.parser, self.fed = parser, 0

    def feed_data(self, data: bytes) -> None:
        self.fed += 1
        self.parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


async def test_a_simple_read_is_answered_without_llhttp_where_it_is_taken_whole(server) -> None:
    conn = server.connect(1)
    conn.parser = feeds = Feeds(conn.parser)
    asked: list[str] = []

    def wire(scope: dict, dater: Any, close: bool) -> list[Any] | None:
        asked.append(scope["path"])
        scope["carried"] = scope["path"]  # as the bot path leaves its request shape, or a reply to send
        return stub_wire(scope, dater, close)

    conn._dated = SimpleNamespace(bot=SimpleNamespace(wire=wire), dater=None)
    conn.data_received(get("/a1"))
    conn.data_received(get("/a2", extra=b"x-pad: 1\r\n"))
    await settle(server)
    assert answers(server.log, 1) == [b"200 /a1", b"200 /a2"]
    assert feeds.fed == (0 if conn._simple else 2)
    conn.data_received(get("/b"))  # not the bot path's: llhttp parses it, the bot path not asked again
    await settle(server)
    conn.data_received(get("/a3", extra=b"content-length: 0\r\n"))  # not of the plainest form
    await settle(server)
    assert answers(server.log, 1) == [b"200 /a1", b"200 /a2", b"200 asgi", b"200 /a3"]
    assert feeds.fed == (2 if conn._simple else 4)
    assert asked == ["/a1", "/a2", "/b", "/a3"]  # each offered once
    assert CARRIED[-1:] == ["/b"]  # the app has what the bot path left for it
