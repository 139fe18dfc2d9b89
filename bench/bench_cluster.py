"""Cluster benchmark: replication lag, write cost with 1, 2 and 3 nodes, and the time a joining node
takes to become ready with 100,000 targets. Simulated nodes on one machine (ray.cluster_utils).

Run: ``.venv/bin/python bench/bench_cluster.py [--writes 300] [--targets 100000]``

- Write cost: sequential ``PUT /render_targets`` through node-a's ingress (target + two schedule
  rows + replication enqueue), beside the same number of ``GET /healthz`` on the same ingress (the
  HTTP floor measured in the same run).
- Replication lag: from the write's acknowledgement to the target being readable on every other
  node's store (polled), p50 and p99.
- Join: with two nodes holding ``--targets`` targets, a third node is added; time until its store
  caught up, its keeper is live with its slice handed over, and its ingress answers /readyz.
All nodes share 2 cores, so a node's replication competes with the others' work: read ratios.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import httpx  # noqa: E402
import ray  # noqa: E402

from prerender_ray.actors.common import lookup  # noqa: E402
from prerender_ray.identity.nodes import Ownership  # noqa: E402
from prerender_ray.storage.registry import target_key  # noqa: E402
from tests.support import RayCluster, deploy_on, wait_for  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def write_round(d, names: list[str], writes: int, tag: str) -> dict:
    base = d.urls["node-a"]
    client = httpx.Client(timeout=30)
    for _ in range(20):
        client.get(f"{base}/healthz")
    t0 = time.perf_counter()
    for _ in range(writes):
        client.get(f"{base}/healthz")
    floor = (time.perf_counter() - t0) / writes
    others = [lookup("store", n) for n in names if n != "node-a"]
    costs, lags = [], []
    for i in range(writes):
        url = f"https://bench.example/{tag}/{i}"
        t0 = time.perf_counter()
        r = client.put(f"{base}/render_targets", json={"url": url, "nextRenderTime": 4_000_000_000_000})
        r.raise_for_status()
        acked = time.perf_counter()
        costs.append(acked - t0)
        for store in others:
            while ray.get(store.get.remote([target_key(url)]))[0] is None:
                pass
        if others:
            lags.append(time.perf_counter() - acked)
    client.close()
    out = {"nodes": len(names), "write_ms": statistics.mean(costs) * 1000, "floor_ms": floor * 1000}
    if lags:
        out |= {"lag_p50_ms": pct(lags, 0.5) * 1000, "lag_p99_ms": pct(lags, 0.99) * 1000}
    return out


def join(rc: RayCluster, d, targets: int) -> dict:
    keeper_a = lookup("keeper", "node-a")
    keeper_b = lookup("keeper", "node-b")
    two = Ownership(["node-a", "node-b"])
    batch: dict[str, list] = {"node-a": [], "node-b": []}
    t0 = time.perf_counter()
    for i in range(targets):
        url = f"https://bench.example/join/{i}"
        batch[two.owner(url)].append({"url": url})
        for owner, keeper in (("node-a", keeper_a), ("node-b", keeper_b)):
            if len(batch[owner]) >= 2_000 or (i == targets - 1 and batch[owner]):
                ray.get(keeper.put_targets.remote(batch[owner]))
                batch[owner] = []
    load_s = time.perf_counter() - t0
    store_b = lookup("store", "node-b")
    wait_for(lambda: not any(ray.get(store_b.status.remote())["replication"]["pending"].values()), timeout=600,
             what="replication to drain")
    t0 = time.perf_counter()
    rc.add_node("node-c")
    three = Ownership(["node-a", "node-b", "node-c"])
    slice_c = sum(1 for i in range(targets) if three.owner(f"https://bench.example/join/{i}") == "node-c")

    def ready() -> bool:
        d.refresh()
        url = d.urls.get("node-c")
        if not url:
            return False
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code != 200:
                return False
            return ray.get(lookup("keeper", "node-c").status.remote())["rows"] >= 2 * slice_c
        except Exception:
            return False

    wait_for(ready, timeout=1800, interval=1.0, what="node-c ready with its slice")
    joined_s = time.perf_counter() - t0
    sync = ray.get(lookup("store", "node-c").status.remote())["replication"]["sync"]
    return {"targets": targets, "slice": slice_c, "write_s": load_s, "join_s": joined_s, "sync": sync}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--targets", type=int, default=100_000)
    args = ap.parse_args()
    rc = RayCluster.start()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            d = deploy_on(rc, Path(tmp) / "d1", {"render": {"reconcile": {"enabled": False}}})
            rounds.append(write_round(d, ["node-a"], args.writes, "n1"))
            rc.add_node("node-b")
            wait_for(lambda: len(d.refresh()["nodes"]) == 2 and d.refresh()["healthy"], timeout=180, what="2 nodes")
            rounds.append(write_round(d, ["node-a", "node-b"], args.writes, "n2"))
            joined = join(rc, d, args.targets)
            wait_for(lambda: d.refresh()["healthy"], timeout=180, what="3 healthy nodes")
            rounds.append(write_round(d, ["node-a", "node-b", "node-c"], args.writes, "n3"))
            d.stop()
        finally:
            rc.shutdown()
    print(f"cluster benchmark ({args.writes} sequential writes per round; simulated nodes share 2 cores)")
    print(f"{'nodes':>6}{'write (PUT) ms':>16}{'HTTP floor ms':>15}{'ratio':>7}{'lag p50 ms':>12}{'lag p99 ms':>12}")
    for r in rounds:
        print(f"{r['nodes']:>6}{r['write_ms']:>16.2f}{r['floor_ms']:>15.2f}{r['write_ms'] / r['floor_ms']:>7.1f}"
              f"{r.get('lag_p50_ms', float('nan')):>12.2f}{r.get('lag_p99_ms', float('nan')):>12.2f}")
    print(f"join: {joined['targets']:,} targets ({2 * joined['targets']:,} rows) written in {joined['write_s']:.1f} s; "
          f"node-c ready with its slice ({joined['slice']:,} targets, {2 * joined['slice']:,} rows handed off) "
          f"in {joined['join_s']:.1f} s; catch-up pulled {joined['sync'].get('records', 0):,} records "
          f"in {joined['sync'].get('ms', 0) / 1000:.1f} s")


if __name__ == "__main__":
    main()
