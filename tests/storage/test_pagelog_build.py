"""The page log built from the pages RocksDB in chunks while writes go on (storage/pagelog/build.py):
real RocksDB and a real log in a temp dir, writes through the mirror between chunks, read back by a
real reader."""

from __future__ import annotations

import os
import threading

import pytest

from prerender_ray.storage.keys import HPTR
from prerender_ray.storage.pagelog import Item, PageLogFull, key_hash
from prerender_ray.storage.pagelog.build import Build
from prerender_ray.storage.pagelog.reconcile import reconcile
from tests.storage.test_pagelog_mirror import Node, ops_of, page, tombstone, touch
from tests.storage.test_pagelog_recovery import full_after


def keys(n: int) -> list[bytes]:
    return [f"https://b.test/p-{i:03d}|desktop".encode() for i in range(n)]


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()


def old_store(node: Node, n: int) -> list[bytes]:
    """``n`` pages written before the log (no mirror attached), then the mirror wired for a build."""
    node.store.mirror = None
    ks = keys(n)
    for i, k in enumerate(ks):
        node.store.write(ops_of(k, page(k, 100 + i), 100 + i))
    return ks


def start(node: Node, **kw) -> Build:
    node.mirror.touched = set()
    b = Build(node.writer, node.store, node.mirror.touched, **kw)
    node.store.mirror = node.mirror
    return b


def step(node: Node, b: Build) -> bool:
    with node.mirror.lock:
        return b.step()


def assert_mirrors(node: Node, ks: list[bytes]) -> None:
    for k in ks:
        held = node.store.get(k)
        hit = node.served(k)
        if held is None or node.store.get(HPTR + k)[8] != 1:
            assert hit is None, k
        else:
            assert hit is not None and hit.data == held, k


def test_a_build_in_chunks_keeps_every_write_made_between_them_at_its_newest_version(node) -> None:
    ks = old_store(node, 40)
    stray = key_hash("https://b.test/gone|desktop")  # a log entry of a page RocksDB does not hold
    node.writer.append([Item(stray, page(b"https://b.test/gone|desktop", 5), 5, None, None)])
    b = start(node, keys=6)
    assert not step(node, b) and 0 < b.passed <= 6 and b.appended == b.passed
    behind, ahead, doomed, new = ks[0], ks[30], ks[31], b"https://b.test/new|desktop"
    node.store.write(ops_of(behind, page(behind, 900, body=b"v2"), 900))
    node.store.write(ops_of(ahead, page(ahead, 901, body=b"v2"), 901))
    node.store.write(ops_of(doomed, tombstone(902), 902))
    node.store.write(ops_of(new, page(new, 903), 903))
    node.store.write([(b"\x00f" + ahead, touch(ahead, 904, etag='"e1"', last=7_000, expires=70_000))])
    steps = 1
    while not step(node, b):
        steps += 1
        assert node.served(ahead).version == 901  # never put back behind the write
    assert steps >= 40 // 6 and b.longest > 0
    done = b.finish()
    assert node.writer.entries.get(stray) is None and done.deleted >= 1
    assert_mirrors(node, ks + [new])
    assert node.served(behind).version == 900 and node.served(doomed) is None
    got = node.served(ahead)
    assert got.version == 901 and (got.last_cached, got.expires_at) == (7_000, 70_000)
    assert len(node.writer.entries) == 40  # 40 - doomed + new
    assert reconcile(node.writer, node.store)[1:4] == (0, 0, 0)  # nothing left to put right


def test_a_stray_entry_written_again_during_the_build_is_kept(node) -> None:
    ks = old_store(node, 10)
    late = b"https://b.test/late|desktop"  # in the log, not in RocksDB (a crash between the two)
    node.writer.append([Item(key_hash(late.decode()), page(late, 50), 50, None, None)])
    b = start(node, keys=3)
    while not step(node, b):
        pass
    node.store.write(ops_of(late, page(late, 50), 50))  # the same record arrives after the walk passed
    b.finish()
    assert node.served(late) is not None and node.served(late).data == node.store.get(late)
    assert_mirrors(node, ks)


def test_a_chunk_stops_at_its_byte_bound(node) -> None:
    old_store(node, 0)
    ks = keys(20)
    for i, k in enumerate(ks):
        node.store.write(ops_of(k, page(k, 100 + i, body=b"x" * 10_000), 100 + i))
    b = start(node, keys=1_000, max_bytes=25_000)
    assert not step(node, b) and b.passed < 20  # bound reached before the keys one
    while not step(node, b):
        pass
    b.finish()
    assert_mirrors(node, ks)


def test_a_build_beside_a_writing_thread_ends_mirroring_the_store(node) -> None:
    ks = old_store(node, 200)
    b = start(node, keys=7)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            k = ks[(i * 37) % len(ks)]
            node.store.write(ops_of(k, page(k, 10_000 + i, body=b"w%d" % i), 10_000 + i))
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        while not step(node, b):
            pass
        with node.mirror.lock:
            b.finish()
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert_mirrors(node, ks)
    assert len(node.writer.entries) == 200


def test_a_chunk_refused_by_a_full_disk_is_walked_again(node) -> None:
    ks = old_store(node, 20)
    b = start(node, keys=5)
    assert not step(node, b)
    node.writer._write = full_after(1_000)  # a few records of the next chunk go in, then no space
    with pytest.raises(PageLogFull):
        step(node, b)
    assert b.passed == 5 and not b.ended
    node.writer._write = os.pwrite
    while not step(node, b):
        pass
    b.finish()
    assert_mirrors(node, ks)
    assert len(node.writer.entries) == 20
