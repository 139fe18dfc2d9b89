"""Many nodes on one machine (ray.cluster_utils.Cluster): ownership, replication, hand-off on join,
rebuild on loss, and claims across nodes. Each test starts from the membership it names (two nodes,
or three, on honest clocks) with every key of URLS settled on its owner, so any order works; file
order needs the fewest node changes."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from dataclasses import dataclass, field

import httpx
import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.storage.replication import CLOCK_OFFSET_ENV
from prerender_ray.storage.rocks import node_dir
from tests.sitemap_server import SitemapSite, urlset
from tests.support import Deployment, RayCluster, claim, deploy_on, post_result, put_target, ready, wait_for

URLS = [f"https://cluster.example/p/{i}" for i in range(120)]
KEYS = [f"{u}|{dev}" for u in URLS for dev in ("desktop", "mobile")]
FUTURE = int(time.time() * 1000) + 30 * 86_400_000  # explicit, distinct due times: a re-jitter shows
TWO, THREE = ("node-a", "node-b"), ("node-a", "node-b", "node-c")
# A test run out of order first changes the membership to the one it needs (each change waits up to 240 s).
pytestmark = pytest.mark.timeout(600)


@dataclass
class Scenario:
    rc: RayCluster
    d: Deployment
    owners: dict[str, str]  # URLS -> the owner its write answered, half written through each node
    skewed: set[str] = field(default_factory=set)  # nodes started with a fast clock
    settled: tuple[tuple[str, ...], int] | None = None  # the last membership found settled, at which change

    def settle(self, names: tuple[str, ...]) -> Scenario:
        """Exactly ``names`` on honest clocks, each serving, and every key of URLS held by exactly its
        owner (a change of membership first waits out its hand-off or rebuild). Only a change of
        nodes moves the rows of URLS, so with none since this was last found, it still holds."""
        if self.settled == (names, self.rc.changes) and not self.skewed:
            return self
        want = set(names)
        for name in sorted((set(self.rc.nodes) - want) | (self.skewed & set(self.rc.nodes))):
            self.rc.remove_node(name)
        self.skewed.clear()
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
            "render": {"reconcile": {"startDelay": "1h"}}, "queue": {"statusSyncInterval": "2s"}})

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


def test_every_node_agrees_on_one_owner_and_only_the_owner_holds_the_rows(on_two) -> None:
    owners = on_two.owners
    expected = Ownership(["node-a", "node-b"])
    assert all(owners[u] == expected.owner(u) for u in URLS)
    assert set(owners.values()) == {"node-a", "node-b"}
    for url in URLS[:20]:
        keys = [f"{url}|desktop", f"{url}|mobile"]
        owner, other = owners[url], ({"node-a", "node-b"} - {owners[url]}).pop()
        assert set(rows_on(owner, keys)) == set(keys) and rows_on(other, keys) == {}


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

    # A keeper whose caller's membership view lagged forwards what it does not own, the condition with it.
    on_b = next(u for u in listed[30:] if expected.owner(u) == "node-b")
    new_on_b = next(u for u in (f"https://cluster.example/sm/late/{i}" for i in range(50))
                    if expected.owner(u) == "node-b")
    answer = ray.get(lookup("keeper", "node-a").put_listed.remote(
        other_root, [on_b, new_on_b], [86_400_000] * 2, [None, None], False, True), timeout=30)
    assert answer["written"] == 1 and [u for u, _ in answer["held"]] == [on_b]
    assert set(rows_on("node-b", [f"{new_on_b}|mobile"])) == {f"{new_on_b}|mobile"}


def test_a_target_written_on_one_node_is_readable_on_every_node(on_two) -> None:
    d = on_two.d
    put_target(d.urls["node-a"], "https://cluster.example/replicated", nextRenderTime=FUTURE)
    for base in d.urls.values():
        wait_for(lambda b=base: httpx.get(f"{b}/render_targets",
                                          params={"url": "https://cluster.example/replicated"}).status_code == 200,
                 timeout=20, what="the target on every node")


def test_a_cluster_pause_reaches_every_node_within_one_status_interval(on_two) -> None:
    d = on_two.d

    def statuses(base: str) -> dict[str, str]:  # a node that left earlier keeps its last row: not asked
        return {s["node"]: s["status"] for s in httpx.get(f"{base}/queue_status").json() if s["node"] in TWO}

    ray.get(lookup("keeper", "node-a").set_pause.remote("all", True, "test"))
    try:
        for base in d.urls.values():
            wait_for(lambda b=base: statuses(b) == {"node-a": "paused", "node-b": "paused"}, timeout=15,
                     what="paused everywhere")
            assert claim(base, 5) == []
        ray.get(lookup("keeper", "node-b").set_pause.remote("all", False, "test"))
        for base in d.urls.values():
            wait_for(lambda b=base: set(statuses(b)) == set(TWO) and "paused" not in statuses(b).values(),
                     timeout=15, what="running everywhere")
    finally:
        ray.get(lookup("keeper", "node-a").set_pause.remote("all", None, "cleanup"), timeout=30)


def test_claims_from_every_node_never_share_a_key_and_results_reach_the_owner(on_two) -> None:
    d = on_two.d
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


def test_a_joining_node_takes_its_slice_by_hand_off_with_nothing_rejittered(on_two) -> None:
    rc, d = on_two.rc, on_two.d
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
             timeout=30, what="node-c to hold the replicated targets")


def test_the_slice_of_a_dead_node_is_rebuilt_by_the_new_owners(on_three) -> None:
    rc, d = on_three.rc, on_three.d
    three = Ownership(["node-a", "node-b", "node-c"])
    lost = [k for k in KEYS if three.owner(k.split("|")[0]) == "node-c"]
    rc.remove_node("node-c")
    two = Ownership(["node-a", "node-b"])

    def rebuilt() -> bool:
        held = {**rows_on("node-a", lost), **rows_on("node-b", lost)}
        return len(held) == len(lost) and all(k in rows_on(two.owner(k.split("|")[0]), [k]) for k in lost[:5])

    wait_for(rebuilt, timeout=120, what="the departed slice to be rebuilt")
    targets_lost = [u for u in URLS if httpx.get(f"{d.urls['node-a']}/render_targets",
                                                 params={"url": u}).status_code != 200]
    assert targets_lost == []


def test_a_node_restarted_with_the_same_name_catches_up_and_takes_its_slice_back(scenario) -> None:
    if not node_dir(scenario.d.data_dir, "node-c").exists():  # node-c must have been a member before
        scenario.settle(THREE)
    rc, d = scenario.settle(TWO).rc, scenario.d
    three = Ownership(["node-a", "node-b", "node-c"])
    slice_c = [k for k in KEYS if three.owner(k.split("|")[0]) == "node-c"]
    rebuilt = {**rows_on("node-a", slice_c), **rows_on("node-b", slice_c)}
    assert len(rebuilt) == len(slice_c)
    put_target(d.urls["node-a"], "https://cluster.example/while-away", nextRenderTime=FUTURE)
    rc.add_node("node-c")  # same name, same data dir, a new Ray node id and port
    wait_for(lambda: rows_on("node-c", slice_c).keys() == set(slice_c), timeout=120, what="node-c's slice back")
    back = rows_on("node-c", slice_c)
    assert [k for k in slice_c if back[k]["nextRenderTime"] != rebuilt[k]["nextRenderTime"]] == []
    d.refresh()
    # its rows can come back before its ingress serves (it reads the membership first)
    wait_for(lambda: ready(d.urls["node-c"]), timeout=60, what="node-c serving")
    wait_for(lambda: httpx.get(f"{d.urls['node-c']}/render_targets",
                               params={"url": "https://cluster.example/while-away"}).status_code == 200,
             timeout=60, what="node-c to catch up on a write made while it was away")


def test_two_nodes_restarted_at_once_lose_no_target_and_end_with_one_owner_per_key(on_three) -> None:
    rc, d = on_three.rc, on_three.d
    rc.remove_node("node-b")
    rc.remove_node("node-c")
    rc.add_node("node-b")
    rc.add_node("node-c")
    wait_for(lambda: held_by_owners(THREE), timeout=240, interval=0.5, what="every key held by exactly its owner")
    d.refresh()
    wait_for(lambda: ready(d.urls["node-b"]), timeout=60, what="node-b serving")
    missing = [u for u in URLS if httpx.get(f"{d.urls['node-b']}/render_targets", params={"url": u}).status_code != 200]
    assert missing == []


def test_a_stalled_peer_delays_nothing_else_and_converges_once_it_answers(on_three) -> None:
    """A network-slow peer, made real: node-c's store process is stopped (SIGSTOP), so every call to
    it hangs. Writes owned by the other nodes still succeed; node-c gets them once it answers."""
    d = on_three.d
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


def test_a_later_write_wins_over_a_node_whose_clock_runs_5_s_ahead(scenario) -> None:
    """Clock skew, made real: node-c restarts with its store's clock 5 s fast. A cluster pause
    written there, then a resume written on node-a a moment later (after node-a saw the pause): with
    wall-clock last-writer-wins the pause would win for 5 s; the hybrid logical clock makes the later
    write win on every node."""
    rc, d = scenario.rc, scenario.d
    if "node-c" in rc.nodes:
        rc.remove_node("node-c")
    scenario.skewed.add("node-c")  # whatever happens next, a later test gets an honest node-c
    rc.add_node("node-c", env={CLOCK_OFFSET_ENV: "5000"})

    def back() -> bool:
        d.refresh()
        return "node-c" in d.urls and ready(d.urls["node-c"])

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


def _cluster_intent(base: str) -> bool | None:
    rows = {r["scope"]: r for r in httpx.get(f"{base}/queue_control", timeout=10).json()}
    return rows["all"]["paused"] if "all" in rows else None


def _pending(base: str, peer: str) -> float:
    """``prerender_replication_pending{peer=...}`` as ``base``'s /metrics reports it (0 when absent)."""
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("prerender_replication_pending{") and f'peer="{peer}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
