"""Many nodes on one machine (ray.cluster_utils.Cluster): what only real Ray processes show. The
controller watching Ray's node table as nodes join, die and come back with the same name, and pushing
the membership to every node's actors; the hand-off and rebuild through real actors; a sitemap walk
whose writes cross nodes; an ingress replica Ray restarts. Each URL is on two of three nodes
(``cluster.replicas: 2``). Each test starts from the membership it names (two nodes, or three) with
every key of URLS settled on its owner, so any order works; file order needs the fewest node changes.

The logic under these (ownership, hand-off, rebuild, replication, leases, results, the hybrid clock)
is shown without Ray, under faults: the simulated cluster (tests/sim/), tests/actors/keeper/ and
tests/actors/store/; over a real network with real kills, tests/actors/test_netns_cluster.py."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass

import httpx
import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.storage.rocks import node_dir
from tests.sitemap_server import SitemapSite, urlset
from tests.support import (
    CLUSTER_SERIES,
    Deployment,
    RayCluster,
    dashboard_series,
    deploy_on,
    exposed_series,
    put_target,
    ready,
    wait_for,
    write_page,
)

R = 2
URLS = [f"https://cluster.example/p/{i}" for i in range(120)]
KEYS = [f"{u}|{dev}" for u in URLS for dev in ("desktop", "mobile")]
FUTURE = int(time.time() * 1000) + 30 * 86_400_000  # explicit, distinct due times: a re-jitter shows
TWO, THREE = ("node-a", "node-b"), ("node-a", "node-b", "node-c")
BOT = {"user-agent": "Googlebot/2.1"}
# A test run out of order first changes the membership to the one it needs (each change waits up to 240 s).
pytestmark = pytest.mark.timeout(600)


@dataclass
class Scenario:
    rc: RayCluster
    d: Deployment
    owners: dict[str, str]  # URLS -> the owner its write answered, half written through each node
    settled: tuple[tuple[str, ...], int] | None = None  # the last membership found settled, at which change

    def settle(self, names: tuple[str, ...]) -> Scenario:
        """Exactly ``names``, each serving, and every key of URLS held by exactly its owner (a change
        of membership first waits out its hand-off or rebuild). Only a change of nodes moves the rows
        of URLS, so with none since this was last found, it still holds."""
        if self.settled == (names, self.rc.changes):
            return self
        want = set(names)
        for name in sorted(set(self.rc.nodes) - want):
            self.rc.remove_node(name)
        for name in sorted(want - set(self.rc.nodes)):
            self.rc.add_node(name)
        wait_for(lambda: held_by_owners(names), timeout=240, interval=0.5, what=f"URLS settled on {names}")
        wait_for(lambda: set(self.d.refresh() and self.d.urls) == want and all(map(ready, self.d.urls.values())),
                 timeout=60, what=f"{names} serving")
        self.settled = (names, self.rc.changes)
        return self


@pytest.fixture(scope="module")
def scenario(ray_cluster, tmp_path_factory):
    with ray_cluster.added("node-b"):
        d = deploy_on(ray_cluster, tmp_path_factory.mktemp("cluster") / "data", {
            "domains": ["cluster.example", "127.0.0.1:*"], "cluster": {"replicas": R},
            "render": {"reconcile": {"startDelay": "1h"}}})

        def write(i: int) -> str:
            return put_target(d.urls["node-a" if i % 2 else "node-b"], URLS[i],
                              nextRenderTime=FUTURE + i * 60_000)["owner"]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            owners = dict(zip(URLS, pool.map(write, range(len(URLS)))))
        yield Scenario(ray_cluster, d, owners)
        d.stop()


@pytest.fixture
def on_two(scenario) -> Scenario:
    return scenario.settle(TWO)


@pytest.fixture
def on_three(scenario) -> Scenario:
    return scenario.settle(THREE)


def rows_on(node: str, keys: list[str]) -> dict[str, ScheduleRow]:
    """The rows a node's keeper holds for ``keys`` (its in-memory view, which is what it serves)."""
    try:
        keeper = lookup("keeper", node)
        found = ray.get([keeper.schedule_row.remote(k) for k in keys], timeout=30)
    except (ValueError, ray.exceptions.RayError):  # not placed yet, or gone
        return {}
    return {k: f["renderSchedule"] for k, f in zip(keys, found) if f["renderSchedule"] is not None}


@dataclass
class Holding:
    """Which keys of KEYS each node holds against what it should: true when every node holds
    exactly its own; its repr names what is off, so a timed-out wait says where."""
    missing: dict[str, list[str]]
    extra: dict[str, list[str]]

    def __bool__(self) -> bool:
        return not any(self.missing.values()) and not any(self.extra.values())

    def __repr__(self) -> str:
        off = ", ".join(f"{n}: {len(self.missing[n])} missing {self.missing[n][:3]}, {len(self.extra[n])} extra "
                        f"{self.extra[n][:3]}" for n in self.missing)
        return off + f"; keepers: {keeper_views(list(self.missing))}" if not self else off


def keeper_views(names: list[str]) -> dict[str, str]:
    """Each keeper's membership and how long ago its controller check last answered: what a wait
    that timed out needs to say why."""
    out = {}
    for n in names:
        try:
            st = ray.get(lookup("keeper", n).status.remote(), timeout=10)
            at = st.get("membershipCheckedAt")
            out[n] = f"{st.get('phase')} {st.get('members')} checked {'never' if at is None else f'{time.time() - at / 1000:.0f}s ago'}"
        except (ValueError, ray.exceptions.RayError) as e:
            out[n] = type(e).__name__
    return out


def held_by_owners(names: tuple[str, ...]) -> Holding:
    owners = Ownership(list(names))
    held = {n: set(rows_on(n, KEYS)) for n in names}
    want = {n: {k for k in KEYS if owners.owner(k.split("|")[0]) == n} for n in names}
    return Holding({n: sorted(want[n] - held[n]) for n in names}, {n: sorted(held[n] - want[n]) for n in names})


def test_a_sitemap_walk_on_one_node_schedules_each_url_on_its_owner(on_two) -> None:
    d = on_two.d
    listed = [f"https://cluster.example/sm/{i}" for i in range(60)]
    fresh = [f"https://cluster.example/sm/new/{i}" for i in range(10)]
    site = SitemapSite()

    def walk(path: str) -> dict:
        r = httpx.post(f"{d.urls['node-a']}/sitemaps", json={"url": site.url(path), "background": False},
                       timeout=120)
        assert r.status_code == 200, r.text
        [result] = r.json()
        assert result["failed"] == [], result
        return result

    try:
        site.put("/sitemap.xml", urlset(*[(u, "weekly") for u in listed]))
        result = walk("/sitemap.xml")
        assert result["created"] == len(listed), result
        expected = Ownership(["node-a", "node-b"])
        assert {expected.owner(u) for u in listed} == {"node-a", "node-b"}  # the walk had to split its writes
        rows = {}
        for url in listed:
            keys = [f"{url}|desktop", f"{url}|mobile"]
            owner = expected.owner(url)
            other = ({"node-a", "node-b"} - {owner}).pop()
            rows[url] = held = rows_on(owner, keys)
            assert set(held) == set(keys) and rows_on(other, keys) == {}
            assert all(r["fromSitemap"] and r["effectiveInterval"] == 7 * 86_400_000 for r in held.values())

        # Another root listing half of them and some new URLs: each owner creates only what is absent and
        # hands back what it holds, which is reattached with its render clock kept.
        site.put("/other.xml", urlset(*listed[:30], *fresh))
        result = walk("/other.xml")
        assert (result["created"], result["updated"], result["duplicates"]) == (len(fresh), 30, 0), result
    finally:
        site.close()
    other_root = site.url("/other.xml")
    for url in listed[:30]:
        keys = [f"{url}|desktop", f"{url}|mobile"]
        got = httpx.get(f"{d.urls[expected.owner(url)]}/render_targets", params={"url": url}).json()
        assert got["sitemapUrl"] == other_root
        due = {k: r["nextRenderTime"] for k, r in rows_on(expected.owner(url), keys).items()}
        assert due == {k: r["nextRenderTime"] for k, r in rows[url].items()}
    for url in fresh:
        assert set(rows_on(expected.owner(url), [f"{url}|desktop"])) == {f"{url}|desktop"}


def test_a_joining_node_takes_its_slice_by_hand_off_with_nothing_rejittered(on_two) -> None:
    rc, d = on_two.rc, on_two.d
    assert on_two.owners == {u: Ownership(list(TWO)).owner(u) for u in URLS}  # both ingresses route to one owner
    before = {**rows_on("node-a", KEYS), **rows_on("node-b", KEYS)}
    assert len(before) == len(KEYS)
    rc.add_node("node-c")
    three = Ownership(["node-a", "node-b", "node-c"])
    moving = [k for k in KEYS if three.owner(k.split("|")[0]) == "node-c"]
    assert moving
    wait_for(lambda: len(rows_on("node-c", moving)) == len(moving), timeout=90, what="the hand-off to node-c")
    after = rows_on("node-c", moving)
    rejittered = [k for k in moving if after[k]["nextRenderTime"] != before[k]["nextRenderTime"]]
    assert rejittered == []
    wait_for(lambda: rows_on("node-a", moving) == {} and rows_on("node-b", moving) == {}, timeout=30,
             what="the old owners to let go")
    d.refresh()
    assert set(d.urls) == {"node-a", "node-b", "node-c"}
    wait_for(lambda: ready(d.urls["node-c"]), timeout=60, what="node-c serving")
    wait_for(lambda: httpx.get(f"{d.urls['node-c']}/render_targets", params={"url": URLS[0]}).status_code == 200,
             timeout=30, what="node-c to serve the targets")


def test_a_restarted_ingress_replica_serves_other_nodes_urls_from_its_first_request(on_three) -> None:
    """Ray restarts a killed replica; it reads the controller's membership before it serves. Knowing
    only its own node, it took every URL for its own and sent the ones it does not hold to the origin
    (seen for 9 s in the soak). Reads from holders also give the cluster's series on the dashboard."""
    d, name = on_three.d, "node-a"
    three = Ownership(list(THREE))
    far = [u for u in URLS if name not in three.holders(u, R)][:6]
    assert far
    for url in far:  # as a result stores it: on its owner, shipped from there
        write_page(three.owner(url), f"{url}|desktop", f"<html><body>rendered {url}</body></html>".encode())
    for url in far:
        holders = three.holders(url, R)
        wait_for(lambda u=url, h=holders: all(ray.get(lookup("store", n).has_pages.remote([f"{u}|desktop"]),
                                                      timeout=30) == [True] for n in h),
                 timeout=30, what=f"the page of {url} on its holders")
    # not on node-a: a replica that took itself for the only node would find none of them
    assert ray.get(lookup("store", name).has_pages.remote([f"{u}|desktop" for u in far]), timeout=30) == [False] * len(far)
    replica = lookup("ingress", name, 0)
    before = ray.get(replica.status.remote(), timeout=30)["pid"]
    ray.kill(replica, no_restart=False)
    wait_for(lambda: _serving_pid(name) not in (None, before), timeout=60, interval=0.1, what="the replica restarted")
    base = d.urls[name]
    for url in far:  # at once: before the first membership check (5 s) could have brought it
        r = httpx.get(f"{base}/p/{url}", headers=BOT, timeout=30)
        assert r.status_code == 200 and f"rendered {url}" in r.text, (url, r.status_code, r.headers)
    # the cluster's series (the rest: tests/api/bot/test_middleware.py); the bot path flushes every few seconds
    wait_for(lambda: CLUSTER_SERIES <= exposed_series(base), timeout=20, what="the cluster's series on node-a")
    assert CLUSTER_SERIES <= dashboard_series()


def test_a_dead_node_s_slice_is_rebuilt_and_back_with_the_same_name_it_takes_it_back_and_catches_up(on_three) -> None:
    """Ray's node table loses node-c: the controller moves its slice to the survivors, rebuilt from
    the replicated targets, nothing lost. node-c comes back (same name and data dir, a new Ray node id
    and port): its rows return by hand-off with their due times, and it catches up on a write made
    while it was away."""
    rc, d = on_three.rc, on_three.d
    three, two = Ownership(list(THREE)), Ownership(list(TWO))
    slice_c = [k for k in KEYS if three.owner(k.split("|")[0]) == "node-c"]
    assert slice_c and node_dir(d.data_dir, "node-c").exists()
    rc.remove_node("node-c")
    wait_for(lambda: held_by_owners(TWO), timeout=240, interval=0.5, what="node-c's slice rebuilt by its new owners")
    rebuilt = {**rows_on("node-a", slice_c), **rows_on("node-b", slice_c)}
    assert all(k in rows_on(two.owner(k.split("|")[0]), [k]) for k in slice_c[:5])
    targets_lost = [u for u in URLS if httpx.get(f"{d.urls['node-a']}/render_targets",
                                                 params={"url": u}).status_code != 200]
    assert targets_lost == []
    put_target(d.urls["node-a"], "https://cluster.example/while-away", nextRenderTime=FUTURE)

    rc.add_node("node-c")
    wait_for(lambda: rows_on("node-c", slice_c).keys() == set(slice_c), timeout=120, what="node-c's slice back")
    back = rows_on("node-c", slice_c)
    assert [k for k in slice_c if back[k]["nextRenderTime"] != rebuilt[k]["nextRenderTime"]] == []
    d.refresh()
    # its rows can come back before its ingress serves (it reads the membership first)
    wait_for(lambda: ready(d.urls["node-c"]), timeout=60, what="node-c serving")
    wait_for(lambda: httpx.get(f"{d.urls['node-c']}/render_targets",
                               params={"url": "https://cluster.example/while-away"}).status_code == 200,
             timeout=60, what="node-c to catch up on a write made while it was away")
    wait_for(lambda: held_by_owners(THREE), timeout=60, interval=0.5, what="the old owners to let go")


def _serving_pid(name: str) -> int | None:
    """The pid of the node's first ingress replica once it serves; None while it starts."""
    try:
        s = ray.get(lookup("ingress", name, 0).status.remote(), timeout=5)
    except (ValueError, ray.exceptions.RayError):
        return None
    return s["pid"] if s["up"] else None
