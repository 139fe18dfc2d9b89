"""Compaction of the page log while readers read, the disk bound, and random histories against a dict
(prerender_ray/storage/pagelog)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prerender_ray.storage.pagelog import Item, PageLogReader, PageLogWriter, compact, maintain
from prerender_ray.storage.pagelog import files as plfiles
from prerender_ray.storage.pagelog.compaction import candidates
from prerender_ray.storage.pagelog.records import ENTRY_HEADER_SIZE, unpack_value
from tests.storage.test_pagelog import body, k, writer


def served(r: PageLogReader, keys: list[bytes]) -> dict[bytes, bytes | None]:
    return {key: (h.data if (h := r.get(key)) is not None else None) for key in keys}



def filled(path: Path) -> tuple[PageLogWriter, int]:
    """A writer with 30 pages of 600 bytes over several segments, and its oldest segment."""
    w = writer(path)
    for i in range(30):
        w.append([Item(k(i), body(i, 600))])
    return w, min(w.sizes)

def test_a_reader_holding_old_entries_reads_them_whole_after_compaction(tmp_path: Path) -> None:
    """The reader applied the old places and has not polled since the segments were compacted and
    unlinked: every page it answers is still the whole, old one (its descriptors keep the files)."""
    w = writer(tmp_path)
    for i in range(40):
        w.append([Item(k(i), body(i, 600))])
    r = PageLogReader(tmp_path)
    before = served(r, [k(i) for i in range(40)])
    for i in range(0, 40, 3):
        w.delete([k(i)])
    first = sorted(w.sizes)[:-1]
    done = [compact(w, seg) for seg in first]
    assert {c.segment for c in done} == set(first) and all(c.moved for c in done)
    assert not set(first) & set(plfiles.segments(tmp_path))  # unlinked
    assert served(r, [k(i) for i in range(40)]) == before  # not polled yet: the old view, whole
    r.poll()
    now = served(r, [k(i) for i in range(40)])
    assert now == {k(i): (None if i % 3 == 0 else body(i, 600)) for i in range(40)}
    assert not set(first) & set(r._fds)  # RETIRE closed them: their space is free
    w.close()
    r.close()


def test_a_reader_that_meets_a_segment_after_its_unlink_reads_on_to_the_moves(tmp_path: Path) -> None:
    r = PageLogReader(tmp_path / "log")
    w = writer(tmp_path / "log")
    r.poll()  # open, empty: the segments below are named only after they are gone
    for i in range(30):
        w.append([Item(k(i), body(i, 600))])
    w.delete([k(i) for i in range(0, 30, 2)])
    for seg in candidates(w):
        compact(w, seg)
    r.poll()
    assert served(r, [k(i) for i in range(30)]) == {k(i): (None if i % 2 == 0 else body(i, 600))
                                                    for i in range(30)}
    assert r.unreadable == 0 and r.entries == w.entries
    w.close()
    r.close()


def test_compaction_moves_a_segment_in_batches_of_its_budget(tmp_path: Path) -> None:
    w, seg = filled(tmp_path)
    live = w.live[seg][1]
    assert live >= 3
    appends: list[int] = []
    append = w.append
    w.append = lambda items: (appends.append(len(items)), append(items))[1]  # type: ignore[method-assign]
    done = compact(w, seg, batch_bytes=2 * 600)  # two bodies a batch
    assert done.moved == live and appends == [2] * (live // 2) + [1] * (live % 2)
    r = PageLogReader(tmp_path)
    assert served(r, [k(i) for i in range(30)]) == {k(i): body(i, 600) for i in range(30)}
    r.close()


def test_compaction_keeps_freshness_and_skips_entries_written_since(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append([Item(k(1), b"one", version=5, last_cached=10, expires_at=20, tag=2)])
    for i in range(2, 40):
        w.append([Item(k(i), body(i, 600))])
    w.touch(k(1), version=6, last_cached=11, expires_at=None)
    w.delete([k(i) for i in range(2, 40)])
    seg = min(w.sizes)
    c = compact(w, seg)
    assert c.moved == 1 and c.dropped == 0
    r = PageLogReader(tmp_path)
    hit = r.get(k(1))
    assert hit is not None and (hit.data, hit.version, hit.last_cached, hit.expires_at, hit.tag) == (
        b"one", 6, 11, None, 2)
    w.close()
    r.close()


def test_a_live_body_that_fails_its_checksum_is_dropped_not_moved(tmp_path: Path) -> None:
    w, seg = filled(tmp_path)
    path = plfiles.segment_path(tmp_path, seg)
    data = bytearray(path.read_bytes())
    data[data.index(body(0, 600)) + 5] ^= 0x01
    path.write_bytes(bytes(data))
    c = compact(w, seg)
    assert c.dropped == 1 and k(0) not in w.entries and w.read(k(1)) == body(1, 600)
    w.close()


def test_a_crash_after_the_moves_leaves_a_segment_the_next_open_retires(tmp_path: Path) -> None:
    w, seg = filled(tmp_path)
    found = [(key, unpack_value(v)[4], w.read(key)) for key, v in list(w.entries.items())
             if unpack_value(v)[3] == seg]
    w.relocate(seg, [(key, off, data) for key, off, data in found if data is not None])  # then "crash"
    w.close()
    again = writer(tmp_path)
    assert seg not in again.sizes and seg not in plfiles.segments(tmp_path)
    assert all(again.read(k(i)) == body(i, 600) for i in range(30))
    again.close()


def test_disk_use_stays_within_the_stated_bound_under_overwrites(tmp_path: Path) -> None:
    """Segments hold at most 1/ratio (2) times the live bytes, plus the active segment, plus the
    index (at most twice the live records, or CHECKPOINT_MIN)."""
    w = writer(tmp_path)
    r = PageLogReader(tmp_path)
    for rnd in range(30):
        w.append([Item(k(i), body(rnd * 50 + i, 500)) for i in range(12)])
        maintain(w, max_segments=10)
        r.poll()
    live = w.live_bytes()
    segments = sum(w.sizes.values())
    assert live == 12 * (500 + ENTRY_HEADER_SIZE)
    assert segments <= 2 * live + w.max_segment + 16 * len(w.sizes)
    assert served(r, [k(i) for i in range(12)]) == {k(i): body(29 * 50 + i, 500) for i in range(12)}
    w.close()
    r.close()


OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 7), st.integers(0, 1500)),
    st.tuples(st.just("touch"), st.integers(0, 7), st.integers(0, 99)),
    st.tuples(st.just("delete"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("maintain"), st.just(0), st.just(0)),
    st.tuples(st.just("checkpoint"), st.just(0), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    st.tuples(st.just("poll"), st.just(0), st.just(0)),
), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_histories_serve_what_a_dict_holds(ops: list[tuple[str, int, int]]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="pagelog-"))
    try:
        w = writer(tmp)
        r = PageLogReader(tmp)
        model: dict[bytes, tuple[bytes, int | None]] = {}
        for n, (op, i, arg) in enumerate(ops):
            key = k(i)
            if op == "put":
                data = body(n, arg)
                w.append([Item(key, data, version=n)])
                model[key] = (data, None)
            elif op == "touch":
                if w.touch(key, version=n, last_cached=None, expires_at=arg) is not None:
                    model[key] = (model[key][0], arg)
            elif op == "delete":
                w.delete([key])
                model.pop(key, None)
            elif op == "maintain":
                maintain(w, ratio=0.9, max_segments=5)
            elif op == "checkpoint":
                w.checkpoint()
            elif op == "reopen":
                w.close()
                w = writer(tmp)
            else:
                r.poll()
            assert {key: w.read(key) for key in w.entries} == {key: v[0] for key, v in model.items()}
        r.poll()
        fresh = PageLogReader(tmp)
        for reader in (r, fresh):
            got = {key: ((h.data, h.expires_at) if (h := reader.get(key)) is not None else None)
                   for key in reader.entries}
            assert got == model and reader.unreadable == 0
        fresh.close()
        r.close()
        w.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
