"""What ``bench_serving`` stores and posts besides its wrk runs: the spread pages (through the fleet's
result path, or written straight into the node's store), a side client posting results at a set rate
while wrk runs, the probe of how soon a new page is served as a hit, and the page log's footprint.

Every request goes to 127.0.0.1. A bot request the cache cannot answer would fetch the page from its
origin (bench.example): the probes carry the staging header, and the deployment pins those fetches
to 127.0.0.1 (``origin.staging.ip``), where nothing listens.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import socket
import threading
import time
from collections import Counter, deque
from email.utils import formatdate
from pathlib import Path

import httpx

UA = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
ACCEPT = "gzip, deflate, br"
URL = "https://bench.example/catalog/item-42"  # the hot page; the spread pages are f"{URL}-{i}"
FRESH = "https://bench.example/fresh/item-"  # the new-page probe's pages (outside the spread set)
PROBE_HEADERS = {"x-harper-prerender-debug": "1", "x-harper-staging": "1"}
STAGING = {"origin": {"staging": {"ip": "127.0.0.1"}}}  # a miss's origin fetch goes nowhere
DAY_MS = 86_400_000
BATCH_BYTES = 8 * 1024 * 1024  # per store call of the direct writer (Ray ships it through its object store)
TARGETS_PER_CALL = 2000


def spread_url(i: int) -> str:
    return f"{URL}-{i}"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def result_doc(job: dict, gz: bytes) -> tuple[bytes, dict[str, str]]:
    """A render result as the fleet posts it: JSON metadata, then the gzip body."""
    meta = json.dumps({"id": job["id"], "url": job["url"], "statusCode": 200, "outcome": "rendered",
                       "renderTime": 900, "headers": {"content-type": "text/html; charset=utf-8",
                                                      "content-encoding": "gzip"}}).encode()
    return meta + gz, {"x-metadata-size": str(len(meta))}


def variants(html: bytes, count: int = 16) -> list[bytes]:
    """``count`` gzip bodies that differ from ``html`` and from each other (another ETag each): a
    result with one of them is a full page write, not a freshness touch."""
    return [gzip.compress(html.replace(b"<body>", f"<body><p>revision {v}</p>".encode(), 1))
            for v in range(count)]


def put_due(urls: list[str], due: int, node: str = "node-a") -> None:
    """Targets for ``urls`` due at ``due`` (epoch ms; 1: now), through the keeper actor in batches
    (the keeper's own put, as PUT /render_targets makes it, without 1,000,000 HTTP requests)."""
    import ray

    from prerender_ray.actors.common import lookup

    keeper = lookup("keeper", node)
    for c in range(0, len(urls), TARGETS_PER_CALL):
        items = [{"url": u, "nextRenderTime": due} for u in urls[c:c + TARGETS_PER_CALL]]
        ray.get(keeper.put_targets.remote(items), timeout=600)


# --------------------------------------------------------------------------- the direct writer


def write_direct(n: int, html: bytes, gz: bytes, *, node: str = "node-a") -> dict:
    """``n`` spread pages written straight into the node's store through its actor's ``apply``, each
    record built as a result builds it (``Page`` with the result's stored headers, ``encode_page``:
    the frame included), several batches in flight; then their targets, due in 30 days, so the
    keeper knows them as it would know rendered pages. Returns the seconds each part took."""
    import ray

    from prerender_ray.actors.common import lookup
    from prerender_ray.serving.framing import encode_page
    from prerender_ray.serving.volatile import content_digest
    from prerender_ray.storage.pages import Page

    store = lookup("store", node)
    now = int(time.time() * 1000)
    headers = {"content-type": "text/html; charset=utf-8", "content-encoding": "gzip", "x-harper-rendered": "1",
               "etag": f'"{content_digest(html, "identity", None)}"',
               "last-modified": formatdate(now / 1000, usegmt=True)}

    def record(i: int) -> tuple[bytes, bytes]:
        key = f"{spread_url(i)}|desktop"
        page = Page(cache_key=key, status_code=200, headers=headers, content=gz, last_cached=now,
                    expires_at=now + 30 * DAY_MS, is_indexable=True)
        return key.encode(), encode_page(page)

    batch = max(1, min(5000, BATCH_BYTES // len(record(0)[1])))
    start = time.perf_counter()
    pending: list = []
    step = max(batch, n // 10)
    for c in range(0, n, batch):
        pending.append(store.apply.remote([], [record(i) for i in range(c, min(n, c + batch))]))
        if len(pending) >= 3:
            done, pending = ray.wait(pending, num_returns=1, timeout=600)
            if not done:
                raise RuntimeError("the store did not take a batch of pages within 600 s")
            ray.get(done)
        if c and c % step < batch:
            rate = c / (time.perf_counter() - start)
            print(f"  direct: {c:,} pages written ({rate:,.0f}/s)", flush=True)
    ray.get(pending, timeout=600)
    pages_s = time.perf_counter() - start
    start = time.perf_counter()
    put_due([spread_url(i) for i in range(n)], now + 30 * DAY_MS, node)
    return {"pages_s": pages_s, "targets_s": time.perf_counter() - start, "batch": batch}


# ------------------------------------------------------------------------ the result path


def spread_pages(base: str, gz: bytes, n: int) -> float:
    """``n`` more pages through the real result path: a sitemap index lists them (new pages are due at
    once), then every job is claimed and its result posted through the fleet API as the fleet does
    (the same gzip body, 32 connections). Returns the seconds the results took."""
    from tests.sitemap_server import SitemapSite, index, urlset

    urls = [spread_url(i) for i in range(n)]
    site = SitemapSite()
    try:
        children = []
        for c in range(0, n, 50_000):
            site.put(f"/sm-{c}.xml", urlset(*urls[c:c + 50_000]))
            children.append(site.url(f"/sm-{c}.xml"))
        site.put("/index.xml", index(*children))
        r = httpx.post(f"{base}/sitemaps", json={"url": site.url("/index.xml"), "background": False}, timeout=1800)
        r.raise_for_status()
    finally:
        site.close()
    start = time.perf_counter()
    posted = asyncio.run(_render_all(base, gz, n))
    took = time.perf_counter() - start
    print(f"(e) pages: {posted:,} results posted through the fleet API in {took:.0f} s ({posted / took:.0f}/s)",
          flush=True)
    if posted < n:
        raise RuntimeError(f"only {posted:,} of {n:,} spread pages were stored")
    return took


async def _render_all(base: str, gz: bytes, n: int, connections: int = 32) -> int:
    """Claim and answer every spread page's job as a fleet would, ``connections`` workers at once."""
    posted = 0
    deadline = time.monotonic() + 3600

    async def worker(client: httpx.AsyncClient, name: str) -> None:
        nonlocal posted
        idle = 0
        while posted < n and time.monotonic() < deadline and idle < 60:
            r = await client.post(f"{base}/render_queue/claim", json={"limit": 25}, headers={"x-worker-id": name})
            jobs = [j for j in r.json() if j["url"].startswith(f"{URL}-")]
            if not jobs:
                idle += 1
                await asyncio.sleep(0.5)
                continue
            idle = 0
            for job in jobs:
                content, headers = result_doc(job, gz)
                r = await client.post(f"{job['callbackOrigin']}/render_queue/job_result", content=content,
                                      headers={**headers, "x-worker-id": name})
                posted += r.status_code == 204

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=connections)) as client:
        await asyncio.gather(*(worker(client, f"bench-{i}") for i in range(connections)))
    return posted


# ------------------------------------------------------------------ results while wrk runs


class RawPoster:
    """POSTs over kept-alive loopback connections with the least Python: the request's bytes written,
    the answer read by ``tests.api.live_server.response`` (the service's answers carry a Content-Length).
    httpx spent about a quarter of a core at 100 results a second, on the two cores the service under
    test has; wrk is C for the same reason."""

    def __init__(self, base: str, size: int) -> None:
        # here, not at the top: it imports the app and Ray, whose auth settings must come from the
        # cluster the bench starts first
        from tests.api.live_server import response

        self.response = response
        host, _, port = base.removeprefix("http://").rstrip("/").partition(":")
        self.host, self.port = host, int(port or 80)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(size)

    async def post(self, path: str, body: bytes, headers: dict[str, str], timeout: float = 30) -> tuple[int, bytes]:
        async with self.slots:
            reader, writer = self.idle.pop() if self.idle else await asyncio.open_connection(self.host, self.port)
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{head}"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            try:
                answer = await asyncio.wait_for(self.response(reader), timeout)
            except BaseException:
                writer.close()  # a connection the server closed, or an answer cut short: never reused
                raise
            self.idle.append((reader, writer))
            return answer

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


class ResultFeeder:
    """Posts render results at ``rate`` per second through the fleet API, claim + result as a worker
    does (to the job's ``callbackOrigin``: the replica wrk loads), for spread pages made due now, in
    its own thread and event loop, over ``RawPoster``s. Each result's body is another revision: a full page write."""

    def __init__(self, base: str, bodies: list[bytes], rate: float, in_flight: int = 32):
        self.base = base
        self.bodies = bodies
        self.rate = rate
        self.in_flight = in_flight
        self.ok = self.failed = self.claimed = 0
        self.latencies: list[float] = []
        self.started = self.first = self.ended = 0.0
        self._stop = threading.Event()
        self._flowing = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._next_body = 0
        self._posters: dict[str, RawPoster] = {}  # by origin: the claims' base, each job's callbackOrigin

    def _poster(self, origin: str) -> RawPoster:
        origin = origin.rstrip("/")
        if origin not in self._posters:
            self._posters[origin] = RawPoster(origin, self.in_flight + 1)
        return self._posters[origin]

    def start(self, urls: list[str]) -> None:
        put_due(urls, 1)
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._main, name="result-feeder", daemon=True)
        self._thread.start()
        if not self._flowing.wait(60):
            self.stop()
            raise RuntimeError(f"no result was accepted within 60 s ({self._error!r})")

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.ended = time.perf_counter()
        span = self.ended - (self.first or self.ended)
        return {"results_s": self.ok / span if span > 0 else 0.0, "ok": self.ok, "failed": self.failed,
                "post_p50": pct(self.latencies, 0.5) * 1000, "post_p99": pct(self.latencies, 0.99) * 1000}

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as e:  # reported by stop()'s figures and start()'s error
            self._error = e

    async def _run(self) -> None:
        jobs: deque[dict] = deque()
        tasks: set[asyncio.Task] = set()
        claiming: asyncio.Task | None = None
        interval = 1.0 / self.rate
        client = self._poster(self.base)
        try:
            due = time.perf_counter()
            while not self._stop.is_set():
                if len(jobs) < 2 * self.rate and (claiming is None or claiming.done()):
                    claiming = asyncio.create_task(self._claim(client, jobs))
                now = time.perf_counter()
                if now >= due and jobs and len(tasks) < self.in_flight:
                    task = asyncio.create_task(self._post(jobs.popleft()))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    due = max(due + interval, now - 1.0)  # catch up after a stall, at most a second's worth
                    continue
                await asyncio.sleep(min(max(due - now, 0.0), 0.005) or 0.001)
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for poster in self._posters.values():
                poster.close()

    async def _claim(self, client: RawPoster, jobs: deque[dict]) -> None:
        status, answer = await client.post("/render_queue/claim", b'{"limit": 25}',
                                           {"content-type": "application/json", "x-worker-id": "bench-feeder"})
        got = [j for j in json.loads(answer) if j["url"].startswith(f"{URL}-")] if status == 200 else []
        self.claimed += len(got)
        jobs.extend(got)
        if not got:
            await asyncio.sleep(0.2)  # the ready set is published every second

    async def _post(self, job: dict) -> None:
        body = self.bodies[self._next_body % len(self.bodies)]
        self._next_body += 1
        content, headers = result_doc(job, body)
        t = time.perf_counter()
        try:
            poster = self._poster(job["callbackOrigin"])
            status, _ = await poster.post("/render_queue/job_result", content, {**headers, "x-worker-id": "bench-feeder"})
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError):
            self.failed += 1
            return
        if status != 204:
            self.failed += 1
            return
        self.latencies.append(time.perf_counter() - t)
        self.ok += 1
        if not self.first:
            self.first = time.perf_counter()
            self._flowing.set()


# --------------------------------------------------------------------- a new page reaches hits


def cache_status(port: int, path: str) -> str:
    """``x-harper-cache`` of one GET on a connection of its own (with several replicas on the port,
    the kernel picks one per connection), or the status line when there is none."""
    head = "".join(f"{k}: {v}\r\n" for k, v in {"User-Agent": UA, "Accept-Encoding": ACCEPT, **PROBE_HEADERS}.items())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}Connection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        while s.recv(65536):  # the body: the server closes after it
            pass
    lines = data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-harper-cache":
            return value.strip().decode()
    return lines[0].decode(errors="replace")


def new_page_delays(base: str, port: int, bodies: list[bytes], n: int, consecutive: int,
                    deadline_s: float = 10.0) -> dict:
    """For ``n`` new pages, one at a time: post the result, then from its 204 GET the page (a new
    connection each) until ``consecutive`` answers in a row are hits. Seconds from the 204 to the
    first hit and to the last of the run of hits, and how many GETs missed first."""
    from tests.support import wait_for

    urls = [f"{FRESH}{i}" for i in range(n)]
    put_due(urls, 1)
    jobs: dict[str, dict] = {}
    wanted = {f"{u}|desktop" for u in urls}

    def granted() -> bool:
        r = httpx.post(f"{base}/render_queue/claim", json={"limit": 25}, headers={"x-worker-id": "bench-probe"},
                       timeout=30)
        jobs.update({j["id"]: j for j in r.json() if j["id"] in wanted})
        return len(jobs) == n

    wait_for(granted, timeout=120, interval=0.1, what=f"{n} new pages' jobs")
    first: list[float] = []
    run: list[float] = []
    misses: list[int] = []
    outcomes: Counter[str] = Counter()  # what the GETs that were not hits got
    late = 0
    with httpx.Client(timeout=30) as client:
        for i, job in enumerate(jobs.values()):
            content, headers = result_doc(job, bodies[i % len(bodies)])
            # the claim's worker: a result from another is told apart from the grant's holder
            r = client.post(f"{job['callbackOrigin']}/render_queue/job_result", content=content,
                            headers={**headers, "x-worker-id": "bench-probe"})
            t0 = time.perf_counter()
            if r.status_code != 204:
                raise RuntimeError(f"result for {job['url']}: {r.status_code} {r.text[:200]}")
            path = f"/p/{job['url']}"
            hit_at = None
            streak = missed = 0
            while streak < consecutive:
                now = time.perf_counter()
                if now - t0 > deadline_s:
                    late += 1
                    break
                status = cache_status(port, path)
                if status == "hit":
                    streak += 1
                    if hit_at is None:
                        hit_at = time.perf_counter() - t0
                        first.append(hit_at)
                else:
                    streak = 0
                    missed += 1
                    outcomes[status] += 1
            else:
                run.append(time.perf_counter() - t0)
            misses.append(missed)
    return {"n": n, "consecutive": consecutive, "first_p50": pct(first, 0.5) * 1000,
            "first_p99": pct(first, 0.99) * 1000, "run_p50": pct(run, 0.5) * 1000, "run_p99": pct(run, 0.99) * 1000,
            "missed_gets": sum(misses), "pages_with_misses": sum(1 for m in misses if m), "late": late,
            "first_max": max(first, default=float("nan")) * 1000, "outcomes": dict(outcomes.most_common(3))}


# ------------------------------------------------------------------------- the page log's footprint


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (blocks, not apparent sizes)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # compacted away meanwhile
                pass
    return total


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:")) / 1024


def replica_status(node: str = "node-a", replica: int = 0) -> dict:
    import ray

    from prerender_ray.actors.common import lookup

    return ray.get(lookup("ingress", node, replica).status.remote(), timeout=30)


def index_footprint(data_dir: Path, node: str = "node-a") -> dict:
    """The page log index as a replica holds it: this process loads the node's log with the same
    reader (``PageLogReader``, whose dict of entries is the whole index), timed, then again under
    ``tracemalloc`` for the bytes it allocates."""
    import tracemalloc

    from prerender_ray.storage.pagelog import PageLogReader
    from prerender_ray.storage.rocks import pagelog_path

    path = pagelog_path(data_dir, node)
    t = time.perf_counter()
    reader = PageLogReader(path)
    load_s = time.perf_counter() - t
    entries = len(reader)
    reader.close()
    del reader
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    reader = PageLogReader(path)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    reader.close()
    return {"entries": entries, "bytes": used, "per_page": used / max(1, entries), "load_s": load_s}


def spread_sample(n: int, k: int, rnd: random.Random) -> list[str]:
    return [spread_url(i) for i in rnd.sample(range(n), min(n, k))]
