"""Cache keys: the format, its inverse, the url half, and the KeyFormat built from the config."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.config.loading import parse
from prerender_ray.identity.cachekeys import (
    CacheKeyError,
    KeyFormat,
    cache_key,
    extract_url,
    parse_cache_key,
)


def test_the_default_key_is_the_url_then_the_device_joined_by_a_pipe() -> None:
    assert cache_key("https://x.com/", "mobile") == "https://x.com/|mobile"


def test_a_missing_device_leaves_a_trailing_delimiter() -> None:
    assert cache_key("https://x.com/", "") == "https://x.com/|"
    assert cache_key("https://x.com/", None) == "https://x.com/|"  # type: ignore[arg-type]


def test_a_key_parses_back_into_its_attributes() -> None:
    key = cache_key("https://x.com/a?page=2", "tablet")
    assert parse_cache_key(key) == {"url": "https://x.com/a?page=2", "deviceType": "tablet"}
    assert parse_cache_key("https://x.com/|") == {"url": "https://x.com/", "deviceType": ""}


def test_extract_url_takes_the_text_before_the_delimiter() -> None:
    assert extract_url("https://x.com/a|desktop") == "https://x.com/a"
    assert extract_url("https://x.com/a|") == "https://x.com/a"


def test_a_custom_delimiter_and_attribute_order_round_trip() -> None:
    fmt = {"delimiter": "::", "attributes": ("deviceType", "url")}
    key = cache_key("https://x.com/a", "mobile", **fmt)
    assert key == "mobile::https://x.com/a"
    assert parse_cache_key(key, **fmt) == {"deviceType": "mobile", "url": "https://x.com/a"}
    assert extract_url(key, "::", ("deviceType", "url")) == "https://x.com/a"


def test_an_attribute_other_than_url_and_device_is_an_empty_field() -> None:
    attributes = ("url", "deviceType", "locale")
    key = cache_key("https://x.com/", "mobile", delimiter="::", attributes=attributes)
    assert key == "https://x.com/::mobile::"
    assert parse_cache_key(key, delimiter="::", attributes=attributes) == {
        "url": "https://x.com/", "deviceType": "mobile", "locale": ""
    }


def test_a_delimiter_inside_the_url_does_not_break_parsing() -> None:
    # The reference splits at the first `::` and would cut the IPv6 host; we take the other
    # attributes from the ends of the key.
    key = cache_key("https://[::1]/a::b", "mobile", delimiter="::")
    assert parse_cache_key(key, delimiter="::") == {"url": "https://[::1]/a::b", "deviceType": "mobile"}
    assert extract_url(key, "::") == "https://[::1]/a::b"
    first = ("deviceType", "url")
    key = cache_key("https://[::1]/", "tablet", delimiter="::", attributes=first)
    assert parse_cache_key(key, delimiter="::", attributes=first)["url"] == "https://[::1]/"


def test_a_key_of_the_wrong_shape_raises_a_cache_key_error() -> None:
    with pytest.raises(CacheKeyError, match="shape"):
        parse_cache_key("https://x.com/")
    with pytest.raises(CacheKeyError):
        extract_url("https://x.com/")
    with pytest.raises(CacheKeyError):
        parse_cache_key("mobile", delimiter="::", attributes=("deviceType", "locale", "url"))
    assert issubclass(CacheKeyError, ValueError)


@settings(max_examples=300, deadline=None)
@given(
    st.text(min_size=1).map(lambda s: "https://x.com/" + s.replace("|", "%7C")),
    st.sampled_from(["desktop", "mobile", "tablet", ""]),
)
def test_every_default_key_round_trips(url: str, device: str) -> None:
    key = cache_key(url, device)
    assert parse_cache_key(key) == {"url": url, "deviceType": device}
    assert extract_url(key) == url


# ------------------------------------------------------------------------------------ KeyFormat


def test_the_key_format_comes_from_the_cache_key_options() -> None:
    cfg = parse({"cacheKey": {"delimiter": "::", "queryParams": ["q"], "decodeReserved": [":"],
                              "trailingSlash": "preserve", "plusIsSpace": True}}).config
    fmt = KeyFormat.from_config(cfg)
    assert fmt == KeyFormat("::", ("url", "deviceType"), ("q",), (":",), "preserve", True)
    assert KeyFormat.from_config(cfg.cache_key) == fmt


def test_the_key_format_canonicalizes_with_the_global_allowlist_unless_told_otherwise() -> None:
    fmt = KeyFormat.from_config(parse({}).config)
    assert fmt.canonicalize("https://x.com/a/?page=2&utm=1#x") == "https://x.com/a?page=2"
    assert fmt.canonicalize("https://x.com/a/?page=2&utm=1", ["*"]) == "https://x.com/a?page=2&utm=1"
    assert fmt.canonicalize("https://x.com/a/?page=2&utm=1", []) == "https://x.com/a"


def test_the_key_format_builds_parses_and_extracts() -> None:
    fmt = KeyFormat()
    key = fmt.key("https://x.com/a", "mobile")
    assert key == "https://x.com/a|mobile"
    assert fmt.parse(key) == {"url": "https://x.com/a", "deviceType": "mobile"}
    assert fmt.url_of(key) == "https://x.com/a"
    assert fmt.key("https://x.com/a", "") == "https://x.com/a|"
    reordered = KeyFormat(delimiter="#", attributes=("deviceType", "url"))
    assert reordered.key("https://x.com/a", "mobile") == "mobile#https://x.com/a"


def test_the_key_format_refuses_options_that_would_make_keys_ambiguous() -> None:
    with pytest.raises(ValueError, match="delimiter"):
        KeyFormat(delimiter="")
    with pytest.raises(ValueError, match="url"):
        KeyFormat(attributes=("deviceType",))
    with pytest.raises(ValueError, match="url"):
        KeyFormat(attributes=("url", "url"))
    with pytest.raises(ValueError, match="trailing_slash"):
        KeyFormat(trailing_slash="sometimes")
    with pytest.raises(ValueError, match="decode_reserved"):
        KeyFormat(decode_reserved=("&",))


def test_a_device_name_holding_the_delimiter_is_refused() -> None:
    with pytest.raises(ValueError, match="delimiter"):
        KeyFormat(delimiter="-").check_devices(["desktop", "smart-tv"])
    KeyFormat().check_devices(["desktop", "smart-tv"])


# ------------------------------------------------ every layout: one parser for url, device and owner

LAYOUTS = [(d, a) for a in (("url", "deviceType"), ("deviceType", "url"), ("url",))
           for d in ("|", "::", ":", "/", "#", "-")]
HOSTILE_URLS = ["https://shop.test/", "https://shop.test/a", "https://shop.test/a:b",
                "https://shop.test/a::b/c", "https://shop.test/a-b#c/d", "https://[::1]:8080/x/y",
                "https://shop.test/hourly/1"]


@pytest.mark.parametrize("delimiter, attributes", LAYOUTS)
def test_every_key_layout_gives_back_its_url_and_device_wherever_the_delimiter_occurs(
        delimiter: str, attributes: tuple[str, ...]) -> None:
    from prerender_ray.queue.targets import Rules
    from prerender_ray.serving.responses import device_from_cache_key

    devices = {"supported": ["desktop", "mobile"], "default": ["desktop", "mobile"]}
    cfg = parse({"cacheKey": {"delimiter": delimiter, "attributes": list(attributes)},
                 "deviceTypes": devices}, {}).config
    rules = Rules(cfg)
    for url in HOSTILE_URLS:
        for device in ("desktop", "mobile"):
            key = rules.keys.key(url, device)
            assert rules.url_of(key) == url, key
            want = device if "deviceType" in attributes else None
            assert (rules.device_of(key) or None) == want, key
            assert device_from_cache_key(key, delimiter, attributes) == want, key


@pytest.mark.parametrize("delimiter, attributes", LAYOUTS)
def test_a_bulk_ranking_load_asks_each_url_for_its_own_route_in_every_layout(delimiter, attributes) -> None:
    """A store walk yields keys in key order: with the device first, all desktop rows come together,
    and with a delimiter inside URLs ``https:`` is no URL. Each row must still get its URL's route."""
    from prerender_ray.queue.ranking import Ranking

    fmt = KeyFormat(delimiter=delimiter, attributes=attributes)
    keys = sorted({fmt.key(u, d) for u in HOSTILE_URLS for d in ("desktop", "mobile")})
    rows = [(k, 1_000, False, None) for k in keys]

    def route_of(key: str) -> str:
        return fmt.url_of(key)  # a distinct "route" per URL: any sharing across URLs shows

    bulk = Ranking(lambda route: 60_000)
    bulk.upsert_many(rows, route_of, delimiter=fmt.variant_delimiter)
    one = Ranking(lambda route: 60_000)
    for row in rows:
        one.upsert(*row, route_of(row[0]))
    assert sorted(bulk.rows()) == sorted(one.rows())
