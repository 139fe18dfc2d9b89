"""The ingress decision: is an HTTP request a bot request, and for which page?

``Ingress.resolve`` is a pure function of (method, raw path, raw query, headers) for one config. It
never raises; it returns one of:

- ``BotRequest``: canonical URL, device, cache key, route class, route and allowlist;
- ``NotBot``: not ours to serve, the request goes on to the other handlers (admin, fleet, REST);
- ``BadBotRequest``: a prefix-mode request whose target is unusable, answered with a 400.

Prefix mode (``/p/<absolute-url>``): the request's own query is the target's query, the device
comes from the device header, the global allowlist applies and the class comes from the canonical
path. Forwarded mode (behind a CDN): the host comes from the forwarded-host header, the scheme from
the forwarded-proto header, the device from the first path segment or the header, and the route's
allowlist applies. Deliberate differences from the reference (docs/serving.md#differences-from-the-reference):

- a bad prefix-mode target is a 400 with a reason, not a 500;
- a prefix-mode target must be http(s), and when ``domains`` is set its host and port must be allowed
  (``origin_policy``; the reference is an open proxy that sends the security token to any host);
- forwarded mode refuses a forwarded protocol other than http/https, and a host or port not allowed
  by a set ``domains``; like every failed forwarded check these fall through (``NotBot``), as in the
  reference.

The request path must be the raw one (ASGI ``raw_path``), not percent-decoded; bytes that are not
UTF-8 survive when it is decoded with ``errors="surrogateescape"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.devices import Devices
from prerender_ray.identity.routes import Route, RouteClass, Router
from prerender_ray.identity.urls import UrlError, url_host, url_path
from prerender_ray.serving.origin_policy import compiled

if TYPE_CHECKING:
    from prerender_ray.config.model import Config

# Our own endpoints: never a bot request, whatever the routes say. The app's routes are added to
# these at startup (``reserved_prefixes``, from api.app), so a new route cannot be forgotten here;
# these stay reserved as whole subtrees (an unknown /render_queue/x is ours too, answered 404).
RESERVED_PATHS = (
    "/prerender_admin",
    "/prerender_peer/page",
    "/render_queue",
    "/queue_status",
    "/healthz",
    "/readyz",
    "/metrics",
)
# The host-injection guard: a bare ASCII host and an optional numeric port. It refuses paths,
# userinfo, schemes, IPv6 brackets, underscores and IDN; the port range is checked by the parser.
_FORWARDED_HOST = re.compile(r"[A-Za-z0-9.\-]+(?::[0-9]+)?", re.ASCII)
_SCHEMES = ("http", "https")
# The methods other than GET and HEAD that may be proxied to the origin (``bypass``, with the security
# token). An allowlist: TRACE (and TRACK, CONNECT, anything unknown) is never sent, as an origin that
# reflects TRACE would echo the request head, token included, back to the bot.
PROXIED_METHODS = ("POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@final
class BotRequest:
    """A bot request for a page. Immutable (``Final``: mypy holds it). Written out rather than a frozen
    dataclass: a frozen dataclass's ``__init__`` runs interpreted, through ``object.__setattr__`` per
    field, even compiled (0.4 us, a spread hit's thirtieth); this one is a compiled struct's."""

    method: Final[str]
    url: Final[str]  # canonical: the url half of the key and the URL fetched from the origin
    device: Final[str]
    cache_key: Final[str]
    route_class: Final[RouteClass]
    route: Final[Route | None]
    allowlist: Final[tuple[str, ...]]
    mode: Final[str]  # "prefix" | "forwarded"

    def __init__(self, method: str, url: str, device: str, cache_key: str, route_class: RouteClass,
                 route: Route | None, allowlist: tuple[str, ...], mode: str) -> None:
        self.method, self.url, self.device, self.cache_key = method, url, device, cache_key
        self.route_class, self.route, self.allowlist, self.mode = route_class, route, allowlist, mode

    def _fields(self) -> tuple[str, str, str, str, RouteClass, Route | None, tuple[str, ...], str]:
        return (self.method, self.url, self.device, self.cache_key, self.route_class, self.route, self.allowlist,
                self.mode)

    def __eq__(self, other: object) -> bool:
        return type(other) is BotRequest and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        names = ("method", "url", "device", "cache_key", "route_class", "route", "allowlist", "mode")
        return f"BotRequest({', '.join(f'{n}={v!r}' for n, v in zip(names, self._fields()))})"

    @property
    def cacheable(self) -> bool:
        """Only GET and HEAD read the cache; other methods are proxied to the origin (bypass)."""
        return self.method in ("GET", "HEAD")

    @property
    def proxiable(self) -> bool:
        """One of ``PROXIED_METHODS``: a bypass the origin may get (methods are case-sensitive)."""
        return self.method in PROXIED_METHODS

    @property
    def host(self) -> str:
        return url_host(self.url)


@final
@dataclass(frozen=True, slots=True)
class NotBot:
    # reserved | not-prefixed | no-device | unclassified | bad-host | bad-proto | bad-url | host-not-allowed
    reason: str
    detail: str = ""  # worth a warning line when set


@final
@dataclass(frozen=True, slots=True)
class BadBotRequest:
    reason: str  # a UrlError reason, or host-not-allowed
    message: str


Decision = BotRequest | NotBot | BadBotRequest


def reserved_prefixes(route_paths: Iterable[str], base: Iterable[str] = RESERVED_PATHS) -> tuple[str, ...]:
    """``base`` plus the static part of each route path (up to its first ``{parameter}`` segment,
    no trailing slash), sorted, without those under another one. A route whose first segment is a
    parameter would reserve every path: ValueError."""
    out = set(base)
    for path in route_paths:
        static = path.split("{", 1)[0]
        if "{" in path:
            static = static.rpartition("/")[0]  # a segment holding a parameter is not static
        static = static.rstrip("/")
        if not static.startswith("/"):
            raise ValueError(f"route {path!r} would reserve every path from bots")
        out.add(static)
    # A prefix under another one adds nothing (is_reserved reserves whole subtrees).
    return tuple(sorted(p for p in out if not any(p.startswith(q + "/") for q in out)))


def is_reserved(path: str, prefixes: tuple[str, ...] = RESERVED_PATHS) -> bool:
    """True for our own endpoints (a prefix itself or anything under it)."""
    if not path.startswith(prefixes):
        return False
    return any(path == p or path.startswith(p + "/") for p in prefixes)


class Ingress:
    """The ingress options of one config, compiled. Build once per config."""

    def __init__(self, cfg: Config, reserved: tuple[str, ...] = RESERVED_PATHS, *,
                 router: Router | None = None, keys: KeyFormat | None = None):
        ing = cfg.ingress
        self.reserved = reserved  # never bot requests: reserved_prefixes() of the app's routes
        self.mode = ing.mode
        self.prefix = ing.bot_path_prefix
        self.router = router or Router(cfg)  # shared when built by CompiledConfig
        self.keys = keys or KeyFormat.from_config(cfg)
        self.devices = Devices.from_config(cfg)
        self.keys.check_devices(self.devices.supported)
        self.device_from_path = ing.device_type_source == "path"
        self.device_header = ing.device_type_header.lower()
        self.host_header = ing.forwarded_host_header.lower()
        self.proto_header = ing.forwarded_proto_header.lower()
        self.default_protocol = ing.default_protocol
        self.domains = compiled(tuple(cfg.domains))
        # The request header that picks the device (the render, and the user agent of an origin
        # fetch), for Vary; None when the path picks it or there is one device to pick.
        self.device_vary: str | None = (
            ing.device_type_header if (self.mode == "prefix" or not self.device_from_path)
            and len(self.devices.supported) > 1 else None)

    def resolve(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> Decision:
        """Decide for one request. ``headers`` must answer lower-case names (Starlette's do)."""
        if is_reserved(path, self.reserved):
            return NotBot("reserved")
        if self.mode == "prefix":
            return self._prefix(method, path, query, headers)
        return self._forwarded(method, path, query, headers)

    def _prefix(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> Decision:
        if not path.startswith(self.prefix):
            return NotBot("not-prefixed")
        target = path[len(self.prefix):]
        if query:
            target = f"{target}?{query}"
        try:
            url = self.keys.canonicalize(target)
        except UrlError as e:
            return BadBotRequest(e.reason, f"bad target URL after {self.prefix}: {e}")
        if self.domains and (why := self.domains.url_refusal(url)):
            return BadBotRequest("host-not-allowed", why)
        verdict = self.router.classify(url_path(url))
        device = self.devices.sanitize(headers.get(self.device_header))
        return BotRequest(
            method, url, device, self.keys.key(url, device), verdict.route_class, verdict.route,
            verdict.allowlist, "prefix",
        )

    def _forwarded(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> Decision:
        if self.device_from_path:
            device, origin_path = self.devices.from_path(path)
            if device is None:
                return NotBot("no-device")
        else:
            device, origin_path = self.devices.sanitize(headers.get(self.device_header)), path
        verdict = self.router.classify(origin_path)
        if verdict.route_class == "unclassified" and not self.device_from_path:
            # Header mode: only a route marks a request as bot traffic; the rest is REST.
            return NotBot("unclassified")
        host = _first_value(headers.get(self.host_header))
        if not host or _FORWARDED_HOST.fullmatch(host) is None:
            return NotBot("bad-host", f"missing or invalid {self.host_header}: {host!r} for {origin_path}")
        proto = _first_value(headers.get(self.proto_header)).lower() or self.default_protocol
        if proto not in _SCHEMES:
            return NotBot("bad-proto", f"{self.proto_header} {proto!r} is not http or https")
        target = f"{proto}://{host}{origin_path}"
        if query:
            target = f"{target}?{query}"
        try:
            url = self.keys.canonicalize(target, verdict.allowlist)
        except UrlError as e:
            return NotBot("bad-url", f"cannot rebuild the forwarded URL for {origin_path}: {e}")
        if self.domains and (why := self.domains.url_refusal(url)):
            return NotBot("host-not-allowed", f"forwarded host {host!r}: {why}")
        return BotRequest(
            method, url, device, self.keys.key(url, device), verdict.route_class, verdict.route,
            verdict.allowlist, "forwarded",
        )


RESOLVED_MEMO = 16_384  # ingress decisions remembered per config (cleared when full)
# Inputs longer than this are decided afresh each time, never kept: a head may be 64 KiB, and a full
# memo of such keys would hold a gigabyte. Kept keys stay under 16,384 x 2 KB.
RESOLVED_KEY_BYTES = 2048


class Remembered:
    """``ingress.resolve``, remembered: it is a pure function of these inputs (the only headers it
    reads are the device, forwarded-host and forwarded-proto ones). One per config (the replica's
    state holds it beside its ingress)."""

    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress
        self._memo: dict[tuple[str, str, str, str | None, str | None, str | None], Decision] = {}

    def __len__(self) -> int:
        return len(self._memo)

    def resolve(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> Decision:
        ing = self.ingress
        device, host, proto = (headers.get(ing.device_header), headers.get(ing.host_header),
                               headers.get(ing.proto_header))
        size = len(method) + len(path) + len(query)
        for part in (device, host, proto):
            if part is not None:
                size += len(part)
        if size > RESOLVED_KEY_BYTES:
            return ing.resolve(method, path, query, headers)
        key = (method, path, query, device, host, proto)
        memo = self._memo
        decision = memo.get(key)
        if decision is None:
            if len(memo) >= RESOLVED_MEMO:
                memo.clear()
            decision = memo[key] = ing.resolve(method, path, query, headers)
        return decision


def resolve(
    method: str, path: str, query: str, headers: Mapping[str, str], ingress: Ingress | Config
) -> Decision:
    """``Ingress.resolve``; given a Config it compiles one first (build an Ingress once on hot paths)."""
    if not isinstance(ingress, Ingress):
        ingress = Ingress(ingress)
    return ingress.resolve(method, path, query, headers)


def _first_value(raw: str | None) -> str:
    return raw.split(",", 1)[0].strip() if raw else ""
