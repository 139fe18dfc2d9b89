"""The NodeStore's conditional write: what a sitemap walk creates its new targets with."""

from __future__ import annotations

import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.storage.registry import Target, target_key
from tests.support import deploy_on


@pytest.fixture(scope="module")
def store(ray_cluster, tmp_path_factory):
    d = deploy_on(ray_cluster, tmp_path_factory.mktemp("store") / "data")
    yield lookup("store", "node-a")
    d.stop()


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
