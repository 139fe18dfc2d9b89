"""Result benchmark: the deployment's CPU per accepted render result, beside a floor measured in the
same run.

Run: ``.venv/bin/python bench/bench_results.py [--results 2000] [--concurrency 32] [--rounds 3]``

- A single-node deployment on a local Ray (defaults, desktop only). Each round puts ``--results``
  targets due now, claims them all through the fleet API, then posts one result per job (a 30 KB
  page, gzip, as the worker sends it) from ``--concurrency`` connections: the real fleet path, no
  browser.
- CPU: user + system time from ``/proc/<pid>/stat`` of every deployment process (the keeper, store,
  lease table, ingress replicas, controller, walker ...) over the posting phase, minus what those
  processes burn idle over as long (their timers), divided by the results accepted.
- Floor: in this process, the same page bytes and one schedule row written in one RocksDB batch per
  result (``Store.write``): what applying a result cannot do without.
- ``--paragraphs 10`` posts a 0.7 KB page instead: the difference is what scales with a result's bytes.
- ``--in-process``: then the same rounds against the same parts in one process without Ray
  (``tests.localnode``: calls copied as Ray copies them, one event loop), posted from another process.
  The node's CPU per result there, beside the deployment's, is what Ray's hops cost.
- Figures are per round and the best; the machine is shared, so read the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ray_env import isolate  # noqa: E402

isolate()

from result_cpu import (  # noqa: E402 (after isolate(): Ray reads the environment at import)
    idle_rates,
    net_of,
    page,
    post_all,
    post_round,
    put_and_claim,
    role,
    snapshot,
)


def profile_start(out: str | None, pids: dict[str, int]) -> list[subprocess.Popen]:
    """py-spy on the keeper, the store and the ingress replicas until stopped (``--profile DIR``): raw collapsed stacks."""
    if not out:
        return []
    Path(out).mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    return [subprocess.Popen([str(spy), "record", "-p", str(pid), "-r", "200", "-f", "raw", "--nonblocking",
                              "-o", str(Path(out) / f"{role(name)}-{pid}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, pid in pids.items() if role(name) in ("keeper", "store", "ingress")]


def profiled(out: str | None, pids: dict[str, int]) -> Callable[[], None]:
    """``profile_start`` now; the returned call stops the profilers (py-spy writes what it sampled)."""
    spies = profile_start(out, pids)

    def stop() -> None:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)

    return stop


def post_from_file(path: str) -> None:
    """The posting phase for another process (``--post``): the jobs file's posts, then wall and count."""
    jobs, concurrency, paragraphs = json.loads(Path(path).read_text())
    wall, ok = asyncio.run(post_all(jobs, concurrency, paragraphs))
    print(wall, ok)


def in_process(args: argparse.Namespace, paragraphs: int) -> list[float]:
    """CPU seconds per result of the node's parts in this process (``--in-process``), per round."""
    from tests.localnode import LocalNode

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRERENDER_LOG_DIR"] = str(Path(tmp) / "logs")  # to files, as placed on Ray
        node = LocalNode.start(Path(tmp) / "data", {"deviceTypes": {"default": ["desktop"]}})
        try:
            me = {"node": os.getpid()}
            for r in range(args.rounds):
                jobs = put_and_claim(node.url, [f"http://local-{r}.test/p/{i}" for i in range(args.results)])
                Path(tmp, "jobs.json").write_text(json.dumps([jobs, args.concurrency, paragraphs]))
                idle = idle_rates(me)
                before, start = snapshot(me), time.perf_counter()
                posted = subprocess.run([sys.executable, __file__, "--post", str(Path(tmp, "jobs.json"))],
                                        capture_output=True, text=True, timeout=600)
                wall = time.perf_counter() - start
                ok = int(posted.stdout.split()[1]) if posted.returncode == 0 else 0
                out.append(net_of(before, me, idle, wall)["node"] / max(ok, 1))
                print(f"in process, round {r + 1}: {ok}/{len(jobs)} accepted in {wall:.2f}s; "
                      f"node CPU {out[-1] * 1000:.2f} ms/result", flush=True)
        finally:
            node.stop(drain=False)
            os.environ.pop("PRERENDER_LOG_DIR", None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32, help="fleet connections posting (the figures are quoted at 32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paragraphs", type=int, default=500,
                    help="the page's size: 500 paragraphs make 33 KB of HTML; 10 make 0.7 KB (what scales with bytes)")
    ap.add_argument("--profile", default=None, help="py-spy the keeper, the store and the ingress replicas over the last round's posts into DIR")
    ap.add_argument("--in-process", action="store_true",
                    help="then the same rounds against the same parts in one process, without Ray")
    ap.add_argument("--post", default=None, help=argparse.SUPPRESS)  # the posting phase of --in-process
    args = ap.parse_args()
    if args.post:
        post_from_file(args.post)
        return
    paragraphs = max(1, args.paragraphs)

    from prerender_ray import logs
    from tests.support import RayCluster, deploy_on

    logs.setup(level="warning")
    cluster = RayCluster.start()
    rounds: list[tuple[float, float, dict[str, float], float]] = []  # per-result s, wall s, by role, floor
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = deploy_on(cluster, Path(tmp) / "data", {"deviceTypes": {"default": ["desktop"]}})
            for r in range(args.rounds):
                urls = [f"http://shop-{r}.test/p/{i}" for i in range(args.results)]
                last = r == args.rounds - 1
                got = post_round(d.url, urls, args.concurrency, paragraphs, Path(tmp) / f"floor-{r}",
                                 during=(lambda pids: profiled(args.profile, pids)) if last else None)
                rounds.append((got["per_result"], got["wall"], got["by_role"], got["floor"]))
                print(f"round {r + 1}: {got['ok']}/{got['jobs']} accepted in {got['wall']:.2f}s "
                      f"({got['ok'] / got['wall']:.0f}/s); deployment CPU {got['per_result'] * 1000:.2f} ms/result, "
                      f"floor {got['floor'] * 1000:.3f} ms, {got['per_group']:.1f} results per keeper group; "
                      + ", ".join(f"{k} {v * 1000:.2f}" for k, v in sorted(got["by_role"].items(), key=lambda x: -x[1])),
                      flush=True)
            d.stop()
    finally:
        cluster.shutdown()
    best = min(rounds, key=lambda x: x[0])
    print(f"result benchmark: {args.results} results of a {len(page(0, paragraphs)) / 1000:.1f} KB page (gzip), "
          f"{args.concurrency} connections, "
          f"{args.rounds} rounds, one node")
    print(f"{'':58}{'ms CPU/result':>14}{'x floor':>10}")
    print(f"{'floor: page + schedule row, one RocksDB batch, one process':58}{best[3] * 1000:>14.3f}{1:>10.1f}")
    print(f"{'deployment, all processes (best round)':58}{best[0] * 1000:>14.2f}{best[0] / best[3]:>10.1f}"
          f"   (goal <= 1 ms, issue 37)")
    for k, v in sorted(best[2].items(), key=lambda x: -x[1]):
        print(f"{'  ' + k:58}{v * 1000:>14.2f}")
    print(f"{'per round (ms CPU/result)':58}{'  '.join(f'{x[0] * 1000:.2f}' for x in rounds):>14}")
    if args.in_process:
        local = in_process(args, paragraphs)
        print(f"{'the same parts in one process, no Ray (best round)':58}{min(local) * 1000:>14.2f}"
              f"{min(local) / best[3]:>10.1f}")
        print(f"{'  per round (ms CPU/result)':58}{'  '.join(f'{x * 1000:.2f}' for x in local):>14}")


if __name__ == "__main__":
    main()
