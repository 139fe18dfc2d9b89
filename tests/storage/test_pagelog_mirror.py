"""The page log as a mirror of the pages RocksDB (storage/pagelog/mirror.py, reconcile.py): batches as
the store writes them, on a real RocksDB and a real log in a temp dir, read back by a real reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prerender_ray.storage.keys import FRESHNESS, HPTR, LIVE, RENDER_HISTORY, VIDX
from prerender_ray.storage.pagelog import PageLogFull, PageLogReader, PageLogWriter, key_hash
from prerender_ray.storage.pagelog.mirror import Mirror, MirroredStore, refusal
from prerender_ray.storage.pagelog.reconcile import reconcile, repair
from prerender_ray.storage.pages import Page, decode_head
from prerender_ray.storage.replication import Version, payload_of, wrap
from prerender_ray.storage.touches import Touch, touch_key
from tests.storage.test_pagelog_recovery import full_after

KEY = b"https://m.test/a|desktop"


def page(key: bytes, hlc: int, *, etag: str = '"e1"', last: int = 1_000, expires: int = 9_000,
         body: bytes = b"<html>x</html>") -> bytes:
    p = Page(cache_key=key.decode(), status_code=200, headers={"etag": etag}, last_cached=last, expires_at=expires,
             content=body)
    return wrap(Version(hlc, "node-a"), p.encode())


def touch(key: bytes, hlc: int, *, etag: str = '"e1"', last: int = 5_000, expires: int = 50_000) -> bytes:
    return wrap(Version(hlc, "node-a"), Touch(key.decode(), etag, last, expires).encode())


def tombstone(hlc: int) -> bytes:
    return wrap(Version(hlc, "node-a"), None)


def ops_of(key: bytes, record: bytes, hlc: int) -> list:
    """A record with its version pointer, as ``Replication._batch`` writes it."""
    live = payload_of(record) is not None
    return [(VIDX + hlc.to_bytes(8, "big") + key, b""), (HPTR + key, hlc.to_bytes(8, "big") + bytes([live])),
            (key, record)]


class Node:
    """A pages store with its log, wired as the node store wires them."""

    def __init__(self, root: Path, write=os.pwrite):
        self.root = root
        self.store = MirroredStore(root / "pages")
        self.writer = PageLogWriter(root / "pagelog", sync=False, write=write)
        self.mirror = Mirror(self.writer, self.store.get_many)
        self.store.mirror = self.mirror

    def served(self, key: bytes):
        r = PageLogReader(self.root / "pagelog")
        try:
            return r.get(key_hash(key.decode()))
        finally:
            r.close()

    def close(self) -> None:
        self.store.mirror = None
        self.writer.close()
        self.store.close()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()


def test_a_page_written_is_in_the_log_as_rocksdb_holds_it(node) -> None:
    rec = page(KEY, 100)
    node.store.write(ops_of(KEY, rec, 100))
    hit = node.served(KEY)
    assert hit is not None and hit.data == rec == node.store.get(KEY)
    assert (hit.version, hit.last_cached, hit.expires_at, hit.tag) == (100, 1_000, 9_000, 0)


def test_a_freshness_record_retimes_the_entry_only_for_the_same_content(node) -> None:
    node.store.write(ops_of(KEY, page(KEY, 100), 100))
    node.store.write([(touch_key(KEY), touch(KEY, 101))])
    hit = node.served(KEY)
    assert hit is not None and (hit.version, hit.last_cached, hit.expires_at) == (100, 5_000, 50_000)
    node.store.write([(touch_key(KEY), touch(KEY, 102, etag='"other"', expires=99_000))])  # not this page's
    hit = node.served(KEY)
    assert hit is not None and (hit.last_cached, hit.expires_at) == (1_000, 9_000)  # its own again
    node.store.write([(touch_key(KEY), touch(KEY, 103, expires=70_000))])
    node.store.write([(touch_key(KEY), None)])  # a freshness record removed: the page's own times
    hit = node.served(KEY)
    assert hit is not None and (hit.last_cached, hit.expires_at) == (1_000, 9_000)


def test_a_page_that_arrives_after_a_newer_freshness_record_takes_its_times(node) -> None:
    """Replication may deliver the touch first: the page's put reads the one the store holds."""
    node.store.write([(touch_key(KEY), touch(KEY, 200))])
    assert node.served(KEY) is None  # no page to re-time yet
    node.store.write(ops_of(KEY, page(KEY, 150), 150))
    hit = node.served(KEY)
    assert hit is not None and (hit.version, hit.last_cached, hit.expires_at) == (150, 5_000, 50_000)
    # a page newer than the touch is not extended by it
    node.store.write(ops_of(KEY, page(KEY, 300, expires=12_000), 300))
    hit = node.served(KEY)
    assert hit is not None and (hit.version, hit.expires_at) == (300, 12_000)


def test_a_tombstone_and_a_removed_key_delete_the_entry(node) -> None:
    other = b"https://m.test/b|desktop"
    node.store.write(ops_of(KEY, page(KEY, 100), 100) + ops_of(other, page(other, 101), 101))
    node.store.write(ops_of(KEY, tombstone(110), 110))
    node.store.write([(other, None), (HPTR + other, None)])  # a rebalance drop
    assert node.served(KEY) is None and node.served(other) is None and not node.writer.entries


def test_internal_keys_leave_the_log_as_it_is(node) -> None:
    before = node.writer.position
    node.store.write([(LIVE, b"\x00" * 8), (RENDER_HISTORY + KEY + b"\x00h0", wrap(Version(5, "node-a"), b"{}")),
                      (VIDX + b"\x00" * 8 + KEY, b"")])
    assert node.writer.position == before


def test_a_full_disk_refuses_the_batch_and_leaves_rocksdb_as_it_was(node) -> None:
    old = page(KEY, 100)
    node.store.write(ops_of(KEY, old, 100))
    refused = []
    node.mirror.on_refused = refused.append
    node.writer._write = full_after(0)
    with pytest.raises(PageLogFull) as e:
        node.store.write(ops_of(KEY, page(KEY, 200, body=b"new"), 200))
    assert refusal(e.value) is e.value and refused == [e.value] and node.mirror.refusing is e.value
    assert node.store.get(KEY) == old and node.store.get(HPTR + KEY)[:8] == (100).to_bytes(8, "big")
    hit = node.served(KEY)
    assert hit is not None and hit.data == old  # hits keep being served
    node.writer._write = os.pwrite  # space again
    node.store.write(ops_of(KEY, page(KEY, 201, body=b"new"), 201))
    assert node.mirror.refusing is None and node.served(KEY).version == 201


def test_an_index_full_part_way_marks_the_batch_for_repair(node) -> None:
    keys = [b"https://m.test/%d|desktop" % i for i in range(3)]
    node.store.write([op for i, k in enumerate(keys) for op in ops_of(k, page(k, 100 + i), 100 + i)])
    new = [page(k, 200 + i, body=b"v2") for i, k in enumerate(keys)]
    size = sum(len(r) + 28 for r in new)
    node.writer._write = full_after(size + 64 + 10)  # the bodies, one index record and a bit
    with pytest.raises(PageLogFull):
        node.store.write([op for i, k in enumerate(keys) for op in ops_of(k, new[i], 200 + i)])
    assert node.served(keys[0]).version == 200  # in the log, not in RocksDB
    assert set(keys) <= node.mirror.dirty
    node.writer._write = os.pwrite
    done = repair(node.writer, node.store.get_many, sorted(node.mirror.dirty))
    assert done.appended == 1 and [node.served(k).version for k in keys] == [100, 101, 102]


def test_reconcile_rebuilds_a_missing_log_and_puts_back_one_ahead_of_rocksdb(tmp_path) -> None:
    n = Node(tmp_path)
    n.store.mirror = None  # a store of an earlier release: pages, no log
    keys = [b"https://m.test/%d|desktop" % i for i in range(5)]
    for i, k in enumerate(keys):
        n.store.write(ops_of(k, page(k, 100 + i), 100 + i))
    n.store.write(ops_of(keys[4], tombstone(120), 120))
    n.store.write([(touch_key(keys[1]), touch(keys[1], 130))])
    done = reconcile(n.writer, n.store)
    assert (done.pages, done.appended, done.deleted) == (4, 4, 0)
    assert [n.served(k).version if n.served(k) else None for k in keys] == [100, 101, 102, 103, None]
    assert n.served(keys[1]).expires_at == 50_000
    # a crash between the log's append and RocksDB's write: the log is ahead
    n.store.mirror = n.mirror
    n.mirror.before_write(ops_of(keys[0], page(keys[0], 140, body=b"lost"), 140))
    n.mirror.before_write([(touch_key(keys[2]), touch(keys[2], 141, expires=77_000))])
    n.mirror.before_write(ops_of(keys[3], tombstone(142), 142))
    n.mirror.before_write(ops_of(keys[4], page(keys[4], 143), 143))
    assert n.served(keys[0]).version == 140 and n.served(keys[2]).expires_at == 77_000
    done = reconcile(n.writer, n.store)
    assert (done.appended, done.retimed, done.deleted) == (2, 1, 1)
    for k in keys[:4]:
        hit = n.served(k)
        assert hit is not None and hit.data == n.store.get(k) and hit.version == 100 + keys.index(k)
        own = decode_head(payload_of(hit.data))
        assert hit.expires_at == (50_000 if k == keys[1] else own.expires_at)
    assert n.served(keys[4]) is None
    assert reconcile(n.writer, n.store)[1:4] == (0, 0, 0)  # nothing left to do
    n.close()


def test_reconcile_drops_entries_of_keys_rocksdb_does_not_hold(tmp_path) -> None:
    n = Node(tmp_path)
    n.mirror.before_write([(KEY, page(KEY, 100))])  # never reached RocksDB
    assert reconcile(n.writer, n.store).deleted == 1 and n.served(KEY) is None
    assert not any(k.startswith(FRESHNESS) for k in n.store.keys())
    n.close()
