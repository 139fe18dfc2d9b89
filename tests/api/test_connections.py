"""Slow clients against a real uvicorn server with the ingress's protocol (api/connections.py): the
header deadline, the idle keep-alive close and the connection cap, each beside a normal request that
is still answered."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import pytest

from prerender_ray import metrics
from prerender_ray.api.connections import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_PIPELINE,
    MIN_WRITE_PROGRESS,
)
from prerender_ray.config.model import Config
from tests.api.live_server import WAIT_S, connect, request, response, serving, until_closed

MIN_CAP = 16  # server.maxConnections' floor
BIG = b"x" * (1 << 20)  # ``/big``'s body: far more than the kernel holds of a connection's sends (SNDBUF)
SNDBUF = 16 * 1024


class App:
    """Answers ``/`` at once; ``/hold`` is being served until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held = 0
        self.all_held = asyncio.Event()
        self.expect_held = MIN_CAP
        self.calls: dict[str, int] = {}  # requests that reached the app, by path
        self.called = asyncio.Event()
        self.protocol: Any = None  # the connection of the last ``/hold``

    async def until_called(self, path: str, n: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while self.calls.get(path, 0) < n:
                self.called.clear()
                await self.called.wait()

    async def __call__(self, scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.calls[scope["path"]] = self.calls.get(scope["path"], 0) + 1
        self.called.set()
        if scope["path"] == "/big":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(BIG)).encode())]})
            await send({"type": "http.response.body", "body": BIG})
            return
        if scope["path"] == "/hold":
            # uvicorn's send is its cycle's, whose on_response is the connection's
            self.protocol = send.__self__.on_response.__self__
            self.held += 1
            if self.held == self.expect_held:
                self.all_held.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


def config(**server: object) -> Config:
    return Config.model_validate({"server": server})


def closed(reason: str) -> float:
    return metrics.connections_closed.labels(reason)._value.get()


async def until_counted(reason: str, n: float) -> None:
    async with asyncio.timeout(WAIT_S):
        while closed(reason) < n:
            await asyncio.sleep(0.02)


def non_reader(port: int, data: bytes) -> socket.socket:
    """A client that sends ``data`` and never reads: its receive window is as small as the kernel
    allows, so the server's answer backs up into the server's transport."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(WAIT_S)
    s.connect(("127.0.0.1", port))
    s.sendall(data)
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything the server sent until it closed (bounded by the socket's timeout)."""
    got = b""
    try:
        while chunk := s.recv(1 << 20):
            got += chunk
    except ConnectionResetError:
        pass
    s.close()
    return got


async def test_a_client_stalling_in_its_headers_is_closed_by_the_deadline_while_others_are_served() -> None:
    async with serving(App(), config(headerTimeout="300ms", keepAliveTimeout="60s")) as port:
        r1, w1 = await connect(port)
        w1.write(b"GET / HTTP/1.1\r\nhost: t\r\nx-slow: ")  # half the headers, then nothing
        r2, w2 = await connect(port)
        w2.write(request())
        assert await response(r2) == (200, b"ok")  # served meanwhile
        assert await until_closed(r1) == b""  # closed, not answered
        # a keep-alive connection's next request is timed too, and so are bytes that begin none
        r3, w3 = await connect(port)
        w3.write(request())
        assert await response(r3) == (200, b"ok")
        w3.write(b"GET / HT")
        assert await until_closed(r3) == b""
        r4, w4 = await connect(port)
        w4.write(request())
        assert await response(r4) == (200, b"ok")
        w4.write(b"\r\n")
        assert await until_closed(r4) == b""
        for w in (w1, w2, w3, w4):
            w.close()


async def test_a_client_trickling_its_headers_is_closed_by_the_deadline_from_its_first_byte() -> None:
    """Each byte arrives well before the deadline would fire: the deadline still runs from the first
    (a trickle must not move it on, or a slow client holds the connection for ever)."""
    async with serving(App(), config(headerTimeout="500ms", keepAliveTimeout="60s")) as port:
        r, w = await connect(port)
        w.write(b"GET / HTTP/1.1\r\nhost: t\r\n")
        closed = asyncio.ensure_future(until_closed(r))
        for _ in range(60):  # a byte every 0.1 s for up to 6 s
            if closed.done():
                break
            w.write(b"x")
            await asyncio.sleep(0.1)
        assert closed.done() and closed.result() == b""  # closed while still trickling
        w.close()


async def test_an_idle_keep_alive_connection_is_closed() -> None:
    async with serving(App(), config(headerTimeout="60s", keepAliveTimeout="300ms")) as port:
        r, w = await connect(port)
        w.write(request())
        assert await response(r) == (200, b"ok")
        assert await until_closed(r) == b""
        w.close()


async def test_each_request_moves_the_idle_deadline_on_and_the_close_comes_no_earlier_than_it() -> None:
    """One timer a connection checks a deadline each request moves: requests spaced closer than the
    timeout keep the connection past the first timer, and the close comes a full timeout after the
    last answer (never at a timer set for an earlier deadline)."""
    loop = asyncio.get_running_loop()
    async with serving(App(), config(headerTimeout="800ms", keepAliveTimeout="800ms")) as port:
        r, w = await connect(port)
        for _ in range(4):  # 0.3 s apart (0.5 s to spare each): past the first timer (0.8 s) and the next
            w.write(request())
            assert await response(r) == (200, b"ok")
            await asyncio.sleep(0.3)
        sent = loop.time()  # the deadline is set after this (the server shares the test's loop)
        w.write(request())
        assert await response(r) == (200, b"ok")
        assert await until_closed(r) == b""
        assert loop.time() - sent >= 0.8 - 0.01  # a loop may round its timers to the millisecond
        w.close()


async def test_over_the_cap_a_new_connection_is_closed_while_those_being_served_are_answered() -> None:
    app = App()
    async with serving(app, config(maxConnections=MIN_CAP)) as port:
        held = [await connect(port) for _ in range(MIN_CAP)]
        for _, w in held:
            w.write(request("/hold"))
        await asyncio.wait_for(app.all_held.wait(), 15)  # every connection is serving a request
        r, w = await connect(port)
        w.write(request())
        assert await until_closed(r) == b""  # refused before anything was read
        app.release.set()
        for r_held, _ in held:
            assert await response(r_held) == (200, b"ok")
        for _, w_held in [*held, (r, w)]:
            w_held.close()


async def test_over_the_cap_a_new_connection_replaces_the_one_waiting_longest() -> None:
    app = App()
    app.expect_held = MIN_CAP - 2
    async with serving(app, config(maxConnections=MIN_CAP, headerTimeout="60s", keepAliveTimeout="60s")) as port:
        slow_r, slow_w = await connect(port)  # first in, never finishes its headers
        slow_w.write(b"GET / HTTP/1.1\r\n")
        idle_r, idle_w = await connect(port)  # a finished request, idle on keep-alive
        idle_w.write(request())
        assert await response(idle_r) == (200, b"ok")
        held = [await connect(port) for _ in range(MIN_CAP - 2)]
        for _, w in held:
            w.write(request("/hold"))
        await asyncio.wait_for(app.all_held.wait(), 15)
        # at the cap: each newcomer is served, in place of the one that waited longest unserved
        new_r, new_w = await connect(port)
        new_w.write(request())
        assert await response(new_r) == (200, b"ok")
        assert await until_closed(slow_r) == b""
        new2_r, new2_w = await connect(port)
        new2_w.write(request())
        assert await response(new2_r) == (200, b"ok")
        assert await until_closed(idle_r) == b""
        app.release.set()
        for r_held, _ in held:
            assert await response(r_held) == (200, b"ok")
        for _, w in [*held, (slow_r, slow_w), (idle_r, idle_w), (new_r, new_w), (new2_r, new2_w)]:
            w.close()


async def test_clients_that_never_read_a_closing_answer_give_their_slots_back() -> None:
    """Answers that close the connection but that the clients never read: uvicorn's graceful close
    waits for the bytes to drain, so without a write deadline the connections stayed counted for ever
    and, every one of them closing, none could be evicted: a newcomer was refused."""
    app = App()
    cfg = config(maxConnections=MIN_CAP, headerTimeout="60s", keepAliveTimeout="60s", writeTimeout="500ms")
    timed_out = closed("write-timeout")
    async with serving(app, cfg, sndbuf=SNDBUF) as port:
        stuck = [non_reader(port, request("/big", extra="connection: close\r\n")) for _ in range(MIN_CAP)]
        await app.until_called("/big", MIN_CAP)  # every slot holds an answer the client does not take
        r, w = await connect(port)
        w.write(request())
        assert await response(r) == (200, b"ok")  # in place of a stuck one (evicted), not refused
        # the others are cut off by the write deadline
        await until_counted("write-timeout", timed_out + MIN_CAP - 1)
        for s in stuck:
            assert len(await asyncio.to_thread(read_all, s)) < len(BIG)  # the answer was cut short
        w.close()


def slow_read(s: socket.socket, every_s: float, at_least: int) -> bytes:
    """Read until the server closes, taking ``at_least`` bytes every ``every_s``: a slow link, not a stall."""
    got = b""
    try:
        while True:
            took = 0
            while took < at_least:
                chunk = s.recv(1 << 16)
                if not chunk:
                    return got
                got += chunk
                took += len(chunk)
            time.sleep(every_s)
    except TimeoutError:  # nothing more for the socket's timeout: a kept-alive answer is whole
        return got
    finally:
        s.close()


@pytest.mark.parametrize("close", [True, False], ids=["closing", "keep-alive"])
async def test_a_client_taking_its_answer_slowly_is_not_cut_off_by_the_write_deadline(close: bool) -> None:
    """The deadline runs between two reads (as nginx's send_timeout): a client that keeps taking at
    least MIN_WRITE_PROGRESS bytes each time gets the whole answer, however long the whole takes."""
    app = App()
    cfg = config(headerTimeout="60s", keepAliveTimeout="60s", writeTimeout="300ms")
    timed_out = closed("write-timeout")
    async with serving(app, cfg, sndbuf=SNDBUF) as port:
        s = non_reader(port, request("/big", extra="connection: close\r\n" if close else ""))
        if not close:
            s.settimeout(2.0)  # the answer is whole when the connection stays open: stop there
        got = await asyncio.to_thread(slow_read, s, 0.1, 2 * MIN_WRITE_PROGRESS)
        assert got.partition(b"\r\n\r\n")[2] == BIG and closed("write-timeout") == timed_out


@pytest.mark.parametrize("pipelined", [False, True], ids=["after", "pipelined"])
async def test_a_request_behind_an_answer_the_client_never_reads_is_cut_off_by_the_write_deadline(
        pipelined: bool) -> None:
    """Keep-alive clients that never read: the answer fills the transport (writing paused), and the
    next request on the connection (sent after it, or pipelined with it) waits in uvicorn's send for a
    drain that never comes, being served, so neither evicted nor timed; the cap stayed full."""
    app = App()
    cfg = config(maxConnections=MIN_CAP, headerTimeout="60s", keepAliveTimeout="60s", writeTimeout="500ms")
    timed_out = closed("write-timeout")
    async with serving(app, cfg, sndbuf=SNDBUF) as port:
        if pipelined:
            stuck = [non_reader(port, request("/big") + request()) for _ in range(MIN_CAP)]
        else:
            stuck = [non_reader(port, request("/big")) for _ in range(MIN_CAP)]
            await app.until_called("/big", MIN_CAP)
            for s in stuck:
                s.sendall(request())
        await app.until_called("/", MIN_CAP)  # each second request is being served, its answer stuck
        await until_counted("write-timeout", timed_out + MIN_CAP)
        for s in stuck:
            assert len(await asyncio.to_thread(read_all, s)) < len(BIG)
        r, w = await connect(port)  # the slots are free again
        w.write(request())
        assert await response(r) == (200, b"ok")
        w.close()


async def test_requests_pipelined_past_the_bound_are_not_taken_and_those_taken_are_answered() -> None:
    """One write: a request being served (held) and 14,000 more behind it (252 KB). Each request a
    read held was queued, a cycle, its scope and an event (2.2 KB against 18 bytes on the wire; 4,738
    of them from the first read): now a connection queues at most ``MAX_PIPELINE``, answers them, the
    last with a close, and takes nothing more."""
    app = App()
    app.expect_held = 1
    async with serving(app, config()) as port:
        r, w = await connect(port)
        w.write(request("/hold") + request() * 14_000)
        await asyncio.wait_for(app.all_held.wait(), WAIT_S)
        queued = app.protocol.pipeline
        async with asyncio.timeout(WAIT_S):  # the server has read past the bound
            while len(queued) < MAX_PIPELINE:
                await asyncio.sleep(0.01)
        assert len(queued) == MAX_PIPELINE
        r2, w2 = await connect(port)  # others are served meanwhile
        w2.write(request())
        assert await response(r2) == (200, b"ok")
        app.release.set()
        assert await response(r) == (200, b"ok")
        for _ in range(MAX_PIPELINE):
            assert await response(r) == (200, b"ok")
        assert await until_closed(r) == b""  # then closed, the rest never answered
        assert app.calls["/"] == 1 + MAX_PIPELINE
        assert len(queued) == 0
        w2.write(request())  # still serving others
        assert await response(r2) == (200, b"ok")
        for w_ in (w, w2):
            w_.close()


def head_of(size: int, headers: int) -> bytes:
    """A request whose URL and header names and values are ``size`` bytes, in ``headers`` headers."""
    small = "x: y\r\n" * (headers - 2)  # 2 bytes each, besides host (5) and the URL (1)
    big = size - 1 - 5 - 2 * (headers - 2) - len("big")
    return request(extra=small + "big: " + "v" * big + "\r\n")


async def test_a_head_past_its_bounds_is_answered_431_and_the_connection_closed(caplog) -> None:
    """httptools 0.9 bounds no head: an 8 MB header value and 200,000 headers were taken whole."""
    app = App()
    async with serving(app, config(headerTimeout="60s")) as port:
        refused = closed("head-too-large")
        heads = [
            request(extra="x-big: " + "v" * 100_000 + "\r\n"),  # one value
            request(extra="a: b\r\n" * 10_000),  # 60 KB, but 10,000 headers
            head_of(MAX_HEAD_BYTES + 1, MAX_HEADERS),  # a byte over
            head_of(MAX_HEAD_BYTES, MAX_HEADERS + 1),  # a header over
            head_of(MAX_HEAD_BYTES + 1, 3) + b"NOT HTTP AT ALL\r\n\r\n",  # what follows is dropped, no 400
            # a value that never ends: refused while it arrives, not held until it does
            b"GET / HTTP/1.1\r\nhost: t\r\nx-long: " + b"v" * 400_000,
        ]
        for head in heads:
            r, w = await connect(port)
            w.write(head)
            status, body = await response(r)
            assert status == 431 and b"request head" in body
            assert await until_closed(r) == b""
            w.close()
        assert "/" not in app.calls
        assert closed("head-too-large") == refused + len(heads)
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        r, w = await connect(port)  # others are served, and a head at the bounds too
        w.write(request())
        assert await response(r) == (200, b"ok")
        w.write(head_of(MAX_HEAD_BYTES, MAX_HEADERS))
        assert await response(r) == (200, b"ok")
        w.close()


def until_reset(s: socket.socket) -> bool:
    """Whether the server closes the connection for good (bounded by ``WAIT_S``): while it still
    reads, what the client sends is taken; then a send is answered with a reset."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            s.sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            return True
        time.sleep(0.02)
    return False


async def test_a_refused_head_still_arriving_is_read_until_the_header_deadline_and_its_slot_is_evictable() -> None:
    """After the 431 the connection half-closes and drops what the client still sends (a close with
    bytes unread would reset it, and the client could lose the answer): bounded by the header
    deadline, and the connection waits among those an eviction takes."""
    async with serving(App(), config(headerTimeout="500ms", maxConnections=MIN_CAP)) as port:
        lingering = [non_reader(port, head_of(MAX_HEAD_BYTES + 1, 3)) for _ in range(MIN_CAP)]
        for s in lingering:
            assert (await asyncio.to_thread(s.recv, 1 << 16)).startswith(b"HTTP/1.1 431 ")
            s.sendall(b"more of the head")  # read and dropped
        r, w = await connect(port)  # the slots are not held: one is evicted
        w.write(request())
        assert await response(r) == (200, b"ok")
        for s in lingering[1:]:
            assert await asyncio.to_thread(until_reset, s)  # the header deadline ends it
            s.close()
        lingering[0].close()
        w.close()


async def test_a_head_past_its_bounds_behind_an_answer_in_flight_closes_the_connection_after_it() -> None:
    app = App()
    app.expect_held = 1
    async with serving(app, config(headerTimeout="60s")) as port:
        r, w = await connect(port)
        w.write(request("/hold") + head_of(MAX_HEAD_BYTES + 1, 3))
        await asyncio.wait_for(app.all_held.wait(), WAIT_S)
        app.release.set()
        assert await response(r) == (200, b"ok")  # the answer taken, then the close: its 431 cannot go first
        assert await until_closed(r) == b""
        assert "/" not in app.calls
        w.close()
