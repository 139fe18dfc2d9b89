"""The ingress page reader on the node's page log (api/bot/page_reader.py ``PageReader``): a real RocksDB
primary and a real page log in a temp dir, written in the store's order (the log first, then the
RocksDB write that moves the write mark) and format (the raw enveloped record, its HLC, the effective
times); read through ``PageReader.for_node`` as a replica opens it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from prerender_ray import metrics
from prerender_ray.api.bot.page_reader import PageReader
from prerender_ray.api.bot.pages import UnreadablePage
from prerender_ray.serving.framing import encode_page
from prerender_ray.storage.pagelog import Item, PageLogWriter, key_hash, maintain
from prerender_ray.storage.pagelog.compaction import compact
from prerender_ray.storage.pagelog.files import COMPLETE, mark_complete, segment_path
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Clock, wrap
from prerender_ray.storage.rocks import PAGES, Store, node_dir, pagelog_path, remove_tree, store_path
from prerender_ray.storage.touches import Touch, touch_key

KEY = "https://x.com/a|desktop"
NODE = "n1"


class Node:
    """What the NodeStore writes for a page, a freshness record and a delete (the page log contract)."""

    def __init__(self, data_dir: Path, *, log: bool = True, max_segment: int = 1 << 20):
        self.data_dir = data_dir
        self.store = Store(store_path(data_dir, NODE, PAGES))
        self.log = self.open_log(max_segment) if log else None
        self.clock = Clock(NODE)
        self.versions: dict[str, int] = {}

    def open_log(self, max_segment: int = 1 << 20, complete: bool = True) -> PageLogWriter:
        """``complete``: as the store marks it once reconciled with RocksDB (readers wait for that)."""
        path = pagelog_path(self.data_dir, NODE)
        self.log = PageLogWriter(path, sync=False, max_segment=max_segment, max_record=max_segment // 2)
        if complete:
            mark_complete(path)
        return self.log

    def put(self, key: str, content: bytes, *, last_cached: int = 1, expires_at: int = 2) -> bytes:
        page = Page(cache_key=key, status_code=200, headers={"content-type": "text/html", "etag": '"e1"'},
                    content=content, last_cached=last_cached, expires_at=expires_at)
        version = self.clock.now()
        raw = wrap(version, encode_page(page))
        if self.log is not None:
            self.log.append([Item(key_hash(key), raw, version.hlc, last_cached, expires_at)])
        self.store.put(key.encode(), raw)
        self.versions[key] = version.hlc
        return raw

    def touch(self, key: str, last_cached: int, expires_at: int) -> None:
        """An unchanged render: new times for the stored page (its freshness record)."""
        version = self.clock.now()
        if self.log is not None:
            self.log.touch(key_hash(key), version=self.versions[key], last_cached=last_cached, expires_at=expires_at)
        self.store.put(touch_key(key), wrap(version, Touch(key, '"e1"', last_cached, expires_at).encode()))

    def delete(self, key: str) -> None:
        version = self.clock.now()
        if self.log is not None:
            self.log.delete([key_hash(key)], version=version.hlc)
        self.store.put(key.encode(), wrap(version, None))

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        self.store.close()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()


def replica(node: Node, index: int = 0, **kw: float) -> PageReader:
    return PageReader.for_node(str(node.data_dir), NODE, index, **kw)


def at_once(coro):
    """Run a read to its end without giving the loop a turn: it must not wait for anything."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("the read waited")


def body(found) -> bytes | None:
    return None if found is None else bytes(found.body)


def unreadable() -> float:
    return metrics.serve_errors.labels("page-log-unreadable")._value.get()


def held_segments(root: Path) -> set[str]:
    """Segment files under ``root`` this process holds open (names; an unlinked one ends in
    " (deleted)"); another test's files left open in this worker are not ours to count."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{root}/") and "/pagelog/seg-" in target:
            found.add(target.rsplit("/", 1)[-1])
    return found


async def test_a_hit_is_read_from_the_page_log_with_its_effective_times(node) -> None:
    """The log holds the times of the page's freshness record (the store applied it): the reader
    takes them from the log and opens no secondary."""
    node.put(KEY, b"<html>log</html>", last_cached=10, expires_at=20)
    node.touch(KEY, 30, 40)
    reader = replica(node)
    found = await reader.read(KEY)
    assert body(found) == b"<html>log</html>" and found.frame is not None
    assert (found.last_cached, found.expires_at) == (30, 40) and found.meta.expires_at == 40
    assert await reader.read("https://x.com/absent|desktop") is None
    assert not (node_dir(node.data_dir, NODE) / "ingress" / "pages-0").exists()  # no secondary opened
    assert reader.source == "pagelog" and reader.ready
    reader.close()


async def test_a_new_version_new_times_and_a_delete_are_read_at_once_after_the_write(node) -> None:
    """Every replica reads its node's writes with no wait: the mark moved, so the read polls the log
    (the store appended before it wrote RocksDB). A decoded page is kept while its entry stands and
    across a touch (the same bytes), never past a new version."""
    node.put(KEY, b"v0")
    replicas = [replica(node, i) for i in range(2)]
    first = [at_once(r.read(KEY)) for r in replicas]
    assert [body(p) for p in first] == [b"v0", b"v0"]
    assert [at_once(r.read(KEY)) for r in replicas] == first  # reused: the same entry
    for version in range(1, 4):
        node.put(KEY, b"v%d" % version)
        assert [body(at_once(r.read(KEY))) for r in replicas] == [b"v%d" % version] * 2
    kept = at_once(replicas[0].read(KEY))
    kept.variants["gzip"] = "a negotiated form"
    node.touch(KEY, 50, 60)
    touched = at_once(replicas[0].read(KEY))
    assert touched is kept and touched.variants == {"gzip": "a negotiated form"}
    assert (touched.last_cached, touched.expires_at) == (50, 60) and touched.meta.last_cached == 50
    node.delete(KEY)
    assert [at_once(r.read(KEY)) for r in replicas] == [None, None]
    # one poll per write a replica read after (the touch: only the first read), no catch-up
    assert [r.polls for r in replicas] == [5, 4] and [r.catch_ups for r in replicas] == [0, 0]
    for r in replicas:
        r.close()


async def test_a_torn_or_short_body_is_never_served_and_reads_as_a_miss(node) -> None:
    """A body that fails its checksum (a power loss after an unsynced append), or a segment cut
    short: the read is a miss, counted, and never a page or an exception."""
    torn, short = "https://x.com/torn|desktop", "https://x.com/short|desktop"
    node.put(torn, b"<html>" + b"t" * 2000 + b"</html>")
    node.put(short, b"<html>" + b"s" * 2000 + b"</html>")
    seg = segment_path(pagelog_path(node.data_dir, NODE), node.log.active)
    size = seg.stat().st_size
    with seg.open("r+b") as f:
        f.seek(size - 4000)  # inside the first body
        f.write(b"X")
    reader = replica(node)
    before = unreadable()
    assert await reader.read(torn) is None and unreadable() == before + 1
    os.truncate(seg, size - 100)  # the second body's tail is gone
    assert await reader.read(short) is None and unreadable() == before + 2
    node.put(torn, b"<html>again</html>")  # written again: served
    assert body(await reader.read(torn)) == b"<html>again</html>"
    reader.close()


async def test_a_record_that_is_not_a_page_is_unreadable(node) -> None:
    node.log.append([Item(key_hash(KEY), wrap(node.clock.now(), b"not a page"), 1)])
    node.store.put(KEY.encode(), wrap(node.clock.now(), b"not a page"))
    reader = replica(node)
    with pytest.raises(UnreadablePage):
        await reader.read(KEY)
    reader.close()


async def test_pages_are_served_whole_through_a_compaction_and_the_timer_lets_retired_files_go(tmp_path) -> None:
    """A compaction and a new index generation move no mark: the reader serves the old places from
    the descriptors it holds until its timer polls, then the new ones, and closes the retired files."""
    node = Node(tmp_path, max_segment=8192)
    keys = [f"https://x.com/{i}|desktop" for i in range(30)]
    for i, key in enumerate(keys):
        node.put(key, b"%d" % i * 600)
    reader = replica(node, poll_s=0.01)
    decoded = {key: await reader.read(key) for key in keys}
    assert len(held_segments(tmp_path)) > 3
    for key in keys[::2]:
        node.put(key, b"new " + key.encode())  # the old segments are mostly dead now
    for key in keys[1::2]:
        assert await reader.read(key) is decoded[key]  # polled, entry unchanged: reused
    old = sorted(node.log.sizes)[:-1]
    for seg in old:
        compact(node.log, seg)
    node.log.checkpoint()
    assert all(f"{segment_path(tmp_path, s).name} (deleted)" in held_segments(tmp_path) for s in old)
    expected = {key: (b"new " + key.encode() if i % 2 == 0 else b"%d" % i * 600) for i, key in enumerate(keys)}
    assert {key: body(reader.get(key)) for key in keys} == expected  # not polled yet: whole, from the old files
    reader.start()
    deadline = asyncio.get_running_loop().time() + 10
    while any(name.endswith("(deleted)") for name in held_segments(tmp_path)):
        assert asyncio.get_running_loop().time() < deadline, held_segments(tmp_path)
        await asyncio.sleep(0.01)
    assert {key: body(reader.get(key)) for key in keys} == expected
    assert all(reader.get(key) is decoded[key] for key in keys[1::2])  # moved bytes: the same decoded page
    maintain(node.log)
    node.put(keys[0], b"after the checkpoint")
    assert body(at_once(reader.read(keys[0]))) == b"after the checkpoint"
    reader.close()
    node.close()


async def test_without_a_page_log_the_secondary_serves_until_the_log_appears(tmp_path) -> None:
    """A store of an older release (no log): reads go through the RocksDB secondary. Once the store
    creates the log, the timer switches the replica to it and closes the secondary."""
    node = Node(tmp_path, log=False)
    node.put(KEY, b"from rocksdb")
    reader = replica(node, interval_s=0.01, poll_s=0.01)
    assert reader.source == "secondary"
    assert body(await reader.read(KEY)) == b"from rocksdb"
    node.put(KEY, b"still rocksdb")
    assert body(await reader.read(KEY)) == b"still rocksdb" and reader.catch_ups >= 1
    log = node.open_log(complete=False)  # the store of the new release, reconciling its new log
    reader.start()
    for _ in range(5):  # a log not yet whole is not followed: it would answer misses for stored pages
        await asyncio.sleep(0.01)
        assert reader.source == "secondary"
    log.append([Item(key_hash(KEY), node.store.get(KEY.encode()), node.versions[KEY], 1, 2)])
    mark_complete(log.path)
    deadline = asyncio.get_running_loop().time() + 10
    while reader.source != "pagelog":
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert reader._db is None  # the secondary is closed
    assert body(at_once(reader.read(KEY))) == b"still rocksdb"
    node.put(KEY, b"from the log")
    assert body(at_once(reader.read(KEY))) == b"from the log"
    reader.close()
    node.close()


async def test_a_log_whose_index_does_not_decode_leaves_the_replica_on_the_secondary(tmp_path) -> None:
    node = Node(tmp_path, log=False)
    node.put(KEY, b"from rocksdb")
    path = pagelog_path(tmp_path, NODE)
    path.mkdir(parents=True)
    (path / "index-0000000001.log").write_bytes(b"\x00" * 64)
    (path / COMPLETE).write_bytes(b"")
    reader = replica(node)
    assert reader.source == "secondary" and "checksum" in reader.log_error
    assert body(await reader.read(KEY)) == b"from rocksdb"
    reader.close()
    node.close()


async def test_a_log_the_store_builds_anew_is_left_for_the_secondary_until_it_is_whole(tmp_path) -> None:
    """A store that found its log damaged removes it and builds it again from RocksDB: a replica that
    followed the old one reads the secondary meanwhile, never a half-built log's misses."""
    node = Node(tmp_path)
    node.put(KEY, b"page")
    reader = replica(node, interval_s=0.01, poll_s=0.01)
    assert reader.source == "pagelog"
    reader.start()
    node.log.close()
    remove_tree(node.log.path)  # what the store does to a log it cannot read
    node.open_log(complete=False)
    deadline = asyncio.get_running_loop().time() + 10
    while reader.source != "secondary":
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert body(await reader.read(KEY)) == b"page"
    node.log.append([Item(key_hash(KEY), node.store.get(KEY.encode()), node.versions[KEY], 1, 2)])
    mark_complete(node.log.path)
    while reader.source != "pagelog":
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert body(at_once(reader.read(KEY))) == b"page"
    reader.close()
    node.close()
