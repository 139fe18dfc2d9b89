"""The worker's egress guard (``--public-only``): a SOCKS5 server on loopback through which Chromium
makes every connection, and which connects only to public addresses.

Anyone may name the page to render on a node with ``allowAnyDomain``, and any page's scripts may ask
for anything. The node checks a host before it asks for a render, but Chromium resolves names itself:
by the time it connects, the name may resolve to the cloud's metadata service or a private host (DNS
rebinding), and the page's own requests are never checked at all. A page that reads such a service and
writes it into its DOM would have it stored and served to whoever asked.

So Chromium gets this server as its proxy (``socks5://``: it hands over the host name unresolved, and
tunnels plain HTTP, TLS and WebSockets alike, one TCP connection per tunnel), with loopback no longer
bypassing it and its own resolver switched off (``switches``). Per tunnel, the host is resolved here,
every address it has must be public (``origin_policy.public_address``: not loopback, private,
link-local, shared, multicast or reserved), and the connection goes to an address that was checked,
so nothing resolves again behind the check. A refused tunnel gets SOCKS5's "not allowed" and the
browser's request fails as a connection failure: nothing is sent. ``private_hosts`` names hosts that
may resolve to anything (the site's own origin on a private network), by exact name or address.

Bounds: the handshake within ``HANDSHAKE_S``, the look-up and connect within ``CONNECT_S``, at most
``max_tunnels`` open (past that a new one is closed unanswered), and a tunnel that carries no byte
either way for ``IDLE_S`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Iterable

from prerender_ray import logs
from prerender_ray.config.base import clean_host
from prerender_ray.serving.origin_policy import public_address

log = logs.get("worker.egress")

HANDSHAKE_S = 10.0
CONNECT_S = 10.0
IDLE_S = 120.0
MAX_TUNNELS = 512
CHUNK = 64 * 1024

# SOCKS5 (RFC 1928): versions, the one method (no authentication), the one command (CONNECT), address
# types and the replies used
VERSION, NO_AUTH, NO_METHOD, CONNECT = 5, 0, 0xFF, 1
IPV4, DOMAIN, IPV6 = 1, 3, 4
SUCCEEDED, FAILURE, NOT_ALLOWED, HOST_UNREACHABLE, REFUSED, BAD_COMMAND, BAD_ADDRESS = 0, 1, 2, 4, 5, 7, 8

Resolve = Callable[[str, int], Awaitable[list[str]]]


class Refused(Exception):
    """A host this guard does not connect to: ``reason`` is ``private`` (an address that is not
    public) or ``unresolved`` (no address)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


# Chromium's switches that would take its connections around the guard: those ``switches`` sets, and
# the other ways to name a proxy or a resolver (``--public-only`` refuses them as --chromium-arg)
PROXY_SWITCHES = frozenset({"--proxy-server", "--proxy-bypass-list", "--proxy-pac-url", "--no-proxy-server",
                            "--proxy-auto-detect", "--host-resolver-rules", "--host-rules",
                            "--force-webrtc-ip-handling-policy"})


def switches(port: int) -> tuple[str, ...]:
    """Chromium's switches that send every connection through the guard on ``port``."""
    return (
        f"--proxy-server=socks5://127.0.0.1:{port}",
        "--proxy-bypass-list=<-loopback>",  # loopback too: by default Chromium never proxies it
        # no name resolved by the browser (a SOCKS5 proxy resolves them): none to prefetch or leak by
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # the proxy itself is resolved too
        # WebRTC's UDP goes around any proxy: none
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    )


class EgressGuard:
    def __init__(self, private_hosts: Iterable[str] = (), *, resolve: Resolve | None = None,
                 max_tunnels: int = MAX_TUNNELS, on_refused: Callable[[str], None] | None = None):
        self.private_hosts = frozenset(host_key(h) for h in private_hosts)
        self.max_tunnels = max_tunnels
        self._resolve = resolve or _resolve
        self._on_refused = on_refused
        self._server: asyncio.Server | None = None
        self._tunnels: set[asyncio.Task[None]] = set()
        self.port = 0
        self.refused = 0  # tunnels refused since start (any reason)

    async def start(self) -> int:
        """Listen on 127.0.0.1; the port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tunnels):
            task.cancel()
        await asyncio.gather(*self._tunnels, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()

    # ---------------------------------------------------------------------------------- a tunnel

    def _refuse(self, reason: str) -> None:
        self.refused += 1
        if self._on_refused is not None:
            self._on_refused(reason)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._tunnels) >= self.max_tunnels:
            self._refuse("busy")
            writer.transport.abort()
            return
        self._tunnels.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(HANDSHAKE_S):
                target = await self._handshake(reader, writer)
            if target is None:
                return
            try:
                async with asyncio.timeout(CONNECT_S):
                    up_reader, upstream = await self._connect(*target)
            except Refused as e:
                self._refuse(e.reason)
                log.debug("egress refused", host=target[0][:200], port=target[1], reason=e.reason)
                await _reply(writer, NOT_ALLOWED)
                return
            except (OSError, TimeoutError):
                await _reply(writer, HOST_UNREACHABLE)
                return
            await _reply(writer, SUCCEEDED)
            await _pipe(reader, writer, up_reader, upstream)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the browser went away, or took too long: nothing more to say to it
        finally:
            self._tunnels.discard(task)
            for w in (writer, upstream):
                if w is not None:
                    w.transport.abort()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> tuple[str, int] | None:
        """The host and port asked for; None when it was answered (refused) or is no SOCKS5 client."""
        version, count = await reader.readexactly(2)
        if version != VERSION:
            return None
        methods = await reader.readexactly(count)
        if NO_AUTH not in methods:
            writer.write(bytes((VERSION, NO_METHOD)))
            await writer.drain()
            return None
        writer.write(bytes((VERSION, NO_AUTH)))
        version, command, _, kind = await reader.readexactly(4)
        if version != VERSION:
            return None
        if kind == IPV4:
            host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
        elif kind == IPV6:
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        elif kind == DOMAIN:
            (size,) = await reader.readexactly(1)
            name = await reader.readexactly(size)
            host = name.decode("ascii", "replace")
        else:
            await _reply(writer, BAD_ADDRESS)
            return None
        port = int.from_bytes(await reader.readexactly(2), "big")
        if command != CONNECT:  # BIND and UDP ASSOCIATE: nothing a page needs
            self._refuse("command")
            await _reply(writer, BAD_COMMAND)
            return None
        return host, port

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``host`` at an address checked here (each in turn until one answers)."""
        try:
            name = host_key(host)
        except ValueError:
            raise Refused("unresolved") from None  # no host name: nothing to look up
        if port == 0:
            raise Refused("unresolved")
        private_ok = name in self.private_hosts
        if _literal(name):
            addresses = [name]
        else:
            try:
                addresses = await self._resolve(name, port)
            except OSError:
                raise Refused("unresolved") from None
            if not addresses:
                raise Refused("unresolved")
        if not private_ok and not all(public_address(a) for a in addresses):
            raise Refused("private")  # every address public, or none used: the name may rotate among them
        error: OSError | None = None
        for address in addresses:
            try:
                return await asyncio.open_connection(address, port, limit=CHUNK)
            except OSError as e:
                error = e
        assert error is not None
        raise error


def host_key(host: str) -> str:
    """``host`` as the guard compares it: an address in its standard form (brackets dropped), or a
    host name lower-cased without its trailing dot. ValueError for neither."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return clean_host(host)


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _reply(writer: asyncio.StreamWriter, code: int) -> None:
    # the bound address is of no use to a browser: zeros, as many servers answer
    writer.write(bytes((VERSION, code, 0, IPV4, 0, 0, 0, 0, 0, 0)))
    await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                up_reader: asyncio.StreamReader, upstream: asyncio.StreamWriter) -> None:
    """Copy both ways until both ends have finished, either fails, or nothing moves for ``IDLE_S``."""
    active = [time.monotonic()]
    tasks = [asyncio.create_task(_copy(reader, upstream, active)),
             asyncio.create_task(_copy(up_reader, writer, active))]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, active: list[float]) -> None:
    while True:
        try:
            async with asyncio.timeout(IDLE_S):
                data = await src.read(CHUNK)
        except TimeoutError:
            if time.monotonic() - active[0] < IDLE_S:
                continue  # the other way is busy: a one-way download or upload is not idle
            raise
        if not data:
            if dst.can_write_eof():
                dst.write_eof()  # half-close: the other way may still be answering
            return
        active[0] = time.monotonic()
        dst.write(data)
        async with asyncio.timeout(IDLE_S):  # a side that takes nothing holds the tunnel no longer
            await dst.drain()

