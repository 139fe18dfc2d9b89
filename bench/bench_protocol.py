"""The ingress's HTTP protocol in process (issue 37): raw requests fed to a replica's protocol
(``api.connections.GuardedHttp`` over the real app, ``api.app.create_asgi``) through a fake
transport, no socket and no Ray, beside raw httptools parsing the same bytes in the same run.

Run: ``.venv/bin/python bench/bench_protocol.py [--pages 100000] [--requests 20000] [--rounds 3] [--alone] [--steps]``

Where the per-URL path is compiled (``prerender_ray/native``), the same rows are measured from
source in a process of their own (``PRERENDER_RAY_NATIVE=0``) and printed beside them.

Rows, each the best of its rounds in microseconds a request:

- **httptools**: the parser alone, one write of a fixed answer per request (the baseline);
- **protocol around an answer**: the replica's protocol with the bot path's answer stubbed (what the
  protocol itself costs: uvicorn's callbacks, the deadlines, the checks);
- **hot hit**: one page asked again and again (the hit memo);
- **floor + decision, spread**: ``bench/serving_floor.py``'s server of the least Python (httptools, the
  ingress decision, the page log's index, one checksummed ``pread``, one write) over the spread pages:
  what the bot path's own work is measured against;
- **spread hit**: pages in random order, each asked once (a crawl: the spread lane); each round asks
  pages no round asked before while there are enough (``--pages`` >= rounds x ``--requests``).

With ``--steps``, a spread hit's budget: the same replica's steps timed one by one over pages no round
asked for (the ingress decision, the lane's entry and answer, and inside the answer each step as
``Lane.wire`` takes it), beside the whole request through the protocol.

The pages are written as the store writes them (a framed record in its replication envelope, into the
page log); bodies are 30 KB of gzip, all in the page cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from email.utils import formatdate
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httptools  # noqa: E402
import uvloop  # noqa: E402

from bench.bench_page_reader import write_pages  # noqa: E402
from bench.bench_serving import page_html  # noqa: E402
from prerender_ray.serving.volatile import content_digest  # noqa: E402
from prerender_ray.storage.pages import Page  # noqa: E402
from tests.support import FakeTransport  # noqa: E402

NODE = "node-a"
URL = "https://bench.example/catalog/item-"
UA = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
DAY_MS = 86_400_000
STUB = [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", b"hello"]


def request(i: int) -> bytes:
    return (f"GET /p/{URL}{i} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: {UA}\r\n"
            "Accept-Encoding: gzip, deflate, br\r\n\r\n").encode()


def fill(data_dir: Path, pages: int) -> None:
    html, gz = page_html()
    now = int(time.time() * 1000)
    headers = {"content-type": "text/html; charset=utf-8", "content-encoding": "gzip", "x-harper-rendered": "1",
               "etag": f'"{content_digest(html, "identity", None)}"', "last-modified": formatdate(now / 1000, usegmt=True)}
    write_pages(data_dir, pages, lambda i: Page(cache_key=f"{URL}{i}|desktop", status_code=200, headers=headers,
                                                content=gz, last_cached=now, expires_at=now + 30 * DAY_MS,
                                                is_indexable=True), NODE)


class Transport(FakeTransport):
    """Counts what is written; never pauses, never closes unless told."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def write(self, data: Any) -> None:
        self.written += len(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.written += len(data)



async def feed(proto: Any, requests: list[bytes]) -> tuple[float, int]:
    """Microseconds a request, and how many went through the ASGI path."""
    via_asgi = 0
    start = time.perf_counter()
    for data in requests:
        proto.data_received(data)
        if proto.cycle is not None and not proto.cycle.response_complete:
            via_asgi += 1
            while not proto.cycle.response_complete:
                await asyncio.sleep(0)
    return (time.perf_counter() - start) / len(requests) * 1e6, via_asgi


def steps(ctx: Any, proto: Any, fresh: list[int]) -> dict[str, float]:
    """Microseconds a spread hit spends in each step, over ``fresh`` pages (never asked before), as
    ``BotMiddleware.wire`` and ``Lane.wire`` take them; the class entry is the lane's newest."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE

    from prerender_ray.api.bot.lane import _LINK, link_line
    from prerender_ray.api.bot.wire import HEAD_END
    from prerender_ray.serving.framing import takes_stored, wire_frame
    from prerender_ray.serving.responses import age_seconds
    from prerender_ray.storage.pagelog import key_hash
    from prerender_ray.storage.pages import decode_head
    from prerender_ray.storage.replication import payload_view
    from prerender_ray.timeutil import now_ms

    state = ctx.state
    services, lane, dater = state.services, state.services.lane, proto._dated.dater
    pages, reader = services.pages, services.pages.log
    entry = next(reversed(lane._entries.values()))
    headers = {"host": "127.0.0.1:8080", "user-agent": UA, "accept-encoding": "gzip, deflate, br"}
    names = ("the ingress decision", "the lane's class entry", "the lane's answer (Lane.wire)", "  key hash, index entry",
             "  pread and checksum", "  envelope and record head", "  Date, frame lines, coding", "  the head joined",
             "  the counts")
    spent = dict.fromkeys(names, 0)
    clock = time.perf_counter_ns
    half = len(fresh) // 2
    for n, i in enumerate(fresh):
        a = clock()
        req = state.resolve("GET", f"/p/{URL}{i}", "", headers)
        b = clock()
        now = now_ms()
        if n < half:  # the lane as it runs
            found = lane.find(lane.key(entry.who, entry.site, req), state, entry.who, entry.site, req, now)
            c = clock()
            lane.wire(found or entry, state, req, headers, now, dater, False)
            d = clock()
            spent[names[0]] += b - a
            spent[names[1]] += c - b
            spent[names[2]] += d - c
            continue
        # its steps one by one, on other pages (a page read twice is cheaper the second time)
        t0 = clock()
        hashed = key_hash(req.cache_key)
        pages.log_entry(hashed)
        t1 = clock()
        hit = reader.get(hashed)
        t2 = clock()
        head = decode_head(payload_view(hit.data))
        t3 = clock()
        second, date = dater.date()
        wired = wire_frame(head.frame)
        takes_stored(wired.coding, headers["accept-encoding"])
        lines = wired.lines(second, date)
        t4 = clock()
        tail = [link_line(req.url) if line is _LINK else line for line in entry.tail]
        age = age_seconds(hit.last_cached, now)
        b"".join((STATUS_LINE[200], b"date: ", date, b"\r\n", lines, b"" if age is None else b"age: %d\r\n" % age,
                  *tail, HEAD_END[False]))
        t5 = clock()
        for fn, args in entry.steps:
            fn(*args)
        for fn, args in entry.timed:
            fn(services, now, hit.last_cached, *args[1:])
        t6 = clock()
        for name, took in zip(names[3:], (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            spent[name] += took
    return {name: took / (half if k < 3 else len(fresh) - half) / 1e3 for k, (name, took) in enumerate(spent.items())}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", action="store_true", help="time a spread hit's steps one by one (its budget)")
    ap.add_argument("--alone", action="store_true",
                    help="this build only (by default a compiled build is measured beside its sources)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the sources' run, for the table
    args = ap.parse_args()
    from prerender_ray import native

    sources: dict[str, list] | None = None
    if native.state == "compiled" and not args.alone:  # the same rows from source, in a process of its own
        env = {**os.environ, native.SWITCH: "0"}
        argv = [sys.executable, __file__, "--alone", "--json", "--pages", str(args.pages), "--requests",
                str(args.requests), "--rounds", str(args.rounds)]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        sources = json.loads(next(line for line in out.splitlines() if line.startswith("rows "))[5:])

    from uvicorn.server import ServerState

    from prerender_ray.api.app import create_asgi
    from prerender_ray.api.context import NodeContext
    from prerender_ray.api.server import server_config
    from prerender_ray.config.model import Config
    from prerender_ray.identity.nodes import NodeInfo

    tmp = tempfile.TemporaryDirectory(prefix="bench-protocol-")
    data = Path(tmp.name) / "data"
    started = time.perf_counter()
    fill(data, args.pages)
    print(f"{args.pages:,} pages of 30 KB written in {time.perf_counter() - started:.1f} s", flush=True)
    cfg = Config.model_validate({"domains": ["bench.example", "127.0.0.1:*"], "deviceTypes": {"default": ["desktop"]},
                                 "origin": {"staging": {"ip": "127.0.0.1"}}})
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name=NODE, host="127.0.0.1", port=8080, ray_node_id=""),
                      data_dir=str(data), replica=0)
    config = server_config(create_asgi(ctx), cfg)
    config.load()
    loop = asyncio.get_running_loop()

    def protocol() -> tuple[Any, Transport]:
        proto = config.http_protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        transport = Transport()
        proto.connection_made(transport)
        return proto, transport

    proto, _ = protocol()
    for i in range(50):  # the replica opens on its first requests (the ASGI path); the decision memo fills
        await feed(proto, [request(i)])
        await asyncio.sleep(0.001)
    while getattr(getattr(ctx.state, "services", None), "pages", None) is None or ctx.state.services.pages.log is None:
        await asyncio.sleep(0.05)

    order = list(range(args.pages))
    random.Random(37).shuffle(order)
    hot = [request(7)] * args.requests
    stubbed, _ = protocol()
    # its own view of the app (the app itself is shared with ``proto``): the bot path's answer stubbed
    stubbed._dated = SimpleNamespace(bot=SimpleNamespace(wire=lambda scope, dater, close: STUB),
                                     dater=stubbed._dated.dater)
    stubbed._simple = proto._simple  # simple reads taken whole as the replica takes them (native)

    class Raw:
        def __init__(self, transport: Transport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.cycle = None

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_message_complete(self) -> None:
            self.transport.writelines(STUB)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

    raw = Raw(Transport())
    # the least Python over the same page log with the ingress decision (bench/serving_floor.py, beside
    # bench_serving's row (e)): what a spread hit costs in process with nothing of the bot path but that
    from bench.serving_floor import Floor

    floor_proto = Floor(ctx.state.services.pages.log, ctx.state.ingress)
    floor_proto.cycle = None  # type: ignore[attr-defined]  # as feed() reads it
    floor_proto.connection_made(Transport())
    best: dict[str, tuple[float, int]] = {}
    for n in range(args.rounds):
        first = n * args.requests % args.pages
        spread = [request(i) for i in (order + order)[first:first + args.requests]]
        for name, target, reqs in (("httptools", raw, hot), ("protocol around an answer", stubbed, hot),
                                   ("hot hit", proto, hot), ("floor + decision, spread", floor_proto, spread),
                                   ("spread hit", proto, spread)):
            got = await feed(target, reqs)
            if name not in best or got[0] < best[name][0]:
                best[name] = got
    services = ctx.state.services
    budget = None
    if args.steps:  # pages no round asked for (a short --pages reuses the first ones)
        used = args.rounds * args.requests
        fresh = (order[used:] if used < len(order) else order)[:args.requests]
        lane_ttl, services.lane.ttl_ms = services.lane.ttl_ms, 10 ** 9  # one class entry throughout
        await feed(proto, [request(i) for i in fresh[:1]] * 2)
        budget = steps(ctx, proto, fresh[1:])
        services.lane.ttl_ms = lane_ttl
    tmp.cleanup()
    if args.json:
        print("rows " + json.dumps(best))
        return
    floor = best["httptools"][0]
    print(f"in process, {args.requests:,} requests a round, best of {args.rounds} rounds; the per-URL path "
          f"{native.state}")
    print(f"{'':32s} {'us/request':>10s} {'x httptools':>12s}  through ASGI" +
          ("   from source  compiled/source" if sources else ""))
    for name, (us, via_asgi) in best.items():
        line = f"{name:32s} {us:10.2f} {us / floor:12.1f}  {via_asgi:12,}"
        if sources:
            line += f"   {sources[name][0]:11.2f}  {us / sources[name][0]:15.2f}"
        print(line)
    print(f"spread lane: {services.lane.hits:,} hits, {services.lane.kept:,} entries made")
    if budget is not None:
        print(f"a spread hit's steps, one by one (us), beside the whole request ({best['spread hit'][0]:.2f} us):")
        for name, us in budget.items():
            print(f"  {name:34s} {us:8.2f}")


if __name__ == "__main__":
    uvloop.run(main())
