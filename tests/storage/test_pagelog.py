"""The page log: append and read, a second process's reader following it, overwrite, touch, delete,
generations, bounds (prerender_ray/storage/pagelog)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prerender_ray.storage.pagelog import Item, PageLogError, PageLogReader, PageLogWriter, key_hash
from prerender_ray.storage.pagelog import files as plfiles
from prerender_ray.storage.pagelog.records import PUT, pack_value, record


def k(i: int) -> bytes:
    return key_hash(f"https://site.example/p/{i}|desktop", "gzip")


def body(i: int, size: int = 300) -> bytes:
    return (f"<page {i}>".encode() * size)[:size]


def writer(path: Path, **kw: object) -> PageLogWriter:
    return PageLogWriter(path, sync=False, max_segment=8192, max_record=2048, **kw)  # type: ignore[arg-type]


def test_an_appended_body_is_read_back_with_its_freshness(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append([Item(k(1), body(1), version=7, last_cached=1_000, expires_at=2_000, tag=3), Item(k(2), b"")])
    r = PageLogReader(tmp_path)
    hit = r.get(k(1))
    assert hit is not None and hit.data == body(1)
    assert (hit.last_cached, hit.expires_at, hit.version, hit.tag) == (1_000, 2_000, 7, 3)
    empty = r.get(k(2))
    assert empty is not None and empty.data == b"" and empty.last_cached is None and empty.expires_at is None
    assert r.get(k(3)) is None and w.read(k(1)) == body(1)
    w.close()
    r.close()


def test_the_key_names_the_coding() -> None:
    assert key_hash("u|desktop", "gzip") != key_hash("u|desktop", "br") != key_hash("u|desktop")
    assert len(key_hash("u")) == 16


def test_a_reader_sees_new_writes_at_its_next_poll_and_says_how_far_it_is(tmp_path: Path) -> None:
    w = writer(tmp_path)
    r = PageLogReader(tmp_path)
    pos = w.append([Item(k(1), body(1))])
    assert r.get(k(1)) is None and not r.caught_up(pos)
    assert r.poll() == 1
    assert r.caught_up(pos) and r.get(k(1)) is not None
    assert r.poll() == 0
    w.close()
    r.close()


def test_a_reader_opened_before_the_log_exists_follows_it_once_it_does(tmp_path: Path) -> None:
    r = PageLogReader(tmp_path / "log")
    assert not r.ready and r.poll() == 0 and r.get(k(1)) is None
    w = writer(tmp_path / "log")
    w.append([Item(k(1), body(1))])
    r.poll()
    assert r.ready and r.get(k(1)) is not None
    w.close()
    r.close()


def test_overwrite_touch_and_delete(tmp_path: Path) -> None:
    w = writer(tmp_path)
    r = PageLogReader(tmp_path)
    w.append([Item(k(1), b"old", version=1), Item(k(2), b"two", version=1)])
    w.append([Item(k(1), b"new", version=2, expires_at=50)])
    assert w.touch(k(2), version=3, last_cached=10, expires_at=99) is not None
    assert w.touch(k(9), version=3, last_cached=10, expires_at=99) is None
    r.poll()
    one, two = r.get(k(1)), r.get(k(2))
    assert one is not None and (one.data, one.version, one.expires_at) == (b"new", 2, 50)
    assert two is not None and (two.data, two.version, two.last_cached, two.expires_at) == (b"two", 3, 10, 99)
    w.delete([k(1), k(7)], version=4)
    r.poll()
    assert r.get(k(1)) is None and w.read(k(1)) is None and len(r) == len(w.entries) == 1
    w.close()
    r.close()


def test_a_key_written_twice_in_one_batch_keeps_the_last(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append([Item(k(1), b"first"), Item(k(1), b"last")])
    r = PageLogReader(tmp_path)
    hit = r.get(k(1))
    assert hit is not None and hit.data == b"last"
    assert w.live == {w.active: [4, 1]}
    w.close()
    r.close()


def test_segments_rotate_at_their_bound_and_a_batch_may_span_them(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append([Item(k(i), body(i, 2000)) for i in range(10)])
    assert len(w.sizes) >= 3 and all(size <= 8192 for size in w.sizes.values())
    r = PageLogReader(tmp_path)
    assert all((h := r.get(k(i))) is not None and h.data == body(i, 2000) for i in range(10))
    w.close()
    r.close()


def test_bad_items_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    w = writer(tmp_path)
    before = w.disk_bytes()
    with pytest.raises(ValueError, match="over the log's limit"):
        w.append([Item(k(1), b"ok"), Item(k(2), b"x" * 2049)])
    with pytest.raises(ValueError, match="16 bytes"):
        w.append([Item(b"short", b"ok")])
    assert w.disk_bytes() == before and not w.entries
    with pytest.raises(ValueError):
        PageLogWriter(tmp_path / "other", max_segment=8192, max_record=9000)
    w.close()


def test_a_record_naming_a_length_over_the_bound_is_refused_by_readers(tmp_path: Path) -> None:
    """A record that passes its CRC but names a body over the log's bound: no read of that size."""
    w = writer(tmp_path)
    w.append([Item(k(1), b"x")])
    bad = record(pack_value(PUT, segment=w.active, offset=16, length=1 << 30, checksum=0), k(2))
    with open(plfiles.index_path(tmp_path, 1), "ab") as f:
        f.write(bad)
    r = PageLogReader(tmp_path)
    assert k(2) in r and r.get(k(2)) is None and r.unreadable == 1
    w.close()
    r.close()


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    w = writer(tmp_path)
    with pytest.raises(PageLogError, match="already has a writer"):
        writer(tmp_path)
    w.close()
    writer(tmp_path).close()


def test_a_checkpoint_starts_a_generation_a_reader_follows_without_a_reload(tmp_path: Path) -> None:
    w = writer(tmp_path)
    r = PageLogReader(tmp_path)
    for i in range(20):
        w.append([Item(k(i % 4), body(i))])
    r.poll()  # state as of now; then more writes, a checkpoint, more writes
    w.append([Item(k(5), b"before the seal")])
    w.checkpoint()
    w.append([Item(k(6), b"after the seal")])
    assert plfiles.generations(tmp_path) == [2]
    assert r.poll() > 0 and r.reloads == 1 and r.position == w.position
    assert r.entries == w.entries
    w.close()
    r.close()


def test_a_reader_two_generations_behind_reloads(tmp_path: Path) -> None:
    w = writer(tmp_path)
    r = PageLogReader(tmp_path)
    w.append([Item(k(1), b"a")])
    w.checkpoint()
    w.append([Item(k(2), b"b")])
    w.checkpoint()
    w.delete([k(1)])
    r.poll()
    assert r.reloads == 2 and r.entries == w.entries and r.position == w.position
    w.close()
    r.close()


def test_a_checkpoint_whose_seal_failed_is_found_by_readers(tmp_path: Path) -> None:
    """The SEAL could not be written (disk full): the old generation is unlinked without it, and a
    reader on it reloads from the new one."""
    def no_seal(fd: int, data: bytes, offset: int) -> int:
        if len(data) == 64 and data[0] == 4:
            raise OSError(28, "No space left on device")
        return os.pwrite(fd, data, offset)

    w = writer(tmp_path, write=no_seal)
    r = PageLogReader(tmp_path)
    w.append([Item(k(1), b"a")])
    w.checkpoint()
    w.append([Item(k(2), b"b")])
    r.poll()
    assert r.reloads == 2 and r.entries == w.entries and r.get(k(2)) is not None
    w.close()
    r.close()


def test_needs_checkpoint_once_the_index_is_twice_the_live_records(tmp_path: Path) -> None:
    w = writer(tmp_path)
    for i in range(17_000):
        w.touch(k(0), version=i, last_cached=i, expires_at=i) if i else w.append([Item(k(0), b"x")])
    assert w.needs_checkpoint()
    w.checkpoint()
    assert not w.needs_checkpoint() and w.position.offset == 128
    w.close()
