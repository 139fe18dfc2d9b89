"""Response shaping for a cached page: the headers a bot gets, ``Age``, and the debug headers.

The order on the serve path is: ``cached_headers`` -> ``negotiation.negotiate`` ->
``conditional.conditional_response`` -> ``debug_headers`` (added last, so they survive a 304).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from prerender_ray.identity.cachekeys import CacheKeyError, parse_cache_key
from prerender_ray.identity.routes import Route
from prerender_ray.queue.guard import MEASURE_HEADER
from prerender_ray.serving.origin_rules import HOP_BY_HOP
from prerender_ray.storage.pages import PageMeta

# `link` is the renderer's preload hints for its own fetch, not for bots; `age` is recomputed; the
# guard's measure of the page is ours (queue/guard.py).
_NOT_SERVED = HOP_BY_HOP | {"link", "age", MEASURE_HEADER}


def age_seconds(last_cached: int | None, now: int) -> int | None:
    """Whole seconds since the page was cached, never negative; None without ``last_cached``."""
    if last_cached is None:
        return None
    return max(0, (now - last_cached) // 1000)


def cached_headers(page: PageMeta, now: int) -> dict[str, str]:
    """The stored headers a bot receives, minus ``link`` and hop-by-hop, plus ``age`` on a 200."""
    out = {k: v for k, v in page.headers.items() if k not in _NOT_SERVED}
    age = age_seconds(page.last_cached, now) if page.status_code == 200 else None
    if age is not None:
        out["age"] = str(age)
    return out


def debug_requested(request_headers: Mapping[str, str], key: str) -> bool:
    """Any non-empty value of the debug header turns the debug headers on (as the reference)."""
    return bool((request_headers.get(key.strip().lower()) or "").strip())


def iso_timestamp(ms: int | None) -> str | None:
    """``ms`` as JavaScript's ``toISOString`` writes it (``2024-05-01T12:00:00.000Z``); None if invalid."""
    if ms is None:
        return None
    try:
        when = datetime.fromtimestamp(ms // 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return f"{when:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def device_from_cache_key(
    cache_key: str, delimiter: str = "|", attributes: Sequence[str] = ("url", "deviceType")
) -> str | None:
    """The device part of a cache key laid out as ``attributes`` joined by ``delimiter``."""
    if "deviceType" not in attributes:
        return None
    try:  # the one key parser: a delimiter that also occurs in URLs still splits right
        parsed = parse_cache_key(cache_key, delimiter=delimiter, attributes=attributes)
        return parsed.get("deviceType") or None
    except CacheKeyError:
        return None


def debug_headers(
    *,
    cache_status: str | None = None,
    source: str | None = None,
    cache_key: str | None = None,
    url: str | None = None,
    device_type: str | None = None,
    route_class: str | None = None,
    route: Route | None = None,
    last_cached: int | None = None,
    is_indexable: bool | None = None,
    via_staging: bool = False,
    delimiter: str = "|",
    attributes: Sequence[str] = ("url", "deviceType"),
) -> dict[str, str]:
    """The ``x-harper-*`` debug headers (docs/serving.md#debug-headers); each only when its value is known."""
    device = device_type or (device_from_cache_key(cache_key, delimiter, attributes) if cache_key else None)
    values = {
        "x-harper-device-type": device,
        "x-harper-cache-timestamp": iso_timestamp(last_cached),
        "x-harper-origin": "staging" if via_staging else None,
        "x-harper-cache": cache_status,
        "x-harper-source": source,
        "x-harper-cache-key": cache_key,
        "x-harper-url": url,
        "x-harper-route-class": route_class,
        "x-harper-route": route.describe() if route is not None else None,
        "x-harper-indexable": None if is_indexable is None else str(is_indexable).lower(),
    }
    return {k: v for k, v in values.items() if v}
