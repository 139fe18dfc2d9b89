"""Route classes: which paths are prerendered, proxied, or not ours at all.

The compiled list is ``excludePathPatterns`` first (as contains/passthrough entries), then
``ingress.routes``; the first match wins. A malformed route entry is dropped on its own with a warning
naming it; an unknown device type in a route is an error (it would schedule renders nobody reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from prerender_ray.config.model import Config
from prerender_ray.config.render import Block, Guard, Scroll
from prerender_ray.identity.urls import UrlError, whatwg_path

RouteClass = Literal["prerender", "passthrough", "unclassified"]
Override = tuple[tuple[str, Any], ...]  # (field, value) pairs a route sets of one render.* section
MATCHES = ("exact", "prefix", "contains")
MODES = ("prerender", "passthrough")
ALL_PARAMS = ("*",)


@dataclass(frozen=True)
class Route:
    match: str
    path: str
    mode: str
    query_params: tuple[str, ...]
    render_interval: int | None = None
    device_types: tuple[str, ...] | None = None
    source: str = "ingress.routes"
    guard: Override | None = None  # the render.guard fields this route overrides
    scroll: Override | None = None  # ... render.scroll's
    block: Override | None = None  # ... render.block's

    def __str__(self) -> str:
        return f"{self.match} {self.path}"

    def matches(self, path: str) -> bool:
        if self.match == "exact":
            return path == self.path
        if self.match == "prefix":
            return path.startswith(self.path)
        return self.path in path

    @property
    def scope(self) -> str:
        return f"route:{self.match}:{self.path}"

    def describe(self) -> str:
        """The debug-header form: ``prefix /catalog/ [CN] prerender (ingress.routes)``."""
        return f"{self.match} {self.path} [{', '.join(self.query_params)}] {self.mode} ({self.source})"

    def as_dict(self) -> dict:
        return {
            "match": self.match,
            "path": self.path,
            "mode": self.mode,
            "queryParams": list(self.query_params),
            "renderInterval": self.render_interval,
            "deviceTypes": list(self.device_types) if self.device_types is not None else None,
            "source": self.source,
            **{name: {k: list(v) if isinstance(v, tuple) else v for k, v in value}
               for name, value in (("guard", self.guard), ("scroll", self.scroll), ("block", self.block))
               if value is not None},
        }


@dataclass(frozen=True)
class CompiledRoutes:
    routes: tuple[Route, ...]
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    dropped: int = 0

    @property
    def prerender_count(self) -> int:
        return sum(1 for r in self.routes if r.mode == "prerender" and r.source == "ingress.routes")


@dataclass(frozen=True)
class Classification:
    route_class: RouteClass
    route: Route | None
    allowlist: tuple[str, ...] = field(default=ALL_PARAMS)


def _get(entry: dict, snake: str, camel: str) -> Any:
    return entry[snake] if snake in entry else entry.get(camel)


def _compile_entry(i: int, entry: Any, supported: tuple[str, ...], warn: list, err: list) -> Route | None:
    label = f"ingress.routes[{i}]"
    if not isinstance(entry, dict):
        warn.append(f"{label}: dropped: expected a mapping, got {type(entry).__name__}")
        return None
    path, match = entry.get("path"), entry.get("match")
    mode = entry.get("mode") if entry.get("mode") is not None else "prerender"
    if not isinstance(path, str) or not path:
        warn.append(f"{label}: dropped: path must be a non-empty string")
        return None
    label = f"{label} ({match} {path})"
    if match not in MATCHES:
        warn.append(f"{label}: dropped: match must be one of {', '.join(MATCHES)}")
        return None
    if match in ("exact", "prefix") and not path.startswith("/"):
        warn.append(f"{label}: dropped: an {match} path must start with '/'")
        return None
    if mode not in MODES:
        warn.append(f"{label}: dropped: mode must be prerender or passthrough")
        return None
    params = _get(entry, "query_params", "queryParams")
    interval = _get(entry, "render_interval", "renderInterval")
    devices = _get(entry, "device_types", "deviceTypes")
    known = {"path", "match", "mode", "query_params", "queryParams", "render_interval", "renderInterval",
             "device_types", "deviceTypes", *OVERRIDES}
    for key in entry:
        if key not in known:
            warn.append(f"{label}: unknown key {key!r} ignored")
    if mode == "passthrough":
        if isinstance(params, list) and params and list(params) != ["*"]:
            warn.append(f"{label}: queryParams ignored on a passthrough route (all params are kept)")
        if interval is not None:
            warn.append(f"{label}: renderInterval ignored on a passthrough route")
        return Route(match, path, mode, ALL_PARAMS, source="ingress.routes")
    qp = tuple(str(p) for p in params) if isinstance(params, list) else ()
    ri = None
    if interval is not None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) \
                or interval <= 0:
            warn.append(f"{label}: renderInterval {interval!r} is not a positive number of ms; field dropped")
        else:
            ri = int(interval)
    dt = None
    if devices is not None:
        if not isinstance(devices, list) or not devices:
            err.append(f"{label}: deviceTypes must be a non-empty list")
        else:
            lowered = tuple(str(d).lower() for d in devices)
            unknown = [d for d in lowered if d not in supported]
            if unknown:
                err.append(f"{label}: unknown device type(s) {unknown}; supported: {list(supported)}")
            dt = lowered
    over = {name: _override(label, name, entry.get(name), warn) for name in OVERRIDES}
    return Route(match, path, mode, qp, ri, dt, "ingress.routes", **over)


# A route may set some fields of these render.* sections; true / false stand for these fields.
OVERRIDES: dict[str, tuple[type[BaseModel], dict[bool, Override]]] = {
    "guard": (Guard, {True: (("enabled", True),), False: (("enabled", False),)}),
    "scroll": (Scroll, {True: (("mode", "bottom"),), False: (("mode", "off"),)}),
    "block": (Block, {True: (("defaults", True),), False: (("defaults", False), ("hosts", ()))}),
}


def _override(label: str, name: str, value: Any, warn: list) -> Override | None:
    """A route's ``guard``, ``scroll`` or ``block``: a boolean, or some fields of ``render.<name>``."""
    if value is None:
        return None
    model, flags = OVERRIDES[name]
    if isinstance(value, bool) and value in flags:
        return flags[value]
    if not isinstance(value, dict):
        warn.append(f"{label}: {name} must be a boolean or a mapping of render.{name} fields; field dropped")
        return None
    try:
        parsed = model.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        warn.append(f"{label}: {name}.{where}: {first['msg']}; field dropped")
        return None
    return tuple((field, getattr(parsed, field)) for field in sorted(parsed.model_fields_set))


def compile_route_list(
    routes: Any, excludes: Any, supported: tuple[str, ...] = ("desktop", "mobile", "tablet")
) -> CompiledRoutes:
    warn: list[str] = []
    err: list[str] = []
    out: list[Route] = []
    for pattern in excludes if isinstance(excludes, list) else []:
        if not isinstance(pattern, str) or not pattern:
            continue  # junk excludes are tolerated silently, as in the reference
        if "?" in pattern or "=" in pattern:
            warn.append(f"ingress.exclude_path_patterns: {pattern!r} can never match (patterns see the path only)")
        out.append(Route("contains", pattern, "passthrough", ALL_PARAMS, source="excludePathPatterns"))
    dropped = 0
    if routes is not None and not isinstance(routes, list):
        warn.append("ingress.routes: not a list; no routes compiled")
        routes = []
    for i, entry in enumerate(routes or []):
        route = _compile_entry(i, entry, supported, warn, err)
        if route is None:
            dropped += 1
        else:
            out.append(route)
    if dropped:
        warn.append(f"ingress.routes: ignored {dropped} invalid route(s)")
    return CompiledRoutes(tuple(out), tuple(warn), tuple(err), dropped)


def compile_routes(cfg: Config) -> CompiledRoutes:
    return compile_route_list(
        cfg.ingress.routes, cfg.ingress.exclude_path_patterns, tuple(cfg.device_types.supported)
    )


class Router:
    """Classifies paths for one config. Build once per config; ``classify`` is the hot path.

    Forwarded mode classifies the raw request path (device segment removed, nothing decoded, the
    trailing slash kept), as the reference does: the CDN forwards its own spelling, and every
    non-admin request passes through here, so matching stays a few string compares.

    Prefix mode classifies the CANONICAL path, so every spelling of one key gets one class. Better
    than the reference: with ``trailingSlash: strip`` a stripped path also matches as if it still
    had its slash, so the default exclude ``/search/`` covers ``/p/https://x.com/search/``, whose
    canonical path is ``/search`` (the reference misses it; docs/serving.md#route-classes).
    """

    def __init__(self, cfg: Config):
        self.mode = cfg.ingress.mode
        self.compiled = compile_routes(cfg)
        self.routes = self.compiled.routes
        self.global_allowlist = tuple(cfg.cache_key.query_params)
        self.default_interval = cfg.render.default_interval
        self._slash_alias = self.mode == "prefix" and cfg.cache_key.trailing_slash == "strip"
        # (route, match, path) triples: the keeper classifies every row it loads, so no method calls
        self._table = tuple((r, r.match, r.path) for r in self.routes)
        # A verdict depends only on the matched route: built once, shared (frozen), since building a
        # frozen dataclass per call costs a sitemap ingest about a microsecond per URL.
        self._verdicts = {id(r): self._verdict(r) for r in self.routes}
        self._no_route = self._verdict(None)

    def first_match(self, path: str) -> Route | None:
        """The first route matching ``path`` (or, with the slash alias, ``path`` + "/"). The matches
        are inlined: a sitemap ingest asks twice per URL (walker and keeper)."""
        alias = path + "/" if self._slash_alias and path[-1:] != "/" else None
        for route, match, rp in self._table:
            if match == "contains":
                if rp in path or (alias is not None and rp in alias):
                    return route
            elif match == "prefix":
                if path.startswith(rp) or (alias is not None and alias.startswith(rp)):
                    return route
            elif path == rp or alias == rp:
                return route
        return None

    def classify(self, path: str) -> Classification:
        """Forwarded mode: no match is unclassified. Prefix mode: everything not passthrough is
        prerender, and the allowlist is always the global one (the class is read off a URL that
        was already canonicalized with it)."""
        route = self.first_match(path)
        return self._no_route if route is None else self._verdicts[id(route)]

    def _verdict(self, route: Route | None) -> Classification:
        if self.mode == "prefix":
            passthrough = route is not None and route.mode == "passthrough"
            return Classification("passthrough" if passthrough else "prerender", route, self.global_allowlist)
        if route is None:
            return Classification("unclassified", None, ALL_PARAMS)
        if route.mode == "passthrough":
            return Classification("passthrough", route, ALL_PARAMS)
        return Classification("prerender", route, route.query_params)

    def allowlist_for(self, url: str) -> tuple[str, ...]:
        """The query allowlist a bot request for ``url`` would use (sitemap ingest, discovery and
        the orphan sweep key URLs with it). Prefix mode: always the global list. Forwarded mode:
        the class of the URL's WHATWG path; an unparseable URL keeps every parameter."""
        if self.mode == "prefix":
            return self.global_allowlist
        try:
            path = whatwg_path(url)
        except UrlError:
            return ALL_PARAMS
        return self.classify(path).allowlist

    def render_interval(self, path: str, stored: Any = None) -> int:
        """Cadence: route > stored > default. Junk stored values (0, negative, NaN, text) fall through."""
        route = self.first_match(path)
        if route is not None and route.mode == "prerender" and route.render_interval:
            return route.render_interval
        n = _number(stored)
        if n is not None and n > 0:
            return int(n)
        return self.default_interval


def _number(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        n = float(v)
    except (TypeError, ValueError):
        return None
    return n if math.isfinite(n) else None
