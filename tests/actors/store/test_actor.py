"""The NodeStore's conditional writes: what a sitemap walk creates its new targets with, and what a
patch writes only over the target it read."""

from __future__ import annotations

import time

import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.storage.registry import Target, target_key
from tests.support import deploy_on


@pytest.fixture(scope="module")
def deployed(ray_cluster, tmp_path_factory):
    d = deploy_on(ray_cluster, tmp_path_factory.mktemp("store") / "data")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def store(deployed):
    return lookup("store", "node-a")


def test_apply_absent_creates_only_what_holds_nothing_live_and_returns_what_is_held(store) -> None:
    old, new = "https://s.test/old.xml", "https://s.test/new.xml"
    absent, live, deleted = (f"https://s.test/p/{name}" for name in ("absent", "live", "deleted"))
    held = Target(url=live, sitemap_url=old).encode()
    ray.get(store.apply.remote([(target_key(live), held),
                                (target_key(deleted), Target(url=deleted).encode())]))
    ray.get(store.apply.remote([(target_key(deleted), None)]))  # a tombstone counts as absent

    puts = [[target_key(u), Target(url=u, sitemap_url=new).encode()] for u in (absent, live, deleted)]
    assert ray.get(store.apply_absent.remote(puts)) == [None, held, None]

    found = ray.get(store.get_targets.remote([absent, live, deleted]))
    assert [Target.decode(u, data).sitemap_url for u, data in zip((absent, live, deleted), found)] == [
        new, old, new]
    # the by-sitemap index is kept in step
    assert sorted(ray.get(store.urls_of_sitemap.remote(new, 10))[0]) == [absent, deleted]
    assert ray.get(store.urls_of_sitemap.remote(old, 10)) == ([live], 1)
    # a replay writes nothing: every key now holds a live record
    assert ray.get(store.apply_absent.remote(puts)) == [puts[0][1], held, puts[2][1]]
    assert ray.get(store.apply_absent.remote([])) == []


def test_apply_absent_can_count_a_recent_delete_as_held(store) -> None:
    """What a bot saw at the origin may predate a delete: discovery's put must not undo it."""
    url = "https://s.test/p/retired-now"
    ray.get(store.apply.remote([(target_key(url), Target(url=url).encode())]))
    ray.get(store.apply.remote([(target_key(url), None)]))
    put = [[target_key(url), Target(url=url).encode()]]
    assert ray.get(store.apply_absent.remote(put, 60_000)) == [b""]
    assert ray.get(store.get_targets.remote([url])) == [None]
    time.sleep(0.05)
    assert ray.get(store.apply_absent.remote(put, 1)) == [None]  # an older delete does not count
    assert ray.get(store.get_targets.remote([url])) != [None]


def test_counts_are_exact_through_overwrites_deletes_replays_and_a_restart(store) -> None:
    # Before: pages came from RocksDB's key estimate (30 for 10 pages: every page is three keys),
    # and the overview showed a snapshot up to 15 minutes old.
    from prerender_ray.storage.replication import wrap_many

    before = ray.get(store.counts.remote())
    pages = [(f"https://c.test/{i}|desktop".encode(), b"page %d" % i) for i in range(10)]
    ray.get(store.apply.remote([], pages))
    ray.get(store.apply.remote([], pages[:3]))  # overwrites
    ray.get(store.apply.remote([], [(pages[3][0], None), (pages[4][0], None),
                                    (b"https://c.test/never|desktop", None)]))  # two deletes, one of nothing
    ray.get(store.apply.remote([], [(pages[5][0], b"again"), (pages[5][0], None)]))  # one key twice in a batch
    targets = [(target_key(f"https://c.test/{i}"), Target(url=f"https://c.test/{i}").encode()) for i in range(4)]
    ray.get(store.apply.remote(targets + [(b"c:control", b"{}")]))  # a control row is no target
    ray.get(store.apply.remote([(targets[0][0], None)]))
    # a peer's records: one new page, one newer tombstone, one stale copy of a live page
    peer = wrap_many("node-z", 1 << 62, [b"from a peer", None])
    stale = wrap_many("node-z", 1, [b"old"])
    ray.get(store.apply_remote.remote([["pages", b"https://c.test/peer|desktop", peer[0]],
                                       ["pages", pages[6][0], peer[1]],
                                       ["pages", pages[7][0], stale[0]]]))
    want = {"pages": before["pages"] + 10 - 2 - 1 + 1 - 1, "targets": before["targets"] + 3}
    assert ray.get(store.counts.remote()) == want

    pid = ray.get(store.status.remote())["pid"]
    ray.kill(store, no_restart=False)  # the count is kept in the store itself, with every batch
    restarted = lookup("store", "node-a")
    got = None
    for _ in range(100):
        try:
            status = ray.get(restarted.status.remote(), timeout=5)
            if status["pid"] != pid:
                got = ray.get(restarted.counts.remote(), timeout=5)
                break
        except Exception:
            pass
        import time

        time.sleep(0.2)
    assert got == want


def test_a_freshness_record_replicates_and_applies_only_to_a_newer_write_of_its_etag(deployed, store, tmp_path) -> None:
    from prerender_ray.actors.store.actor import NodeStoreActor
    from prerender_ray.storage.pages import Page
    from prerender_ray.storage.replication import unwrap, wrap_many
    from prerender_ray.storage.touches import Touch, touch_key

    key = "https://f.test/p|desktop"
    page = Page(cache_key=key, status_code=200, headers={"etag": '"a"'}, last_cached=1_000, expires_at=2_000,
                content=b"<html>a</html>")

    def expires(s) -> int:
        return Page.decode(ray.get(s.get_pages.remote([key]))[0]).expires_at

    def shipped() -> dict[bytes, bytes]:  # what a peer pulls (and what is shipped to it)
        return {r[1]: r[2] for r in ray.get(store.since.remote("pages", 0, None, 10_000))["records"]
                if r[1] in (key.encode(), touch_key(key))}

    before = ray.get(store.counts.remote())["pages"]
    ray.get(store.apply.remote([], [(key.encode(), page.encode())]))
    ray.get(store.apply.remote([], [(touch_key(key), Touch(key, '"a"', 5_000, 9_000).encode())]))
    assert expires(store) == 9_000
    [meta] = ray.get(store.page_metas.remote([key]))
    assert (meta.last_cached, meta.expires_at, meta.headers) == (5_000, 9_000, page.headers)
    listed = ray.get(store.page_keys.remote("https://f.test/", None, 10))["pages"]
    assert [(k, Page.decode(v).expires_at) for k, v in listed] == [(key, 9_000)]  # the touch is no page
    assert ray.get(store.counts.remote())["pages"] == before + 1

    first = shipped()
    assert set(first) == {key.encode(), touch_key(key)}
    peer = NodeStoreActor.options(num_cpus=0).remote(deployed.config, "node-z", str(tmp_path), None)
    ray.get(peer.apply_remote.remote([["pages", k, first[k]] for k in (touch_key(key), key.encode())]))  # touch first
    assert expires(peer) == 9_000 and ray.get(peer.counts.remote())["pages"] == 1

    # A full write of the same ETag: the touch is deleted in its batch, and a peer that has the new
    # page but not yet that delete ignores its older touch
    ray.get(store.apply.remote([], [(key.encode(), page.encode())]))
    second = shipped()
    assert expires(store) == 2_000 and unwrap(second[touch_key(key)])[1] is None  # a tombstone
    ray.get(peer.apply_remote.remote([["pages", key.encode(), second[key.encode()]]]))
    assert expires(peer) == 2_000

    # A touch of another content, however new, never extends this page
    newest = unwrap(second[touch_key(key)])[0].hlc + (1 << 32)
    other = wrap_many("node-y", newest, [Touch(key, '"b"', 7_000, 99_000).encode()])[0]
    ray.get(peer.apply_remote.remote([["pages", touch_key(key), other]]))
    assert expires(peer) == 2_000
    ray.get(peer.close.remote())
    ray.kill(peer)


def test_apply_if_writes_only_over_the_payload_that_was_read(store) -> None:
    same, changed, deleted = (f"https://s.test/if/{name}" for name in ("same", "changed", "deleted"))
    was = {u: Target(url=u).encode() for u in (same, changed, deleted)}
    ray.get(store.apply.remote([(target_key(u), p) for u, p in was.items()]))
    now = Target(url=changed, sitemap_url="https://s.test/other.xml").encode()
    ray.get(store.apply.remote([(target_key(changed), now), (target_key(deleted), None)]))

    patch = {u: Target(url=u, sitemap_url="https://s.test/new.xml").encode() for u in was}
    ops = [[target_key(u), p] for u, p in patch.items()]
    assert ray.get(store.apply_if.remote(ops, list(was.values()))) == [True, False, False]
    assert ray.get(store.get_targets.remote([same, changed, deleted])) == [patch[same], now, None]
    # None expects nothing live: a write over a tombstone
    assert ray.get(store.apply_if.remote([ops[2]], [None])) == [True]
    assert ray.get(store.get_targets.remote([deleted])) == [patch[deleted]]
    with pytest.raises(ray.exceptions.RayTaskError, match="one expected payload per op"):
        ray.get(store.apply_if.remote(ops, []))
