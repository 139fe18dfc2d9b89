"""The per-node process model on the shared Ray cluster: placement, readiness, restarts."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import ray

from prerender_ray.actors.common import lookup
from tests.api.origin_site import OriginSite
from tests.support import deploy_on, get, post_result, put_target, ready, take, wait_for, write_page

BOT = {"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
       "x-harper-prerender-debug": "1"}


def _pid(handle) -> int | None:
    try:
        return ray.get(handle.status.remote(), timeout=2)["pid"]
    except Exception:
        return None


def _find(kind: str, node: str):
    try:
        return lookup(kind, node)
    except ValueError:
        return None


@pytest.fixture(scope="module")
def site():
    s = OriginSite().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def deployment(ray_cluster, tmp_path_factory, site):
    """One deployment for the module: the restart test comes after the first, so the controller's
    hold-off on placing a node again (``REPLACE_AFTER_S`` from its placement) has passed by then."""
    d = deploy_on(ray_cluster, tmp_path_factory.mktemp("controller") / "data",
                  {"domains": [f"127.0.0.1:{site.port}"]}, replicas=2)
    yield d
    d.stop()


def test_every_node_gets_its_actors_and_answers_ready(ray_cluster, deployment, site) -> None:
    d = deployment
    [node] = d.status["nodes"]
    assert node["name"] == "node-a"
    assert node["url"] == f"http://127.0.0.1:{ray_cluster.ports['node-a']}"
    assert node["ingressReplicas"] == {"up": 2, "configured": 2}
    # a replica caches its readiness for a second: one that probed while the node came up may
    # still answer 503 right after the controller reports ready
    wait_for(lambda: get(f"{d.url}/readyz").status_code == 200, timeout=15, what="readyz 200")
    assert (d.data_dir / "nodes" / "node-a" / "schedule").is_dir()
    assert node["keeper"]["members"] == ["node-a"]  # what it holds, beside when it last checked
    assert "membershipCheckedAt" in node["keeper"]
    # Every actor runs on its node, named by the node's stable name.
    for kind in ("store", "leases", "keeper"):
        assert lookup(kind, "node-a") is not None
    assert lookup("ingress", "node-a", 1) is not None
    # each replica's process froze what its start-up built before serving (actors/ingress.py)
    for i in (0, 1):
        assert ray.get(lookup("ingress", "node-a", i).status.remote(), timeout=30)["gcFrozen"] > 0
    _every_replica_reads_the_node_s_writes(d.url, site)


def _every_replica_reads_the_node_s_writes(base: str, site: OriginSite) -> None:
    """Right after a write was answered (a result's 204, the store's reply), every bot request to
    the node gets that page, whichever replica answers: each page read 12 times at once on new
    connections (the port spreads them over both replicas). Three rounds of 12 pages: first renders
    through the result path and new pages written by the store, while another client keeps both
    replicas missing an absent page (before the fix a replica that had just caught up for a miss
    served the origin for the next 50 ms; the issue measured 31 of 72 such reads), then a newer
    version of each rendered page (before the fix a replica served the older one until its next
    timed catch-up, up to 250 ms). A 204 here can take about as long as those windows, so the
    store's rounds, answered in a few ms, are the ones that always caught the old reader."""
    rendered = [f"{site.base}/page/ryw-{i}" for i in range(12)]
    keys = [put_target(base, url, nextRenderTime=1)["cacheKeys"][0] for url in rendered]
    assert keys == [f"{url}|desktop" for url in rendered]
    written = [f"{site.base}/page/ryw-new-{i}" for i in range(12)]
    stop = threading.Event()

    def miss_on() -> None:  # misses all along: each replica has just caught up when a write lands
        while not stop.is_set():
            httpx.get(f"{base}/p/{site.base}/page/absent", headers=BOT, timeout=30)

    # no keep-alive: each read a connection of its own, which the port hands to either replica (one
    # client: a client of its own per read spent ~10 ms of CPU on its TLS context first)
    client = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))

    def read(url: str) -> tuple[str, str]:
        r = client.get(f"{base}/p/{url}", headers=BOT)
        return r.headers.get("x-harper-cache", ""), r.text

    def status() -> dict:
        return {i: ray.get(lookup("ingress", "node-a", i).status.remote(), timeout=30)["pageCatchUps"] for i in (0, 1)}

    before = status()
    missing = threading.Thread(target=miss_on)
    missing.start()
    wrong: list = []
    with ThreadPoolExecutor(12) as pool:

        def after(url: str, marker: str) -> None:
            got = list(pool.map(read, [url] * 12))
            wrong.extend((url, marker, cache) for cache, text in got if f"{marker} of {url}" not in text)

        try:
            jobs = take(base, keys, timeout=30)
            for url, key in zip(rendered, keys):
                assert read(url)[0] == "miss"  # the origin's, before the result
                html = f"<html><body>render of {url}</body></html>".encode()
                assert post_result(jobs[key], html=html).status_code == 204
                after(url, "render")
            for url in written:
                assert read(url)[0] == "miss"
                write_page("node-a", f"{url}|desktop", f"<html><body>page of {url}</body></html>".encode())
                after(url, "page")
        finally:
            stop.set()
            missing.join(60)
        for url in rendered:
            write_page("node-a", f"{url}|desktop", f"<html><body>newer page of {url}</body></html>".encode())
            after(url, "newer page")
    client.close()
    by_round = {m: sum(w[1] == m for w in wrong) for m in ("render", "page", "newer page")}
    assert not wrong, (f"{len(wrong)} of {3 * 12 * 12} reads, of 144 each: {by_round}", wrong[:6])
    # each replica answered reads right after writes: from a secondary they waited for a catch-up,
    # from the page log they polled it first
    assert all(now["waited"] + now["polls"] > before[i]["waited"] + before[i]["polls"]
               for i, now in status().items()), (before, status())


def test_a_killed_keeper_is_restarted_and_the_node_becomes_ready_again(deployment) -> None:
    d = deployment
    keeper = lookup("keeper", "node-a")
    pid = ray.get(keeper.status.remote(), timeout=30)["pid"]
    ray.kill(keeper, no_restart=False)
    wait_for(lambda: _pid(keeper) not in (None, pid), timeout=60, what="a new keeper process")
    wait_for(lambda: get(f"{d.url}/readyz").status_code == 200, timeout=60, what="the keeper to come back")
    assert get(f"{d.url}/healthz").status_code == 200

    # Killed for good (an operator's `ray kill`): Ray does not start it again, the controller
    # places the node again whole (its other actors held the dead handle).
    pid = _pid(lookup("keeper", "node-a"))
    ray.kill(lookup("keeper", "node-a"), no_restart=True)
    wait_for(lambda: _pid(_find("keeper", "node-a")) not in (None, pid), timeout=90, interval=1,
             what="a keeper placed again by the controller")
    wait_for(lambda: ready(d.url), timeout=60, what="the node to be ready again")


def test_a_controller_placed_again_starts_from_the_last_membership_kept_in_rays_store(deployment) -> None:
    """Killed (its node died, or was cut off from Ray's head), Ray places the controller again; it
    reads the last membership from Ray's store, so a node it cannot list would stay a member until
    its trust ran out (tests/sim: ``controller_on_the_minority``). Here every node is alive: the same
    membership, no new epoch, and the node's actors are found, not placed again."""
    d = deployment
    before = d.refresh()
    url = d.url
    keeper_pid = _pid(lookup("keeper", "node-a"))

    def restarts() -> tuple[int, str]:
        info = ray._private.state.actors(actor_id=d.controller.handle._actor_id.hex())
        return info["NumRestarts"], info["State"]

    assert restarts() == (0, "ALIVE")
    ray.kill(d.controller.handle, no_restart=False)
    # a status asked while Ray places it again is answered (by the new one), never "the controller
    # is gone": the call that met the old one dying is sent again (a clean CI run met that)
    assert d.refresh()["membership"] == ["node-a"]
    wait_for(lambda: restarts() == (1, "ALIVE"), timeout=60, what="the controller placed again")
    after = d.refresh()
    assert after["membershipEpoch"] == before["membershipEpoch"] and after["membership"] == ["node-a"]
    assert _pid(lookup("keeper", "node-a")) == keeper_pid
    # the membership is read back at once; the node's status is listed once the new controller has
    # found its actors (a status taken between the two lists none: a clean CI run met that)
    wait_for(lambda: "node-a" in (d.refresh() and d.urls), timeout=60, what="the node listed by the new controller")
    assert d.url == url  # the same ingress, found, not placed again
    wait_for(lambda: ready(url), timeout=60, what="the node ready under the new controller")


@ray.remote(num_cpus=0)
class _SlowController:
    """Answers ``status`` only after its first call has waited ``first_s`` (a worker still starting)."""

    def __init__(self, first_s: float):
        self.first_s = first_s

    def status(self) -> dict:
        import time

        time.sleep(self.first_s)
        self.first_s = 0
        return {"nodes": [], "membership": [], "epoch": "x", "healthy": True}


def test_a_controller_slower_than_one_status_call_is_waited_for_until_the_deadline(ray_cluster, monkeypatch) -> None:
    """The first status call waits for the controller's worker to start; a busy machine stretched
    that past one call's deadline and the deploy failed although its own deadline had minutes left."""
    from prerender_ray.actors import deploy
    from prerender_ray.actors.controller_client import ControllerClient

    monkeypatch.setattr(deploy, "STATUS_CALL_S", 1.0)
    slow, slow2 = _SlowController.remote(3.0), _SlowController.remote(60.0)
    try:
        assert deploy.wait_ready(ControllerClient(slow), 30.0, expect_nodes=0)["healthy"] is True
        t0 = time.monotonic()
        with pytest.raises(deploy.DeployError, match="not ready within 4s: the controller did not answer"):
            deploy.wait_ready(ControllerClient(slow2), 4.0, expect_nodes=0)
        assert time.monotonic() - t0 < 10
    finally:
        ray.kill(slow)
        ray.kill(slow2)
