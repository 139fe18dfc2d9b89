"""A longer search than CI's: ``make sim SEEDS=500`` (``python -m tests.sim SEEDS [--first N] [--steps N]
[--nodes N] [--replicas R] [--strays] [--script NAME]``). Prints each failing seed with its replay line;
exits 1 if any failed."""

from __future__ import annotations

import argparse
import sys
import time

from tests.sim.history import SCRIPTS, SimFailure, simulate


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim")
    p.add_argument("seeds", type=int, help="how many seeds")
    p.add_argument("--first", type=int, default=1000, help="the first seed (CI runs low ones)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--replicas", type=int, default=2, help="cluster.replicas (>= the nodes: every node holds all)")
    p.add_argument("--strays", action="store_true", help="also fail on records kept by a non-holder")
    p.add_argument("--script", choices=sorted(SCRIPTS), default=None,
                   help="a scripted shape instead of the random walk (``minority``: the controller on the minority side)")
    a = p.parse_args()
    script, queue = SCRIPTS[a.script] if a.script else (None, None)
    failed: dict[str, list[int]] = {}
    t0 = time.monotonic()
    for seed in range(a.first, a.first + a.seeds):
        try:
            simulate(seed, steps=a.steps, nodes=a.nodes, strays=a.strays, replicas=a.replicas, script=script,
                     queue=queue)
        except SimFailure as e:
            failed.setdefault(e.invariant, []).append(seed)
            print(str(e).splitlines()[0], flush=True)
            print(f"  replay: SIM_SEED={seed} SIM_STEPS={a.steps} SIM_NODES={a.nodes}"
                  f"{' SIM_STRAYS=1' if a.strays else ''}{f' SIM_REPLICAS={a.replicas}' if a.replicas != 2 else ''}"
                  f"{f' SIM_SCRIPT={a.script}' if a.script else ''} .venv/bin/python -m pytest -q tests/sim -k replay -s",
                  flush=True)
    print(f"{a.seeds} seeds from {a.first} in {time.monotonic() - t0:.0f}s; failed: "
          + (", ".join(f"{k} {v}" for k, v in failed.items()) or "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
