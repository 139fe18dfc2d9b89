"""The origin policy: which origins may be fetched (and so receive the security token), and which
hosts are ours to serve. One implementation for every ``domains`` check: the bot decision (prefix
and forwarded mode), the result planner, the explainer, the sitemap loc filter, the origin client
and the sitemap fetcher (root, index child and every redirect hop).

A ``domains`` entry names one host and the ports it allows:

- ``host``: the scheme's default port only (80 for http, 443 for https);
- ``host:port``: that port, whatever the scheme;
- ``host:*``: any port.

IPv6 literals are bracketed (``[::1]``, ``[::1]:8080``); names are matched case-insensitively and
IDN as punycode, as canonical URLs spell them. An entry that is a URL (scheme, path, query,
userinfo) is refused at config validation with the entry to write instead.

An empty ``domains`` allows every host for serving; for fetching it keeps its old meaning: allowed
on a loopback listener or with ``allowAnyDomain``, else every fetch is refused (no open proxy). With
``allowAnyDomain`` on a listener that is not loopback (``public_only``), anyone may name the host to
fetch, so a fetch connects only to an address of the public internet (``public_address``, checked on
the address it connects to: ``api/outbound.py``): never to the node's own network, its cloud's
metadata service or loopback.

``NoCookies`` is the cookie jar of every outbound HTTP client: it never stores a cookie, so one
origin's ``Set-Cookie`` is never replayed to another bot, port or host.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from http.cookiejar import Cookie, CookieJar
from typing import TYPE_CHECKING, Any

from prerender_ray.config.base import is_loopback
from prerender_ray.identity.urls import UrlError, url_parts

if TYPE_CHECKING:
    from prerender_ray.config.model import Config

DEFAULT_PORTS = {"http": 80, "https": 443}
_URL_SHAPED = re.compile(r"[/?#@\\]|^[a-z][a-z0-9+.\-]*://", re.I)
_PORT = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True, slots=True)
class DomainEntry:
    text: str  # as configured (trimmed, lower-cased)
    host: str  # as canonical URLs spell it: IDN as punycode, IPv6 bracketed
    port: int | None  # None: the scheme's default port
    any_port: bool = False

    def allows(self, scheme: str, host: str, port: int) -> bool:
        if host != self.host:
            return False
        if self.any_port:
            return True
        if self.port is None:
            return port == DEFAULT_PORTS.get(scheme)
        return port == self.port

    def describe(self) -> str:
        """What the entry allows, in words (``config check``)."""
        if self.any_port:
            return f"{self.host}: http and https on any port"
        if self.port is None:
            return f"{self.host}: http on port 80 and https on port 443 only"
        return f"{self.host}: http and https on port {self.port} only"


def parse_entry(text: str) -> DomainEntry:
    """One ``domains`` entry; ``ValueError`` says what is wrong and what to write instead."""
    raw = text.strip().lower()
    if not raw:
        raise ValueError("domains entry is empty")
    if _URL_SHAPED.search(raw):
        raise ValueError(f"domains entry {text!r} is a URL; write {_suggest(raw)!r}")
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0:
            raise ValueError(f"domains entry {text!r}: an IPv6 literal needs its closing ']'")
        host, rest = raw[:close + 1], raw[close + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"domains entry {text!r}: expected ':port' or ':*' after {host!r}")
        port_text = rest[1:] if rest else None
    elif raw.count(":") > 1:
        raise ValueError(f"domains entry {text!r}: write an IPv6 literal in brackets, e.g. '[{raw}]'")
    else:
        host, colon, port_text = raw.partition(":")
        port_text = port_text if colon else None
    if port_text is None:
        port, any_port = None, False
    elif port_text == "*":
        port, any_port = None, True
    elif _PORT.fullmatch(port_text) and 0 < int(port_text) <= 65535:
        port, any_port = int(port_text), False
    else:
        raise ValueError(f"domains entry {text!r}: the port must be 1-65535 or '*', not {port_text!r}")
    return DomainEntry(raw, _canonical_host(host, text), port, any_port)


def _canonical_host(host: str, text: str) -> str:
    if not host:
        raise ValueError(f"domains entry {text!r} has no host")
    try:
        authority = url_parts(f"http://{host}/")[1]
    except UrlError:
        raise ValueError(f"domains entry {text!r}: {host!r} is not a valid host name") from None
    return authority


def _suggest(raw: str) -> str:
    """The entry a URL-shaped one most likely means: its host and port (default port dropped)."""
    try:
        target = raw if "://" in raw else f"http://{raw.lstrip('/')}"
        scheme, authority, _, _ = url_parts(target)
    except UrlError:
        return raw.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2] or "host[:port]"
    return authority


def split_authority(scheme: str, authority: str) -> tuple[str, int]:
    """(host, port) of a URL authority; the port defaults to the scheme's."""
    if authority.startswith("["):
        close = authority.find("]")
        host, rest = authority[:close + 1], authority[close + 1:]
    else:
        host, _, port_text = authority.partition(":")
        rest = f":{port_text}" if port_text else ""
    port = int(rest[1:]) if rest[1:].isdigit() else DEFAULT_PORTS.get(scheme, 0)
    return host, port


def origin_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL as a WHATWG parser reads it, or None."""
    try:
        scheme, authority, _, _ = url_parts(url)
    except UrlError:
        return None
    return (scheme, *split_authority(scheme, authority))


def label(scheme: str, host: str, port: int) -> str:
    """An origin as an entry would name it: ``host`` on its default port, else ``host:port``."""
    return host if DEFAULT_PORTS.get(scheme) == port else f"{host}:{port}"


class Domains:
    """The compiled ``domains`` list: ``allows``/``refusal`` for one origin or URL."""

    def __init__(self, entries: Iterable[str]):
        self.entries = tuple(parse_entry(e) for e in entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def allows(self, scheme: str, host: str, port: int) -> bool:
        """An empty list allows everything (the caller decides what that means for fetching)."""
        return not self.entries or any(e.allows(scheme, host, port) for e in self.entries)

    def refusal(self, scheme: str, host: str, port: int) -> str | None:
        """None when allowed, else why, with the entry that would allow it."""
        if self.allows(scheme, host, port):
            return None
        name = label(scheme, host, port)
        return f"{name} is not allowed by domains; add '{name}' or '{host}:*'"

    def url_refusal(self, url: str) -> str | None:
        """``refusal`` for a URL; one that is not an absolute http(s) URL is refused."""
        origin = origin_of(url)
        if origin is None:
            return f"{url[:200]!r} is not an absolute http(s) URL"
        return self.refusal(*origin)

    def url_allowed(self, url: str) -> bool:
        return self.url_refusal(url) is None


@lru_cache(maxsize=32)
def compiled(entries: tuple[str, ...]) -> Domains:
    """``Domains`` for a list of entries, compiled once (for callers that hold only the list)."""
    return Domains(entries)


class OriginPolicy:
    """What may be fetched from an origin, compiled once from the config. Every origin fetch asks
    ``refusal`` before it connects, for its first URL and for each redirect hop; the security token
    goes only to an origin it allowed."""

    def __init__(self, cfg: Config):
        self.domains = compiled(tuple(cfg.domains))
        # An empty list fetches any host only where that cannot make an open proxy.
        self.closed = not (cfg.domains or cfg.allow_any_domain or is_loopback(cfg.server.host))
        # anyone may name the host: only public addresses are connected to (module docstring)
        self.public_only = not cfg.domains and cfg.allow_any_domain and not is_loopback(cfg.server.host)

    def refusal(self, scheme: str, host: str, port: int) -> str | None:
        if self.closed:
            return ("origin fetches are off: `domains` is empty on a non-loopback listener "
                    "(set domains, or allowAnyDomain: true)")
        if scheme not in DEFAULT_PORTS:
            return f"{scheme!r} is not http or https"
        return self.domains.refusal(scheme, host, port)

    def url_refusal(self, url: str) -> str | None:
        origin = origin_of(url)
        if origin is None:
            return f"{url[:200]!r} is not an absolute http(s) URL"
        return self.refusal(*origin)

    def request_refusal(self, scheme: str, raw_host: bytes | str, port: int | None) -> str | None:
        """``refusal`` for the URL an HTTP client is about to connect to, as that client parsed it
        (httpx: ``url.scheme``, ``url.raw_host``, ``url.port``), so no parser difference can slip
        a host past the check."""
        host = raw_host.decode("ascii", "replace") if isinstance(raw_host, bytes) else raw_host
        host = host.lower()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return self.refusal(scheme, host, port or DEFAULT_PORTS.get(scheme, 0))


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def public_address(ip: str) -> bool:
    """Whether ``ip`` (a literal, as a resolver answers it) is an address of the public internet:
    ``ipaddress``'s ``is_global`` and not multicast, an IPv6 address that carries an IPv4 one
    (mapped, 6to4, NAT64, Teredo) judged by the IPv4 one as well. Anything unparsable is not."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])  # a scope id (fe80::1%eth0) names no other host
    except ValueError:
        return False
    inner: list[ipaddress.IPv4Address] = []
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            inner.append(addr.ipv4_mapped)
        if addr.sixtofour is not None:
            inner.append(addr.sixtofour)
        if addr.teredo is not None:
            inner.extend(addr.teredo)
        if addr in _NAT64:
            inner.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    return all(a.is_global and not a.is_multicast for a in (addr, *inner))


def describe_domains(entries: Sequence[str]) -> list[str]:
    """One line per entry: what it allows (``config check``)."""
    return [parse_entry(e).describe() for e in entries]


class NoCookies(CookieJar):
    """A cookie jar that never stores: outbound clients keep no cookie from one fetch to the next."""

    def set_cookie(self, cookie: Cookie) -> None:
        return None

    def set_cookie_if_ok(self, cookie: Cookie, request: Any) -> None:
        return None

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None
