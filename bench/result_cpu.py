"""The CPU a deployment spends per accepted render result, measured from outside: shared by
``bench_results.py`` (its rounds) and ``bench_serving.py`` (the issue's CPU-per-result row beside the
serving rows, on the same deployment).

- ``post_round``: puts ``urls`` due now, claims them all through the fleet API, then posts one result
  per job (a 33 KB page, gzip, as the worker sends it) from ``concurrency`` connections; CPU is user +
  system time from ``/proc/<pid>/stat`` of every deployment process (titled ``ray::<Class>``) over the
  posting phase, less what those processes burn idle over as long, divided by the results accepted.
- ``floor``: in this process, the same page bytes and one schedule row written in one RocksDB batch
  per result (``Store.write``): what applying a result cannot do without.

Import after the benchmark has set Ray's environment (``ray_env.isolate``).
"""

from __future__ import annotations

import asyncio
import gzip
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx

TICK = os.sysconf("SC_CLK_TCK")
PARAGRAPH = b"<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit. %d</p>"


def page(n: int, paragraphs: int) -> bytes:
    """Page ``n`` of ``paragraphs`` paragraphs (``--paragraphs``: 500 make the 33 KB page)."""
    html = (b"<!doctype html><html><head><title>Product %d</title></head><body><main>" + PARAGRAPH * paragraphs
            + b"</main></body></html>")
    return html.replace(b"%d", str(n).encode())


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def deployment_pids() -> dict[str, int]:
    """The deployment's actor processes: Ray titles each ``ray::<Class>[.<method>]``. The benchmark's
    cluster is the only one it may share the machine with, so run it alone."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::") and not title.startswith(("ray::IDLE", "ray::Dashboard", "ray::RuntimeEnv")):
            out[f"{title[5:].split('.')[0]} {proc.name}"] = int(proc.name)
    return out


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_s(pid) for name, pid in pids.items()}


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a.get(k, 0.0) for k in b}


def idle_rates(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds a second each process burns with no result arriving (its timers), after a settle."""
    time.sleep(1.0)
    before = snapshot(pids)
    time.sleep(3.0)
    return {k: v / 3.0 for k, v in delta(before, snapshot(pids)).items()}


def net_of(before: dict[str, float], pids: dict[str, int], idle: dict[str, float], wall: float) -> dict[str, float]:
    """CPU seconds each process spent since ``before``, less what it burns idle over ``wall``."""
    return {k: max(0.0, v - idle.get(k, 0.0) * wall) for k, v in delta(before, snapshot(pids)).items()}


def role(name: str) -> str:
    for r in ("keeper", "store", "lease", "ingress", "controller", "walker", "fleet"):
        if r in name.lower():
            return r
    return name


async def post_all(jobs: list[dict], concurrency: int, paragraphs: int) -> tuple[float, int]:
    from tests.support import result_body

    bodies = [result_body(j, html=page(i, paragraphs)) for i, j in enumerate(jobs)]
    queue = list(range(len(bodies)))
    ok = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal ok
        while queue:
            body, headers = bodies[queue.pop()]
            r = await client.post(f"{jobs[0]['callbackOrigin']}/render_queue/job_result", content=body,
                                  headers=headers)
            ok += r.status_code == 204

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(concurrency)))
        return time.perf_counter() - start, ok


def group_totals(base: str) -> tuple[float, float]:
    """(results, groups) the keeper applied so far: ``prerender_result_group_size``'s sum and count."""
    found = {"sum": 0.0, "count": 0.0}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        for part in found:
            if line.startswith(f"prerender_result_group_size_{part} "):
                found[part] = float(line.split()[-1])
    return found["sum"], found["count"]


def put_and_claim(base: str, urls: list[str]) -> list[dict]:
    from tests.support import take

    async def put() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            for i in range(0, len(urls), 50):
                await asyncio.gather(*(client.put(f"{base}/render_targets", json={"url": u, "nextRenderTime": 1})
                                       for u in urls[i: i + 50]))

    asyncio.run(put())
    jobs = take(base, [f"{u}|desktop" for u in urls], timeout=120)
    return [jobs[f"{u}|desktop"] for u in urls]


def floor(n: int, tmp: Path, paragraphs: int) -> float:
    """CPU seconds per result for the page and one schedule row in one RocksDB batch."""
    from prerender_ray.queue.schedule import ScheduleRow
    from prerender_ray.storage.pages import Page
    from prerender_ray.storage.rocks import Store

    store = Store(tmp / "floor")
    now = int(time.time() * 1000)
    bodies = [gzip.compress(page(i, paragraphs), 6) for i in range(n)]
    start = time.process_time()
    for i, body in enumerate(bodies):
        key = f"https://shop.test/p/{i}|desktop"
        rec = Page(cache_key=key, status_code=200, headers={"content-type": "text/html", "content-encoding": "gzip"},
                   content=body, last_cached=now, expires_at=now + 86_400_000).encode()
        row = ScheduleRow(key, now + 86_400_000, False, 86_400_000).encode()
        store.write([(b"p:" + key.encode(), rec), (b"s:" + key.encode(), row)])
    spent = time.process_time() - start
    store.close()
    return spent / n


def post_round(base: str, urls: list[str], concurrency: int, paragraphs: int, floor_dir: Path,
               during: Callable[[dict[str, int]], Callable[[], None]] | None = None) -> dict:
    """One round against the deployment at ``base``: the CPU a result by process role, the keeper's
    group size, the wall time, the results accepted, and the floor measured right after. ``during``
    (a profiler) is started with the deployment's processes as the posts begin and stopped as they end."""
    pids = deployment_pids()
    jobs = put_and_claim(base, urls)
    idle = idle_rates(pids)
    before, groups0 = snapshot(pids), group_totals(base)
    stop = during(pids) if during is not None else None
    wall, ok = asyncio.run(post_all(jobs, concurrency, paragraphs))
    if stop is not None:
        stop()
    net = net_of(before, pids, idle, wall)
    groups1 = group_totals(base)
    by_role: dict[str, float] = {}
    for name, v in net.items():
        by_role[role(name)] = by_role.get(role(name), 0.0) + v / max(ok, 1)
    return {"per_result": sum(net.values()) / max(ok, 1), "by_role": by_role, "wall": wall, "ok": ok,
            "jobs": len(jobs), "per_group": (groups1[0] - groups0[0]) / max(1.0, groups1[1] - groups0[1]),
            "floor": floor(len(urls), floor_dir, paragraphs)}
