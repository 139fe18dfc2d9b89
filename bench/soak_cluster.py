"""Soak (issue 25): three nodes, each a network namespace of its own (tests/netns.py, as the namespace
cluster tests build them), under mixed traffic for ``--minutes`` with a random actor killed every
``--kill-every`` seconds.

Run (root, Linux): ``.venv/bin/python bench/soak_cluster.py [--minutes 30] [--kill-every 180]
[--replicas 2]``

Traffic, from inside the namespaces, on every node all along: bot GETs of cached pages (both devices),
a fleet that claims jobs and posts a rendered page for each, target writes of new URLs (due now, so
the fleet renders them) and admin reads (``/readyz`` and ``GET /render_targets``). Every few minutes
one actor (a keeper, a store, a lease table or an ingress replica of a random node) is killed with
``ray.kill``; the controller places it again. Printed: the RSS of every process of every node at the
start and at the end, every error and every answer that was not a success (with when it came,
relative to the kills), the counts of each kind of traffic, and a final check, once the traffic has
stopped, that every target written (seeded and acknowledged during the soak) is readable on every
node, every seeded page is served from the cache on every node, every key's schedule row is on
exactly its owner, and no key was granted while a lease on it was live.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import netns  # noqa: E402
from tests.actors import test_netns_cluster as T  # noqa: E402

KINDS = (("keeper", None), ("store", None), ("leases", None), ("ingress", 0))


def rss(c: T.Cluster) -> dict[str, list[tuple[int, str]]]:
    """Per host: (RSS in MB, program) of every process in its namespace."""
    out: dict[str, list[tuple[int, str]]] = {}
    for h in T.HOSTS:
        rows = []
        for pid in c.net.pids(h):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
                name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except (OSError, StopIteration):
                continue
            rows.append((kb // 1024, name.rsplit("/", 1)[-1][:40]))
        out[T.NODE[h]] = sorted(rows, reverse=True)
    return out


def print_rss(title: str, table: dict[str, list[tuple[int, str]]]) -> None:
    print(f"\n{title}")
    for node, rows in table.items():
        print(f"  {node}: {sum(mb for mb, _ in rows)} MB in {len(rows)} processes: "
              + ", ".join(f"{name} {mb}" for mb, name in rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--kill-every", type=float, default=180)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    reason = netns.unavailable()
    if reason:
        sys.exit(f"soak skipped: network namespaces unavailable: {reason}")
    netns.remove_leftovers()
    root = Path(f"/tmp/soak-{int(time.time())}")
    root.mkdir(parents=True)
    env = netns.ray_env(secrets.token_hex(32), {T.FLEET_ENV: secrets.token_hex(16), T.ADMIN_ENV: secrets.token_hex(16)})
    c = T.Cluster(netns.Net(list(T.HOSTS)), env, root, root / "data")
    rnd = random.Random(7)
    try:
        c.net.up()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            started = [pool.submit(c.start_ray, "a")]
            time.sleep(2)
            started += [pool.submit(c.start_ray, h) for h in ("b", "c")]
            for f in started:
                f.result()
        c.agent("a")
        c.drv("drv_deploy", f"{c.net.addr['a']}:6379", str(c.data_dir),
              {"cluster": {"replicas": args.replicas}}, timeout=200)
        c.ledger += c.drv("drv_seed", c.bases(*T.HOSTS), timeout=120)
        T.settle(c, T.HOSTS, T.URLS, timeout=120, r=args.replicas)
        before = rss(c)
        all_nodes = c.bases(*T.HOSTS)
        c.drv("probe_start", "soak", {"bots": all_nodes, "claims": all_nodes, "writes": all_nodes,
                                      "reads": all_nodes, "fresh": f"{T.SITE}/soak/", "answer": True,
                                      "limit": 10, "pause": 0.5, "timeout": 10.0})
        t0 = T.now_ms()
        end = time.monotonic() + args.minutes * 60
        kills: list[tuple[int, str]] = []
        while time.monotonic() < end:
            time.sleep(min(args.kill_every, max(0.0, end - time.monotonic())))
            if time.monotonic() >= end:
                break
            kind, index = rnd.choice(KINDS)
            node = T.NODE[rnd.choice(T.HOSTS)]
            try:
                kills.append((T.now_ms(), c.drv("drv_kill", kind, node, index, timeout=30)))
            except Exception as e:
                kills.append((T.now_ms(), f"{kind}:{node} not killed: {e!r}"[:200]))
            print(f"+{(kills[-1][0] - t0) / 1000:.0f} s killed {kills[-1][1]}", flush=True)
        rec = c.drv("probe_stop", "soak", timeout=120)
        acked = [w["url"] for w in rec["writes"] if w.get("status") == 200]
        c.ledger += rec["grants"]
        ok = {"bots": lambda r: r.get("status") == 200, "claims": lambda r: "error" not in r,
              "writes": lambda r: r.get("status") == 200, "reads": lambda r: r.get("ready") == 200 and r.get("target") == 200,
              "results": lambda r: r.get("status") == 204}
        print(f"\nsoak: {args.minutes:g} min on 3 namespace nodes, cluster.replicas {args.replicas}; kills:",
              [(round((t - t0) / 1000), what) for t, what in kills])
        for kind, good in ok.items():
            bad = [r for r in rec[kind] if not good(r)]
            print(f"{kind}: {len(rec[kind])} requests, {len(bad)} not a success", T.summary(bad, "node", "status"))
            spans: dict[str, list] = {}  # each kind of failure: when it began and ended, how often, a sample
            for r in bad:
                what = f"{r.get('node')} {r.get('error') or r.get('status') or (r.get('ready'), r.get('target'))}"
                span = spans.setdefault(what, [r["t"], r["t"], 0, r])
                span[1], span[2] = r["t"], span[2] + 1
            for what, (first, last, n, sample) in spans.items():
                print(f"   {what}: {n} from +{(first - t0) / 1000:.1f} s to +{(last - t0) / 1000:.1f} s; e.g. "
                      f"{ {k: v for k, v in sample.items() if k not in ('t', 'node')} }"[:400])
        t_settle = time.monotonic()
        try:
            T.settle(c, T.HOSTS, T.URLS + acked, timeout=300, r=args.replicas)
            settled = f"settled in {time.monotonic() - t_settle:.1f} s"
        except AssertionError as e:
            settled = f"NOT SETTLED: {e}"
        doubles = T.double_grants(c.ledger, c.deaths)
        print_rss("RSS at the start (MB)", before)
        print_rss("RSS at the end (MB)", rss(c))
        print(f"\nfinal check: {len(T.URLS) + len(acked)} targets ({len(acked)} written during the soak), "
              f"{len(T.PAGED) * 2} seeded pages, {len(T.KEYS)} seeded schedule rows: {settled}; "
              f"keys granted inside a live lease: {len(doubles)}", *doubles[:10], sep="\n")
    finally:
        c.close()


if __name__ == "__main__":
    main()
