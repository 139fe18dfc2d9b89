"""Queue benchmark through the real stack: keeper load rate from RocksDB and claim throughput over HTTP.

Run: ``.venv/bin/python bench/bench_queue.py [--rows 250000] [--seconds 10]``

1. Load: the rows of bench_keeper's corpus written to a real schedule RocksDB, then loaded the way
   the keeper does (store walk, decode, ``Ranking.upsert_many``), beside a bare RocksDB walk of the
   same store (the ceiling).
2. Claims: a single-node deployment on a local Ray (one ingress replica), ``--due`` targets due now;
   8 concurrent claimers (limit 20) for ``--seconds``; jobs granted per second, beside the same HTTP
   stack (uvicorn + FastAPI inside a Ray actor) returning a canned 20-job array (the ceiling).
   Ratios, not absolute figures: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
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

from bench.bench_keeper import cadence_for, corpus, route_of  # noqa: E402
from prerender_ray.queue.ranking import Ranking  # noqa: E402
from prerender_ray.queue.schedule import decode_many  # noqa: E402
from prerender_ray.storage.rocks import Store  # noqa: E402

CANNED = [{"id": f"https://www.example.com/p/{i}|desktop", "url": f"https://www.example.com/p/{i}",
           "deviceType": "desktop", "expiresAt": 1_796_000_000_000, "callbackOrigin": "http://127.0.0.1:9926",
           "isFromSitemap": True} for i in range(20)]


def bench_load(rows: int) -> dict:
    pairs = corpus(rows // 2, 7)
    with tempfile.TemporaryDirectory() as tmp:
        db = Store(Path(tmp) / "schedule")
        for i in range(0, len(pairs), 10_000):
            db.write(pairs[i:i + 10_000])
        db.flush()
        t0 = time.perf_counter()
        n = sum(1 for _ in db.items())
        walk = time.perf_counter() - t0
        t0 = time.perf_counter()
        ranking = Ranking(cadence_for)
        ranking.upsert_many(decode_many(db.items()), route_of)
        load = time.perf_counter() - t0
        db.close()
    assert len(ranking) == n == len(pairs)
    return {"rows": n, "walk_rps": n / walk, "load_rps": n / load}


# ------------------------------------------------------------------------------------------ claims


async def claimers(url: str, seconds: float, concurrency: int = 8) -> tuple[int, int]:
    """(jobs, requests) granted by ``concurrency`` claimers looping for ``seconds``."""
    jobs = reqs = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        async def worker() -> None:
            nonlocal jobs, reqs
            while time.perf_counter() < deadline:
                r = await client.post(url, json={"limit": 20})
                r.raise_for_status()
                jobs += len(r.json())
                reqs += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return jobs, reqs


def canned_actor(port: int):
    import ray
    import uvicorn
    from fastapi import FastAPI

    @ray.remote(num_cpus=0)
    class Canned:
        def __init__(self) -> None:
            app = FastAPI()

            from fastapi import Request
            from fastapi.responses import JSONResponse

            async def claim(request):  # type: ignore[no-untyped-def]
                body = await request.json()
                return JSONResponse(CANNED[: int(body.get("limit", 20))])

            # Real annotations (this module postpones them): FastAPI injects the request from them.
            claim.__annotations__ = {"request": Request, "return": JSONResponse}
            app.post("/render_queue/claim")(claim)

            from prerender_ray.actors.ingress import bind_socket

            sock = bind_socket("127.0.0.1", port, probe=True)
            self.server = uvicorn.Server(uvicorn.Config(app, loop="none", http="httptools", log_level="warning",
                                                        access_log=False))
            self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))

        async def ready(self) -> bool:
            while not self.server.started:
                await asyncio.sleep(0.05)
            return True

    actor = Canned.remote()
    ray.get(actor.ready.remote())
    return actor


def bench_claims(due: int, seconds: float) -> dict:
    import ray

    from prerender_ray.actors.common import lookup
    from tests.support import RayCluster, deploy_on, free_port

    cluster = RayCluster.start()
    try:
        canned_port = free_port()
        actor = canned_actor(canned_port)
        ceiling_jobs, ceiling_reqs = asyncio.run(claimers(f"http://127.0.0.1:{canned_port}/render_queue/claim",
                                                          seconds))
        ray.kill(actor)
        with tempfile.TemporaryDirectory() as tmp:
            d = deploy_on(cluster, Path(tmp) / "data", {"queue": {"maxClaimLimit": 25, "maxLeases": 1_000_000}})
            keeper = lookup("keeper", "node-a")
            batch = 2_000
            for i in range(0, due, batch):
                items = [{"url": f"https://bench.example/p/{j}", "nextRenderTime": 1}
                         for j in range(i, min(i + batch, due))]
                ray.get(keeper.put_targets.remote(items))
            time.sleep(2)
            jobs, reqs = asyncio.run(claimers(f"{d.url}/render_queue/claim", seconds))
            d.stop()
    finally:
        cluster.shutdown()
    return {"jobs_rps": jobs / seconds, "claims_rps": reqs / seconds,
            "ceiling_jobs_rps": ceiling_jobs / seconds, "ceiling_rps": ceiling_reqs / seconds, "granted": jobs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--due", type=int, default=50_000, help="targets due now (x2 devices) for the claim run")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    load = bench_load(args.rows)
    claims = bench_claims(args.due, args.seconds)
    print(f"queue benchmark: {load['rows']:,} schedule rows; {2 * args.due:,} due rows for claims")
    print(f"{'':44}{'this run':>16}{'baseline':>16}{'ratio':>8}{'goal':>22}")
    print(f"{'keeper load from RocksDB (rows/s)':44}{load['load_rps']:>16,.0f}{load['walk_rps']:>16,.0f}"
          f"{load['load_rps'] / load['walk_rps']:>8.2f}{'>= 500,000 rows/s':>22}")
    print(f"{'  (baseline: bare RocksDB walk; reference V8 load ~60,000 rows/s)':44}")
    print(f"{'claims: jobs granted/s (8 claimers, limit 20)':44}{claims['jobs_rps']:>16,.0f}"
          f"{claims['ceiling_jobs_rps']:>16,.0f}{claims['jobs_rps'] / claims['ceiling_jobs_rps']:>8.2f}"
          f"{'>= 0.50 of ceiling':>22}")
    print(f"{'claims: requests/s':44}{claims['claims_rps']:>16,.0f}{claims['ceiling_rps']:>16,.0f}")
    print("  (baseline: the same uvicorn + FastAPI stack in a Ray actor returning a canned 20-job array)")


if __name__ == "__main__":
    main()
