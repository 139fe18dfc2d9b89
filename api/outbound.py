"""Where the outbound HTTP clients connect (the bot path's origin client, the walker's sitemap
fetcher): httpx's transport over an httpcore pool whose network backend decides the address.

- ``PinnedBackend``: staging pinning, every connection to the one IP the operator configured; Host
  and TLS SNI stay the URL's host (httpcore takes both from the request URL), as a DNS override would.
- ``PublicOnlyBackend``: with ``allowAnyDomain`` on a listener that is not loopback, anyone may name
  the host to fetch. The name is resolved here, every address it has must be public
  (``origin_policy.public_address``), and the connection goes to the address that was checked, so a
  name that resolves again to another address (DNS rebinding) cannot slip past (each checked
  address is tried in turn, as a client would). A refusal is
  ``NonPublicAddress``, raised before anything is sent (the security token included).
- ``public_host``: the same check for a URL the fleet's browsers would load instead (a bot's miss that
  asks for a render), which no client of ours connects to first.

httpx has no public hook for the network backend, so ``transport`` swaps its pool for one that has it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import httpcore
import httpx

from prerender_ray.serving.origin_policy import public_address

Resolve = Callable[[str, int], Awaitable[list[str]]]


class NonPublicAddress(Exception):
    """A host refused: one of its addresses is outside the public internet, or it has none. The text
    says neither which (a bot gets it: no oracle of the node's own DNS); ``detail`` does, for the
    admins' own messages."""

    def __init__(self, host: str, address: str | None):
        super().__init__(f"{host[:200]} does not resolve to public addresses only "
                         "(allowAnyDomain fetches those alone; list the host in domains)")
        self.host, self.address = host, address
        self.detail = "it has no address" if address is None else f"it resolves to {address}"


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def public_addresses(host: str, port: int, timeout: float | None, resolve: Resolve | None = None) -> list[str]:
    """``host``'s addresses, each public, in the resolver's order. Raises ``NonPublicAddress`` (a
    look-up that fails included), or httpcore's ``ConnectTimeout`` when it outlasts ``timeout``."""
    try:
        async with asyncio.timeout(timeout):  # a connection's deadline covers its look-up
            addresses = await (resolve or _resolve)(host, port)
    except TimeoutError:
        raise httpcore.ConnectTimeout(f"resolving {host[:200]} took longer than the connect deadline") from None
    except OSError:
        raise NonPublicAddress(host, None) from None  # as a private one: the node's DNS says nothing
    if not addresses:
        raise NonPublicAddress(host, None)
    refused = next((a for a in addresses if not public_address(a)), None)
    if refused is not None:
        raise NonPublicAddress(host, refused)
    return addresses


async def public_host(host: str, port: int, timeout: float | None, resolve: Resolve | None = None) -> bool:
    """Whether ``host`` resolves, within ``timeout``, to public addresses only (``public_addresses``)."""
    try:
        await public_addresses(host, port, timeout, resolve)
    except (NonPublicAddress, httpcore.ConnectTimeout):
        return False
    return True


class _Over(httpcore.AsyncNetworkBackend):
    """A backend that decides where TCP connections go and leaves the rest to ``inner``."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None):
        self.inner = inner or httpcore.AnyIOBackend()

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> Any:
        return await self.inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class PinnedBackend(_Over):
    """Every TCP connection to one IP (staging pinning)."""

    def __init__(self, ip: str, inner: httpcore.AsyncNetworkBackend | None = None):
        super().__init__(inner)
        self.ip = ip

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> Any:
        return await self.inner.connect_tcp(self.ip, port, timeout=timeout, local_address=local_address,
                                            socket_options=socket_options)


class PublicOnlyBackend(_Over):
    """Every TCP connection to the address its host was checked at, a public one only."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None, resolve: Resolve | None = None):
        super().__init__(inner)
        self.resolve = resolve

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> Any:
        addresses = await public_addresses(host, port, timeout, self.resolve)
        failed: Exception | None = None
        for address in dict.fromkeys(addresses):  # in the resolver's order, as a client tries them
            try:
                return await self.inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                failed = e
        assert failed is not None
        raise failed

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> Any:
        raise httpcore.ConnectError("a unix socket is not a public address")


def transport(limits: httpx.Limits | None = None, *, pin: str = "", public_only: bool = False,
              backend: httpcore.AsyncNetworkBackend | None = None,
              resolve: Resolve | None = None) -> httpx.AsyncHTTPTransport:
    """An httpx transport that connects as ``pin`` (staging) or ``public_only`` say, else as httpx
    does. ``backend`` (the network beneath them) and ``resolve``: a test's."""
    limits = limits or httpx.Limits()
    out = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
    if pin or public_only:
        chosen = PinnedBackend(pin, backend) if pin else PublicOnlyBackend(backend, resolve)
        out._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=chosen,
        )
    return out
