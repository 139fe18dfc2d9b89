"""The NodeStore's conditional write: what a sitemap walk creates its new targets with."""

from __future__ import annotations

import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.registry import Target, target_key
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
