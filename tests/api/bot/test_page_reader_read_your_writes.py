"""A replica reads its node's writes (api/bot/page_reader.py ``PageReader.read``): against a real RocksDB
primary written as the NodeStore writes it, read through real secondary instances, one per replica.
What a store wrote before a read began is what the read sees (or newer), never the view before it;
the catch-ups that takes are shared, and reads while the store writes nothing take none."""

from __future__ import annotations

import asyncio

from prerender_ray import metrics
from prerender_ray.api.bot.page_reader import PageReader
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Clock, stub, wrap
from prerender_ray.storage.rocks import Store
from prerender_ray.storage.write_mark import mark_path

KEYS = [f"https://x.com/{i}|desktop" for i in range(12)]


def _late() -> float:
    return metrics.serve_errors.labels("page-catch-up-late")._value.get()


def _put(primary: Store, clock: Clock, key: str, content: bytes) -> None:
    """As the NodeStore writes a page: one write, which returns before its caller is answered."""
    page = Page(cache_key=key, status_code=200, headers={"content-type": "text/html"}, content=content,
                last_cached=1, expires_at=2)
    primary.put(key.encode(), wrap(clock.now(), page.encode()))


def _body(found) -> bytes | None:
    return None if found is None else bytes(found.body)


async def test_every_replica_reads_a_write_made_right_after_its_last_catch_up(tmp_path) -> None:
    """The issue's case: a replica had just caught up (a miss, the timer) when the result was
    written; the next request, a few ms later, must not get the origin's page, nor an older one."""
    primary = Store(tmp_path / "pages")
    clock = Clock("n1")
    replicas = [PageReader(tmp_path / "pages", tmp_path / f"sec-{i}") for i in range(2)]
    for version in range(3):  # 1: a miss before, a page after; 2, 3: never the version before
        for key in KEYS:
            for reader in replicas:
                await reader.read(key)
                reader.catch_up(force=True)  # as a miss or the timer had, just before the write
            _put(primary, clock, key, b"v%d" % version)
            for _ in range(6):
                for reader in replicas:
                    assert _body(await reader.read(key)) == b"v%d" % version, (key, version)
    for reader in replicas:
        reader.close()
    primary.close()


async def test_reads_at_once_through_every_replica_see_the_write_and_share_one_catch_up_each(tmp_path) -> None:
    primary = Store(tmp_path / "pages")
    clock = Clock("n1")
    replicas = [PageReader(tmp_path / "pages", tmp_path / f"sec-{i}") for i in range(2)]
    for key in KEYS:
        _put(primary, clock, key, b"written")
    before = [r.waited for r in replicas]
    found = await asyncio.gather(*(r.read(k) for k in KEYS for r in replicas for _ in range(20)))
    assert [_body(f) for f in found] == [b"written"] * len(KEYS) * len(replicas) * 20
    assert [r.waited - b for r, b in zip(replicas, before)] == [1, 1]  # 240 reads each, one catch-up
    for reader in replicas:
        reader.close()
    primary.close()


async def test_a_flood_of_misses_while_the_store_writes_nothing_takes_no_catch_up(tmp_path) -> None:
    primary = Store(tmp_path / "pages")
    _put(primary, Clock("n1"), KEYS[0], b"there")
    reader = PageReader(tmp_path / "pages", tmp_path / "sec")
    assert _body(await reader.read(KEYS[0])) == b"there"
    runs = reader.catch_ups
    found = await asyncio.gather(*(reader.read(f"https://x.com/absent/{i}|desktop") for i in range(2000)))
    assert found == [None] * 2000 and reader.catch_ups == runs
    reader.close()
    primary.close()


async def test_a_flood_of_misses_while_the_store_writes_takes_one_catch_up_per_gap(tmp_path) -> None:
    """Each wave of misses begins after a write: every wave waits for one catch-up, all its reads
    share it, and the catch-ups start ``gap_s`` apart at the least, however many reads."""
    primary = Store(tmp_path / "pages")
    clock = Clock("n1")
    reader = PageReader(tmp_path / "pages", tmp_path / "sec", gap_s=0.02)
    starts = []  # when each catch-up began (monotonic)
    for wave in range(5):
        _put(primary, clock, KEYS[wave], b"w")
        found = await asyncio.gather(*(reader.read(f"https://x.com/absent/{i}|desktop") for i in range(200)),
                                     reader.read(KEYS[wave]))
        assert found[-1] is not None and found[:-1] == [None] * 200
        starts.append(reader._caught_up)
    assert reader.waited == 5 and reader.catch_ups == 5
    assert all(b - a >= 0.02 * 0.99 for a, b in zip(starts, starts[1:])), starts
    assert all(b - a >= 0.02 * 0.99 for a, b in zip(starts, starts[1:])), starts
    reader.close()
    primary.close()


async def test_a_read_waits_for_a_catch_up_that_starts_after_it_began(tmp_path) -> None:
    """A read that comes while a catch-up is waiting for its turn shares it; the one after its
    start waits for the next: neither is answered by a replay that began before its write."""
    primary = Store(tmp_path / "pages")
    clock = Clock("n1")
    reader = PageReader(tmp_path / "pages", tmp_path / "sec", gap_s=0.05)
    reader.catch_up(force=True)
    _put(primary, clock, KEYS[0], b"first")
    first = asyncio.create_task(reader.read(KEYS[0]))
    await asyncio.sleep(0)  # scheduled, 50 ms out
    _put(primary, clock, KEYS[1], b"second")
    second = asyncio.create_task(reader.read(KEYS[1]))
    assert [_body(f) for f in await asyncio.gather(first, second)] == [b"first", b"second"]
    assert reader.waited == 1
    _put(primary, clock, KEYS[2], b"third")
    assert _body(await reader.read(KEYS[2])) == b"third" and reader.waited == 2
    reader.close()
    primary.close()


async def test_a_read_whose_catch_up_cannot_start_in_time_takes_the_view_it_has(tmp_path) -> None:
    primary = Store(tmp_path / "pages")
    reader = PageReader(tmp_path / "pages", tmp_path / "sec", gap_s=3600.0, wait_s=0.05)
    reader.catch_up(force=True)
    _put(primary, Clock("n1"), KEYS[0], b"late")
    late = _late()
    assert await reader.read(KEYS[0]) is None and _late() == late + 1  # by its deadline, not an hour
    waiter = asyncio.create_task(reader.sync())
    await asyncio.sleep(0)
    reader.close()  # a reader that closes lets its waiters go
    assert await waiter is True
    primary.close()


async def test_a_reader_started_before_its_store_reads_the_store_s_first_write(tmp_path) -> None:
    reader = PageReader(tmp_path / "pages", tmp_path / "sec")
    assert await reader.read(KEYS[0]) is None and not reader.ready
    primary = Store(tmp_path / "pages")
    _put(primary, Clock("n1"), KEYS[0], b"first")
    assert _body(await reader.read(KEYS[0])) == b"first"
    reader.close()
    primary.close()


async def test_a_restarted_store_and_a_mark_made_again_are_followed(tmp_path) -> None:
    primary = Store(tmp_path / "pages")
    clock = Clock("n1")
    reader = PageReader(tmp_path / "pages", tmp_path / "sec")
    _put(primary, clock, KEYS[0], b"before")
    assert _body(await reader.read(KEYS[0])) == b"before"
    primary.close()
    primary = Store(tmp_path / "pages")  # the count goes on from the file
    _put(primary, clock, KEYS[0], b"after a restart")
    assert _body(await reader.read(KEYS[0])) == b"after a restart"
    primary.close()
    mark_path(tmp_path / "pages").unlink()  # lost: the store makes a new one, the reader follows it
    primary = Store(tmp_path / "pages")
    _put(primary, clock, KEYS[0], b"after a new mark")
    reader.catch_up(force=True)  # the timer: it finds the file made again
    _put(primary, clock, KEYS[0], b"newest")
    assert _body(await reader.read(KEYS[0])) == b"newest"
    reader.close()
    primary.close()


async def test_a_stub_met_on_the_secondary_is_a_miss_not_an_unreadable_page(tmp_path) -> None:
    """While the store builds its page log again (its mark gone), a replica reads RocksDB; a page the
    lost log alone held is there as a stub (storage/replication.py): a miss, not an unreadable page."""
    primary = Store(tmp_path / "pages")
    clock = Clock("n1")
    _put(primary, clock, KEYS[0], b"whole")
    page = Page(cache_key=KEYS[1], status_code=200, headers={}, content=b"in the log", last_cached=1, expires_at=2)
    primary.put(KEYS[1].encode(), stub(wrap(clock.now(), page.encode())))
    reader = PageReader(tmp_path / "pages", tmp_path / "sec")
    assert _body(await reader.read(KEYS[0])) == b"whole"
    assert await reader.read(KEYS[1]) is None and await reader.record(KEYS[1]) is None  # (UnreadablePage raised)
    reader.close()
    primary.close()
