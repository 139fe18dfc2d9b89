"""Which address a request comes from, for the failed-login limiter, the loopback-only default and logs.

The TCP peer, unless the peer is one of ``server.trustedProxies``: then the right-most address of
``X-Forwarded-For`` that is not itself a trusted proxy (each proxy appends the address it saw, so
everything left of the first untrusted hop was written by the client and proves nothing). With no
proxies configured the header is never believed: rotating it must not buy fresh login attempts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_HOPS = 32  # X-Forwarded-For entries looked at, right to left


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """IPs and CIDRs (``10.0.0.5``, ``10.0.0.0/8``, ``::1``); ValueError names a bad entry."""
    out = []
    for entry in entries:
        try:
            out.append(ipaddress.ip_network(str(entry).strip()))
        except ValueError as e:
            raise ValueError(f"{entry!r} is not an IP address or CIDR network ({e})") from None
    return tuple(out)


def parse_address(value: str) -> Address | None:
    """One hop of a forwarded header: ``1.2.3.4``, ``1.2.3.4:5678``, ``::1`` or ``[::1]:80``; None
    for anything else (``unknown``, an obfuscated name, garbage)."""
    value = value.strip()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


class Proxies:
    """The configured trusted proxies of one config; build once per config."""

    def __init__(self, entries: Iterable[str] = ()):
        self.networks = parse_networks(entries)

    def trusts(self, host: str | None) -> bool:
        if not self.networks or not host:
            return False
        address = parse_address(host)
        return address is not None and any(address in n for n in self.networks)

    def client(self, peer: str | None, forwarded_for: str | None) -> str:
        """The client's address: ``peer`` unless it is a trusted proxy (then see the module doc). A
        hop that is not an address stops the walk at the trusted proxy that wrote it."""
        peer = peer or "unknown"
        if not forwarded_for or not self.trusts(peer):
            return peer
        hop = peer
        for entry in reversed(forwarded_for.split(",")[-MAX_HOPS:]):
            address = parse_address(entry)
            if address is None:
                return hop
            hop = str(address)
            if not any(address in n for n in self.networks):
                return hop
        return hop  # every hop is a proxy of ours: the left-most one is the client

    def hides_client(self, peer: str | None, forwarded_for: str | None) -> bool:
        """True when an untrusted peer says it forwards for someone: the peer is a proxy we were not
        told about, so the client behind it is unknown (it must not pass as the peer, e.g. loopback)."""
        return bool(forwarded_for and forwarded_for.strip()) and not self.trusts(peer)
