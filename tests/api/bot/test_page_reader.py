"""The ingress page reader against a real RocksDB primary written as the NodeStore writes it
(replication envelope around Page.encode), read through a real secondary instance."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.api.bot.page_reader import PageReader
from prerender_ray.api.bot.pages import UnreadablePage
from prerender_ray.serving.framing import encode_page
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Clock, wrap
from prerender_ray.storage.rocks import Store

KEY = "https://x.com/a|desktop"


def record(clock: Clock, content: bytes, **kw) -> bytes:
    page = Page(cache_key=KEY, status_code=200, headers={"content-type": "text/html"}, content=content,
                last_cached=1, expires_at=2, **kw)
    return wrap(clock.now(), page.encode())


@pytest.fixture
def paths(tmp_path):
    return tmp_path / "pages", tmp_path / "secondary"


def test_the_reader_opens_once_the_primary_exists_and_sees_writes_after_a_catch_up(paths) -> None:
    primary_path, secondary = paths
    reader = PageReader(primary_path, secondary)
    assert not reader.ready and reader.get(KEY) is None
    primary = Store(primary_path)
    clock = Clock("n1")
    primary.put(KEY.encode(), record(clock, b"v1"))
    assert reader.catch_up(force=True) and reader.ready
    assert bytes(reader.get(KEY).body) == b"v1"
    primary.put(KEY.encode(), record(clock, b"v2"))
    assert bytes(reader.get(KEY).body) == b"v1"  # a secondary: nothing new until it catches up
    reader.catch_up(force=True)
    assert bytes(reader.get(KEY).body) == b"v2"
    primary.put(KEY.encode(), wrap(clock.now(), None))  # a tombstone
    assert reader.get(KEY) is not None  # the view still holds v2...
    reader.catch_up(force=True)
    assert reader.get(KEY) is None  # ...the deleted page is gone after a catch-up
    reader.close()
    primary.close()


def test_a_non_forced_catch_up_runs_at_most_once_per_gap(paths) -> None:
    primary_path, secondary = paths
    primary = Store(primary_path)
    reader = PageReader(primary_path, secondary, gap_s=3600.0)
    primary.put(KEY.encode(), record(Clock("n1"), b"late"))
    assert not reader.catch_up() and reader.get(KEY) is None  # opened just now: the gap has not passed
    reader.gap_s = 0.0
    assert reader.catch_up() and bytes(reader.get(KEY).body) == b"late"
    reader.close()
    primary.close()


def test_a_decoded_page_is_reused_while_its_record_is_unchanged(paths) -> None:
    primary_path, secondary = paths
    primary = Store(primary_path)
    clock = Clock("n1")
    primary.put(KEY.encode(), record(clock, b"x" * 1000))
    reader = PageReader(primary_path, secondary)
    first, again = reader.get(KEY), reader.get(KEY)
    assert first is again and first.meta.status_code == 200 and isinstance(first.body, memoryview)
    primary.put(KEY.encode(), record(clock, b"y" * 1000))
    reader.catch_up(force=True)
    fresh = reader.get(KEY)
    assert fresh is not first and bytes(fresh.body) == b"y" * 1000
    reader.close()
    primary.close()


def test_a_record_that_does_not_decode_is_unreadable(paths) -> None:
    primary_path, secondary = paths
    primary = Store(primary_path)
    primary.put(KEY.encode(), wrap(Clock("n1").now(), b"not a page"))
    primary.put(b"garbage", b"\x00\x01")
    reader = PageReader(primary_path, secondary)
    with pytest.raises(UnreadablePage):
        reader.get(KEY)
    with pytest.raises(UnreadablePage):
        reader.get("garbage")
    reader.close()
    primary.close()


async def test_the_timer_catches_up_on_its_own(paths) -> None:
    primary_path, secondary = paths
    primary = Store(primary_path)
    reader = PageReader(primary_path, secondary, interval_s=0.02)
    reader.start()
    primary.put(KEY.encode(), record(Clock("n1"), b"timed"))
    for _ in range(200):
        if reader.get(KEY) is not None:
            break
        await asyncio.sleep(0.02)
    assert bytes(reader.get(KEY).body) == b"timed"
    reader.close()
    primary.close()


@pytest.mark.parametrize("encode", [Page.encode, encode_page], ids=["plain", "framed"])
def test_a_touched_page_is_a_hit_past_its_own_expiry_without_being_decoded_again(paths, encode) -> None:
    from prerender_ray.serving.answer import verdict
    from prerender_ray.storage.touches import Touch, touch_key

    now, swr = 10_000_000, 0
    primary_path, secondary = paths
    primary = Store(primary_path)
    clock = Clock("n1")
    page = Page(cache_key=KEY, status_code=200, headers={"etag": '"e1"'}, content=b"<html>x</html>",
                last_cached=now - 7_000, expires_at=now - 1_000)
    primary.put(KEY.encode(), wrap(clock.now(), encode(page)))
    reader = PageReader(primary_path, secondary)
    first = reader.get(KEY)
    assert verdict(first.meta, now, swr) == "stale"  # past its expiry
    first.variants["gzip"] = "a negotiated form"

    primary.put(touch_key(KEY), wrap(clock.now(), Touch(KEY, '"e1"', now - 10, now + 60_000).encode()))
    reader.catch_up(force=True)
    touched = reader.get(KEY)
    assert touched is first and touched.variants == {"gzip": "a negotiated form"}  # kept: same record
    assert verdict(touched.meta, now, swr) == "hit" and touched.meta.last_cached == now - 10
    assert verdict(touched, now, swr) == "hit" and touched.last_cached == now - 10  # what a hit reads
    assert touched.meta.headers == page.headers and bytes(touched.body) == page.content

    primary.put(touch_key(KEY), wrap(clock.now(), Touch(KEY, '"e0"', now, now + 90_000).encode()))
    reader.catch_up(force=True)
    assert verdict(reader.get(KEY).meta, now, swr) == "stale"  # the touch of another content: ignored
    assert verdict(reader.get(KEY), now, swr) == "stale"

    primary.put(touch_key(KEY), wrap(clock.now(), Touch(KEY, '"e1"', now, now + 90_000).encode()))
    primary.put(KEY.encode(), wrap(clock.now(), encode(page)))  # a later full write supersedes it
    reader.catch_up(force=True)
    assert reader.get(KEY).meta.expires_at == now - 1_000 and reader.get(KEY).expires_at == now - 1_000
    reader.close()
    primary.close()


def test_a_framed_page_is_served_from_its_frame_and_decodes_its_headers_only_when_asked(paths) -> None:
    primary_path, secondary = paths
    primary = Store(primary_path)
    page = Page(cache_key=KEY, status_code=200, headers={"content-type": "text/html", "etag": '"e1"'},
                content=b"<html>x</html>", last_cached=1, expires_at=2, is_indexable=False)
    primary.put(KEY.encode(), wrap(Clock("n1").now(), encode_page(page)))
    reader = PageReader(primary_path, secondary)
    found = reader.get(KEY)
    assert found.frame is not None and found._base is None  # nothing decoded yet
    assert (found.status_code, found.last_cached, found.expires_at, found.is_indexable) == (200, 1, 2, False)
    assert bytes(found.body) == page.content and found.meta.headers == page.headers
    reader.close()
    primary.close()


def test_a_framed_page_whose_headers_do_not_decode_is_unreadable_when_they_are_needed(paths) -> None:
    primary_path, secondary = paths
    primary = Store(primary_path)
    page = Page(cache_key=KEY, status_code=200, headers={"content-type": "text/html"}, content=b"<html>x</html>",
                last_cached=1, expires_at=2)
    record = encode_page(page).replace(b'"content-type"', b'"content-type"'[:-1] + b"\x01")  # corrupt JSON
    primary.put(KEY.encode(), wrap(Clock("n1").now(), record))
    reader = PageReader(primary_path, secondary)
    found = reader.get(KEY)
    assert found.frame is not None
    with pytest.raises(UnreadablePage):
        found.meta
    reader.close()
    primary.close()
