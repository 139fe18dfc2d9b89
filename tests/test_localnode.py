"""The LocalNode harness itself: a node's real parts in this process, which a stop closes whole (its
thread, its port, its RocksDB locks), so the next node, or the same one restarted, starts clean."""

from __future__ import annotations

import gc
import threading

import httpx

from tests.localnode import LocalNode
from tests.support import metric_value, put_target, ready, target, write_page


def localnode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("localnode-")]


def test_a_stopped_node_leaves_nothing_running_and_restarts_on_its_data(tmp_path) -> None:
    threshold = gc.get_threshold()
    node = LocalNode.start(tmp_path / "data")
    try:
        assert ready(node.url) and node.status["nodes"][0]["healthy"]
        assert node.status["nodes"][0]["keeper"]["members"] == ["node-a"]
        put_target(node.url, "https://local.test/kept")
        r = node.asgi(lambda client: client.get("/render_targets", params={"url": "https://local.test/kept"}))
        assert r.status_code == 200 and r.json()["url"] == "https://local.test/kept"  # without a socket
        report = node.stop()
        assert report["drain"]["nodes"][0]["node"] == "node-a"
        assert not ready(node.url) and localnode_threads() == []
        assert gc.get_threshold() == threshold  # the shells' GC tuning is the process's no more

        node.restart()  # the RocksDB locks were released: the same directories open again
        assert target(node.url, "https://local.test/kept") is not None
    finally:
        node.stop(drain=False)
    assert localnode_threads() == []
    assert node.stop() == {"stopped": []}  # twice is harmless


def test_nodes_one_after_another_each_see_only_their_own_data_and_series(tmp_path) -> None:
    """One metrics registry per process: a labelled series a node exposes is one its own work made,
    as on a node of fresh processes (a dashboard test would otherwise pass on an earlier node's)."""
    pages = lambda node: metric_value(node.url, "prerender_page_writes_total", kind="page")  # noqa: E731
    for i in range(2):
        node = LocalNode.start(tmp_path / f"data-{i}")
        try:
            assert target(node.url, "https://local.test/0") is None  # node 0's target is not node 1's
            assert pages(node) == 0
            put_target(node.url, f"https://local.test/{i}")
            write_page(node, f"https://local.test/{i}|desktop", b"<html>mine</html>")
            assert pages(node) == 1
            assert httpx.get(f"{node.url}/readyz", timeout=5).status_code == 200
        finally:
            node.stop()


def test_a_cluster_runs_every_node_on_one_loop_and_each_finds_the_others_parts(tmp_path) -> None:
    """Two nodes in this process: one membership (both, one epoch), each node's keeper routes a row
    to its owner's keeper, each store replicates to the other's; a stop closes them all."""
    from prerender_ray.identity.nodes import Ownership
    from tests.localcluster import LocalCluster
    from tests.support import schedule, wait_for

    cluster = LocalCluster.start(tmp_path / "data", names=("node-a", "node-b"))
    try:
        assert cluster.status["healthy"] and cluster.status["epoch"] == 1
        assert [n["keeper"]["members"] for n in cluster.status["nodes"]] == [["node-a", "node-b"]] * 2
        assert localnode_threads() == [cluster.thread]  # one loop, one thread, for every node
        assert {n.data_dir.name for n in cluster.nodes.values()} == {"node-a", "node-b"}
        url = next(u for u in (f"https://local.test/b/{i}" for i in range(100))
                   if Ownership(["node-a", "node-b"]).owner(u) == "node-b")
        key = put_target(cluster.urls["node-a"], url, nextRenderTime=1)["cacheKeys"][0]
        assert schedule(cluster.urls["node-b"], key) is not None  # the row is on its owner's keeper
        write_page(cluster["node-a"], f"{url}|desktop", b"<html>both</html>")
        wait_for(lambda: cluster["node-b"].ask("store", "has_pages", [f"{url}|desktop"]) == [True],
                 timeout=30, what="the page replicated to node-b")
    finally:
        report = cluster.stop()
    assert report["stopped"] == ["node-a", "node-b"] and len(report["drain"]["nodes"]) == 2
    assert localnode_threads() == [] and not ready(cluster.urls["node-b"])
    assert cluster.stop() == {"stopped": []}
