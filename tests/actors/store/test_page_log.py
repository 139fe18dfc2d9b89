"""The node store writes its page log (actors/store/page_log.py): every kind of pages write shows in a
reader of the same directory, a full disk refuses the batch whole, and a store killed mid-append
reopens with every acknowledged page in its log. A real NodeStore (no Ray) on real RocksDB."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prerender_ray import logs, metrics
from prerender_ray.actors.store.actor import NodeStore
from prerender_ray.storage.keys import HPTR
from prerender_ray.storage.pagelog import PageLogFull, PageLogReader, build, key_hash, thinning
from prerender_ray.storage.pagelog.files import is_complete
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Version, hlc_bytes, payload_of, wrap
from prerender_ray.storage.rocks import pagelog_path, remove_tree
from prerender_ray.storage.touches import Touch, touch_key
from tests.storage.test_pagelog_recovery import full_after
from tests.support import REPO, node_config


def payload(key: str, *, body: bytes = b"<html>x</html>", etag: str = '"e1"', expires: int = 9_000) -> bytes:
    return Page(cache_key=key, status_code=200, headers={"etag": etag}, last_cached=1_000, expires_at=expires,
                content=body).encode()


def store(tmp_path: Path) -> NodeStore:
    return NodeStore(node_config(tmp_path), "node-a", str(tmp_path), log=logs.get("store"))


def legacy(tmp_path: Path) -> NodeStore:
    """A store writing as a release before one copy on disk did: whole records in RocksDB too, so the
    log may be taken away (as before the page log) and built from them."""
    s = store(tmp_path)
    s.page_log.mirror.stubs = False
    thinning.owe(s.pages)  # (no mark of a walk: that release had none)
    return s


def hit(tmp_path: Path, key: str):
    r = PageLogReader(pagelog_path(tmp_path, "node-a"))
    try:
        return r.get(key_hash(key))
    finally:
        r.close()


async def test_local_replicated_freshness_and_delete_writes_all_show_in_the_log(tmp_path) -> None:
    s = store(tmp_path)
    try:
        a, b = "https://s.test/a|desktop", "https://s.test/b|desktop"
        await s.apply(pages=[(a.encode(), payload(a))])
        got = hit(tmp_path, a)
        assert got is not None and got.data == s.pages.get(a.encode()) and got.expires_at == 9_000
        assert got.version == int.from_bytes(hlc_bytes(got.data), "big")
        replicated = wrap(Version(s.clock.now().hlc + 10, "node-b"), payload(b))
        assert await s.apply_remote([["pages", b.encode(), replicated]]) == 1
        got = hit(tmp_path, b)
        assert got is not None and got.data == replicated
        await s.apply(pages=[(touch_key(a), Touch(a, '"e1"', 5_000, 60_000).encode())])
        got = hit(tmp_path, a)
        assert got is not None and (got.last_cached, got.expires_at) == (5_000, 60_000)
        await s.apply(pages=[(a.encode(), None)])
        assert hit(tmp_path, a) is None and hit(tmp_path, b) is not None
        status = (await s.status())["pageLog"]
        assert status["entries"] == 1 and status["liveBytes"] > len(replicated) and status["diskBytes"] > 0
    finally:
        await s.close()


async def test_a_full_disk_refuses_the_pages_and_the_registry_with_them_and_raises_the_alert(tmp_path) -> None:
    s = store(tmp_path)
    try:
        a = "https://s.test/a|desktop"
        await s.apply(pages=[(a.encode(), payload(a))])
        held = s.pages.get(a.encode())
        before = (s.records.live["pages"], s.pages.get(HPTR + a.encode()))
        refused = metrics.pagelog_refused.labels("full")._value.get()
        s.page_log.writer._write = full_after(0)
        target = (b"t:https://s.test/a", b'{"url": "https://s.test/a"}')
        with pytest.raises(PageLogFull):
            await s.apply([target], pages=[(a.encode(), payload(a, body=b"new")), (b"https://s.test/c|desktop",
                                                                              payload("https://s.test/c|desktop"))])
        assert s.pages.get(a.encode()) == held and (s.records.live["pages"], s.pages.get(HPTR + a.encode())) == before
        assert s.registry.get(target[0]) is None  # the result's other writes were not made either
        assert metrics.pagelog_full._value.get() == 1
        assert metrics.pagelog_refused.labels("full")._value.get() == refused + 1
        assert (await s.status())["pageLog"]["refusing"]
        got = hit(tmp_path, a)
        assert got is not None and got.data == held  # hits keep being served
        s.page_log.writer._write = os.pwrite  # space again: the fleet's retry goes in
        await s.apply([target], pages=[(a.encode(), payload(a, body=b"new"))])
        assert metrics.pagelog_full._value.get() == 0 and hit(tmp_path, a).data == s.pages.get(a.encode())
    finally:
        await s.close()


async def refused_part_way(s: NodeStore, keys: list[str]) -> list[bytes | None]:
    """``keys`` written, then a second version of them refused by a full disk part way through (the
    bodies go in, their index records not all); the records held before it."""
    await s.apply(pages=[(k.encode(), payload(k)) for k in keys])
    olds = [s.pages.get(k.encode()) for k in keys]
    size = sum(len(wrap(Version(0, "node-a"), payload(k, body=b"v2"))) + 28 for k in keys)
    s.page_log.writer._write = full_after(size + 64 + 10)
    with pytest.raises(PageLogFull):
        await s.apply(pages=[(k.encode(), payload(k, body=b"v2")) for k in keys])
    return olds


async def test_maintenance_repairs_a_batch_refused_part_way(tmp_path) -> None:
    s = store(tmp_path)
    try:
        keys = [f"https://s.test/{i}|desktop" for i in range(3)]
        olds = await refused_part_way(s, keys)
        assert hit(tmp_path, keys[0]).data != olds[0] and s.page_log.mirror.dirty
        s.page_log.writer._write = os.pwrite
        s.page_log.turn()
        assert not s.page_log.mirror.dirty and [hit(tmp_path, k).data for k in keys] == olds
    finally:
        await s.close()


CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    from prerender_ray import logs
    from prerender_ray.actors.store.actor import NodeStore
    from prerender_ray.storage.pages import Page
    from tests.support import node_config

    data, mode = sys.argv[1], sys.argv[2]

    async def main():
        s = NodeStore(node_config(data), "node-a", data, log=logs.get("store"))
        if mode == "between":  # killed after the log took the batch, before RocksDB did
            real = type(s.pages).__mro__[1].write
            def write(self, ops):
                if any(k == b"https://s.test/doomed|desktop" for k, _ in ops):
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(self, ops)
            type(s.pages).__mro__[1].write = write
        i = 0
        while True:
            keys = [f"https://s.test/{i}-{j}|desktop" for j in range(50)]
            if mode == "between" and i == 3:  # a new page, and a new version of an acknowledged one
                keys = ["https://s.test/doomed|desktop", "https://s.test/0-0|desktop"]
            await s.apply(pages=[(k.encode(), Page(cache_key=k, status_code=200, last_cached=1, expires_at=2,
                                                   content=os.urandom(20_000)).encode()) for k in keys])
            print("ACK", i, flush=True)  # acknowledged
            i += 1

    asyncio.run(main())
""")


@pytest.mark.parametrize("mode", ["mid-append", "between"])
async def test_a_store_killed_mid_write_reopens_with_every_acknowledged_page_in_its_log(tmp_path, mode) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), mode], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    acked = -1
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # ends when the child dies ("between" kills itself)
            if not line.startswith("ACK "):
                continue  # its log lines
            acked = int(line.split()[1])
            if mode == "mid-append" and acked == 20:
                proc.send_signal(signal.SIGKILL)  # while it appends the next batches
                break
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert acked >= (2 if mode == "between" else 20)
    if mode == "between":  # the log holds a batch RocksDB never got
        r = PageLogReader(pagelog_path(tmp_path, "node-a"))
        assert key_hash("https://s.test/doomed|desktop") in r
        r.close()
    s = store(tmp_path)  # reopen: reconcile
    try:
        assert s.page_log.last is not None
        if mode == "between":  # RocksDB's stub names the version before: the write completes (one copy)
            s.page_log.settle(s.records)
            assert s.page_log.settled == {"applied": 1, "dropped": 0, "refilled": 0}
            assert not s.page_log.mirror.unresolved
        r = PageLogReader(pagelog_path(tmp_path, "node-a"))
        for i in range(acked + 1):
            for j in range(50):
                key = f"https://s.test/{i}-{j}".encode() + b"|desktop"
                got = r.get(key_hash(key.decode()))
                assert got is not None and got.data == s.pages.get(key), key
        served = 0
        for kh in list(r.entries):
            got = r.get(kh)
            assert got is not None and payload_of(got.data) is not None  # never torn
            served += 1
        assert served == s.records.live["pages"] and r.unreadable == 0
        assert key_hash("https://s.test/doomed|desktop") not in r
        r.close()
    finally:
        await s.close()



async def test_a_store_of_pages_without_a_log_builds_it_and_only_then_marks_it_complete(tmp_path) -> None:
    a = "https://s.test/a|desktop"
    s = legacy(tmp_path)
    await s.apply(pages=[(a.encode(), payload(a))])
    await s.close()
    remove_tree(pagelog_path(tmp_path, "node-a"))  # pages written by a release before the log
    s = store(tmp_path)
    try:
        assert is_complete(pagelog_path(tmp_path, "node-a"))  # readers may follow it now
        got = hit(tmp_path, a)
        assert got is not None and got.data == s.pages.get(a.encode())
    finally:
        await s.close()



async def old_pages(tmp_path: Path, n: int) -> list[str]:
    """A store holding ``n`` pages and no page log (written by a release before the log)."""
    keys = [f"https://s.test/p-{i:03d}|desktop" for i in range(n)]
    s = legacy(tmp_path)
    await s.apply(pages=[(k.encode(), payload(k)) for k in keys])
    await s.close()
    remove_tree(pagelog_path(tmp_path, "node-a"))
    return keys


def stepped(tmp_path: Path) -> NodeStore:
    """A store whose page log maintenance the test drives, one chunk at a time (its task cancelled)."""
    s = store(tmp_path)
    for t in s._tasks:
        if t.get_coro().__qualname__ == "StorePageLog.run":  # type: ignore[union-attr]
            t.cancel()
    return s


def assert_served(tmp_path: Path, s: NodeStore, keys: list[str]) -> None:
    for k in keys:
        got = hit(tmp_path, k)
        assert got is not None and got.data == s.pages.get(k.encode()), k


async def test_a_store_over_pages_without_a_log_serves_at_once_and_builds_the_log_in_chunks(tmp_path,
                                                                                          monkeypatch) -> None:
    keys = await old_pages(tmp_path, 60)
    monkeypatch.setattr(build, "CHUNK_KEYS", 8)
    s = stepped(tmp_path)
    path = pagelog_path(tmp_path, "node-a")
    try:
        status = (await s.status())["pageLog"]
        assert status["building"] is not None and status["building"]["pages"] == 8  # one chunk at open
        assert status["building"]["total"] == 60 and not status["reconciled"] and not is_complete(path)
        ahead, behind, new = keys[50], keys[0], "https://s.test/new|desktop"
        await s.apply(pages=[(ahead.encode(), payload(ahead, body=b"v2")), (new.encode(), payload(new))])
        assert (await s.get_pages([ahead]))[0] == payload(ahead, body=b"v2")  # a write and a read answered
        assert hit(tmp_path, ahead).data == s.pages.get(ahead.encode())  # the write is in the log already
        steps = 0
        while s.page_log.build is not None:
            assert not is_complete(path)  # readers keep to RocksDB until the build has passed every key
            if steps == 2:
                await s.apply(pages=[(behind.encode(), payload(behind, body=b"v3")),
                                     (keys[40].encode(), None)])
            s.page_log.build_some(0)
            steps += 1
        assert steps >= 60 // 8 - 1 and is_complete(path)
        status = (await s.status())["pageLog"]
        assert status["building"] is None and status["reconciled"] and status["entries"] == 60
        assert_served(tmp_path, s, [k for k in keys if k != keys[40]] + [new])
        assert hit(tmp_path, keys[40]) is None
        assert payload_of(hit(tmp_path, behind).data) == payload(behind, body=b"v3")  # the newest version
        assert payload_of(hit(tmp_path, ahead).data) == payload(ahead, body=b"v2")
    finally:
        await s.close()


async def test_a_build_cut_short_by_a_close_resumes_and_completes_on_the_next_open(tmp_path, monkeypatch) -> None:
    keys = await old_pages(tmp_path, 60)
    monkeypatch.setattr(build, "CHUNK_KEYS", 8)
    path = pagelog_path(tmp_path, "node-a")
    s = stepped(tmp_path)
    try:
        s.page_log.build_some(0)
        s.page_log.build_some(0)
        first = s.page_log.build.appended
        assert first == 24 and not is_complete(path)
    finally:
        await s.close()
    assert not is_complete(path)
    s = stepped(tmp_path)
    try:
        assert s.page_log.build is not None and not is_complete(path)
        while s.page_log.build is not None:
            s.page_log.build_some(0)
        assert is_complete(path) and s.page_log.last is not None
        assert s.page_log.last.appended == 60 - first  # what the first open built is not written again
        assert_served(tmp_path, s, keys)
    finally:
        await s.close()


async def test_the_maintenance_task_builds_the_log_and_marks_it_complete(tmp_path, monkeypatch) -> None:
    keys = await old_pages(tmp_path, 30)
    monkeypatch.setattr(build, "CHUNK_KEYS", 4)
    s = store(tmp_path)
    try:
        assert s.page_log.build is not None
        for _ in range(200):  # each turn passes a chunk at least; a deadline, not a sync
            if s.page_log.build is None:
                break
            await asyncio.sleep(0.05)
        assert s.page_log.build is None and is_complete(pagelog_path(tmp_path, "node-a"))
        assert_served(tmp_path, s, keys)
    finally:
        await s.close()
