"""Slow clients against a real uvicorn server with the ingress's protocol (api/connections.py): the
header deadline, the idle keep-alive close and the connection cap, each beside a normal request that
is still answered."""

from __future__ import annotations

import asyncio

from prerender_ray.api.connections import connection_budget
from prerender_ray.config.model import Config
from tests.api.live_server import connect, request, response, serving, until_closed

MIN_CAP = 16  # server.maxConnections' floor


class App:
    """Answers ``/`` at once; ``/hold`` is being served until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held = 0
        self.all_held = asyncio.Event()
        self.expect_held = MIN_CAP

    async def __call__(self, scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/hold":
            self.held += 1
            if self.held == self.expect_held:
                self.all_held.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


def config(**server: object) -> Config:
    return Config.model_validate({"server": server})


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


def test_the_cap_fits_the_open_file_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_budget(100) == 100
    if hard != resource.RLIM_INFINITY:
        assert connection_budget(hard) == hard // 2  # lowered: half the descriptors stay free
