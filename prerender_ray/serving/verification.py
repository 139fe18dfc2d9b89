"""Is a request that claims a crawler from that crawler's operator? (``bots.verify``). Pure: no Ray, no
HTTP; DNS goes through an injected resolver, time through an injected clock.

Two methods, as operators document them:

- **Reverse DNS, confirmed forward** (Google, Bing, Apple, Yandex, Baidu, Amazon ...): the address's
  PTR name must be in one of the bot's domains (``googlebot.com`` allows ``crawl-1.googlebot.com``),
  and that name must resolve back to the address. A PTR that names the domain but resolves elsewhere
  is a lie anyone with a reverse zone can tell: ``failed``.
- **Published IP ranges** (OpenAI, Perplexity, DuckDuckGo ...): files in the shape Google and OpenAI
  publish, ``{"prefixes": [{"ipv4Prefix": ...}, {"ipv6Prefix": ...}]}``, or one CIDR a line. A bot
  with ranges is checked by them.

A request never waits more than ``deadlineMs`` for a check: past it, it is ``unverified`` for now,
the check goes on in the background (at most ``maxPending`` at once) and its answer is remembered
(``ttl``; a lookup that timed out or errored: ``retryAfter``) in a bounded LRU.
"""

from __future__ import annotations

import asyncio
import bisect
import ipaddress
import json
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from prerender_ray.serving.bot_policy import FAILED, UNCHECKED, UNVERIFIED, VERIFIED

if TYPE_CHECKING:
    from prerender_ray.config.bots import Verify

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_HOSTNAME = 253
MAX_NAMES = 8  # PTR names looked at per address, and forward lookups made
MAX_ADDRESSES = 64  # forward addresses compared per name

# Google's common crawlers reverse-resolve to googlebot.com, special-case crawlers to google.com,
# user-triggered fetchers to gae.googleusercontent.com. Never all of googleusercontent.com: any
# Compute Engine VM's default PTR is a.b.c.d.bc.googleusercontent.com, and it resolves back.
_GOOGLE = ("googlebot.com", "google.com", "gae.googleusercontent.com")
# Reverse-DNS domains operators publish for their crawlers (by registry name).
BUILTIN_DNS: dict[str, tuple[str, ...]] = {
    **{name: _GOOGLE for name in (
        "Googlebot", "Googlebot-Image", "Googlebot-Video", "Google InspectionTool", "GoogleOther",
        "GoogleOther-Image", "GoogleOther-Video", "Storebot-Google", "AdsBot-Google", "Google-CloudVertexBot")},
    "Bingbot": ("search.msn.com",),
    "Applebot": ("applebot.apple.com",),
    "YandexBot": ("yandex.ru", "yandex.net", "yandex.com"),
    "Baidu Spider": ("baidu.com", "baidu.jp"),
    "Amazonbot": ("crawl.amazonbot.amazon",),
    "PetalBot": ("petalsearch.com",),
    "SeznamBot": ("seznam.cz",),
    "Naver Yeti": ("naver.com",),
}


def reserved_names(cfg: Verify) -> set[str]:
    """The bot names whose operators are verified another way (reverse DNS or ranges), whether the
    check is on or not: a Web Bot Auth agent verifies one of them only when it names it."""
    names = set(BUILTIN_DNS) if cfg.builtin_dns else set()
    return names | {name for name, domains in cfg.dns.items() if domains} | set(cfg.ranges)


class Resolver(Protocol):
    """DNS for the check. Return ``[]`` for "no such record"; raise (OSError, TimeoutError) for a
    failure that says nothing about the address (the claim stays unverified)."""

    async def reverse(self, address: str) -> list[str]: ...

    async def forward(self, host: str) -> list[str]: ...


class SystemResolver:
    """The host's resolver: getnameinfo / getaddrinfo on a few threads of its own, so a resolver that
    hangs holds these and never the loop's default executor (``maxPending`` bounds the queue)."""

    _NONE = frozenset(e for e in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
                      if e is not None)

    def __init__(self, threads: int = 4):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="bot-verify")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def reverse(self, address: str) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            host, _ = await loop.run_in_executor(self._pool, socket.getnameinfo, (address, 0), socket.NI_NAMEREQD)
        except socket.gaierror as e:
            if e.errno in self._NONE:
                return []
            raise
        return [host]

    async def forward(self, host: str) -> list[str]:
        try:
            infos = await asyncio.get_running_loop().run_in_executor(
                self._pool, lambda: socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
        except socket.gaierror as e:
            if e.errno in self._NONE:
                return []
            raise
        return [str(info[4][0]) for info in infos]


def parse_address(value: str | None) -> Address | None:
    """An address, IPv4-mapped IPv6 as IPv4 (a dual-stack socket reports ``::ffff:1.2.3.4``)."""
    if not value:
        return None
    try:
        address = ipaddress.ip_address(value.strip().partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def in_domains(host: str, domains: Iterable[str]) -> bool:
    return any(host == d or host.endswith("." + d) for d in domains)


# ------------------------------------------------------------------------------------------- ranges


class RangeError(ValueError):
    """A range file that cannot be used (its path and the reason)."""


class RangeSet:
    """Networks merged and sorted by start, so a lookup is one bisection (a file may hold thousands)."""

    def __init__(self, networks: Iterable[Network] = ()):
        self._starts: dict[int, list[int]] = {4: [], 6: []}
        self._ends: dict[int, list[int]] = {4: [], 6: []}
        self.size = 0
        networks = list(networks)
        v4 = [n for n in networks if n.version == 4]
        v6 = [n for n in networks if n.version == 6]
        merged: list[Network] = [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]
        for n in sorted(merged, key=lambda n: (n.version, int(n.network_address))):
            self._starts[n.version].append(int(n.network_address))
            self._ends[n.version].append(int(n.broadcast_address))
            self.size += 1

    def __contains__(self, address: object) -> bool:
        if not isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
            return False
        value, starts = int(address), self._starts[address.version]
        i = bisect.bisect_right(starts, value) - 1
        return i >= 0 and value <= self._ends[address.version][i]


def parse_ranges(data: bytes, *, max_prefixes: int, source: str = "ranges") -> list[Network]:
    """The networks of a range file: JSON ``{"prefixes": [{"ipv4Prefix"|"ipv6Prefix": cidr}]}`` or
    one CIDR (or address) a line, ``#`` comments allowed. RangeError for anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RangeError(f"{source}: not UTF-8 text") from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise RangeError(f"{source}: not valid JSON ({e})") from None
        prefixes = doc.get("prefixes") if isinstance(doc, dict) else None
        if not isinstance(prefixes, list):
            raise RangeError(f"{source}: JSON without a 'prefixes' array")
        entries = []
        for i, p in enumerate(prefixes):
            value = p.get("ipv4Prefix", p.get("ipv6Prefix")) if isinstance(p, dict) else None
            if not isinstance(value, str):
                raise RangeError(f"{source}: prefixes[{i}] has no ipv4Prefix or ipv6Prefix string")
            entries.append((f"prefixes[{i}]", value))
    else:
        entries = [(f"line {n}", line.partition("#")[0].strip()) for n, line in enumerate(text.splitlines(), 1)]
        entries = [(where, value) for where, value in entries if value]
    if len(entries) > max_prefixes:
        raise RangeError(f"{source}: {len(entries)} prefixes, more than maxPrefixes ({max_prefixes})")
    out: list[Network] = []
    for where, value in entries:
        try:
            out.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise RangeError(f"{source}: {where}: not an IP network: {value[:80]!r}") from None
    return out


# A source that is a URL is fetched by a callable the caller gives (the core makes no HTTP request):
# (url, max_bytes) -> the body, at most max_bytes + 1 bytes of it; RangeError when it cannot.
Fetch = Callable[[str, int], bytes]


def is_url(source: str) -> bool:
    return source.startswith(("https://", "http://"))


def read_range_file(path: str, *, max_bytes: int, max_prefixes: int, fetch: Fetch | None = None) -> list[Network]:
    """Blocking: run it off the event loop. ``path`` is a file, or a URL read through ``fetch``."""
    if is_url(path):
        if fetch is None:
            raise RangeError(f"{path}: no fetcher for range URLs here")
        data = fetch(path, max_bytes)
    else:
        try:
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)
        except OSError as e:
            raise RangeError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise RangeError(f"{path}: larger than maxRangeBytes ({max_bytes})")
    return parse_ranges(data, max_prefixes=max_prefixes, source=path)


class RangeStore:
    """Each bot's published ranges from its files and URLs. ``reload`` reads every source (blocking)
    and swaps in the new sets at once; a source that fails keeps its previous networks (none at first)."""

    def __init__(self, files: Mapping[str, list[str]], *, max_bytes: int, max_prefixes: int,
                 fetch: Fetch | None = None):
        self.files = {name: list(paths) for name, paths in files.items()}
        self.max_bytes = max_bytes
        self.max_prefixes = max_prefixes
        self.fetch = fetch
        self._loaded: dict[str, list[Network]] = {}  # path -> its last good networks
        self.sets: dict[str, RangeSet] = {}  # bot name -> the union of its files' (loaded ones only)

    def reload(self) -> list[str]:
        """Read every file again; the errors, one line each (the caller logs them)."""
        errors = []
        for path in {p for paths in self.files.values() for p in paths}:
            try:
                self._loaded[path] = read_range_file(path, max_bytes=self.max_bytes, max_prefixes=self.max_prefixes,
                                                     fetch=self.fetch)
            except RangeError as e:
                errors.append(str(e))
        self.sets = {name: RangeSet(n for p in paths if p in self._loaded for n in self._loaded[p])
                     for name, paths in self.files.items() if any(p in self._loaded for p in paths)}
        return errors


# --------------------------------------------------------------------------------------------- check


# Why a reverse-DNS or range check answered as it did (bounded: a metric label).
OUTCOMES = (VERIFIED, "not-in-ranges", "not-confirmed", "no-address", "no-ranges", "lookup-error", "overloaded",
            "deadline")


def _dns_reason(state: str) -> str:
    # failed: no PTR in the domains, or one that does not resolve back; unverified: the lookup failed
    return {VERIFIED: VERIFIED, FAILED: "not-confirmed"}.get(state, "lookup-error")


@dataclass(frozen=True, slots=True)
class Answer:
    state: str
    until: float  # clock time it is remembered to


class Verifier:
    """The checks of one replica: its methods (from the config), its cache and its background checks."""

    def __init__(self, cfg: Verify, *, resolver: Resolver | None = None, ranges: RangeStore | None = None,
                 clock: Callable[[], float] = time.monotonic, fetch: Fetch | None = None):
        dns: dict[str, tuple[str, ...]] = dict(BUILTIN_DNS) if cfg.builtin_dns else {}
        dns.update({name: tuple(domains) for name, domains in cfg.dns.items()})
        self.dns = {name.lower(): domains for name, domains in dns.items() if domains}
        self.ranges = ranges if ranges is not None else RangeStore(
            cfg.ranges, max_bytes=cfg.max_range_bytes, max_prefixes=cfg.max_prefixes, fetch=fetch)
        self._ranged = {name.lower(): name for name in self.ranges.files}
        self.resolver: Resolver = resolver if resolver is not None else SystemResolver()
        self.clock = clock
        self.deadline_s = cfg.deadline_ms / 1000
        self.lookup_s = cfg.lookup_timeout_ms / 1000
        self.ttl_s = cfg.ttl / 1000
        self.retry_s = cfg.retry_after / 1000
        self.cache_size = cfg.cache_size
        self.max_pending = cfg.max_pending
        self._cache: OrderedDict[tuple[str, Address], Answer] = OrderedDict()
        self._pending: dict[tuple[str, Address], asyncio.Task] = {}
        self.stats = {"overloaded": 0, "deadline": 0, "errors": 0}

    def applies(self, name: str) -> bool:
        """A method exists for this bot name (else it is ``unchecked``)."""
        key = name.lower()
        return key in self._ranged or key in self.dns

    def method(self, name: str) -> str | None:
        """``ranges``, ``dns`` or None (no method for this bot name)."""
        key = name.lower()
        return "ranges" if key in self._ranged else "dns" if key in self.dns else None

    async def check(self, name: str, client: str | None) -> str:
        """``verified``, ``failed``, ``unverified`` or ``unchecked``; never waits past the deadline."""
        return (await self.check_why(name, client))[0]

    async def check_why(self, name: str, client: str | None) -> tuple[str, str]:
        """The state and why (``OUTCOMES``: the metric's outcomes and the admin report's)."""
        found = self.known(name, client)
        if found is not None:
            return found
        key = name.lower()
        address = cast("Address", parse_address(client))  # ``known`` answered every other case
        cache_key = (key, address)
        task = self._pending.get(cache_key)
        if task is None:
            if len(self._pending) >= self.max_pending:
                self.stats["overloaded"] += 1
                return UNVERIFIED, "overloaded"
            task = asyncio.get_running_loop().create_task(self._run(cache_key, self.dns[key], address))
            self._pending[cache_key] = task
            task.add_done_callback(lambda _: self._pending.pop(cache_key, None))
        try:
            state = await asyncio.wait_for(asyncio.shield(task), self.deadline_s)
        except TimeoutError:
            self.stats["deadline"] += 1
            return UNVERIFIED, "deadline"
        return state, _dns_reason(state)

    def known(self, name: str, client: str | None) -> tuple[str, str] | None:
        """What ``check_why`` answers without waiting, as it answers it (an expired answer is
        forgotten), or None when it would look the address up or wait for a lookup in flight. The
        ingress's hit memo (``api/bot/memo.py``) asks it to tell that a request's check is unchanged."""
        key = name.lower()
        ranged = self._ranged.get(key)
        if ranged is None and key not in self.dns:
            return UNCHECKED, UNCHECKED
        address = parse_address(client)
        if address is None:  # no socket peer (an in-process caller): nothing to check against
            return UNVERIFIED, "no-address"
        if ranged is not None:  # a bisection: no cache or deadline needed
            found = self.ranges.sets.get(ranged)
            if found is None:  # its files never loaded: we cannot tell
                return UNVERIFIED, "no-ranges"
            return (VERIFIED, VERIFIED) if address in found else (FAILED, "not-in-ranges")
        cache_key = (key, address)
        known = self._cache.get(cache_key)
        if known is not None:
            if known.until > self.clock():
                self._cache.move_to_end(cache_key)
                return known.state, _dns_reason(known.state)
            del self._cache[cache_key]
        return None

    async def _run(self, cache_key: tuple[str, Address], domains: tuple[str, ...], address: Address) -> str:
        try:
            state = await asyncio.wait_for(self._dns(domains, address), self.lookup_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # a timeout, a resolver error, a resolver that returned garbage
            self.stats["errors"] += 1
            state = UNVERIFIED
        self._remember(cache_key, state)
        return state

    async def _dns(self, domains: tuple[str, ...], address: Address) -> str:
        names = await self.resolver.reverse(str(address))
        hosts = []
        for raw in list(names)[:MAX_NAMES]:
            host = raw.strip().lower().rstrip(".") if isinstance(raw, str) else ""
            if 0 < len(host) <= MAX_HOSTNAME and in_domains(host, domains):
                hosts.append(host)
        for host in hosts:
            addresses = await self.resolver.forward(host)
            if any(parse_address(a) == address for a in list(addresses)[:MAX_ADDRESSES] if isinstance(a, str)):
                return VERIFIED
        return FAILED  # no PTR in the domains, or one that does not resolve back (a lie)

    def _remember(self, cache_key: tuple[str, Address], state: str) -> None:
        ttl = self.retry_s if state == UNVERIFIED else self.ttl_s
        self._cache[cache_key] = Answer(state, self.clock() + ttl)
        self._cache.move_to_end(cache_key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        closer = getattr(self.resolver, "close", None)
        if callable(closer):
            closer()

    def snapshot(self) -> dict[str, Any]:
        return {"cached": len(self._cache), "pending": len(self._pending), **self.stats,
                "rangeSets": {name: s.size for name, s in self.ranges.sets.items()}}
