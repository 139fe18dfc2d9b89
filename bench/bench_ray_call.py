"""What one Ray actor call costs in CPU, both sides, beside the same call made in-process: the floor
under every hop of the result path (issue 37: CPU per result).

Run: ``.venv/bin/python bench/bench_ray_call.py [--calls 2000] [--items 15] [--size 3000]``

- A local Ray (2 CPUs, the deployment's ``max_direct_call_object_size``), a caller actor and a callee
  actor. The caller awaits ``--calls`` calls one at a time, then eight at once, each carrying
  ``--items`` byte strings of ``--size`` bytes (a keeper group's shape); the callee answers one int.
  Both an async callee (``async def``, as the keeper, store and lease table are) and a threaded one.
- CPU: user + system time of the two actor processes from ``/proc/<pid>/stat`` over the calls.
- Baseline: the same payload awaited through a coroutine in this process (what the call would cost
  without the hop).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ray_env import isolate  # noqa: E402

isolate()

import ray  # noqa: E402 (after isolate(): Ray reads the environment at import)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@ray.remote(num_cpus=0)
class AsyncCallee:
    async def take(self, items: list[bytes]) -> int:
        return len(items)

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class ThreadedCallee:
    def take(self, items: list[bytes]) -> int:
        return len(items)

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class Caller:
    def __init__(self, callee: ray.actor.ActorHandle):
        self.callee = callee

    def pid(self) -> int:
        return os.getpid()

    async def run(self, calls: int, at_once: int, items: int, size: int) -> None:
        payload = [b"x" * size for _ in range(items)]

        async def one(n: int) -> None:
            for _ in range(n):
                await self.callee.take.remote(payload)

        await asyncio.gather(*(one(calls // at_once) for _ in range(at_once)))


async def local(calls: int, items: int, size: int) -> float:
    payload = [b"x" * size for _ in range(items)]

    async def take(items: list[bytes]) -> int:
        return len(items)

    start = time.process_time()
    for _ in range(calls):
        await take(payload)
    return (time.process_time() - start) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--items", type=int, default=15)
    ap.add_argument("--size", type=int, default=3000)
    args = ap.parse_args()
    from prerender_ray.identity.nodes import RAY_SYSTEM_CONFIG

    ray.init(num_cpus=2, include_dashboard=False, _system_config=RAY_SYSTEM_CONFIG)
    rows = []
    try:
        for name, kind in (("async callee", AsyncCallee), ("threaded callee", ThreadedCallee)):
            callee = kind.remote()
            caller = Caller.remote(callee)
            pids = ray.get(caller.pid.remote()), ray.get(callee.pid.remote())
            ray.get(caller.run.remote(200, 1, args.items, args.size))  # warm
            for at_once in (1, 8):
                before = [cpu_s(p) for p in pids]
                start = time.perf_counter()
                ray.get(caller.run.remote(args.calls, at_once, args.items, args.size))
                wall = time.perf_counter() - start
                spent = [cpu_s(p) - b for p, b in zip(pids, before)]
                rows.append((f"{name}, {at_once} in flight", wall / args.calls, spent[0] / args.calls,
                             spent[1] / args.calls))
            ray.kill(caller)
            ray.kill(callee)
    finally:
        ray.shutdown()
    base = asyncio.run(local(args.calls * 10, args.items, args.size))
    print(f"Ray actor call: {args.calls} calls of {args.items} x {args.size} B, CPU of both actor processes")
    print(f"{'':34}{'wall ms':>9}{'caller ms':>11}{'callee ms':>11}{'both ms':>9}{'x in-process':>14}")
    print(f"{'baseline: awaited in-process':34}{'':>9}{'':>11}{'':>11}{base * 1000:>9.4f}{1:>14.0f}")
    for name, wall, caller, callee in rows:
        print(f"{name:34}{wall * 1000:>9.3f}{caller * 1000:>11.3f}{callee * 1000:>11.3f}"
              f"{(caller + callee) * 1000:>9.3f}{(caller + callee) / base:>14,.0f}")


if __name__ == "__main__":
    main()
