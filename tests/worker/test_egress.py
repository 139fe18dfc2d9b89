"""The egress guard (``worker/egress.py``): a SOCKS5 server that connects only to public addresses,
spoken to by a raw client, then in front of a real Chromium through the worker (``--public-only``)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import struct
import sys

import pytest
import pytest_asyncio

from prerender_ray.worker import egress
from prerender_ray.worker.egress import EgressGuard
from prerender_ray.worker.options import WorkerOptions, add_arguments, find_chromium, from_args
from tests.worker.test_render import Rig


class Echo:
    """A TCP server on 127.0.0.1 that echoes, and counts its connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Echo:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(echo, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def request(host: str, port: int, command: int = egress.CONNECT) -> bytes:
    """A SOCKS5 greeting (no authentication) and request, as Chromium sends them."""
    try:
        ip = ipaddress.ip_address(host)
        address = bytes((egress.IPV4 if ip.version == 4 else egress.IPV6,)) + ip.packed
    except ValueError:
        address = bytes((egress.DOMAIN, len(host))) + host.encode()
    return b"\x05\x01\x00" + bytes((5, command, 0)) + address + struct.pack(">H", port)


async def ask(guard: EgressGuard, payload: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Send ``payload``; the reader, writer and what came back before the tunnel opened (or closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", guard.port)
    writer.write(payload)
    got = b""
    while len(got) < 12:
        chunk = await asyncio.wait_for(reader.read(12 - len(got)), 5)
        if not chunk:
            break
        got += chunk
    return reader, writer, got


def reply(code: int) -> bytes:
    return b"\x05\x00" + bytes((5, code, 0, 1, 0, 0, 0, 0, 0, 0))


@pytest_asyncio.fixture
async def guard():
    reasons: list[str] = []
    names = {"site.test": ["127.0.0.1"], "localhost": ["127.0.0.1", "::1"], "mixed.test": ["93.184.215.14", "10.0.0.7"]}

    async def resolve(host: str, port: int) -> list[str]:
        if host not in names:
            raise OSError("no such name")
        return names[host]

    g = EgressGuard(["site.test", "LOOPBACK.TEST.", "[::1]"], resolve=resolve, on_refused=reasons.append)
    g.reasons = reasons  # type: ignore[attr-defined]
    await g.start()
    yield g
    await g.close()


async def test_a_private_host_named_for_it_is_tunnelled_to_the_address_resolved_here(guard: EgressGuard) -> None:
    async with Echo() as echo:
        # site.test exists only in the guard's resolver: the tunnel goes to the address it checked
        reader, writer, got = await ask(guard, request("site.test", echo.port))
        assert got == reply(egress.SUCCEEDED)
        writer.write(b"both ways")
        assert await asyncio.wait_for(reader.readexactly(9), 5) == b"both ways"
        writer.close()
    assert echo.connections == 1 and guard.refused == 0


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::ffff:127.0.0.1", "mixed.test", "10.1.2.3", "169.254.169.254"])
async def test_a_host_not_public_is_refused_and_never_connected(guard: EgressGuard, host: str) -> None:
    async with Echo() as echo:
        port = echo.port
        _, writer, got = await ask(guard, request(host, port))
        writer.close()
    assert got == reply(egress.NOT_ALLOWED)
    assert echo.connections == 0 and guard.reasons == ["private"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("host", ["nowhere.test", "a b", "x" * 255, "*.site.test", ""])
async def test_a_name_that_does_not_resolve_or_is_no_name_is_refused(guard: EgressGuard, host: str) -> None:
    _, writer, got = await ask(guard, request(host, 80))
    writer.close()
    assert got == reply(egress.NOT_ALLOWED) and guard.reasons == ["unresolved"]  # type: ignore[attr-defined]


async def test_a_private_address_listed_is_tunnelled() -> None:
    guard = EgressGuard(["[::1]", "127.0.0.1"])
    await guard.start()
    try:
        async with Echo() as echo:
            _, writer, got = await ask(guard, request("127.0.0.1", echo.port))
            writer.close()
        assert got == reply(egress.SUCCEEDED) and echo.connections == 1
    finally:
        await guard.close()


async def test_private_hosts_are_exact_names_and_a_literal_is_judged_as_an_address(guard: EgressGuard) -> None:
    async with Echo() as echo:
        # "LOOPBACK.TEST." was given: cleaned, it names loopback.test, and no subdomain of it
        _, w1, sub = await ask(guard, request("a.loopback.test", echo.port))
        _, w2, port0 = await ask(guard, request("site.test", 0))
        w1.close()
        w2.close()
    assert sub == port0 == reply(egress.NOT_ALLOWED)
    assert guard.private_hosts == frozenset({"site.test", "loopback.test", "::1"})
    assert echo.connections == 0


@pytest.mark.parametrize(("payload", "answer", "reason"), [
    (request("site.test", 80, command=2), reply(egress.BAD_COMMAND), "command"),  # BIND
    (request("site.test", 80, command=3), reply(egress.BAD_COMMAND), "command"),  # UDP ASSOCIATE
    (b"\x05\x01\x00\x05\x01\x00\x09", reply(egress.BAD_ADDRESS), None),  # an address type that does not exist
    (b"\x05\x01\x02", b"\x05\xff", None),  # only username and password offered
    (b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00", b"", None),  # SOCKS4: no answer at all
    (b"GET / HTTP/1.1\r\n\r\n", b"", None),  # not SOCKS
])
async def test_what_is_not_a_socks5_connect_is_refused(guard: EgressGuard, payload: bytes, answer: bytes,
                                                        reason: str | None) -> None:
    reader, writer, got = await ask(guard, payload)
    assert got == answer
    assert await asyncio.wait_for(reader.read(), 5) == b""  # and closed
    writer.close()
    assert guard.reasons == ([reason] if reason else [])  # type: ignore[attr-defined]


async def test_a_silent_client_is_cut_at_the_handshake_deadline(guard: EgressGuard,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "HANDSHAKE_S", 0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", guard.port)
    writer.write(b"\x05")  # a greeting begun, never finished
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_a_tunnel_idle_both_ways_is_closed(guard: EgressGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "IDLE_S", 0.2)
    async with Echo() as echo:
        reader, writer, got = await ask(guard, request("site.test", echo.port))
        assert got == reply(egress.SUCCEEDED)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_past_the_cap_a_new_connection_is_closed_unanswered() -> None:
    reasons: list[str] = []
    guard = EgressGuard(max_tunnels=1, on_refused=reasons.append)
    await guard.start()
    try:
        _, first = await asyncio.open_connection("127.0.0.1", guard.port)  # holds the one tunnel
        await asyncio.sleep(0.05)
        reader, second = await asyncio.open_connection("127.0.0.1", guard.port)
        second.write(request("localhost", 80))
        try:
            got = await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:  # aborted
            got = b""
        assert got == b""
        assert reasons == ["busy"]
        first.close()
        second.close()
    finally:
        await guard.close()


def test_public_only_refuses_chromium_switches_that_would_go_around_it() -> None:
    base = dict(queues=["http://127.0.0.1:1"], chromium="/bin/true")
    with pytest.raises(ValueError, match="--proxy-server"):
        WorkerOptions(**base, public_only=True, chromium_args=("--proxy-server=http://p:3128",))
    with pytest.raises(ValueError, match="--private-host 'a b' is neither a host name nor an address"):
        WorkerOptions(**base, public_only=True, private_hosts=("a b",))
    with pytest.raises(ValueError, match="--private-host only makes sense with --public-only"):
        WorkerOptions(**base, private_hosts=("db.internal",))
    WorkerOptions(**base, chromium_args=("--proxy-server=http://p:3128",))  # without the guard: the operator's
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    opts = from_args(parser.parse_args(["--queue", "http://127.0.0.1:1", "--chromium", sys.executable,
                                        "--public-only", "--private-host", "origin.internal"]), {})
    assert opts.public_only and opts.private_hosts == ("origin.internal",)


# ------------------------------------------------------------------------------------ with Chromium

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="needs Debian's chromium (apt install chromium)")


@pytest_asyncio.fixture(scope="module")
async def guarded():
    """A worker with ``--public-only --private-host 127.0.0.1``; its pages' third party named
    ``localhost`` (loopback, so not public, and not listed)."""
    r = Rig()
    r.origin.third_party = r.third.base.replace("//127.0.0.1:", "//localhost:")
    await r.start(public_only=True, private_hosts=("127.0.0.1",))
    yield r
    await r.stop()


@pytest.mark.browser
@needs_chromium
async def test_a_page_renders_through_the_guard_and_its_request_to_a_private_host_never_leaves(guarded: Rig) -> None:
    res = (await guarded.render(guarded.job("/third-party")))[guarded.url("/third-party") + "|desktop"]
    assert res["outcome"] == "rendered"
    assert guarded.origin.requests("/third-party") and guarded.origin.requests("/app.js")  # through the tunnel
    assert guarded.third.requests("/lib.js") == []  # localhost: refused at the guard, nothing sent
    worker = guarded.worker
    assert worker is not None
    assert worker.metrics.egress_refused.labels("private")._value.get() >= 1


@pytest.mark.browser
@needs_chromium
async def test_a_page_whose_host_is_not_public_is_not_rendered(guarded: Rig) -> None:
    url = guarded.url("/js/refused").replace("//127.0.0.1:", "//localhost:")
    res = (await guarded.render(guarded.queue.job(url)))[url + "|desktop"]
    assert res["outcome"] != "rendered" and res["html"] is None
    assert "ERR_SOCKS_CONNECTION_FAILED" in res["error"]["message"]
    assert guarded.origin.requests("/js/refused") == []
