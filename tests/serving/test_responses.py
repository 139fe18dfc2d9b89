"""Response shaping for cached pages (docs/serving.md#response-headers) and the debug headers
(docs/serving.md#debug-headers)."""

from __future__ import annotations

import gzip

from prerender_ray.identity.routes import Route
from prerender_ray.serving.conditional import conditional_response
from prerender_ray.serving.negotiation import negotiate
from prerender_ray.serving.responses import (
    age_seconds,
    cached_headers,
    debug_headers,
    debug_requested,
    device_from_cache_key,
    iso_timestamp,
)
from prerender_ray.storage.pages import Page

NOW = 1_714_565_400_123  # 2024-05-01T12:10:00.123Z
STORED = {
    "content-type": "text/html",
    "content-encoding": "gzip",
    "etag": '"v1"',
    "link": "</app.js>; rel=preload",
    "x-harper-rendered": "1",
    "cache-control": "max-age=60",
}


def _page(status: int = 200, last_cached: int | None = NOW - 5_000, headers: dict | None = None) -> Page:
    return Page(
        cache_key="https://x.com/catalog/a|mobile",
        status_code=status,
        headers=STORED if headers is None else headers,
        content=gzip.compress(b"<html>hi</html>"),
        last_cached=last_cached,
        expires_at=NOW + 60_000,
        is_indexable=True,
    )


def test_cached_headers_drop_link_keep_the_rest_and_set_age() -> None:
    headers = cached_headers(_page(), NOW)
    assert "link" not in headers
    assert headers["x-harper-rendered"] == "1" and headers["etag"] == '"v1"'
    assert headers["content-encoding"] == "gzip"
    assert headers["age"] == "5"


def test_no_age_without_last_cached_or_on_a_non_200() -> None:
    assert "age" not in cached_headers(_page(last_cached=None), NOW)
    assert "age" not in cached_headers(_page(status=404), NOW)


def test_a_stored_age_or_hop_by_hop_header_is_never_served() -> None:
    headers = cached_headers(_page(status=404, headers={"age": "999", "connection": "close", "te": "x"}), NOW)
    assert headers == {}


def test_age_is_floored_and_never_negative() -> None:
    assert age_seconds(NOW - 5_999, NOW) == 5
    assert age_seconds(NOW + 10_000, NOW) == 0
    assert age_seconds(None, NOW) is None


def test_debug_headers_carry_exact_values() -> None:
    route = Route(match="prefix", path="/catalog/", mode="prerender", query_params=("CN",))
    headers = debug_headers(
        cache_status="hit",
        source="cache",
        cache_key="https://x.com/catalog/a|mobile",
        url="https://x.com/catalog/a",
        device_type="mobile",
        route_class="prerender",
        route=route,
        last_cached=NOW,
        is_indexable=False,
        via_staging=True,
    )
    assert headers == {
        "x-harper-device-type": "mobile",
        "x-harper-cache-timestamp": "2024-05-01T12:10:00.123Z",
        "x-harper-origin": "staging",
        "x-harper-cache": "hit",
        "x-harper-source": "cache",
        "x-harper-cache-key": "https://x.com/catalog/a|mobile",
        "x-harper-url": "https://x.com/catalog/a",
        "x-harper-route-class": "prerender",
        "x-harper-route": "prefix /catalog/ [CN] prerender (ingress.routes)",
        "x-harper-indexable": "false",
    }


def test_the_route_header_joins_params_with_a_comma_and_space() -> None:
    route = Route(
        match="exact", path="/a", mode="prerender", query_params=("page", "q"), source="excludePathPatterns"
    )
    assert (
        debug_headers(route=route)["x-harper-route"] == "exact /a [page, q] prerender (excludePathPatterns)"
    )


def test_the_route_class_is_emitted_without_a_route() -> None:
    headers = debug_headers(cache_status="miss", source="origin", route_class="unclassified")
    assert headers["x-harper-route-class"] == "unclassified"
    assert "x-harper-route" not in headers


def test_unknown_values_are_left_out() -> None:
    headers = debug_headers(cache_status="bypass", source="origin")
    assert headers == {"x-harper-cache": "bypass", "x-harper-source": "origin"}


def test_the_device_falls_back_to_the_cache_key_device() -> None:
    headers = debug_headers(cache_key="https://x.com/a|tablet")
    assert headers["x-harper-device-type"] == "tablet"


def test_the_device_is_read_from_a_custom_key_layout() -> None:
    assert device_from_cache_key("desktop::https://x.com/a", "::", ("deviceType", "url")) == "desktop"
    assert device_from_cache_key("https://x.com/a", "|", ("url",)) is None
    assert device_from_cache_key("no delimiter here", "|") is None


def test_debug_is_on_only_when_the_debug_header_has_a_value() -> None:
    assert debug_requested({"x-harper-prerender-debug": "1"}, "x-harper-prerender-debug")
    assert debug_requested({"x-debug": "true"}, "X-Debug")
    assert not debug_requested({"x-harper-prerender-debug": ""}, "x-harper-prerender-debug")
    assert not debug_requested({}, "x-harper-prerender-debug")


def test_timestamps_are_iso_8601_in_utc_with_milliseconds() -> None:
    assert iso_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert iso_timestamp(NOW) == "2024-05-01T12:10:00.123Z"
    assert iso_timestamp(None) is None
    assert iso_timestamp(10**18) is None
    assert "x-harper-cache-timestamp" not in debug_headers(last_cached=10**18)


def test_a_full_hit_pipeline_turns_into_a_304_that_keeps_debug_headers() -> None:
    page = _page()
    headers, _ = negotiate(cached_headers(page, NOW), page.content, "gzip")
    not_modified = conditional_response(page.status_code, headers, {"if-none-match": 'W/"v1"'})
    assert not_modified is not None
    not_modified |= debug_headers(cache_status="hit", source="cache", cache_key=page.cache_key)
    assert not_modified == {
        "etag": '"v1"',
        "cache-control": "max-age=60",
        "age": "5",
        "vary": "Accept-Encoding",
        "x-harper-device-type": "mobile",
        "x-harper-cache": "hit",
        "x-harper-source": "cache",
        "x-harper-cache-key": "https://x.com/catalog/a|mobile",
    }


def test_a_recoded_hit_still_matches_its_etag() -> None:
    page = _page()
    headers, _ = negotiate(cached_headers(page, NOW), page.content, "br")
    assert conditional_response(200, headers, {"if-none-match": '"v1"'}) is not None
