from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import pytest

from prerender_ray.storage import rocks
from prerender_ray.storage.rocks import (
    SORT_AT,
    Store,
    StoreError,
    check_writable,
    direct_io_works,
    store_path,
)
from tests.support import rocksdb_options


def test_items_stay_inside_their_prefix_in_key_order(tmp_path: Path) -> None:
    db = Store(tmp_path / "db")
    db.write([(b"t:b", b"2"), (b"t:a", b"1"), (b"u:a", b"x"), (b"s:z", b"y")])
    assert list(db.items(b"t:")) == [(b"t:a", b"1"), (b"t:b", b"2")]
    assert list(db.items(b"t:", start=b"t:b")) == [(b"t:b", b"2")]
    assert db.count(b"t:") == 2
    db.close()


def test_a_batch_applies_puts_and_deletes_together(tmp_path: Path) -> None:
    db = Store(tmp_path / "db")
    db.put(b"k1", b"v1")
    assert db.write([(b"k1", None), (b"k2", b"v2")]) == 2
    assert db.get(b"k1") is None and db.get(b"k2") == b"v2"
    assert db.get_many([b"k1", b"k2"]) == [None, b"v2"]
    db.close()


@pytest.mark.parametrize("size", [3, SORT_AT, 5 * SORT_AT])
def test_a_key_written_twice_in_one_batch_keeps_its_last_write(tmp_path: Path, size: int) -> None:
    """Large batches are written in key order: the reordering must not swap two writes of one key."""
    db = Store(tmp_path / "db")
    db.write([(b"gone", b"old"), (b"kept", b"old")])
    filler = [(f"f{i:05d}".encode(), b"x") for i in range(size - 4, 0, -1)]  # reversed: a sort moves them
    ops = [(b"kept", b"first"), (b"gone", b"first"), *filler, (b"kept", b"last"), (b"gone", None)]
    assert db.write(iter(ops)) == len(ops)
    assert db.get(b"kept") == b"last" and db.get(b"gone") is None
    assert db.count(b"f") == len(filler)
    db.close()


def test_writes_survive_a_reopen(tmp_path: Path) -> None:
    db = Store(tmp_path / "db")
    db.put(b"k", b"v")
    db.close()
    again = Store(tmp_path / "db")
    assert again.get(b"k") == b"v"
    again.close()


def test_a_secondary_reader_sees_new_writes_only_after_catching_up(tmp_path: Path) -> None:
    db = Store(tmp_path / "db")
    db.put(b"a", b"1")
    reader = Store(tmp_path / "db", secondary=tmp_path / "sec")
    assert reader.get(b"a") == b"1"
    db.put(b"b", b"2")
    db.flush()
    reader.catch_up()
    assert reader.get(b"b") == b"2"
    reader.close()
    db.close()


def test_a_second_writer_is_refused_with_the_path_named(tmp_path: Path) -> None:
    db = Store(tmp_path / "db")
    with pytest.raises(StoreError, match=str(tmp_path / "db")):
        Store(tmp_path / "db")
    db.close()


def test_each_node_keeps_its_stores_under_its_own_name(tmp_path: Path) -> None:
    assert store_path(tmp_path, "web-3", "pages") == tmp_path / "nodes" / "web-3" / "pages"
    with pytest.raises(ValueError):
        store_path(tmp_path, "web-3", "nonsense")


def test_an_unwritable_data_dir_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="not writable"):
        check_writable(blocker / "data")


def _running_options(path: Path, **kw: bool) -> str:
    store = Store(path, **kw)
    store.put(b"k", b"v")
    store.flush()
    store.close()
    return rocksdb_options(path)


def test_compaction_waits_for_16_flushed_files_and_writes_stall_only_well_past_them(tmp_path: Path) -> None:
    text = _running_options(tmp_path / "s")
    assert "level0_file_num_compaction_trigger=16\n" in text
    assert "level0_slowdown_writes_trigger=40\n" in text
    assert "level0_stop_writes_trigger=64\n" in text


def test_a_store_written_blind_has_no_memtable_bloom_and_the_others_do(tmp_path: Path) -> None:
    default = _running_options(tmp_path / "default")
    assert "memtable_whole_key_filtering=true\n" in default
    assert "memtable_prefix_bloom_size_ratio=0.100000\n" in default
    blind = _running_options(tmp_path / "blind", memtable_bloom=False)
    assert "memtable_whole_key_filtering=false\n" in blind
    assert "memtable_prefix_bloom_size_ratio=0.000000\n" in blind


def _resident(path: Path) -> int:
    """Bytes of ``path`` in the page cache (mincore over a mapping of it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
        assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) * mmap.PAGESIZE


def _flushed_share_cached(path: Path, **kw: bool) -> tuple[bool, float]:
    db = Store(path, **kw)
    for batch in range(10):
        db.write([(f"page-{batch}-{i}".encode(), os.urandom(20_000)) for i in range(100)])
    db.flush()
    tables = list(path.glob("*.sst"))
    share = sum(_resident(t) for t in tables) / sum(t.stat().st_size for t in tables)
    direct = db.direct_writes
    db.close()
    return direct, share


def test_a_store_with_direct_writes_flushes_past_the_page_cache(tmp_path: Path) -> None:
    """The pages store's copy of every body takes no memory the page log's copy needs (issue 37)."""
    if not direct_io_works(tmp_path):
        pytest.skip(f"the file system under {tmp_path} takes no O_DIRECT write")
    assert _flushed_share_cached(tmp_path / "buffered") == (False, pytest.approx(1.0, abs=0.1))
    direct, share = _flushed_share_cached(tmp_path / "direct", direct_writes=True)
    assert direct and share < 0.1  # the table's index and filter blocks, read back when it opens
    db = Store(tmp_path / "direct")  # reopened without: what it wrote reads back whole
    assert db.get(b"page-9-99") is not None and db.count(b"page-") == 1_000
    db.close()


def test_a_file_system_without_o_direct_gets_a_store_that_writes_through_the_page_cache(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    if direct_io_works(tmp_path):
        text = _running_options(tmp_path / "direct", direct_writes=True)
        assert "use_direct_io_for_flush_and_compaction=true\n" in text
        assert "compaction_readahead_size=2097152\n" in text
    monkeypatch.setattr(rocks, "direct_io_works", lambda path: False)
    assert "use_direct_io_for_flush_and_compaction=false\n" in _running_options(tmp_path / "s", direct_writes=True)
    db = Store(tmp_path / "s", direct_writes=True)
    assert not db.direct_writes and db.get(b"k") == b"v"
    db.close()
