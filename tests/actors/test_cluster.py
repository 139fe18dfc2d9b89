"""Many nodes on one machine (ray.cluster_utils.Cluster): ownership, replication, hand-off on join,
rebuild on loss, and claims across nodes. One scenario, in order: two nodes, then a third joins,
then it dies, comes back, restarts with another, and stalls."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.storage.replication import CLOCK_OFFSET_ENV
from tests.sitemap_server import SitemapSite, urlset
from tests.support import claim, deploy_on, post_result, put_target, wait_for

URLS = [f"https://cluster.example/p/{i}" for i in range(120)]
FUTURE = int(time.time() * 1000) + 30 * 86_400_000  # explicit, distinct due times: a re-jitter shows


@pytest.fixture(scope="module")
def cluster(ray_cluster, tmp_path_factory):
    ray_cluster.add_node("node-b")
    d = deploy_on(ray_cluster, tmp_path_factory.mktemp("cluster") / "data", {
        "render": {"reconcile": {"startDelay": "1h"}}, "queue": {"statusSyncInterval": "2s"}})
    yield ray_cluster, d
    d.stop()
    for name in ("node-b", "node-c"):
        if name in ray_cluster.nodes:
            ray_cluster.remove_node(name)


def rows_on(node: str, keys: list[str]) -> dict[str, ScheduleRow]:
    """The rows a node's keeper holds for ``keys`` (its in-memory view, which is what it serves)."""
    try:
        keeper = lookup("keeper", node)
        found = ray.get([keeper.schedule_row.remote(k) for k in keys], timeout=30)
    except (ValueError, ray.exceptions.RayError):  # not placed yet, or gone
        return {}
    return {k: f["renderSchedule"] for k, f in zip(keys, found) if f["renderSchedule"] is not None}


def test_every_node_agrees_on_one_owner_and_only_the_owner_holds_the_rows(cluster) -> None:
    rc, d = cluster
    base_a, base_b = d.urls["node-a"], d.urls["node-b"]
    owners = {}
    for i, url in enumerate(URLS):
        owners[url] = put_target(base_a if i % 2 else base_b, url, nextRenderTime=FUTURE + i * 60_000)["owner"]
    expected = Ownership(["node-a", "node-b"])
    assert all(owners[u] == expected.owner(u) for u in URLS)
    assert set(owners.values()) == {"node-a", "node-b"}
    for url in URLS[:20]:
        keys = [f"{url}|desktop", f"{url}|mobile"]
        owner, other = owners[url], ({"node-a", "node-b"} - {owners[url]}).pop()
        assert set(rows_on(owner, keys)) == set(keys) and rows_on(other, keys) == {}


def test_a_sitemap_walk_on_one_node_schedules_each_url_on_its_owner(cluster) -> None:
    rc, d = cluster
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

    # A keeper whose caller's membership view lagged forwards what it does not own, the condition with it.
    on_b = next(u for u in listed[30:] if expected.owner(u) == "node-b")
    new_on_b = next(u for u in (f"https://cluster.example/sm/late/{i}" for i in range(50))
                    if expected.owner(u) == "node-b")
    answer = ray.get(lookup("keeper", "node-a").put_listed.remote(
        other_root, [on_b, new_on_b], [86_400_000] * 2, [None, None], False, True), timeout=30)
    assert answer["written"] == 1 and [u for u, _ in answer["held"]] == [on_b]
    assert set(rows_on("node-b", [f"{new_on_b}|mobile"])) == {f"{new_on_b}|mobile"}


def test_a_target_written_on_one_node_is_readable_on_every_node(cluster) -> None:
    rc, d = cluster
    put_target(d.urls["node-a"], "https://cluster.example/replicated", nextRenderTime=FUTURE)
    for base in d.urls.values():
        wait_for(lambda b=base: httpx.get(f"{b}/render_targets",
                                          params={"url": "https://cluster.example/replicated"}).status_code == 200,
                 timeout=20, what="the target on every node")


def test_a_cluster_pause_reaches_every_node_within_one_status_interval(cluster) -> None:
    rc, d = cluster
    ray.get(lookup("keeper", "node-a").set_pause.remote("all", True, "test"))
    for base in d.urls.values():
        wait_for(lambda b=base: {s["node"]: s["status"] for s in httpx.get(f"{b}/queue_status").json()}
                 == {"node-a": "paused", "node-b": "paused"}, timeout=15, what="paused everywhere")
        assert claim(base, 5) == []
    ray.get(lookup("keeper", "node-b").set_pause.remote("all", False, "test"))
    for base in d.urls.values():
        wait_for(lambda b=base: all(s["status"] != "paused" for s in httpx.get(f"{b}/queue_status").json()),
                 timeout=15, what="running everywhere")


def test_claims_from_every_node_never_share_a_key_and_results_reach_the_owner(cluster) -> None:
    rc, d = cluster
    urls = [f"https://cluster.example/due/{i}" for i in range(40)]
    for u in urls:
        put_target(d.urls["node-a"], u, nextRenderTime=1)
    time.sleep(1.5)
    bases = list(d.urls.values()) * 6
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        batches = list(pool.map(lambda b: claim(b, 20), bases))
    jobs = [j for batch in batches for j in batch if "/due/" in j["url"]]
    ids = [j["id"] for j in jobs]
    assert len(ids) == len(set(ids)) == 80
    for job in jobs[:10]:  # each job names its owner's ingress; the result lands there
        owner = Ownership(["node-a", "node-b"]).owner(job["url"])
        assert job["callbackOrigin"] == d.urls[owner]
        assert post_result(job).status_code == 204
    # the rendered page is replicated to every node
    key = jobs[0]["id"]
    for node in ("node-a", "node-b"):
        wait_for(lambda n=node: ray.get(lookup("store", n).get_pages.remote([key]))[0] is not None, timeout=20,
                 what=f"the page on {node}")


def test_a_joining_node_takes_its_slice_by_hand_off_with_nothing_rejittered(cluster) -> None:
    rc, d = cluster
    keys = [f"{u}|{dev}" for u in URLS for dev in ("desktop", "mobile")]
    before = {**rows_on("node-a", keys), **rows_on("node-b", keys)}
    assert len(before) == len(keys)
    rc.add_node("node-c")
    three = Ownership(["node-a", "node-b", "node-c"])
    moving = [k for k in keys if three.owner(k.split("|")[0]) == "node-c"]
    assert moving
    wait_for(lambda: len(rows_on("node-c", moving)) == len(moving), timeout=90, what="the hand-off to node-c")
    after = rows_on("node-c", moving)
    rejittered = [k for k in moving if after[k]["nextRenderTime"] != before[k]["nextRenderTime"]]
    assert rejittered == []
    wait_for(lambda: rows_on("node-a", moving) == {} and rows_on("node-b", moving) == {}, timeout=30,
             what="the old owners to let go")
    d.refresh()
    assert set(d.urls) == {"node-a", "node-b", "node-c"}
    wait_for(lambda: httpx.get(f"{d.urls['node-c']}/render_targets", params={"url": URLS[0]}).status_code == 200,
             timeout=30, what="node-c to hold the replicated targets")


def test_the_slice_of_a_dead_node_is_rebuilt_by_the_new_owners(cluster) -> None:
    rc, d = cluster
    keys = [f"{u}|{dev}" for u in URLS for dev in ("desktop", "mobile")]
    three = Ownership(["node-a", "node-b", "node-c"])
    lost = [k for k in keys if three.owner(k.split("|")[0]) == "node-c"]
    rc.remove_node("node-c")
    two = Ownership(["node-a", "node-b"])

    def rebuilt() -> bool:
        held = {**rows_on("node-a", lost), **rows_on("node-b", lost)}
        return len(held) == len(lost) and all(k in rows_on(two.owner(k.split("|")[0]), [k]) for k in lost[:5])

    wait_for(rebuilt, timeout=120, what="the departed slice to be rebuilt")
    targets_lost = [u for u in URLS if httpx.get(f"{d.urls['node-a']}/render_targets",
                                                 params={"url": u}).status_code != 200]
    assert targets_lost == []


def test_a_node_restarted_with_the_same_name_catches_up_and_takes_its_slice_back(cluster) -> None:
    rc, d = cluster
    keys = [f"{u}|{dev}" for u in URLS for dev in ("desktop", "mobile")]
    three = Ownership(["node-a", "node-b", "node-c"])
    slice_c = [k for k in keys if three.owner(k.split("|")[0]) == "node-c"]
    rebuilt = {**rows_on("node-a", slice_c), **rows_on("node-b", slice_c)}
    assert len(rebuilt) == len(slice_c)
    put_target(d.urls["node-a"], "https://cluster.example/while-away", nextRenderTime=FUTURE)
    rc.add_node("node-c")  # same name, same data dir, a new Ray node id and port
    wait_for(lambda: rows_on("node-c", slice_c).keys() == set(slice_c), timeout=120, what="node-c's slice back")
    back = rows_on("node-c", slice_c)
    assert [k for k in slice_c if back[k]["nextRenderTime"] != rebuilt[k]["nextRenderTime"]] == []
    d.refresh()
    wait_for(lambda: httpx.get(f"{d.urls['node-c']}/render_targets",
                               params={"url": "https://cluster.example/while-away"}).status_code == 200,
             timeout=60, what="node-c to catch up on a write made while it was away")


def test_two_nodes_restarted_at_once_lose_no_target_and_end_with_one_owner_per_key(cluster) -> None:
    rc, d = cluster
    keys = [f"{u}|{dev}" for u in URLS for dev in ("desktop", "mobile")]
    rc.remove_node("node-b")
    rc.remove_node("node-c")
    rc.add_node("node-b")
    rc.add_node("node-c")
    three = Ownership(["node-a", "node-b", "node-c"])

    def settled() -> bool:
        held = {n: rows_on(n, keys) for n in ("node-a", "node-b", "node-c")}
        return all(set(held[n]) == {k for k in keys if three.owner(k.split("|")[0]) == n} for n in held)

    wait_for(settled, timeout=240, interval=2, what="every key held by exactly its owner")
    d.refresh()
    missing = [u for u in URLS if httpx.get(f"{d.urls['node-b']}/render_targets", params={"url": u}).status_code != 200]
    assert missing == []


def test_a_stalled_peer_delays_nothing_else_and_converges_once_it_answers(cluster) -> None:
    """A network-slow peer, made real: node-c's store process is stopped (SIGSTOP), so every call to
    it hangs. Writes owned by the other nodes still succeed; node-c gets them once it answers."""
    rc, d = cluster
    d.refresh()
    three = Ownership(["node-a", "node-b", "node-c"])
    urls = [u for u in (f"https://cluster.example/stall/{i}" for i in range(60)) if three.owner(u) != "node-c"][:20]
    store_c = lookup("store", "node-c")
    pid = ray.get(store_c.status.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        for i, url in enumerate(urls):
            put_target(d.urls["node-a"] if i % 2 else d.urls["node-b"], url, nextRenderTime=FUTURE)
        for url in urls:  # the other nodes agree at once
            for node in ("node-a", "node-b"):
                wait_for(lambda b=d.urls[node], u=url: httpx.get(f"{b}/render_targets", params={"url": u}).status_code
                         == 200, timeout=20, what=f"{url} on {node} while node-c is stalled")
        pending = wait_for(lambda: _pending(d.urls["node-a"], "node-c"), timeout=20, what="a backlog for node-c")
        assert pending > 0
    finally:
        os.kill(pid, signal.SIGCONT)
    for url in urls:  # and node-c converges once it answers again
        wait_for(lambda u=url: httpx.get(f"{d.urls['node-c']}/render_targets", params={"url": u}).status_code == 200,
                 timeout=60, what=f"{url} on node-c after the stall")
    wait_for(lambda: _pending(d.urls["node-a"], "node-c") == 0, timeout=60, what="node-a's backlog for node-c drained")


def test_a_later_write_wins_over_a_node_whose_clock_runs_5_s_ahead(cluster) -> None:
    """Clock skew, made real: node-c restarts with its store's clock 5 s fast. A cluster pause
    written there, then a resume written on node-a a moment later (after node-a saw the pause): with
    wall-clock last-writer-wins the pause would win for 5 s; the hybrid logical clock makes the later
    write win on every node."""
    rc, d = cluster
    if "node-c" in rc.nodes:
        rc.remove_node("node-c")
    rc.add_node("node-c", env={CLOCK_OFFSET_ENV: "5000"})

    def back() -> bool:
        d.refresh()
        return "node-c" in d.urls and _ready(d.urls["node-c"])

    wait_for(back, timeout=120, interval=1, what="node-c back with a fast clock")
    try:
        ray.get(lookup("keeper", "node-c").set_pause.remote("all", True, "skewed"), timeout=30)
        wait_for(lambda: _cluster_intent(d.urls["node-a"]) is True, timeout=30, what="the pause on node-a")
        ray.get(lookup("keeper", "node-a").set_pause.remote("all", False, "later"), timeout=30)
        for base in d.urls.values():  # converges to the later write and stays there
            wait_for(lambda b=base: _cluster_intent(b) is False, timeout=30, what="the resume everywhere")
        time.sleep(2)
        assert [_cluster_intent(b) for b in d.urls.values()] == [False] * len(d.urls)
    finally:
        ray.get(lookup("keeper", "node-a").set_pause.remote("all", None, "cleanup"), timeout=30)


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _cluster_intent(base: str) -> bool | None:
    rows = {r["scope"]: r for r in httpx.get(f"{base}/queue_control", timeout=10).json()}
    return rows["all"]["paused"] if "all" in rows else None


def _pending(base: str, peer: str) -> float:
    """``prerender_replication_pending{peer=...}`` as ``base``'s /metrics reports it (0 when absent)."""
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("prerender_replication_pending{") and f'peer="{peer}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
