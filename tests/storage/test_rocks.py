from __future__ import annotations

from pathlib import Path

import pytest

from prerender_ray.storage.rocks import SORT_AT, Store, StoreError, check_writable, store_path
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
