"""One copy of each page on disk (issue 37): while its page log is complete, the node store keeps a
page's bytes in the log alone and a stub in the pages RocksDB, and every read hands out the whole
record; a stub the log cannot resolve after a crash or a lost log is settled, never served torn. A
real NodeStore (no Ray) on real RocksDB and a real page log."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from prerender_ray import logs, metrics
from prerender_ray.actors.store.actor import NodeStore
from prerender_ray.identity.membership import Membership
from prerender_ray.storage.keys import HPTR
from prerender_ray.storage.pagelog import PageLogFull, thinning
from prerender_ray.storage.pagelog.mirror import raw_reads
from prerender_ray.storage.replication import Version, hlc_bytes, is_stub, payload_of, stub, wrap
from prerender_ray.storage.rocks import pagelog_path, remove_tree, store_path
from tests.actors.store.test_page_log import hit, legacy, payload, refused_part_way, stepped, store
from tests.actors.store.test_replication import Net, _until
from tests.support import node_config

BODY = b"<html>" + b"lorem ipsum dolor sit amet " * 1_200 + b"</html>"  # about 32 KB, as a rendered page


def raw(s, key: str) -> bytes | None:
    return raw_reads(s.pages)([key.encode()])[0]


async def lost_log(tmp_path: Path, keys: list[str]) -> None:
    """``keys`` stored (one copy) by a store that then closed, and its page log lost (its disk replaced, say)."""
    s = store(tmp_path)
    await s.apply(pages=[(k.encode(), payload(k)) for k in keys])
    await s.close()
    remove_tree(pagelog_path(tmp_path, "node-a"))


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def test_rocksdb_keeps_a_stub_and_every_read_gets_the_whole_record_from_the_log(tmp_path) -> None:
    s = store(tmp_path)
    try:
        a, b = "https://s.test/a|desktop", "https://s.test/b|desktop"
        await s.apply(pages=[(a.encode(), payload(a, body=BODY))])
        replicated = wrap(Version(s.clock.now().hlc + 10, "node-b"), payload(b, body=BODY))
        assert await s.apply_remote([["pages", b.encode(), replicated]]) == 1
        assert (await s.status())["pageLog"]["oneCopy"]
        for key in (a, b):
            stub = raw(s, key)
            assert stub is not None and is_stub(stub) and len(stub) < 40  # version and writer, no page
            whole = s.pages.get(key.encode())
            assert whole == hit(tmp_path, key).data and hlc_bytes(whole) == hlc_bytes(stub)
            assert dict(s.pages.items(key.encode()))[key.encode()] == whole  # scans too
        assert s.pages.get(b.encode()) == replicated
        assert await s.get_pages([a, b]) == [payload(a, body=BODY), payload(b, body=BODY)]
        assert [r[0] for r in await s.stored_pages([a])] == [s.pages.get(a.encode())]
        assert await s.has_pages([a, b, "https://s.test/none|desktop"]) == [True, True, False]
        shipped = {bytes(r[1]): r[2] for r in (await s.since("pages", 0, None))["records"]}
        assert shipped[a.encode()] == s.pages.get(a.encode()) and not is_stub(shipped[a.encode()])  # peers get pages
        listed = await s.page_keys("https://s.test/", None, 10)
        assert [k for k, _ in listed["pages"]] == [a, b] and listed["total"] == 2
        await s.apply(pages=[(a.encode(), None)])
        assert s.pages.get(a.encode()) is not None and payload_of(s.pages.get(a.encode())) is None  # a tombstone
        assert hit(tmp_path, a) is None and s.records.live["pages"] == 1
    finally:
        await s.close()


async def test_a_page_is_on_disk_once(tmp_path) -> None:
    s = store(tmp_path)
    keys = [f"https://s.test/p{i}|desktop" for i in range(300)]
    try:
        for i in range(0, len(keys), 50):
            await s.apply(pages=[(k.encode(), payload(k, body=os.urandom(30_000))) for k in keys[i:i + 50]])
        live = (await s.status())["pageLog"]["liveBytes"]
        assert live > 300 * 30_000
    finally:
        await s.close()  # flushes the memtable: RocksDB's share is on disk
    pages_db = dir_bytes(store_path(tmp_path, "node-a", "pages"))
    log = dir_bytes(pagelog_path(tmp_path, "node-a"))
    assert log >= live and pages_db < live / 10, (pages_db, log, live)


async def test_pages_written_whole_before_are_thinned_to_stubs_by_a_walk_while_the_store_serves(tmp_path,
                                                                                                monkeypatch) -> None:
    keys = [f"https://s.test/p{i:02d}|desktop" for i in range(40)]
    s = legacy(tmp_path)  # a release before one copy: whole records in RocksDB (bodies it cannot compress)
    await s.apply(pages=[(k.encode(), payload(k, body=os.urandom(30_000))) for k in keys])
    wholes = {k: raw(s, k) for k in keys}
    await s.close()
    monkeypatch.setattr(thinning, "CHUNK_KEYS", 8)
    s = stepped(tmp_path)
    try:
        assert s.page_log.thinning is not None and not any(is_stub(raw(s, k)) for k in keys)
        assert [s.pages.get(k.encode()) for k in keys] == list(wholes.values())  # read as before
        steps = 0
        while s.page_log.thinning is not None:
            if steps == 2:  # writes meanwhile, behind and ahead of the walk
                await s.apply(pages=[(keys[0].encode(), payload(keys[0], body=b"v2")), (keys[30].encode(), None),
                                     (keys[35].encode(), payload(keys[35], body=b"v2"))])
            s.page_log.thin_some(0)
            steps += 1
        assert steps >= 40 // 8
        # RocksDB's copies left the disk with the walk's compaction (a fifth of the whole records at most)
        assert dir_bytes(store_path(tmp_path, "node-a", "pages")) < sum(len(w) for w in wholes.values()) / 5
        for k in keys:
            if k == keys[30]:
                assert payload_of(s.pages.get(k.encode())) is None and hit(tmp_path, k) is None
                continue
            assert is_stub(raw(s, k)) and s.pages.get(k.encode()) == hit(tmp_path, k).data
            if k not in (keys[0], keys[35]):
                assert s.pages.get(k.encode()) == wholes[k]
        assert payload_of(s.pages.get(keys[35].encode())) == payload(keys[35], body=b"v2")
        assert s.records.live["pages"] == 39 and thinning.thinned(s.pages)
    finally:
        await s.close()
    s = stepped(tmp_path)
    try:
        assert s.page_log.thinning is None  # walked once: not again at every open
    finally:
        await s.close()
    remove_tree(pagelog_path(tmp_path, "node-a"))
    s = stepped(tmp_path)  # a build: whole records again, so the walk is owed again
    try:
        assert not thinning.thinned(s.pages)
    finally:
        await s.close()


async def test_a_batch_refused_part_way_over_stubs_is_put_back_and_never_rolled_forward(tmp_path) -> None:
    s = stepped(tmp_path)
    try:
        keys = [f"https://s.test/{i}|desktop" for i in range(3)]
        olds = await refused_part_way(s, keys)
        assert all(is_stub(raw(s, k)) for k in keys)
        assert s.page_log.mirror.previous  # the entries the refused batch replaced
        try:
            s.page_log.turn()  # still full: the repair waits, and so does compaction
        except PageLogFull:
            pass
        assert s.page_log.mirror.dirty and s.page_log.mirror.previous
        s.page_log.writer._write = os.pwrite
        s.page_log.turn()
        assert not s.page_log.mirror.dirty and not s.page_log.mirror.previous
        assert [s.pages.get(k.encode()) for k in keys] == olds  # the refused write never landed
        assert [hit(tmp_path, k).data for k in keys] == olds
        assert not s.page_log.mirror.unresolved
    finally:
        await s.close()


async def test_a_crash_between_the_log_and_rocksdb_completes_the_write_on_the_next_open(tmp_path) -> None:
    a = "https://s.test/a|desktop"
    s = store(tmp_path)
    await s.apply(pages=[(a.encode(), payload(a))])
    v1 = s.pages.get(a.encode())
    v2 = wrap(Version(s.clock.now().hlc + 5, "node-a"), payload(a, body=b"v2"))
    with s.page_log.mirror.lock:  # the log's half of the write, and then the process died
        s.page_log.mirror.before_write([(a.encode(), v2)])
    await s.close()
    s = stepped(tmp_path)
    try:
        assert s.page_log.mirror.unresolved == {a.encode()} and s.pages.get(a.encode()) is None  # never v1's bytes
        applied = metrics.pagelog_settled.labels("applied")._value.get()
        s.page_log.settle(s.records)
        assert s.pages.get(a.encode()) == v2 == hit(tmp_path, a).data and v1 != v2
        assert s.pages.get(HPTR + a.encode())[:8] == hlc_bytes(v2) and is_stub(raw(s, a))
        assert metrics.pagelog_settled.labels("applied")._value.get() == applied + 1
        assert s.records.live["pages"] == 1 and not s.page_log.mirror.unresolved
    finally:
        await s.close()


async def test_a_lost_log_drops_its_stubs_so_holders_or_a_render_fill_them_again(tmp_path) -> None:
    keys = [f"https://s.test/{i}|desktop" for i in range(5)]
    await lost_log(tmp_path, keys)
    s = stepped(tmp_path)
    try:
        assert s.page_log.build is None and (await s.status())["pageLog"]["oneCopy"]  # nothing to copy: built
        assert s.page_log.mirror.unresolved == {k.encode() for k in keys}
        assert await s.get_pages(keys) == [None] * 5  # nothing torn or empty is handed out meanwhile
        s.page_log.settle(s.records)
        assert await s.has_pages(keys) == [False] * 5 and s.records.live["pages"] == 0
        assert all(raw(s, k) is None and s.pages.get(HPTR + k.encode()) is None for k in keys)
        assert (await s.status())["pageLog"]["settled"]["dropped"] == 5
        await s.apply(pages=[(keys[0].encode(), payload(keys[0], body=b"again"))])  # a render fills it again
        assert payload_of(s.pages.get(keys[0].encode())) == payload(keys[0], body=b"again")
        assert hit(tmp_path, keys[0]) is not None
    finally:
        await s.close()



async def test_a_peers_stub_is_never_taken_for_a_page(tmp_path) -> None:
    s = store(tmp_path)
    try:
        a = "https://s.test/a|desktop"
        record = wrap(Version(s.clock.now().hlc + 10, "node-b"), payload(a))
        assert await s.apply_remote([["pages", a.encode(), stub(record)]]) == 0
        assert s.pages.get(a.encode()) is None and s.records.live["pages"] == 0
    finally:
        await s.close()


async def test_a_settling_the_disk_refuses_is_owed_again_not_forgotten(tmp_path) -> None:
    a = "https://s.test/a|desktop"
    await lost_log(tmp_path, [a])
    s = stepped(tmp_path)
    try:

        class Refusing:
            def drop_local(self, name, items):
                raise PageLogFull("no space left on device")

        try:
            s.page_log.settle(Refusing())
            raise AssertionError("not raised")
        except PageLogFull:
            pass
        assert s.page_log.mirror.unresolved == {a.encode()}  # the next turn settles it
        s.page_log.settle(s.records)
        assert not s.page_log.mirror.unresolved and await s.has_pages([a]) == [False]
    finally:
        await s.close()


async def test_pages_lost_with_a_page_log_are_refilled_from_their_other_holder(tmp_path) -> None:
    """Two real stores, each with its page log; node-a's log is lost while it is down. At its next
    start its stubs of those pages are dropped, and it asks node-b for them again."""
    net: dict = {}
    names = ["node-a", "node-b"]

    def open_store(name: str) -> NodeStore:
        s = NodeStore(node_config(tmp_path), name, str(tmp_path), membership=Membership.of(1, names).to_wire(),
                      stores=Net(net), log=logs.get("store"))
        net[name] = s
        return s

    keys = [f"https://s.test/{i}|desktop" for i in range(30)]
    a, b = open_store("node-a"), open_store("node-b")
    try:
        await a.apply(pages=[(k.encode(), payload(k, body=BODY)) for k in keys])
        await _until(lambda: all(b.pages.get(k.encode()) is not None for k in keys), "node-b's copies")
        held = [a.pages.get(k.encode()) for k in keys]
        await a.close()
        net.pop("node-a")
        remove_tree(pagelog_path(tmp_path, "node-a"))
        a = open_store("node-a")
        for t in a._tasks:  # its maintenance driven here, after its own catch-up (which may pull them too)
            if t.get_coro().__qualname__ == "StorePageLog.run":  # type: ignore[union-attr]
                t.cancel()
        await asyncio.wait_for(a.catch_up.synced.wait(), 30)
        assert await a.get_pages(keys) == [None] * len(keys)  # stubs the log cannot resolve: absent
        lost = a.page_log.settle(a.records)
        assert sorted(lost) == sorted(k.encode() for k in keys) and await a.has_pages(keys) == [False] * len(keys)
        assert await a.catch_up.refill(lost) == len(keys)  # applied: none held them meanwhile
        assert [a.pages.get(k.encode()) for k in keys] == held  # the very records, versions and all
        assert all(is_stub(raw(a, k)) for k in keys) and all(hit(tmp_path, k) is not None for k in keys)
    finally:
        await a.close()
        await b.close()


async def test_the_maintenance_task_settles_lost_pages_and_asks_for_them_again(tmp_path) -> None:
    keys = [f"https://s.test/{i}|desktop" for i in range(3)]
    await lost_log(tmp_path, keys)
    s = store(tmp_path)  # its maintenance task running
    asked: list = []

    async def refill(lost: list[bytes]) -> int:
        asked.append(sorted(lost))
        return 0

    s.page_log.refill = refill  # (before the task's first turn: nothing has awaited since the open)
    try:
        await _until(lambda: asked, "the task's settling", timeout=10)
        assert asked == [sorted(k.encode() for k in keys)] and s.page_log.settled["dropped"] == 3
    finally:
        await s.close()
