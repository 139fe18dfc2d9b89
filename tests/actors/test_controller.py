"""The per-node process model on the shared Ray cluster: placement, readiness, restarts."""

from __future__ import annotations

import time

import pytest
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
        assert node["keeper"]["members"] == ["node-a"]  # what it holds, beside when it last checked
        assert "membershipCheckedAt" in node["keeper"]
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

    monkeypatch.setattr(deploy, "STATUS_CALL_S", 1.0)
    slow, slow2 = _SlowController.remote(3.0), _SlowController.remote(60.0)
    try:
        assert deploy.wait_ready(slow, 30.0, expect_nodes=0)["healthy"] is True
        t0 = time.monotonic()
        with pytest.raises(deploy.DeployError, match="not ready within 4s: the controller did not answer"):
            deploy.wait_ready(slow2, 4.0, expect_nodes=0)
        assert time.monotonic() - t0 < 10
    finally:
        ray.kill(slow)
        ray.kill(slow2)
