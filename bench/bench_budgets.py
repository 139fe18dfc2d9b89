"""What strangers can hold on one ingress replica: request-body memory and slow connections
(docs/serving.md#slow-clients-and-connection-budgets).

Run: ``.venv/bin/python bench/bench_budgets.py [--posts 100] [--post-mb 9.5] [--slow 20000] [--window 25]``

One replica's app (``create_asgi``, the bot path in front of the routers) under uvicorn with the
replica's own config (``api.server.server_config``: the guarded protocol) in its own process,
outside Ray, with a page in its store; an origin on 127.0.0.1 (in this process) that reads and
discards request bodies.

- Bodies: RSS of the replica before, at peak (VmHWM, reset before each burst) and 2 s after a burst of
  ``--posts`` concurrent anonymous ``POST /p/<allowed-url>`` (the bypass path), first with 128-byte
  bodies (the baseline: what the requests themselves cost), then with ``--post-mb`` MB each.
- Slow clients: ``--slow`` connections that send a request's headers a byte every 10 s and never
  finish them, for ``--window`` seconds; meanwhile a normal client opens a new connection and GETs the
  stored page (a cache hit) every 250 ms. Shown: the most slow connections open at once, the hit's
  latency, the replica's own count of the connections it closed (header deadline, evicted at the cap),
  and how long each slow connection lived. Three rows: each slow client connects once (cap above
  ``--slow``, as far as the open-file limit allows); each reconnects as soon as it is closed (a
  sustained attack); and the same at the default cap.

The slow clients run in processes of 5,000 each, under the open-file limit; the script raises the
soft limit to the hard one. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

URL = "https://x.example/a"
HTML = b"<!doctype html><html><body>" + b"<p>rendered</p>" * 2000 + b"</body></html>"
SLOW_DRIP_S = 10.0  # as issue 35 measured it: a byte every 10 s
HIT_EVERY_S = 0.25
CONNECTS_AT_ONCE = 256  # per client process
CLIENTS_PER_PROCESS = 5_000
WAIT_S = 30.0


# ------------------------------------------------------------------------------------- the replica


def serve(port_file: str, data_dir: str, config_json: str) -> None:
    import uvicorn

    from prerender_ray.api.app import create_asgi
    from prerender_ray.api.context import NodeContext
    from prerender_ray.api.server import server_config
    from prerender_ray.config.model import Config
    from prerender_ray.identity.nodes import NodeInfo

    cfg = Config.model_validate(json.loads(config_json))
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=data_dir)

    async def main() -> None:
        from prerender_ray.actors.ingress import bind_socket

        sock = bind_socket("127.0.0.1", 0, probe=False)
        server = uvicorn.Server(server_config(create_asgi(ctx), cfg))
        Path(port_file).write_text(str(sock.getsockname()[1]))
        await server.serve(sockets=[sock])

    asyncio.run(main())


def store_page(data_dir: str) -> None:
    from prerender_ray.storage.pages import Page
    from prerender_ray.storage.replication import Clock, wrap
    from prerender_ray.storage.rocks import PAGES, Store, store_path

    now = int(time.time() * 1000)
    page = Page(cache_key=f"{URL}|desktop", status_code=200, content=gzip.compress(HTML), last_cached=now,
                expires_at=now + 3_600_000, headers={"content-type": "text/html", "content-encoding": "gzip"})
    primary = Store(store_path(data_dir, "n1", PAGES))
    primary.put(page.cache_key.encode(), wrap(Clock("n1").now(), page.encode()))
    primary.close()


class Replica:
    def __init__(self, data_dir: str, config: dict):
        self.port_file = Path(tempfile.mktemp(prefix="bench-budgets-port-"))
        self.metrics = tempfile.TemporaryDirectory(prefix="bench-budgets-metrics-")
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self.metrics.name}
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port_file), data_dir,
                                      json.dumps(config)], env=env)
        deadline = time.monotonic() + WAIT_S
        while not self.port_file.exists() or not self.port_file.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the replica did not start")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())

    def status(self, field: str) -> float:
        """A /proc/<pid>/status size in MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise KeyError(field)

    def reset_peak(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS

    def closed(self) -> dict[str, int]:
        """The replica's own count of connections it closed early, by reason."""
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.metrics.name)
        return {s.labels["reason"]: int(s.value) for m in registry.collect() for s in m.samples
                if s.name == "prerender_connections_closed_total"}

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.port_file.unlink(missing_ok=True)
        self.metrics.cleanup()


# -------------------------------------------------------------------------------------- the origin


class Sink:
    """An origin that reads each request body and throws it away, then answers 200 with 2 bytes."""

    def start(self) -> Sink:
        ready = threading.Event()
        self.loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)
        return self

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                               if line.startswith("content-length:")), 0)
                while length > 0:
                    chunk = await reader.read(min(length, 1 << 20))
                    if not chunk:
                        return
                    length -= len(chunk)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


# -------------------------------------------------------------------------------------- the bodies


async def burst(port: int, target: str, n: int, size: int) -> tuple[int, float]:
    import httpx

    body = b"b" * size
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(client.post(f"http://127.0.0.1:{port}/p/{target}", content=body)
                                         for _ in range(n)))
        ok = sum(1 for r in answers if r.status_code == 200)
        return ok, time.perf_counter() - t0


def bodies(data_dir: str, posts: int, post_mb: float) -> None:
    sink = Sink().start()
    target = f"http://127.0.0.1:{sink.port}/sink"
    replica = Replica(data_dir, {"domains": ["x.example", f"127.0.0.1:{sink.port}"],
                                 "server": {"dataDir": data_dir, "maxBodyBytes": int(post_mb * 1024 * 1024) + 1}})
    try:
        print(f"bodies: {posts} concurrent POST /p/<allowed-url> to one replica (pid {replica.proc.pid})")
        print(f"{'':28}{'answered':>10}{'seconds':>9}{'RSS before':>12}{'peak':>8}{'after 2 s':>11}  MB")
        asyncio.run(burst(replica.port, target, 4, 128))  # warm: the first request builds the bot path
        for name, size in (("128 B each (baseline)", 128), (f"{post_mb} MB each", int(post_mb * 1024 * 1024))):
            time.sleep(1)
            before = replica.status("VmRSS")
            replica.reset_peak()
            ok, seconds = asyncio.run(burst(replica.port, target, posts, size))
            peak = replica.status("VmHWM")
            time.sleep(2)
            after = replica.status("VmRSS")
            print(f"{name:28}{ok:>7}/{posts:<3}{seconds:>8.1f}{before:>12.0f}{peak:>8.0f}{after:>11.0f}")
        print(f"(a body held whole would be {posts * post_mb:,.0f} MB at once)")
    finally:
        replica.stop()


# --------------------------------------------------------------------------------- slow clients


DRIP = b"GET /p/" + URL.encode() + b" HTTP/1.1\r\nhost: x.example\r\nuser-agent: " + b"s" * 10_000


class Slow:
    def __init__(self) -> None:
        self.open: set[SlowConnection] = set()
        self.peak = 0
        self.lifetimes: list[float] = []  # seconds from connect to the server's close
        self.connect_errors = 0
        self.answered = 0  # the server answered headers that never ended: must stay 0


class SlowConnection(asyncio.Protocol):
    """A client that sends a request's headers a byte at a time (``Slow.drip`` writes them) and never
    finishes them. A protocol, not a coroutine per connection: cheap enough that 20,000 of them leave
    the CPU to the replica."""

    def __init__(self, slow: Slow, done: asyncio.Future):
        self.slow = slow
        self.done = done
        self.sent = 0
        self.t0 = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.t0 = time.monotonic()
        self.slow.open.add(self)
        self.slow.peak = max(self.slow.peak, len(self.slow.open))
        self.drip()

    def drip(self) -> None:
        if self.sent < len(DRIP):
            self.transport.write(DRIP[self.sent:self.sent + 1])  # type: ignore[attr-defined]
            self.sent += 1

    def data_received(self, data: bytes) -> None:
        self.slow.answered += 1
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.slow.open:
            self.slow.open.discard(self)
            self.slow.lifetimes.append(time.monotonic() - self.t0)
        if not self.done.done():
            self.done.set_result(None)


async def slow_client(port: int, stop: float, gate: asyncio.Semaphore, slow: Slow, reopen: bool) -> None:
    loop = asyncio.get_running_loop()
    first = True
    while time.monotonic() < stop and (first or reopen):  # bounded by the window
        first = False
        done = loop.create_future()
        async with gate:
            try:
                transport, conn = await asyncio.wait_for(
                    loop.create_connection(lambda: SlowConnection(slow, done), "127.0.0.1", port), 10)
            except (OSError, TimeoutError):
                slow.connect_errors += 1
                await asyncio.sleep(0.5)
                continue
        try:
            await asyncio.wait_for(asyncio.shield(done), max(0.0, stop - time.monotonic()))
        except TimeoutError:  # the window ended with it open
            slow.open.discard(conn)
            transport.close()


async def dripper(slow: Slow, stop: float) -> None:
    while time.monotonic() < stop:
        await asyncio.sleep(SLOW_DRIP_S)
        for conn in list(slow.open):
            conn.drip()


def probe(port: int, seconds: float) -> None:
    """A new connection and a GET of the stored page every HIT_EVERY_S, in a process of its own (the
    slow clients' loop must not delay it); prints the latencies and failures as JSON."""
    import httpx

    latencies: list[float] = []
    failed = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        with httpx.Client(timeout=5) as client:  # a fresh connection each time
            t0 = time.perf_counter()
            try:
                r = client.get(f"http://127.0.0.1:{port}/p/{URL}", headers={"accept-encoding": "gzip"})
                if r.status_code == 200 and r.content == HTML:
                    latencies.append(time.perf_counter() - t0)
                else:
                    failed += 1
            except httpx.HTTPError:
                failed += 1
        time.sleep(HIT_EVERY_S)
    print(json.dumps({"latencies": latencies, "failed": failed}))


def slow_worker(port: int, n: int, window: float, reopen: bool) -> None:
    """``n`` slow clients in a process of their own (each process keeps under its open-file limit);
    prints what they saw as JSON."""
    async def run() -> Slow:
        slow = Slow()
        stop = time.monotonic() + window
        gate = asyncio.Semaphore(CONNECTS_AT_ONCE)
        await asyncio.wait_for(asyncio.gather(dripper(slow, stop), *(slow_client(port, stop, gate, slow, reopen)
                                                                     for _ in range(n))), window + WAIT_S)
        return slow

    slow = asyncio.run(run())
    print(json.dumps({"peak": slow.peak, "lifetimes": slow.lifetimes, "connect_errors": slow.connect_errors,
                      "answered": slow.answered}))


async def slow_run(port: int, n: int, window: float, replica: Replica,
                   reopen: bool) -> tuple[dict, list[float], int, int]:
    import httpx

    async with httpx.AsyncClient(timeout=WAIT_S) as client:  # warm: the first request builds the bot path
        assert (await client.get(f"http://127.0.0.1:{port}/p/{URL}")).status_code == 200
    share = -(-n // CLIENTS_PER_PROCESS)
    workers = [await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--slow-worker", str(port), str(len(part)), str(window), str(int(reopen)),
        stdout=asyncio.subprocess.PIPE) for part in (range(n)[i::share] for i in range(share))]
    prober = await asyncio.create_subprocess_exec(sys.executable, __file__, "--probe", str(port), str(window),
                                                  stdout=asyncio.subprocess.PIPE)
    stop = time.monotonic() + window
    peak_fds = 0
    while time.monotonic() < stop:
        peak_fds = max(peak_fds, replica.fds())
        await asyncio.sleep(0.5)
    seen: dict = {"peak": 0, "lifetimes": [], "connect_errors": 0, "answered": 0}
    for worker in workers:
        out, _ = await asyncio.wait_for(worker.communicate(), 2 * WAIT_S)
        got = json.loads(out)
        seen["peak"] += got["peak"]
        seen["lifetimes"] += got["lifetimes"]
        seen["connect_errors"] += got["connect_errors"]
        seen["answered"] += got["answered"]
    out, _ = await asyncio.wait_for(prober.communicate(), WAIT_S)
    probed = json.loads(out)
    return seen, probed["latencies"], probed["failed"], peak_fds


def slow_clients(data_dir: str, n: int, window: float) -> None:
    from prerender_ray.api.server import connection_budget
    from prerender_ray.config.model import Config

    default_cap = Config().server.max_connections
    header_s = Config().server.header_timeout / 1000
    print(f"\nslow clients: {n} connections dripping a header byte every {SLOW_DRIP_S:.0f} s for {window:.0f} s, "
          f"and a cache hit on a new connection every {HIT_EVERY_S} s (header deadline {header_s:.0f} s)")
    print(f"{'':8}{'maxConnections':>15}{'slow open':>11}{'server fds':>12}{'hits':>6}{'failed':>8}{'hit p50':>9}"
          f"{'hit max':>9}{'timed out':>11}{'evicted':>9}{'refused':>9}{'lifetime p50':>14}{'p99':>7}{'max':>7}")
    for reopen, cap in ((False, n + 5_000), (True, n + 5_000), (True, default_cap)):
        replica = Replica(data_dir, {"domains": ["x.example"], "server": {"dataDir": data_dir, "maxConnections": cap}})
        try:
            seen, latencies, failed, fds = asyncio.run(slow_run(replica.port, n, window, replica, reopen))
            closed = replica.closed()
        finally:
            replica.stop()
        life = sorted(seen["lifetimes"]) or [0.0]
        q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
        print(f"{'reopened' if reopen else 'once':8}{connection_budget(cap):>15,}{seen['peak']:>11,}{fds:>12,}{len(latencies):>6}{failed:>8}"
              f"{q[49] * 1000:>7.1f}ms{max(latencies or [0]) * 1000:>7.1f}ms{closed.get('header-timeout', 0):>11,}"
              f"{closed.get('evicted', 0):>9,}{closed.get('refused', 0):>9,}"
              f"{statistics.median(life):>13.2f}s{life[int(len(life) * 0.99)]:>6.2f}s{life[-1]:>6.2f}s")
        if seen["connect_errors"] or seen["answered"]:
            print(f"  ({seen['connect_errors']} slow connects failed, {seen['answered']} slow ones answered)")
    print("once: each slow client connects once and is held until the server closes it; reopened: it "
          "connects again at once, for the whole window (a sustained attack)")
    print("maxConnections: the replica's cap, as its open-file limit lowers it "
          f"(hard limit here {resource.getrlimit(resource.RLIMIT_NOFILE)[1]:,}); slow open: the most each client "
          "process held, summed; server fds: the most the replica had open at once")
    print("timed out / evicted / refused: the replica's own count (prerender_connections_closed_total); "
          "lifetime: from the slow client's connect to the server's close, as the client saw it")


def raise_open_files() -> None:
    """Soft limit to the hard one (inherited by the replica and the client processes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--posts", type=int, default=100)
    ap.add_argument("--post-mb", type=float, default=9.5)
    ap.add_argument("--slow", type=int, default=20_000)
    ap.add_argument("--window", type=float, default=25.0)
    ap.add_argument("--serve", nargs=3, metavar=("PORT_FILE", "DATA_DIR", "CONFIG"), help=argparse.SUPPRESS)
    ap.add_argument("--slow-worker", nargs=4, metavar=("PORT", "N", "SECONDS", "REOPEN"), help=argparse.SUPPRESS)
    ap.add_argument("--probe", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    if args.probe:
        probe(int(args.probe[0]), float(args.probe[1]))
        return
    if args.slow_worker:
        slow_worker(int(args.slow_worker[0]), int(args.slow_worker[1]), float(args.slow_worker[2]),
                    args.slow_worker[3] == "1")
        return
    raise_open_files()
    with tempfile.TemporaryDirectory() as data_dir:
        store_page(data_dir)
        bodies(data_dir, args.posts, args.post_mb)
        slow_clients(data_dir, args.slow, args.window)


if __name__ == "__main__":
    main()
