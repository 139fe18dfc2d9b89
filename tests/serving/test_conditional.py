"""Conditional requests: If-None-Match, If-Modified-Since, the 304 headers
(docs/serving.md#conditional-requests)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.serving.conditional import (
    MAX_IF_NONE_MATCH,
    conditional_response,
    etag_matches,
    is_not_modified,
    not_modified_since,
    parse_if_none_match,
)

LAST_MODIFIED = "Wed, 01 May 2024 12:00:00 GMT"
RESPONSE = {
    "content-type": "text/html",
    "content-encoding": "gzip",
    "content-length": "123",
    "cache-control": "max-age=60",
    "expires": "Wed, 01 May 2024 13:00:00 GMT",
    "date": "Wed, 01 May 2024 12:30:00 GMT",
    "etag": '"v1"',
    "last-modified": LAST_MODIFIED,
    "vary": "Accept-Encoding",
    "age": "5",
    "x-harper-rendered": "1",
    "x-robots-tag": "all",
}


def test_a_matching_if_none_match_gives_a_304_with_validators_but_no_content_headers() -> None:
    headers = conditional_response(200, RESPONSE, {"if-none-match": '"v1"'})
    assert headers is not None
    assert headers["etag"] == '"v1"' and headers["cache-control"] == "max-age=60"
    assert "content-type" not in headers and "content-length" not in headers


def test_the_304_keeps_only_the_allowed_headers() -> None:
    headers = conditional_response(200, RESPONSE, {"if-none-match": '"v1"'})
    assert headers is not None
    assert set(headers) == {"cache-control", "expires", "date", "etag", "last-modified", "vary", "age"}


@pytest.mark.parametrize(
    ("inm", "etag"),
    [
        ('W/"v1"', '"v1"'),
        ('"v1"', 'W/"v1"'),
        ('w/"v1"', 'W/"v1"'),
        ('"a", "v1", "b"', '"v1"'),
        ('"a",W/"v1"', '"v1"'),
        (' , "v1" ,', '"v1"'),
        ("*", '"anything"'),
        (" * ", '"anything"'),
        ('"a,b"', '"a,b"'),
        ("v1", "v1"),
    ],
)
def test_if_none_match_uses_weak_comparison_over_lists(inm: str, etag: str) -> None:
    assert etag_matches(inm, etag)


@pytest.mark.parametrize(
    ("inm", "etag"),
    [
        ('"v2"', '"v1"'),
        ('"a", "b"', '"v1"'),
        ('"v1" "v2"', '"v1"'),
        ('"v1', '"v1"'),
        ('""', '"v1"'),
        ('"v1"', None),
        ('"v1"', ""),
        ('"V1"', '"v1"'),
    ],
)
def test_if_none_match_without_a_match_or_with_garbage_never_matches(inm: str, etag: str | None) -> None:
    assert not etag_matches(inm, etag)


def test_a_non_matching_if_none_match_ignores_a_matching_if_modified_since() -> None:
    request = {"if-none-match": '"v2"', "if-modified-since": LAST_MODIFIED}
    assert conditional_response(200, RESPONSE, request) is None


def test_if_modified_since_at_or_after_last_modified_gives_a_304() -> None:
    assert is_not_modified(200, RESPONSE, {"if-modified-since": LAST_MODIFIED})
    assert is_not_modified(200, RESPONSE, {"if-modified-since": "Thu, 02 May 2024 00:00:00 GMT"})


def test_if_modified_since_before_last_modified_gives_the_page() -> None:
    assert not is_not_modified(200, RESPONSE, {"if-modified-since": "Wed, 01 May 2024 11:59:59 GMT"})


def test_an_empty_if_none_match_counts_as_absent() -> None:
    assert is_not_modified(200, RESPONSE, {"if-none-match": " ", "if-modified-since": LAST_MODIFIED})


def test_dates_compare_across_time_zones() -> None:
    assert not_modified_since("Wed, 01 May 2024 14:00:00 +0200", LAST_MODIFIED)
    assert not not_modified_since("Wed, 01 May 2024 13:59:59 +0200", LAST_MODIFIED)


@pytest.mark.parametrize("ims", ["yesterday", "", "Wed, 01 May 2024", "Wed, 32 May 2024 12:00:00 GMT"])
def test_an_unparseable_if_modified_since_never_gives_a_304(ims: str) -> None:
    assert not is_not_modified(200, RESPONSE, {"if-modified-since": ims})


def test_an_unparseable_or_missing_last_modified_never_gives_a_304() -> None:
    assert not not_modified_since(LAST_MODIFIED, "garbage")
    assert not not_modified_since(LAST_MODIFIED, None)


@pytest.mark.parametrize("status", [201, 203, 301, 404, 500])
def test_a_non_200_is_never_downgraded(status: int) -> None:
    assert conditional_response(status, RESPONSE, {"if-none-match": "*"}) is None
    assert conditional_response(status, RESPONSE, {"if-modified-since": LAST_MODIFIED}) is None


def test_a_request_without_validators_gets_the_page() -> None:
    assert conditional_response(200, RESPONSE, {}) is None


def test_if_none_match_lists_parse_to_opaque_tags() -> None:
    assert parse_if_none_match('W/"a", "b",, c') == ['"a"', '"b"', "c"]
    assert parse_if_none_match('"a" junk') is None


@given(st.text(max_size=120), st.none() | st.text(max_size=40))
def test_any_if_none_match_never_raises(inm: str, etag: str | None) -> None:
    etag_matches(inm, etag)
    is_not_modified(200, {"etag": etag or ""}, {"if-none-match": inm})


@given(st.text(max_size=80), st.text(max_size=80))
def test_any_if_modified_since_never_raises(ims: str, last_modified: str) -> None:
    is_not_modified(200, {"last-modified": last_modified}, {"if-modified-since": ims})


def test_a_long_if_none_match_is_not_compared() -> None:
    # the full answer is always correct; a head may be 64 KiB (14,000 tags took 20 ms to parse)
    listed = '"a", ' * ((MAX_IF_NONE_MATCH - 3) // 5) + '"b"'
    assert len(listed) <= MAX_IF_NONE_MATCH and etag_matches(listed, '"b"')
    assert not etag_matches('"a", ' * (MAX_IF_NONE_MATCH // 5) + '"b"', '"b"')
    assert etag_matches("*", '"b"')
    assert parse_if_none_match('"a"  ') == ['"a"'] and parse_if_none_match('"a", ,  ') == ['"a"']
    assert parse_if_none_match('"a" x') is None and parse_if_none_match("  ") == []
