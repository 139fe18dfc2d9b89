"""The per-node process model on the shared Ray cluster: placement, readiness, restarts."""

from __future__ import annotations

import ray

from prerender_ray.actors.common import lookup
from tests.support import deploy_on, get, ready, wait_for


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


def test_every_node_gets_its_actors_and_answers_ready(ray_cluster, tmp_path) -> None:
    d = deploy_on(ray_cluster, tmp_path / "data", replicas=2)
    try:
        [node] = d.status["nodes"]
        assert node["name"] == "node-a"
        assert node["url"] == f"http://127.0.0.1:{ray_cluster.ports['node-a']}"
        assert node["ingressReplicas"] == {"up": 2, "configured": 2}
        # a replica caches its readiness for a second: one that probed while the node came up may
        # still answer 503 right after the controller reports ready
        wait_for(lambda: get(f"{d.url}/readyz").status_code == 200, timeout=15, what="readyz 200")
        assert (tmp_path / "data" / "nodes" / "node-a" / "schedule").is_dir()
        # Every actor runs on its node, named by the node's stable name.
        for kind in ("store", "leases", "keeper"):
            assert lookup(kind, "node-a") is not None
        assert lookup("ingress", "node-a", 1) is not None
    finally:
        d.stop()


def test_a_killed_keeper_is_restarted_and_the_node_becomes_ready_again(ray_cluster, tmp_path) -> None:
    d = deploy_on(ray_cluster, tmp_path / "data")
    try:
        keeper = lookup("keeper", "node-a")
        pid = ray.get(keeper.status.remote())["pid"]
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
    finally:
        d.stop()
