"""Keeper ranking benchmark: publish, load and memory at 250,000 rows, beside the reference (V8).

Run: ``.venv/bin/python bench/bench_keeper.py [--rows 250000] [--seed 7]``. One run, same rows
for every figure. Rows are stored-shaped: (UTF-8 cache key, encoded schedule value) pairs in key
order, as a RocksDB walk yields them. The corpus: two devices per URL; four sections with route
cadences of 6 h / 7 d or none (default 24 h); most rows carry their cadence, some a ladder rung,
5 % none; 70 % listed in a sitemap; about 30 % due.

Publish is measured the way the keeper runs it: once a simulated second, with churn in between
(claims lease 10 of the published keys each second; results reschedule them 30 s later), over
three simulated minutes, so the figure includes the once-a-minute rebuild of the merge. The cold
figure forces that rebuild on every call. The baseline scores every row and sorts. A full GC pass
is printed apart: it walks every held row, so the keeper should ``gc.freeze()`` after its load.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from prerender_ray.queue.ranking import Ranking
from prerender_ray.queue.row_classes import top_k_bruteforce
from prerender_ray.queue.schedule import ScheduleRow, decode_many
from prerender_ray.timeutil import DAY_MS, HOUR_MS, fnv1a32, minute

NOW = 1_780_000_000_000
K = 5_000
SECTIONS = (("catalog", 6 * HOUR_MS, 0.30), ("product", DAY_MS, 0.45), ("blog", 7 * DAY_MS, 0.15),
            ("help", 30 * DAY_MS, 0.10))
ROUTE_CADENCE = {"/catalog/": 6 * HOUR_MS, "/blog/": 7 * DAY_MS}


def route_of(key: str) -> str | None:
    """What the keeper does per URL: the path's first matching prefix route."""
    url = key[: key.find("|")]
    path = url[url.find("/", url.find("//") + 2):]
    for prefix in ROUTE_CADENCE:
        if path.startswith(prefix):
            return prefix
    return None


def cadence_for(route: Any) -> int:
    return ROUTE_CADENCE.get(route, DAY_MS)


def corpus(urls: int, seed: int) -> list[tuple[bytes, bytes]]:
    rnd = random.Random(seed)
    pairs = []
    for i in range(urls):
        section, cadence, _ = rnd.choices(SECTIONS, weights=[w for *_, w in SECTIONS])[0]
        url = f"https://www.example-shop.com/{section}/item-{i:07d}"
        if rnd.random() < 0.1:
            url += f"?page={rnd.randint(2, 9)}"
        sitemap = rnd.random() < 0.7
        x = rnd.random()
        carried = None if x < 0.05 else cadence // 2 if x < 0.15 and cadence > 6 * HOUR_MS else cadence
        span = carried or cadence
        due = minute(NOW - span * 3 // 10 + fnv1a32(url) % span)
        for device in ("desktop", "mobile"):
            key = f"{url}|{device}"
            pairs.append((key.encode(), ScheduleRow(key, due, sitemap, carried).encode()))
    pairs.sort()
    return pairs


def load(pairs: list[tuple[bytes, bytes]]) -> Ranking:
    ranking = Ranking(cadence_for, boost=2.0)
    ranking.upsert_many(decode_many(pairs), route_of)
    return ranking


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steady_publishes(ranking: Ranking, seconds: int) -> list[float]:
    """Publish once a simulated second; claims lease 10 published keys a second, results come back
    30 s later and reschedule their rows at cadence."""
    leased: set[str] = set()
    in_flight: deque[tuple[int, str]] = deque()
    samples = []
    now = NOW
    for _ in range(seconds):
        now += 1_000
        start = time.perf_counter()
        ready = ranking.top_k(K, now, leased.__contains__)
        samples.append(time.perf_counter() - start)
        for key in ready[:10]:
            leased.add(key)
            in_flight.append((now + 30_000, key))
        while in_flight and in_flight[0][0] <= now:
            _, key = in_flight.popleft()
            leased.discard(key)
            row = ranking.get(key)
            if row is not None:
                cadence = row.interval or cadence_for(row.route)
                ranking.upsert(key, minute(now) + cadence, row.from_sitemap, row.interval, row.route)
    return samples


def rebuilt_state(ranking: Ranking) -> dict:
    """The queue-state with its kept counts dropped first (the cost before they were kept)."""
    for cls in ranking._classes.values():
        cls.forget()
    return ranking.state(NOW)


def state_with_churn(ranking: Ranking, rounds: int = 20, changes: int = 50) -> list[float]:
    """Queue-state documents as the console asks them, every few seconds of a busy keeper: between two,
    ``changes`` rows rescheduled (results, about 10 a second)."""
    rnd = random.Random(3)
    keys = rnd.sample(list(ranking._where), 5_000)
    ranking.state(NOW)
    samples = []
    for _ in range(rounds):
        for key in rnd.sample(keys, changes):
            row = ranking.get(key)
            assert row is not None
            ranking.upsert(key, minute(NOW) + rnd.randrange(DAY_MS), row.from_sitemap, row.interval, row.route)
        samples.append(timed(partial(ranking.state, NOW)))
    return samples


def measure_ranking(pairs: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    ranking = load(pairs)
    out: dict[str, Any] = {
        "due": ranking.state(NOW)["now"]["due"],
        "classes": len(ranking._classes),
        "buckets": sum(len(c.buckets) for c in ranking._classes.values()),
    }
    gc.collect()  # so garbage of the sections above does not trigger a full pass inside one below
    out["cold"] = [timed(partial(ranking.top_k, K, NOW + i * 60_000)) for i in range(1, 41)]
    gc.collect()
    out["steady"] = steady_publishes(ranking, 180)
    leased = set(ranking.top_k(500, NOW))
    merged = ranking.top_k(K, NOW, leased.__contains__)
    brute: list[list] = []
    oracle = partial(top_k_bruteforce, k=K, now=NOW, cadence_for=cadence_for, is_leased=leased.__contains__)
    out["brute"] = [timed(lambda: brute.append(oracle(ranking.rows()))) for _ in range(3)]
    assert merged == [entry[0] for entry in brute[-1]], "the merge disagrees with the brute-force oracle"
    out["state_rebuilt"] = [timed(partial(rebuilt_state, ranking)) for _ in range(5)]
    out["state"] = state_with_churn(ranking)
    out["full_gc"] = [timed(gc.collect) for _ in range(3)]
    return out


def bytes_per_row(pairs: list[tuple[bytes, bytes]]) -> float:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    ranking = load(pairs)
    ranking.top_k(K, NOW)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    pairs = corpus(args.rows // 2, args.seed)
    n = len(pairs)

    load_times = []
    for _ in range(3):
        gc.collect()  # a dropped Ranking holds reference cycles (bucket <-> class): free it first
        load_times.append(timed(partial(load, pairs)))
    m = measure_ranking(pairs)
    per_row = bytes_per_row(pairs)  # last: a call timed right after tracemalloc.stop() stalls ~30 ms once

    ms, med = 1e3, statistics.median
    print(f"keeper benchmark: {n:,} rows ({n // 2:,} URLs x 2 devices), {m['classes']} classes, "
          f"{m['buckets']:,} buckets, {m['due']:,} due; publish top {K:,}")
    print(f"{'':34}{'this run':>22}{'reference (V8)':>18}{'goal':>12}")
    rows = [
        ("publish p50 (1/s, with churn)", f"{pct(m['steady'], 0.5) * ms:.3f} ms", "0.14-0.27 ms", "<= 1 ms"),
        ("publish p99 (1/s, with churn)", f"{pct(m['steady'], 0.99) * ms:.3f} ms", "", ""),
        ("publish, rebuilt merge p50", f"{pct(m['cold'], 0.5) * ms:.3f} ms", "", ""),
        ("publish, rebuilt merge p99", f"{pct(m['cold'], 0.99) * ms:.3f} ms", "", ""),
        ("baseline: score every row + sort", f"{med(m['brute']) * ms:.1f} ms", "", ""),
        ("load (decode + upsert)", f"{n / med(load_times):,.0f} rows/s", "~60,000 rows/s", ">= 500,000"),
        ("memory per row (tracemalloc)", f"{per_row:.0f} B", "~190 B", "<= 200 B"),
        ("queue-state, 50 changes since last", f"{med(m['state']) * ms:.2f} ms", "~0.5 ms", "<= 1 ms"),
        ("queue-state, counts rebuilt", f"{med(m['state_rebuilt']) * ms:.2f} ms", "", ""),
        ("full GC pass (process, rows held)", f"{med(m['full_gc']) * ms:.1f} ms", "", ""),
    ]
    for label, ours, ref, goal in rows:
        print(f"{label:34}{ours:>22}{ref:>18}{goal:>12}")


if __name__ == "__main__":
    main()
