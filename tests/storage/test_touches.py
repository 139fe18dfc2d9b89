"""Freshness records: their encoding, and when a reader applies one to the stored page."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.storage.pages import Page, decode_meta, retimed
from prerender_ray.storage.replication import wrap_many
from prerender_ray.storage.touches import (
    Touch,
    TouchDecodeError,
    applicable,
    is_touch_key,
    touch_key,
    touched,
    touched_payload,
)

KEY = "https://shop.test/p|desktop"
PAGE = Page(cache_key=KEY, status_code=200, headers={"etag": '"abc"', "content-type": "text/html"},
            last_cached=1_000, expires_at=2_000, is_indexable=True, content=b"<html>body</html>")
TOUCH = Touch(KEY, '"abc"', 5_000, 9_000)


def stored(payload: bytes | None, hlc: int, node: str = "node-a") -> bytes:
    return wrap_many(node, hlc, [payload])[0]


@given(st.text(max_size=200), st.one_of(st.none(), st.integers(0, 2**62)), st.one_of(st.none(), st.integers(0, 2**62)))
def test_a_touch_round_trips(etag: str, last: int | None, expires: int | None) -> None:
    t = Touch(KEY, etag, last, expires)
    assert Touch.decode(KEY, t.encode()) == t


@pytest.mark.parametrize("junk", [b"", b"\x00" * 20, TOUCH.encode()[:-1], TOUCH.encode() + b"x",
                                  b"PG" + TOUCH.encode()[2:]])
def test_junk_is_a_decode_error(junk: bytes) -> None:
    with pytest.raises(TouchDecodeError):
        Touch.decode(KEY, junk)


def test_touch_keys_sort_below_every_cache_key_and_are_told_apart() -> None:
    k = touch_key(KEY)
    assert k == touch_key(KEY.encode()) and is_touch_key(k) and not is_touch_key(KEY.encode())
    assert k < b"\x01" < KEY.encode()  # page scans start at \x01: a touch is never listed as a page


def test_a_newer_touch_with_the_pages_etag_applies() -> None:
    page, touch = stored(PAGE.encode(), 10), stored(TOUCH.encode(), 11)
    meta = decode_meta(PAGE.encode())[0]
    assert applicable(meta, page, touch) == TOUCH
    fresh = touched(meta, TOUCH)
    assert (fresh.last_cached, fresh.expires_at) == (5_000, 9_000)
    assert fresh.headers == meta.headers and fresh.status_code == 200 and fresh.is_indexable is True


@pytest.mark.parametrize("why, page_hlc, touch", [
    ("another etag: the touch of another content", 10, stored(Touch(KEY, '"old"', 5_000, 9_000).encode(), 11)),
    ("older than the page: a later full write supersedes it", 12, stored(TOUCH.encode(), 11)),
    ("the same version", 11, stored(TOUCH.encode(), 11)),
    ("deleted", 10, stored(None, 11)),
    ("unreadable", 10, stored(b"junk", 11)),
    ("not an envelope", 10, b"junk"),
    ("none", 10, None),
])
def test_a_touch_that_does_not_apply_leaves_the_pages_times(why: str, page_hlc: int, touch: bytes | None) -> None:
    page = stored(PAGE.encode(), page_hlc)
    meta = decode_meta(PAGE.encode())[0]
    assert applicable(meta, page, touch) is None, why
    assert touched_payload(page, touch) == PAGE.encode(), why


def test_a_page_stored_without_an_etag_takes_a_touch_with_none() -> None:
    bare = Page(cache_key=KEY, status_code=200, headers={}, last_cached=1, expires_at=2, content=b"x")
    page, touch = stored(bare.encode(), 10), stored(Touch(KEY, "", 3, 4).encode(), 11)
    assert Page.decode(touched_payload(page, touch) or b"").expires_at == 4


def test_the_whole_record_with_a_touch_applied_differs_only_in_its_times() -> None:
    out = touched_payload(stored(PAGE.encode(), 10), stored(TOUCH.encode(), 11))
    assert out is not None and Page.decode(out) == Page(
        cache_key=KEY, status_code=200, headers=PAGE.headers, last_cached=5_000, expires_at=9_000,
        is_indexable=True, content=PAGE.content)
    absent = Page.decode(retimed(PAGE.encode(), None, None))
    assert absent.last_cached is None and absent.expires_at is None and absent.content == PAGE.content
    assert touched_payload(None, stored(TOUCH.encode(), 11)) is None  # no page: nothing to serve
