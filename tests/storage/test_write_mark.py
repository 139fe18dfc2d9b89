"""A store's write mark (prerender_ray/storage/write_mark.py): the writer counts its writes in a file
beside its RocksDB directory; a reader in another process maps the same word."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from prerender_ray.storage.rocks import Store
from prerender_ray.storage.write_mark import WriteMark, mark_path


def test_every_write_moves_the_mark_and_an_empty_batch_does_not(tmp_path: Path) -> None:
    assert WriteMark.follow(tmp_path / "db") is None  # no writer yet
    db = Store(tmp_path / "db")
    mark = WriteMark.follow(tmp_path / "db")
    assert mark is not None and mark_path(tmp_path / "db").parent == tmp_path  # beside, not in, the db
    seen = [mark.value()]
    db.put(b"k", b"v")
    seen.append(mark.value())
    db.delete(b"k")
    seen.append(mark.value())
    db.write([(b"a", b"1"), (b"b", None)])
    seen.append(mark.value())
    db.write([])
    seen.append(mark.value())
    assert [b - a for a, b in zip(seen, seen[1:])] == [1, 1, 1, 0]
    mark.close()
    db.close()


def test_a_reopened_store_counts_on_and_readers_never_count(tmp_path: Path) -> None:
    db = Store(tmp_path / "db")
    db.put(b"k", b"v")
    first = WriteMark.follow(tmp_path / "db").value()
    db.close()
    db = Store(tmp_path / "db")
    reader = Store(tmp_path / "db", secondary=tmp_path / "sec")
    assert reader.mark is None and WriteMark.follow(tmp_path / "db").value() == first
    db.put(b"k", b"w")
    assert WriteMark.follow(tmp_path / "db").value() == first + 1
    reader.close()
    db.close()


def _write(path: str, n: int) -> None:
    db = Store(path)
    for i in range(n):
        db.put(b"k%d" % i, b"v")
    db.close()


def test_a_reader_in_another_process_sees_the_writer_s_count(tmp_path: Path) -> None:
    Store(tmp_path / "db").close()
    mark = WriteMark.follow(tmp_path / "db")
    start = mark.value()
    p = multiprocessing.get_context("spawn").Process(target=_write, args=(str(tmp_path / "db"), 50))
    p.start()
    p.join(60)
    assert p.exitcode == 0 and mark.value() == start + 50
    assert not mark.replaced()
    mark_path(tmp_path / "db").unlink()
    assert mark.replaced()  # the reader follows it anew (api/bot/page_reader.py)
    mark.close()
