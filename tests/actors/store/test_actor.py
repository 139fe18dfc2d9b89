"""The NodeStore's conditional writes: what a sitemap walk creates its new targets with, and what a
patch writes only over the target it read; its exact counts and its freshness records. A real NodeStore
on real RocksDB, without Ray: the actor is a thin shell over it (a restart of its process by Ray is the
controller's and the keeper's tests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prerender_ray import logs
from prerender_ray.actors.store.actor import NodeStore
from prerender_ray.storage.registry import Target, target_key
from tests.support import node_config


def open_store(data: Path, node: str = "node-a") -> NodeStore:
    return NodeStore(node_config(data), node, str(data), log=logs.get("store"))


@pytest.fixture
def data(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def store(data) -> AsyncIterator[NodeStore]:
    s = open_store(data)
    yield s
    await s.close()


async def test_apply_absent_creates_only_what_holds_nothing_live_and_returns_what_is_held(store) -> None:
    old, new = "https://s.test/old.xml", "https://s.test/new.xml"
    absent, live, deleted = (f"https://s.test/p/{name}" for name in ("absent", "live", "deleted"))
    held = Target(url=live, sitemap_url=old).encode()
    await store.apply([(target_key(live), held), (target_key(deleted), Target(url=deleted).encode())])
    await store.apply([(target_key(deleted), None)])  # a tombstone counts as absent

    puts = [[target_key(u), Target(url=u, sitemap_url=new).encode()] for u in (absent, live, deleted)]
    assert (await store.apply_absent(puts)) == [None, held, None]

    found = await store.get_targets([absent, live, deleted])
    assert [Target.decode(u, data).sitemap_url for u, data in zip((absent, live, deleted), found)] == [
        new, old, new]
    # the by-sitemap index is kept in step
    assert sorted((await store.urls_of_sitemap(new, 10))[0]) == [absent, deleted]
    assert (await store.urls_of_sitemap(old, 10)) == ([live], 1)
    # a replay writes nothing: every key now holds a live record
    assert (await store.apply_absent(puts)) == [puts[0][1], held, puts[2][1]]
    assert (await store.apply_absent([])) == []


async def test_apply_absent_can_count_a_recent_delete_as_held(store) -> None:
    """What a bot saw at the origin may predate a delete: discovery's put must not undo it."""
    url = "https://s.test/p/retired-now"
    await store.apply([(target_key(url), Target(url=url).encode())])
    await store.apply([(target_key(url), None)])
    put = [[target_key(url), Target(url=url).encode()]]
    assert (await store.apply_absent(put, 60_000)) == [b""]
    assert (await store.get_targets([url])) == [None]
    await asyncio.sleep(0.05)
    assert (await store.apply_absent(put, 1)) == [None]  # an older delete does not count
    assert (await store.get_targets([url])) != [None]


async def test_counts_are_exact_through_overwrites_deletes_replays_and_a_restart(store, data) -> None:
    # Before: pages came from RocksDB's key estimate (30 for 10 pages: every page is three keys),
    # and the overview showed a snapshot up to 15 minutes old.
    from prerender_ray.storage.replication import wrap_many

    before = await store.counts()
    pages = [(f"https://c.test/{i}|desktop".encode(), b"page %d" % i) for i in range(10)]
    await store.apply([], pages)
    await store.apply([], pages[:3])  # overwrites
    await store.apply([], [(pages[3][0], None), (pages[4][0], None),
                       (b"https://c.test/never|desktop", None)])  # two deletes, one of nothing
    await store.apply([], [(pages[5][0], b"again"), (pages[5][0], None)])  # one key twice in a batch
    targets = [(target_key(f"https://c.test/{i}"), Target(url=f"https://c.test/{i}").encode()) for i in range(4)]
    await store.apply(targets + [(b"c:control", b"{}")])  # a control row is no target
    await store.apply([(targets[0][0], None)])
    # a peer's records: one new page, one newer tombstone, one stale copy of a live page
    peer = wrap_many("node-z", 1 << 62, [b"from a peer", None])
    stale = wrap_many("node-z", 1, [b"old"])
    await store.apply_remote([["pages", b"https://c.test/peer|desktop", peer[0]],
                              ["pages", pages[6][0], peer[1]],
                              ["pages", pages[7][0], stale[0]]])
    want = {"pages": before["pages"] + 10 - 2 - 1 + 1 - 1, "targets": before["targets"] + 3}
    assert (await store.counts()) == want

    await store.close()  # the count is kept in the store itself, with every batch
    again = open_store(data)
    try:
        assert (await again.counts()) == want
    finally:
        await again.close()


async def test_a_freshness_record_replicates_and_applies_only_to_a_newer_write_of_its_etag(store, tmp_path) -> None:
    from prerender_ray.storage.pages import Page
    from prerender_ray.storage.replication import unwrap, wrap_many
    from prerender_ray.storage.touches import Touch, touch_key

    key = "https://f.test/p|desktop"
    page = Page(cache_key=key, status_code=200, headers={"etag": '"a"'}, last_cached=1_000, expires_at=2_000,
                content=b"<html>a</html>")

    async def expires(s: NodeStore) -> int:
        return Page.decode((await s.get_pages([key]))[0]).expires_at

    async def shipped() -> dict[bytes, bytes]:  # what a peer pulls (and what is shipped to it)
        return {r[1]: r[2] for r in (await store.since("pages", 0, None, 10_000))["records"]
                if r[1] in (key.encode(), touch_key(key))}

    before = (await store.counts())["pages"]
    await store.apply([], [(key.encode(), page.encode())])
    await store.apply([], [(touch_key(key), Touch(key, '"a"', 5_000, 9_000).encode())])
    assert (await expires(store)) == 9_000
    [meta] = await store.page_metas([key])
    assert (meta.last_cached, meta.expires_at, meta.headers) == (5_000, 9_000, page.headers)
    listed = (await store.page_keys("https://f.test/", None, 10))["pages"]
    assert [(k, Page.decode(v).expires_at) for k, v in listed] == [(key, 9_000)]  # the touch is no page
    assert (await store.counts())["pages"] == before + 1

    first = await shipped()
    assert set(first) == {key.encode(), touch_key(key)}
    peer = open_store(tmp_path / "peer", "node-z")
    await peer.apply_remote([["pages", k, first[k]] for k in (touch_key(key), key.encode())])  # touch first
    assert (await expires(peer)) == 9_000 and (await peer.counts())["pages"] == 1

    # A full write of the same ETag: the touch is deleted in its batch, and a peer that has the new
    # page but not yet that delete ignores its older touch
    await store.apply([], [(key.encode(), page.encode())])
    second = await shipped()
    assert (await expires(store)) == 2_000 and unwrap(second[touch_key(key)])[1] is None  # a tombstone
    await peer.apply_remote([["pages", key.encode(), second[key.encode()]]])
    assert (await expires(peer)) == 2_000

    # A touch of another content, however new, never extends this page
    newest = unwrap(second[touch_key(key)])[0].hlc + (1 << 32)
    other = wrap_many("node-y", newest, [Touch(key, '"b"', 7_000, 99_000).encode()])[0]
    await peer.apply_remote([["pages", touch_key(key), other]])
    assert (await expires(peer)) == 2_000
    await peer.close()


async def test_apply_if_writes_only_over_the_payload_that_was_read(store) -> None:
    same, changed, deleted = (f"https://s.test/if/{name}" for name in ("same", "changed", "deleted"))
    was = {u: Target(url=u).encode() for u in (same, changed, deleted)}
    await store.apply([(target_key(u), p) for u, p in was.items()])
    now = Target(url=changed, sitemap_url="https://s.test/other.xml").encode()
    await store.apply([(target_key(changed), now), (target_key(deleted), None)])

    patch = {u: Target(url=u, sitemap_url="https://s.test/new.xml").encode() for u in was}
    ops = [[target_key(u), p] for u, p in patch.items()]
    assert (await store.apply_if(ops, list(was.values()))) == [True, False, False]
    assert (await store.get_targets([same, changed, deleted])) == [patch[same], now, None]
    # None expects nothing live: a write over a tombstone
    assert (await store.apply_if([ops[2]], [None])) == [True]
    assert (await store.get_targets([deleted])) == [patch[deleted]]
    with pytest.raises(ValueError, match="one expected payload per op"):
        await store.apply_if(ops, [])
