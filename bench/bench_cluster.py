"""Cluster benchmark. Simulated nodes on one machine (ray.cluster_utils); all nodes share 2 cores, so
read the ratios and the bytes, not the times.

Run: ``.venv/bin/python bench/bench_cluster.py [--sections write,placement,join] [--writes 300]
[--renders 300] [--targets 1000000]``

- write: write cost and replication lag with 1, 2 and 3 nodes (every node holds everything):
  sequential ``PUT /render_targets`` through node-a's ingress beside the same number of ``GET
  /healthz`` (the HTTP floor in the same run); lag from the acknowledgement to the target being
  readable on every other node's store (polled).
- placement (issue 25): per-URL data on R nodes against full replication, at 3 nodes (R = 3, which is
  every node) and 5 nodes (R = 3, and R = 5 = full): ``--renders`` results of a ~30 KB gzip page
  posted through the fleet API (claimed, then ``job_result``), then the bytes shipped to peers per
  render (``prerender_replication_shipped_bytes_total`` of every node, before and after), the
  pages and targets each node holds and its store's bytes on disk; then bot hits (``GET /p/<url>``,
  Googlebot) of every rendered URL on every node, p50 / p99 on a holder (a local RocksDB read), on
  a non-holder reading a holder (the first request of each URL), and on a non-holder again (its
  cache of holder reads).
- join: 3 nodes with R = 2 hold ``--targets`` targets (written through their owners' keepers); a
  fourth node is added; the time until its store pulled its share (catch-up), its keeper is live
  with its slice handed over and its ingress answers /readyz.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
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
from prerender_ray.storage.rocks import PAGES, REGISTRY, store_path  # noqa: E402
from tests.support import RayCluster, claim, deploy_on, post_result, wait_for  # noqa: E402

UA = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"


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


# ------------------------------------------------------------------------------------ placement


def metric_sum(base: str, name: str, label: str = "") -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def drained(names: list[str]) -> bool:
    for n in names:
        rep = ray.get(lookup("store", n).status.remote(), timeout=60)["replication"]
        if any(rep["pending"].values()) or rep["resyncing"] or rep["rebalance"].get("state") == "running":
            return False
    return True


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def placement_round(rc: RayCluster, tmp: Path, nodes: int, replicas: int, renders: int) -> dict:
    names = [f"node-{c}" for c in "abcdefgh"[:nodes]]
    for n in names[1:]:
        if n not in rc.nodes:
            rc.add_node(n)
    data = tmp / f"placement-{nodes}-{replicas}"
    d = deploy_on(rc, data, {"domains": ["bench.example"], "cluster": {"replicas": replicas},
                             "render": {"reconcile": {"enabled": False}}}, timeout=300)
    wait_for(lambda: len(d.refresh()["nodes"]) == nodes and d.refresh()["healthy"], timeout=300, what="healthy")
    own = Ownership(names)
    urls = [f"https://bench.example/p/{nodes}-{replicas}/{i}" for i in range(renders)]
    by_owner: dict[str, list] = {}
    for u in urls:
        by_owner.setdefault(own.owner(u), []).append({"url": u, "nextRenderTime": 1})
    for owner, items in by_owner.items():
        ray.get(lookup("keeper", owner).put_targets.remote(items), timeout=120)
    wait_for(lambda: drained(names), timeout=300, interval=1, what="target replication to drain")
    shipped0 = sum(metric_sum(b, "prerender_replication_shipped_bytes_total") for b in d.urls.values())
    html, _ = page_html()
    jobs: dict[str, dict] = {}

    def claimed() -> bool:
        for base in d.urls.values():
            for job in claim(base, 50):
                jobs[job["id"]] = job
        return len({j["url"] for j in jobs.values()} & set(urls)) == renders

    wait_for(claimed, timeout=300, interval=0.5, what="every render claimed")
    posted = 0
    for job in jobs.values():
        if job["url"] in urls and job["deviceType"] == "desktop":
            r = post_result(job, html=html)
            assert r.status_code == 204, r.text
            posted += 1
    wait_for(lambda: drained(names), timeout=600, interval=1, what="page replication to drain")
    shipped = sum(metric_sum(b, "prerender_replication_shipped_bytes_total") for b in d.urls.values()) - shipped0
    held = {n: ray.get(lookup("store", n).counts.remote(), timeout=60) for n in names}
    disk = {n: disk_bytes(store_path(data, n, PAGES)) + disk_bytes(store_path(data, n, REGISTRY)) for n in names}
    # hits of every rendered URL on every node: holders read locally, the others read a holder
    client = httpx.Client(timeout=30, headers={"user-agent": UA, "accept-encoding": "gzip"})
    lat: dict[str, list[float]] = {"holder": [], "non-holder": [], "non-holder again": []}
    for rnd in (0, 1):
        for name, base in d.urls.items():
            for u in urls[:posted]:
                holder = name in own.holders(u, replicas)
                if rnd and holder:
                    continue
                t0 = time.perf_counter()
                r = client.get(f"{base}/p/{u}")
                ms = (time.perf_counter() - t0) * 1000
                assert r.status_code == 200, (name, u, r.status_code)
                lat["holder" if holder else ("non-holder again" if rnd else "non-holder")].append(ms)
    client.close()
    d.stop()
    for n in names[1:]:
        rc.remove_node(n)
    return {"nodes": nodes, "replicas": replicas, "renders": posted, "shipped_per_render": shipped / max(1, posted),
            "page_bytes": len(gzip.compress(html)), "held": held, "disk": disk,
            "lat": {k: (pct(v, 0.5), pct(v, 0.99), len(v)) for k, v in lat.items() if v}}


def page_html(target_gz: int = 30 * 1024) -> tuple[bytes, None]:
    words = ("product", "catalog", "price", "shipping", "review", "color", "size", "stock", "brand")
    rnd, parts = random.Random(5), [b"<!doctype html><html><body>"]
    while True:
        parts.append((" ".join(rnd.choice(words) + str(rnd.randrange(10_000)) for _ in range(40))).encode())
        html = b"<p>".join(parts) + b"</body></html>"
        if len(parts) % 20 == 0 and len(gzip.compress(html)) >= target_gz:
            return html, None


# ----------------------------------------------------------------------------------------- join


def join(rc: RayCluster, tmp: Path, targets: int) -> dict:
    """3 nodes with R = 2 hold ``targets``; node-d joins."""
    names = ["node-a", "node-b", "node-c"]
    for n in names[1:]:
        if n not in rc.nodes:
            rc.add_node(n)
    d = deploy_on(rc, tmp / "join", {"cluster": {"replicas": 2}, "render": {"reconcile": {"enabled": False}}},
                  timeout=300)
    wait_for(lambda: len(d.refresh()["nodes"]) == 3 and d.refresh()["healthy"], timeout=300, what="3 nodes")
    keepers = {n: lookup("keeper", n) for n in names}
    three = Ownership(names)
    batch: dict[str, list] = {n: [] for n in names}
    pending = []
    t0 = time.perf_counter()
    for i in range(targets):
        url = f"https://bench.example/join/{i}"
        owner = three.owner(url)
        batch[owner].append({"url": url})
        if len(batch[owner]) >= 2_000:
            pending.append(keepers[owner].put_targets.remote(batch[owner]))
            batch[owner] = []
        if len(pending) >= 6:
            ray.get(pending.pop(0), timeout=600)
    pending += [keepers[o].put_targets.remote(b) for o, b in batch.items() if b]
    ray.get(pending, timeout=600)
    wait_for(lambda: drained(names), timeout=3600, interval=2, what="replication to drain")
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rc.add_node("node-d")
    four = Ownership([*names, "node-d"])
    slice_d = share_d = 0
    for i in range(targets):
        url = f"https://bench.example/join/{i}"
        slice_d += four.owner(url) == "node-d"
        share_d += "node-d" in four.holders(url, 2)

    def ready() -> bool:
        d.refresh()
        url = d.urls.get("node-d")
        if not url:
            return False
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code != 200:
                return False
            return ray.get(lookup("keeper", "node-d").status.remote(), timeout=30)["rows"] >= 2 * slice_d
        except Exception:
            return False

    wait_for(ready, timeout=3600, interval=1.0, what="node-d ready with its slice")
    joined_s = time.perf_counter() - t0
    sync = ray.get(lookup("store", "node-d").status.remote(), timeout=60)["replication"]["sync"]
    d.stop()
    for n in ["node-b", "node-c", "node-d"]:
        rc.remove_node(n)
    return {"targets": targets, "slice": slice_d, "share": share_d, "write_s": load_s, "join_s": joined_s,
            "sync": sync}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="write,placement,join")
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--renders", type=int, default=300)
    ap.add_argument("--targets", type=int, default=1_000_000)
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    rc = RayCluster.start()
    rounds, placed, joined = [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if "write" in sections:
                d = deploy_on(rc, Path(tmp) / "d1", {"render": {"reconcile": {"enabled": False}}})
                rounds.append(write_round(d, ["node-a"], args.writes, "n1"))
                for n, names in (("node-b", ["node-a", "node-b"]), ("node-c", ["node-a", "node-b", "node-c"])):
                    rc.add_node(n)
                    wait_for(lambda k=len(names): len(d.refresh()["nodes"]) == k and d.refresh()["healthy"],
                             timeout=180, what=f"{len(names)} nodes")
                    rounds.append(write_round(d, names, args.writes, f"n{len(names)}"))
                d.stop()
                for n in ("node-b", "node-c"):
                    rc.remove_node(n)
            if "placement" in sections:
                for nodes, replicas in ((3, 3), (5, 3), (5, 5)):
                    placed.append(placement_round(rc, Path(tmp), nodes, replicas, args.renders))
            if "join" in sections:
                joined = join(rc, Path(tmp), args.targets)
        finally:
            rc.shutdown()
    if rounds:
        print(f"write cost ({args.writes} sequential writes per round; every node holds everything)")
        print(f"{'nodes':>6}{'write (PUT) ms':>16}{'HTTP floor ms':>15}{'ratio':>7}{'lag p50 ms':>12}{'lag p99 ms':>12}")
        for r in rounds:
            print(f"{r['nodes']:>6}{r['write_ms']:>16.2f}{r['floor_ms']:>15.2f}{r['write_ms'] / r['floor_ms']:>7.1f}"
                  f"{r.get('lag_p50_ms', float('nan')):>12.2f}{r.get('lag_p99_ms', float('nan')):>12.2f}")
    if placed:
        print(f"\nplacement: {args.renders} renders of a {placed[0]['page_bytes']:,}-byte gzip page, posted "
              "through the fleet API")
        print(f"{'nodes':>6}{'R':>4}{'shipped/render':>16}{'x page':>8}{'pages per node':>22}"
              f"{'store MB per node':>24}")
        for p in placed:
            pages = [h["pages"] for h in p["held"].values()]
            mb = [b / 1e6 for b in p["disk"].values()]
            print(f"{p['nodes']:>6}{p['replicas']:>4}{p['shipped_per_render']:>16,.0f}"
                  f"{p['shipped_per_render'] / p['page_bytes']:>8.2f}{min(pages):>10}-{max(pages):<11}"
                  f"{min(mb):>12.1f}-{max(mb):<11.1f}")
        print("\nbot hits (GET /p/<url>, sequential, one client), ms")
        print(f"{'nodes':>6}{'R':>4}  {'where':<18}{'p50':>8}{'p99':>8}{'n':>7}")
        for p in placed:
            for where, (p50, p99, n) in p["lat"].items():
                print(f"{p['nodes']:>6}{p['replicas']:>4}  {where:<18}{p50:>8.2f}{p99:>8.2f}{n:>7}")
    if joined:
        print(f"\njoin: {joined['targets']:,} targets on 3 nodes with R = 2 (written in {joined['write_s']:.0f} s); "
              f"node-d ready with its slice ({joined['slice']:,} targets owned, {joined['share']:,} held) in "
              f"{joined['join_s']:.1f} s; its catch-up pulled {joined['sync'].get('records', 0):,} records from "
              f"{len(joined['sync'].get('sources', []))} peers in {joined['sync'].get('ms', 0) / 1000:.1f} s "
              f"({joined['sync'].get('received', 0):,} sent by them)")


if __name__ == "__main__":
    main()
