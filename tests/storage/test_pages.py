"""The stored page record: binary round trips, junk rejection, and freshness (docs/serving.md#freshness)."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.storage.pages import (
    Page,
    PageDecodeError,
    PageMeta,
    decode_head,
    decode_meta,
    freshness,
    retimed,
)

NOW = 1_700_000_000_000


def _page(**overrides: object) -> Page:
    fields: dict = {
        "cache_key": "https://x.com/a|mobile",
        "status_code": 200,
        "headers": {"content-type": "text/html", "content-encoding": "gzip", "x-harper-rendered": "1"},
        "content": b"\x1f\x8b body bytes",
        "last_cached": NOW - 5_000,
        "expires_at": NOW + 60_000,
        "is_indexable": True,
    }
    fields.update(overrides)
    return Page(**fields)


def test_a_page_round_trips_through_its_binary_form() -> None:
    page = _page()
    assert Page.decode(page.encode()) == page


def test_absent_times_and_zero_times_stay_distinct() -> None:
    absent = Page.decode(_page(last_cached=None, expires_at=None).encode())
    zero = Page.decode(_page(last_cached=0, expires_at=0).encode())
    assert (absent.last_cached, absent.expires_at) == (None, None)
    assert (zero.last_cached, zero.expires_at) == (0, 0)


@pytest.mark.parametrize("indexable", [True, False, None])
def test_indexability_keeps_true_false_and_unknown(indexable: bool | None) -> None:
    assert Page.decode(_page(is_indexable=indexable).encode()).is_indexable is indexable


def test_metadata_decodes_with_a_view_of_the_body_not_a_copy() -> None:
    data = _page(content=b"x" * 30_000).encode()
    meta, body = decode_meta(data)
    assert isinstance(meta, PageMeta) and not isinstance(meta, Page)
    assert meta.cache_key == "https://x.com/a|mobile" and meta.status_code == 200
    assert body.obj is data
    assert bytes(body) == b"x" * 30_000


def test_header_names_are_lowercased_on_construction() -> None:
    page = _page(headers={"Content-Type": "text/html", "ETag": '"v1"'})
    assert page.headers == {"content-type": "text/html", "etag": '"v1"'}


@pytest.mark.parametrize(
    ("header", "encoding"), [("gzip", "gzip"), (" BR ", "br"), ("", "identity"), (None, "identity")]
)
def test_content_encoding_is_derived_from_the_stored_header(header: str | None, encoding: str) -> None:
    headers = {"content-type": "text/html"} if header is None else {"content-encoding": header}
    assert _page(headers=headers).content_encoding == encoding


def test_a_status_outside_the_record_range_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        _page(status_code=70_000).encode()


@pytest.mark.parametrize(
    "junk",
    [
        b"",
        b"PG",
        b"not a page record at all, just some bytes of the right-ish length......",
        b"XX" + _page().encode()[2:],
        _page().encode()[:2] + b"\x09" + _page().encode()[3:],
        _page().encode()[:-1],
        _page().encode() + b"trailing",
    ],
    ids=["empty", "short", "text", "magic", "version", "truncated", "trailing"],
)
def test_junk_raises_the_dedicated_error(junk: bytes) -> None:
    with pytest.raises(PageDecodeError):
        Page.decode(junk)


def _record(key: bytes, headers: bytes, flags: int = 0) -> bytes:
    head = struct.pack("<2sBBHqqIII", b"PG", 1, flags, 200, 0, 0, len(key), len(headers), 0)
    return head + key + headers


@pytest.mark.parametrize(
    "record",
    [
        _record(b"k", b"{not json"),
        _record(b"k", b'["a list"]'),
        _record(b"k", b'{"etag": 5}'),
        _record(b"\xff\xfe", b"{}"),
        _record(b"k", b"{}", flags=0x80),
    ],
    ids=["bad-json", "not-object", "non-string-value", "bad-utf8-key", "unknown-flag"],
)
def test_corrupt_metadata_raises_the_dedicated_error(record: bytes) -> None:
    with pytest.raises(PageDecodeError):
        decode_meta(record)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_the_dedicated_error(data: bytes) -> None:
    with contextlib.suppress(PageDecodeError):
        Page.decode(data)


_header_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)


@given(
    st.builds(
        Page,
        cache_key=st.text(max_size=100),
        status_code=st.integers(0, 65535),
        headers=st.dictionaries(_header_names, st.text(max_size=50), max_size=8),
        content=st.binary(max_size=2_000),
        last_cached=st.none() | st.integers(-(2**63), 2**63 - 1),
        expires_at=st.none() | st.integers(-(2**63), 2**63 - 1),
        is_indexable=st.none() | st.booleans(),
    )
)
def test_any_page_round_trips(page: Page) -> None:
    assert Page.decode(page.encode()) == page


def _v1(page: Page) -> bytes:
    """A record as version 1 wrote it (no frame length, no frame)."""
    key, hdrs = page.cache_key.encode(), json.dumps(page.headers, separators=(",", ":")).encode()
    head = struct.pack("<2sBBHqqIII", b"PG", 1, 0x01 | 0x02 | 0x04 | 0x08, page.status_code, page.last_cached,
                       page.expires_at, len(key), len(hdrs), len(page.content))
    return head + key + hdrs + page.content


def test_a_version_1_record_still_loads_without_a_frame() -> None:
    page = _page()
    assert Page.decode(_v1(page)) == page
    head = decode_head(_v1(page))
    assert head.frame.nbytes == 0 and bytes(head.body) == page.content and head.last_cached == page.last_cached


@given(frame=st.binary(max_size=300))
def test_a_frame_travels_opaque_beside_the_page_and_survives_new_times(frame: bytes) -> None:
    page = _page()
    record = page.encode(frame)
    assert Page.decode(record) == page and bytes(decode_head(record).frame) == frame
    later = retimed(record, NOW, NOW + 1)
    head = decode_head(later)
    assert bytes(head.frame) == frame and (head.last_cached, head.expires_at) == (NOW, NOW + 1)
    assert bytes(head.body) == page.content


@given(st.integers(0, 100))
def test_every_truncation_of_a_record_is_rejected(cut: int) -> None:
    data = _page().encode()
    with pytest.raises(PageDecodeError):
        Page.decode(data[: len(data) - 1 - cut])


def test_a_page_before_its_expiry_is_a_hit() -> None:
    assert freshness(_page(expires_at=NOW + 1), NOW, 100) == "hit"


def test_the_expiry_instant_itself_is_swr() -> None:
    assert freshness(_page(expires_at=NOW), NOW, 100) == "swr"


def test_the_swr_window_includes_its_start_and_excludes_its_end() -> None:
    assert freshness(_page(expires_at=NOW - 99), NOW, 100) == "swr"
    assert freshness(_page(expires_at=NOW - 100), NOW, 100) is None


def test_a_page_without_an_expiry_is_never_served() -> None:
    assert freshness(_page(expires_at=None), NOW, 100) is None


@pytest.mark.parametrize("swr_ttl", [0, -5])
def test_a_zero_swr_ttl_disables_the_window(swr_ttl: int) -> None:
    assert freshness(_page(expires_at=NOW), NOW, swr_ttl) is None
    assert freshness(_page(expires_at=NOW + 1), NOW, swr_ttl) == "hit"


def test_freshness_reads_metadata_alone() -> None:
    meta, _ = decode_meta(_page(expires_at=NOW + 10).encode())
    assert freshness(meta, NOW, 0) == "hit"
