"""The page log after faults: torn and corrupt tails cut on open and never served, a crash part way
through an append, a full disk (prerender_ray/storage/pagelog)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from prerender_ray.storage.pagelog import Item, PageLogError, PageLogFull, PageLogReader, PageLogWriter
from prerender_ray.storage.pagelog import files as plfiles
from prerender_ray.storage.pagelog.records import RECORD_SIZE, SEGMENT_HEADER_SIZE
from tests.storage.test_pagelog import body, k, writer


def state(path: Path) -> dict[bytes, bytes | None]:
    """What a fresh reader serves for every key it holds."""
    r = PageLogReader(path)
    out = {key: (h.data if (h := r.get(key)) is not None else None) for key in r.entries}
    r.close()
    return out


def index_file(path: Path) -> Path:
    return plfiles.index_path(path, plfiles.generations(path)[-1])


def filled(path: Path, n: int = 5) -> dict[bytes, bytes | None]:
    w = writer(path)
    for i in range(n):
        w.append([Item(k(i), body(i))])
    w.close()
    return {k(i): body(i) for i in range(n)}


@pytest.mark.parametrize("cut", [1, 30, 63])
def test_an_index_torn_mid_record_is_cut_on_open(tmp_path: Path, cut: int) -> None:
    expected = filled(tmp_path)
    idx = index_file(tmp_path)
    size = idx.stat().st_size
    os.truncate(idx, size - cut)  # the last record loses its tail
    r = PageLogReader(tmp_path)
    assert k(4) not in r and r.position.offset == size - RECORD_SIZE  # a partial record is never applied
    del expected[k(4)]
    w = writer(tmp_path)
    assert w.cut["index"] == RECORD_SIZE - cut and idx.stat().st_size == size - RECORD_SIZE
    w.append([Item(k(9), b"after")])  # written where the torn record was: the waiting reader reads it
    r.poll()
    hit = r.get(k(9))
    assert hit is not None and hit.data == b"after" and r.entries == w.entries
    w.close()
    r.close()
    assert state(tmp_path) == {**expected, k(9): b"after"}


def test_a_corrupt_index_record_ends_the_log_there(tmp_path: Path) -> None:
    expected = filled(tmp_path)
    idx = index_file(tmp_path)
    data = bytearray(idx.read_bytes())
    data[-RECORD_SIZE * 2 + 20] ^= 0xFF  # the fourth record of five
    idx.write_bytes(bytes(data))
    assert state(tmp_path) == {key: expected[key] for key in (k(0), k(1), k(2))}
    w = writer(tmp_path)
    assert w.cut["index"] == 2 * RECORD_SIZE
    w.close()


def test_a_record_being_written_is_applied_only_once_whole(tmp_path: Path) -> None:
    filled(tmp_path, 1)
    idx = index_file(tmp_path)
    whole = idx.read_bytes()[-RECORD_SIZE:]  # a copy of the last record, written again in two parts
    r = PageLogReader(tmp_path)
    pos = r.position.offset
    with open(idx, "ab") as f:
        f.write(whole[:40])
        f.flush()
        assert r.poll() == 0 and r.position.offset == pos
        f.write(whole[40:])
    assert r.poll() == 1 and r.position.offset == pos + RECORD_SIZE
    r.close()


def test_a_torn_segment_tail_is_cut_on_open_and_appends_go_on_after_it(tmp_path: Path) -> None:
    expected = filled(tmp_path)
    seg = plfiles.segment_path(tmp_path, plfiles.segments(tmp_path)[-1])
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"PGE1" + b"\x10\x00\x00\x00" + b"junk")  # an entry header torn by a crash
    w = writer(tmp_path)
    assert w.cut["segment"] == 12 and seg.stat().st_size == size
    w.append([Item(k(9), b"after")])
    w.close()
    assert state(tmp_path) == {**expected, k(9): b"after"}


def test_a_body_damaged_on_disk_is_never_served(tmp_path: Path) -> None:
    filled(tmp_path, 3)
    seg = plfiles.segment_path(tmp_path, plfiles.segments(tmp_path)[0])
    data = bytearray(seg.read_bytes())
    at = data.index(body(1)) + 10
    data[at] ^= 0x01
    seg.write_bytes(bytes(data))
    r = PageLogReader(tmp_path)
    assert r.get(k(1)) is None and r.unreadable == 1
    hit = r.get(k(2))
    assert hit is not None and hit.data == body(2)
    r.close()


class Crash(Exception):
    """The process dies here: nothing after this write happens."""


def crashing(budget: int):
    """A pwrite that writes ``budget`` bytes in all, then writes a part and dies."""
    left = [budget]

    def write(fd: int, data: bytes, offset: int) -> int:
        if len(data) > left[0]:
            os.pwrite(fd, data[:left[0]], offset)
            raise Crash()
        left[0] -= len(data)
        return os.pwrite(fd, data, offset)

    return write


@pytest.mark.parametrize("budget", [0, 20, 350, 700, 983, 1000, 1048, 1060, 1112, 1150])
def test_a_crash_part_way_through_an_append_loses_only_that_batch(tmp_path: Path, budget: int) -> None:
    """After a crash at any byte of a batch, a reopen serves every acknowledged page and, of the
    batch in flight, a prefix of whole items: no torn page, no half record."""
    acked = filled(tmp_path, 3)
    w = writer(tmp_path, write=crashing(budget))
    batch = [Item(k(0), body(100)), Item(k(7), body(7)), Item(k(8), body(8))]
    with pytest.raises(Crash):
        w.append(batch)
    w.close()
    again = writer(tmp_path)
    again.append([Item(k(9), b"after")])
    again.close()
    got = state(tmp_path)
    assert got.pop(k(9)) == b"after"
    prefixes = []
    for n in range(len(batch) + 1):
        model = dict(acked)
        model.update({it.key: it.data for it in batch[:n]})
        prefixes.append(model)
    assert got in prefixes


def full_after(budget: int):
    """A pwrite that writes ``budget`` bytes, then one short write, then fails with ENOSPC."""
    left = [budget]

    def write(fd: int, data: bytes, offset: int) -> int:
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), left[0])
        left[0] -= n
        return os.pwrite(fd, data[:n], offset)

    return write


def test_a_full_disk_on_the_segment_refuses_the_batch_and_changes_nothing(tmp_path: Path) -> None:
    acked = filled(tmp_path, 2)
    r = PageLogReader(tmp_path)
    w = writer(tmp_path, write=full_after(100))
    before = (w.position, dict(w.sizes))
    with pytest.raises(PageLogFull, match="No space left") as e:
        w.append([Item(k(5), body(5)), Item(k(6), body(6))])
    assert e.value.committed == 0 and (w.position, w.sizes) == before
    assert r.poll() == 0 and r.get(k(0)) is not None  # readers keep serving
    w.close()
    assert state(tmp_path) == acked
    r.close()


def test_a_full_disk_on_the_index_keeps_whole_records_only(tmp_path: Path) -> None:
    """The bodies went in; the index write stopped after one record and a half: the whole one is
    committed (a reader may have seen it), the half is cut, the error says so."""
    acked = filled(tmp_path, 2)
    w = writer(tmp_path)
    r = PageLogReader(tmp_path)
    items = [Item(k(5), body(5)), Item(k(6), body(6)), Item(k(7), body(7))]
    w._write = full_after(28 * 3 + 300 * 3 + RECORD_SIZE + 20)  # the segment run, then 1.3 records
    with pytest.raises(PageLogFull) as e:
        w.append(items)
    assert e.value.committed == 1
    r.poll()
    assert r.entries == w.entries and r.get(k(5)) is not None and k(6) not in r
    assert index_file(tmp_path).stat().st_size == w.position.offset
    w._write = os.pwrite  # space again: the rest is retried
    w.append(items[1:])
    r.poll()
    assert r.entries == w.entries
    w.close()
    r.close()
    assert state(tmp_path) == {**acked, **{it.key: it.data for it in items}}


def test_a_failed_index_sync_stops_the_writer_until_it_is_reopened(tmp_path: Path) -> None:
    filled(tmp_path, 1)

    w = PageLogWriter(tmp_path, sync=True, max_segment=8192, max_record=2048)

    def failing_sync(fd: int) -> None:
        if fd == w._index_fd:
            raise OSError(errno.EIO, "Input/output error")
        os.fdatasync(fd)

    w._fsync = failing_sync
    with pytest.raises(PageLogError):
        w.append([Item(k(5), b"x")])
    with pytest.raises(PageLogError, match="reopened"):
        w.append([Item(k(6), b"y")])
    w.close()
    again = writer(tmp_path)
    again.append([Item(k(6), b"y")])
    again.close()


def test_a_segment_torn_at_its_creation_is_made_again(tmp_path: Path) -> None:
    filled(tmp_path, 1)
    nxt = plfiles.segment_path(tmp_path, plfiles.segments(tmp_path)[-1] + 1)
    nxt.write_bytes(b"PGLOG")  # the header of a new segment, torn
    w = writer(tmp_path)
    w.append([Item(k(9), b"after")])
    assert not nxt.exists() and w.active > plfiles.segments(tmp_path)[0] and w.read(k(9)) == b"after"
    assert plfiles.segment_path(tmp_path, w.active).stat().st_size > SEGMENT_HEADER_SIZE
    w.close()
