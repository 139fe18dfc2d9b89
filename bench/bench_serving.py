"""Bot serving benchmark: every serving row of issue 37 beside its ceiling, from one run.

Run: ``.venv/bin/python bench/bench_serving.py [--seconds 5] [--rounds 3] [--connections 32]
[--spread 100000] [--direct] [--page-kb 30] [--results-rate 100] [--new-pages 200] [--replicas 1]
[--results-cpu 2000]``

- Load generator: wrk (``/usr/bin/wrk``), 1 thread, ``--connections`` keep-alive connections, with a
  Googlebot User-Agent and ``Accept-Encoding: gzip, deflate, br`` as crawlers send them.
- The hot page is produced as the fleet produces it: a target put due now, its job claimed, a result
  posted (gzip, ~30 KB on the wire); then ``/p/<url>`` is served from the replica's page log. The
  ceiling is uvicorn (httptools, its default loop) in its own process answering the same bytes and
  headers from memory with a bare ASGI callable.
- (a) the hot page's hit, (b) a 304 on it (If-None-Match: the ETag it is served with), (d) the hit
  for a client that does not accept gzip (the body decoded once, then kept with the page).
- (e) hits spread at random over ``--spread`` pages of ``--page-kb`` KB gzip, far more bytes than the
  replica keeps decoded (the path of a crawl that rarely repeats a page); wrk runs a Lua script per
  request, so the ceiling is measured again with the same script, answering every random path from
  memory with a body of the same size. The pages are stored through the real result path by default
  (listed by a sitemap, claimed, each result posted: 100-115/s on a busy 2-core machine, so about
  15 min for 100,000), or with ``--direct`` written straight into the node's store through its
  actor's ``apply``, framed as a result frames them, with their targets put due in 30 days (the
  issue's 1,000,000-page row: ``--spread 1000000 --direct --page-kb 12``; the disk use is printed;
  ``--tmp DIR`` puts the deployment's data on another disk).
- (f) the spread load again while a side client posts ``--results-rate`` results/s through the real
  fleet API (claim + result, each a new revision: a full page write) for spread pages made due;
  req/s and latency of the hits beside the same-script ceiling, and the results/s achieved.
- (g) a new page reaches hits: for ``--new-pages`` new pages, one at a time, the result is posted
  and from its 204 the page is asked for, a new connection per GET (the kernel picks one of the
  node's ``--replicas`` replicas per connection), until ``--consecutive`` answers in a row are hits:
  p50/p99 from the 204 to the first hit and to the last hit of that run.
- (h) the page log index a replica holds at the spread size: this process loads the node's log with
  the replica's reader under ``tracemalloc`` (bytes per page) and times the load (a restart's
  reload); the replica's RSS before and after the spread pages, and where it reads hits from.
- Context rows split the cost: the bare app inside a Ray actor (what the actor host costs), and the
  ingress app itself under plain uvicorn outside Ray (what the bot path costs without the actor host),
  and that app again with the hit memo off (``api/bot/memo.py``: what a repeated hit saves). Beside
  (e), two floors (``bench/serving_floor.py``): the least Python over the same page log (parse, key,
  look-up, ``pread``, write), and that with the ingress decision for each URL: what is left between
  them and (e) is the bot path's own work per new URL.
- (i) CPU per result: after the rows above, ``--results-cpu`` targets put due now, claimed and their
  results posted from ``--connections`` connections (``result_cpu.post_round``, as one round of
  ``bench/bench_results.py``, which has more rounds, a profile and the same parts without Ray).
- Goals (issue 37) are printed beside each row.
  The machine is shared and noisy: read the ratios, and run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import json
import os
import random
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import serving_pages as sp
from serving_pages import ACCEPT, PROBE_HEADERS, UA, URL

from prerender_ray import native

WRK = "/usr/bin/wrk"
ETAG = '"bench-v1"'
WORDS = ("product", "catalog", "price", "shipping", "review", "color", "size", "stock", "brand", "delivery",
         "warranty", "return", "compare", "detail", "image", "gallery", "cart", "checkout", "account", "search",
         "category", "offer")


def page_html(target_gz: int = 30 * 1024, seed: int = 5, step: int = 20) -> tuple[bytes, bytes]:
    """An HTML page whose gzip body is about ``target_gz`` bytes (checked every ``step`` paragraphs:
    20 keeps the hot page the 31,790 B of earlier runs): (html, gzip body)."""
    rnd = random.Random(seed)
    parts = [b"<!doctype html><html><head><title>Item 42</title></head><body>"]
    while True:
        para = " ".join(rnd.choice(WORDS) + str(rnd.randrange(10_000)) for _ in range(40))
        parts.append(f"<p class=d{rnd.randrange(100)}>{para}</p>".encode())
        html = b"".join(parts) + b"</body></html>"
        if len(parts) % step == 0 and len(gzip.compress(html)) >= target_gz:
            return html, gzip.compress(html)


# ------------------------------------------------------------------------------------------ ceiling


def ceiling_app(body: bytes, headers: list[tuple[bytes, bytes]]):
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    done = {"type": "http.response.body", "body": body}

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        await send(start)
        await send(done)

    return app


def ceiling_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"text/html; charset=utf-8"), (b"content-encoding", b"gzip"),
            (b"etag", ETAG.encode()), (b"x-harper-rendered", b"1"), (b"age", b"3"),
            (b"content-length", str(len(body)).encode()), (b"vary", b"Accept-Encoding")]


def serve_ceiling(port: int, body_file: str) -> None:
    """The ceiling process: plain uvicorn, defaults (httptools, uvloop when installed)."""
    import uvicorn

    body = Path(body_file).read_bytes()
    uvicorn.run(ceiling_app(body, ceiling_headers(body)), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, server_header=False)


def serve_app(port: int, data_dir: str, config_json: str) -> None:
    """Context: the ingress app itself under the replica's uvicorn server in its own process, outside
    Ray (another reader of the deployment's page log; hits need no actor)."""
    import uvicorn
    import uvloop

    from prerender_ray.api.app import create_asgi
    from prerender_ray.api.context import NodeContext
    from prerender_ray.api.server import server_config
    from prerender_ray.config.model import Config
    from prerender_ray.identity.nodes import NodeInfo

    if os.environ.get("BENCH_HIT_MEMO") == "0":  # the context row without the hit memo (api/bot/memo.py)
        import prerender_ray.api.bot.replica as replica

        replica.HitMemo = lambda: None  # type: ignore[assignment,misc]
    cfg = Config.model_validate(json.loads(config_json))
    node = NodeInfo(name="node-a", host="127.0.0.1", port=port, ray_node_id="")
    ctx = NodeContext(cfg=cfg, node=node, data_dir=data_dir, replica=99)
    # the replica's own server (its protocol answers memo hits), on uvloop as Ray's actors run
    config = server_config(create_asgi(ctx), cfg)
    config.host, config.port = "127.0.0.1", port
    gc.freeze()  # as the replica's actor freezes what its start-up built (actors/ingress.py)
    uvloop.run(uvicorn.Server(config).serve())


def actor_ceiling(port: int, body: bytes):
    """The same bare app served by uvicorn inside a Ray actor, on Ray's event loop (context only)."""
    import ray
    import uvicorn

    @ray.remote(num_cpus=0)
    class Bare:
        def __init__(self) -> None:
            from prerender_ray.actors.ingress import bind_socket

            sock = bind_socket("127.0.0.1", port, probe=True)
            self.server = uvicorn.Server(uvicorn.Config(
                ceiling_app(body, ceiling_headers(body)), loop="none", http="httptools", lifespan="off",
                log_level="warning", access_log=False, server_header=False))
            self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))

        async def ready(self) -> bool:
            while not self.server.started:
                await asyncio.sleep(0.05)
            return True

    actor = Bare.remote()
    ray.get(actor.ready.remote())
    return actor


# ---------------------------------------------------------------------------------------------- wrk


def wrk(url: str, seconds: float, connections: int, headers: dict[str, str], script: str | None = None) -> dict:
    """requests/s, p50 and p99 (ms) from one wrk run after a 1 s warm-up."""
    hdr = [a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]
    if script:
        hdr += ["-s", script]
    subprocess.run([WRK, "-t1", f"-c{connections}", "-d1s", *hdr, url], check=True, capture_output=True)
    out = subprocess.run([WRK, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", *hdr, url],
                         check=True, capture_output=True, text=True).stdout
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50": _ms(re.search(r"^\s+50%\s+(\S+)", out, re.MULTILINE).group(1)),
            "p99": _ms(re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE).group(1)),
            "bad": int(non2xx.group(1)) if non2xx else 0, "errors": errors.group(1) if errors else ""}


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


# ------------------------------------------------------------------------------------------ the run


def produce_page(base: str, gz: bytes) -> str:
    """Put the target due now, claim its desktop job, post the gzip result (as the fleet does)."""
    from tests.support import claim, wait_for

    r = httpx.put(f"{base}/render_targets", json={"url": URL, "nextRenderTime": 1}, timeout=30)
    r.raise_for_status()
    key = f"{URL}|desktop"
    jobs: dict[str, dict] = {}

    def granted() -> bool:
        jobs.update({j["id"]: j for j in claim(base, 25)})
        return key in jobs

    wait_for(granted, timeout=30, what="the bench page's job")
    meta = json.dumps({"id": key, "url": URL, "statusCode": 200, "outcome": "rendered", "renderTime": 900,
                       "headers": {"content-type": "text/html; charset=utf-8", "content-encoding": "gzip",
                                   "etag": ETAG}}).encode()
    r = httpx.post(f"{jobs[key]['callbackOrigin']}/render_queue/job_result", content=meta + gz,
                   headers={"x-metadata-size": str(len(meta))}, timeout=30)
    assert r.status_code == 204, r.text
    hit = f"{base}/p/{URL}"
    wait_for(lambda: httpx.get(hit, headers={**PROBE_HEADERS, "accept-encoding": ACCEPT})
             .headers.get("x-harper-cache") == "hit", what="the first cache hit")
    return hit


def stored_etag(hit: str) -> str:
    """The ETag the page is served with: the keeper's digest of the rendered bytes, not the one the
    result carried (a rendered page's own validators replace the origin's)."""
    etag = httpx.get(hit, headers={"user-agent": UA, "accept-encoding": ACCEPT}, timeout=30).headers["etag"]
    r = httpx.get(hit, headers={"user-agent": UA, "accept-encoding": ACCEPT, "if-none-match": etag}, timeout=30)
    assert r.status_code == 304, f"the stored ETag {etag} did not give a 304 ({r.status_code})"
    return etag


def spread_script(tmp: Path, n: int) -> str:
    """A wrk script asking for a random spread page per request."""
    script = tmp / "spread.lua"
    script.write_text(f"math.randomseed(os.time())\nrequest = function()\n"
                      f"  return wrk.format(\"GET\", \"/p/{URL}-\" .. math.random(0, {n - 1}))\nend\n")
    return str(script)


def store_spread(d: Any, args: argparse.Namespace, html: bytes, gz: bytes, extras: dict) -> None:
    """The spread pages, by the result path or (``--direct``) straight into the store; then every one
    is checked served as a hit at a few random places."""
    from tests.support import wait_for

    pid = sp.replica_status()["pid"]
    extras["rss_before"] = sp.rss_mb(pid)
    if args.direct:
        took = sp.write_direct(args.spread, html, gz)
        print(f"(e) pages: {args.spread:,} written straight into the store in {took['pages_s']:.0f} s "
              f"({args.spread / took['pages_s']:,.0f}/s, {took['batch']} a call); their targets in "
              f"{took['targets_s']:.0f} s", flush=True)
    else:
        sp.spread_pages(d.url, gz, args.spread)
    for i in {0, args.spread - 1, *random.Random(7).sample(range(args.spread), min(args.spread, 8))}:
        page = f"{d.url}/p/{sp.spread_url(i)}"
        wait_for(lambda page=page: httpx.get(page, headers=PROBE_HEADERS, timeout=30).headers.get("x-harper-cache")
                 == "hit", what=f"spread page {i} served as a hit")
    extras["rss_after"] = sp.rss_mb(pid)


def run(args: argparse.Namespace) -> tuple[list[tuple[str, dict]], dict]:
    """Every server up at once, then ``rounds`` rounds over the wrk rows in turn; each row keeps its
    best round (the one least disturbed by whatever else the shared machine was doing). Then the new
    page probe (g) and the page log's footprint (h), from the same deployment."""
    import ray

    from tests.support import RayCluster, deploy_on, free_port

    seconds, connections, spread, rounds = args.seconds, args.connections, args.spread, args.rounds
    html, gz = page_html()
    spread_html, spread_gz = (html, gz) if args.page_kb == 30 else page_html(args.page_kb * 1024, step=1)
    common = {"User-Agent": UA, "Accept-Encoding": ACCEPT}
    extras: dict = {"spread": spread, "page_kb": args.page_kb, "replicas": args.replicas, "connections": connections}
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        def ceiling(body: bytes) -> int:
            port = free_port()
            body_file = Path(tmp) / f"body-{port}.gz"
            body_file.write_bytes(body)
            procs.append(subprocess.Popen([sys.executable, __file__, "--ceiling-server", str(port), str(body_file)]))
            _wait_up(f"http://127.0.0.1:{port}/")
            return port

        cluster = RayCluster.start()
        d = None
        try:
            plain = ceiling(gz)
            plain_spread = plain if spread_gz is gz else ceiling(spread_gz)
            in_actor = free_port()
            bare = actor_ceiling(in_actor, gz)
            # 127.0.0.1: the spread row's sitemap is served there; a miss's origin fetch is pinned there
            d = deploy_on(cluster, Path(tmp) / "data", {"domains": ["bench.example", "127.0.0.1:*"],
                                                        "deviceTypes": {"default": ["desktop"]}, **sp.STAGING},
                          replicas=args.replicas)
            hit = produce_page(d.url, gz)
            etag = stored_etag(hit)
            outside = free_port()
            no_memo = free_port()
            (Path(tmp) / "metrics").mkdir()
            for port, memo in ((outside, "1"), (no_memo, "0")):
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--app-server", str(port), str(d.data_dir), json.dumps(d.config)],
                    env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(Path(tmp) / "metrics"), "BENCH_HIT_MEMO": memo}))
            one = "one ingress replica" if args.replicas == 1 else f"{args.replicas} ingress replicas"
            rows: list[tuple[str, str, dict[str, str], str | None]] = [
                ("ceiling: plain uvicorn, bytes from memory", f"http://127.0.0.1:{plain}/", common, None),
                ("context: the same app in a Ray actor", f"http://127.0.0.1:{in_actor}/", common, None),
                (f"(a) cache hit through {one}", hit, common, None),
                ("context: the ingress app, plain uvicorn, no Ray", f"http://127.0.0.1:{outside}/p/{URL}", common,
                 None),
                ("context: the same without the hit memo", f"http://127.0.0.1:{no_memo}/p/{URL}", common, None),
                ("(b) 304 (If-None-Match) on it", hit, {**common, "If-None-Match": etag}, None),
                ("(d) hit, client without gzip (decoded)", hit, {"User-Agent": UA}, None),
            ]
            bodies = None  # row (f)'s result bodies: revisions of the spread page
            if spread:
                store_spread(d, args, spread_html, spread_gz, extras)
                script = spread_script(Path(tmp), spread)
                rows.append((f"(e) hits spread over {spread:,} pages", d.url, common, script))
                rows.append((SAME_SCRIPT, f"http://127.0.0.1:{plain_spread}", common, script))
                rows.append((SPREAD_OUTSIDE, f"http://127.0.0.1:{outside}", common, script))
                for mode, name in FLOORS.items():
                    port = free_port()
                    procs.append(subprocess.Popen([sys.executable, str(Path(__file__).parent / "serving_floor.py"),
                                                   str(port), str(d.data_dir), json.dumps(d.config), mode]))
                    _wait_up(f"http://127.0.0.1:{port}/")
                    rows.append((name, f"http://127.0.0.1:{port}", common, script))
                if args.results_rate > 0:
                    rows.append((f"(f) (e) while {args.results_rate:g} results/s arrive", d.url, common, script))
                    bodies = sp.variants(spread_html)
            _wait_up(f"http://127.0.0.1:{outside}/healthz")
            _wait_up(f"http://127.0.0.1:{no_memo}/healthz")
            runs: dict[str, list[dict]] = {name: [] for name, *_ in rows}
            rnd = random.Random(11)
            for r in range(rounds):
                for name, url, headers, lua in rows:
                    spy = profile_start(args.profile, seconds) if r == rounds - 1 and name.startswith("(e)") else None
                    if name.startswith("(f)"):
                        runs[name].append(fed_wrk(d.url, bodies, args, rnd, url, headers, lua))
                    else:
                        runs[name].append(wrk(url, seconds, connections, headers, lua))
                    if spy is not None:
                        extras["profile"] = profile_end(*spy)
            from tests.support import ingress_peak_rss_mb

            extras["peak_rss"] = ingress_peak_rss_mb()
            ray.kill(bare)
            if args.new_pages:
                print(f"(g) {args.new_pages} new pages, one at a time ...", flush=True)
                extras["new"] = sp.new_page_delays(d.url, httpx.URL(d.url).port or 80, sp.variants(html, 4),
                                                   args.new_pages, args.consecutive)
            extras["source"] = (sp.replica_status().get("pageCatchUps") or {}).get("source")
            extras["index"] = sp.index_footprint(d.data_dir)
            from prerender_ray.storage.rocks import PAGES, pagelog_path, store_path

            extras["disk_log"] = sp.disk_bytes(pagelog_path(d.data_dir, "node-a"))
            extras["disk_rocks"] = sp.disk_bytes(store_path(d.data_dir, "node-a", PAGES))
            if args.results_cpu:
                from result_cpu import post_round

                print(f"(i) CPU per result: {args.results_cpu} results ...", flush=True)
                urls = [f"https://bench.example/results-cpu/{i}" for i in range(args.results_cpu)]
                extras["cpu"] = post_round(d.url, urls, connections, 500, Path(tmp) / "floor")
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            if d is not None:
                d.stop()
            cluster.shutdown()
    print(f"bot serving benchmark: {len(html):,} B of HTML, {len(gz):,} B gzip on the wire (spread pages "
          f"{len(spread_gz):,} B); wrk 1 thread, {connections} connections, best of {rounds} rounds of "
          f"{seconds:g} s per row; the per-URL path {native.state}")
    return [(name, {**max(results, key=lambda r: r["rps"]), "rounds": [r["rps"] for r in results],
                    "fed": [r["feed"]["results_s"] for r in results if "feed" in r]})
            for name, results in runs.items() if results], extras


SAME_SCRIPT = "    ceiling, same random-path wrk script"
SPREAD_OUTSIDE = "    context: (e) on the ingress app, plain uvicorn, no Ray"
# bench/serving_floor.py: the least Python over the same page log, without and with the URL decision
FLOORS = {"key": "    floor: Python over the page log, key from the path",
          "decision": "    floor + the ingress decision for each URL"}


def profile_start(out: str | None, seconds: float) -> tuple[subprocess.Popen, Path] | None:
    """py-spy on the ingress replica for the row's length (``--profile DIR``): collapsed stacks."""
    if not out:
        return None
    pid = sp.replica_status()["pid"]
    path = Path(out) / f"replica-{pid}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    cmd = [str(spy), "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "250", "-f", "raw",
           "--nonblocking", "--idle", "-o", str(path)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), path


def profile_end(proc: subprocess.Popen, path: Path, top: int = 14) -> list[str]:
    """The replica's time by the innermost frame of ours or of the library it is in (self time), and
    by a few frames that name a stage (inclusive), as shares of the samples."""
    proc.wait(60)
    if not path.exists():
        return [f"no profile written to {path}"]
    leaf: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        name = frames[-1].split(" (")[0] + " (" + frames[-1].rsplit("/", 1)[-1] if frames else "?"
        leaf[name] = leaf.get(name, 0) + n
    lines = [f"py-spy, {total:,} samples of the replica during row (e) ({path}): self time"]
    for name, n in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {n / max(1, total):6.1%}  {name}")
    return lines


def fed_wrk(base: str, bodies: list[bytes] | None, args: argparse.Namespace, rnd: random.Random, url: str,
            headers: dict[str, str], script: str | None) -> dict:
    """One wrk run of the spread script while results arrive at ``--results-rate`` per second for
    spread pages made due now (enough for the warm-up, the run and a margin)."""
    assert bodies is not None
    wanted = int(args.results_rate * (args.seconds + 1 + 10))
    feeder = sp.ResultFeeder(base, bodies, args.results_rate)
    feeder.start(sp.spread_sample(args.spread, wanted, rnd))
    try:
        out = wrk(url, args.seconds, args.connections, headers, script)
    finally:
        feed = feeder.stop()
    return {**out, "feed": feed}


def _wait_up(url: str) -> None:
    for _ in range(100):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def goal_of(name: str, spread: int) -> tuple[float | None, float | None]:
    """Issue 37's goal for a row: (least ratio to its ceiling, most p99 ms); None: no goal."""
    if name.startswith("(a)"):
        return 0.75, None
    if name.startswith("(d)"):
        return 0.60, None
    if name.startswith("(e)"):
        return (0.50, 15.0) if spread >= 1_000_000 else (0.60, 10.0)
    if name.startswith("(f)"):
        return None, 15.0
    return None, None


def report(rows: list[tuple[str, dict]], extras: dict) -> None:
    if not rows:
        rows = [("ceiling: not run (--rounds 0)", {"rps": float("nan"), "p50": 0.0, "p99": 0.0, "rounds": [],
                                                  "fed": [], "bad": 0, "errors": ""})]
    same_script = next((r for name, r in rows if name == SAME_SCRIPT), None)
    spread = extras["spread"]
    print(f"{'':46}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x ceiling':>11}  {'goal':30}notes")
    for name, r in rows:
        notes = []
        base = (same_script if (name.startswith(("(e)", "(f)")) or name == SPREAD_OUTSIDE or name in FLOORS.values())
                and same_script else rows[0][1])
        ratio = r["rps"] / base["rps"]
        if base is same_script:
            notes.append("x its same-script ceiling")
        if r is not rows[0][1] and r is not same_script:
            per_round = [a / b for a, b in zip(r["rounds"], base["rounds"])]
            notes.append(f"per round {min(per_round):.2f}-{max(per_round):.2f}")
        if r["fed"]:
            feed = r["feed"]
            notes.append(f"{feed['results_s']:.0f} results/s achieved (rounds {min(r['fed']):.0f}-"
                         f"{max(r['fed']):.0f}), {feed['failed']} not 204, a post p50 {feed['post_p50']:.1f} ms "
                         f"p99 {feed['post_p99']:.1f} ms")
        if r["bad"]:
            notes.append(f"{r['bad']} non-2xx/3xx")
        if r["errors"]:
            notes.append(f"socket errors {r['errors']}")
        least, most = goal_of(name, spread)
        goal = ""
        if least is not None or most is not None:
            met = (least is None or ratio >= least) and (most is None or r["p99"] < most)
            goal = " ".join(([f">= {least:.2f}"] if least is not None else [])
                            + ([f"p99 < {most:g}"] if most is not None else [])
                            + ["met" if met else "NOT met"])
        print(f"{name:46}{r['rps']:>10,.0f}{r['p50']:>9.2f}{r['p99']:>9.2f}{ratio:>11.2f}  {goal:30}"
              f"{'; '.join(notes)}")
    new = extras.get("new")
    if new:
        met = "met" if new["first_p99"] <= 1000 and not new["late"] else "NOT met"
        missed = f" (what the misses got: {new['outcomes']})" if new["outcomes"] else ""
        print(f"(g) a new page reaches hits, {new['n']} pages, {extras['replicas']} replica(s), a new connection "
              f"per GET: first hit after the 204 p50 {new['first_p50']:.1f} ms p99 {new['first_p99']:.1f} ms "
              f"(max {new['first_max']:.1f}); {new['consecutive']} hits in a row p50 {new['run_p50']:.1f} ms "
              f"p99 {new['run_p99']:.1f} ms; {new['missed_gets']} GETs missed on {new['pages_with_misses']} pages, "
              f"{new['late']} pages not there in 10 s{missed}; goal p99 <= 1000 ms: {met}")
    index = extras.get("index")
    if index:
        print(f"(h) page log index at {index['entries']:,} entries (spread {spread:,} pages of {extras['page_kb']} KB): "
              f"{index['bytes'] / 2**20:.1f} MiB in a reader, {index['per_page']:.0f} B a page (tracemalloc); "
              f"loaded in {index['load_s']:.2f} s; hits read from: {extras.get('source')}")
    if "rss_before" in extras:
        print(f"    ingress replica RSS {extras['rss_before']:.0f} MB before the spread pages, "
              f"{extras['rss_after']:.0f} MB after them (+{extras['rss_after'] - extras['rss_before']:.0f} MB); "
              f"peak after every row {extras['peak_rss']:.0f} MB")
    elif "peak_rss" in extras:
        print(f"    ingress replica peak RSS after every row: {extras['peak_rss']:.0f} MB")
    if "disk_log" in extras:
        print(f"    disk: page log {extras['disk_log'] / 1e9:.2f} GB, RocksDB pages {extras['disk_rocks'] / 1e9:.2f} GB")
    cpu = extras.get("cpu")
    if cpu:
        met = "met" if cpu["per_result"] <= 0.001 else "NOT met"
        roles = ", ".join(f"{k} {v * 1000:.2f}" for k, v in sorted(cpu["by_role"].items(), key=lambda x: -x[1])
                          if v >= 0.000005)
        print(f"(i) CPU per result, the whole deployment: {cpu['per_result'] * 1000:.2f} ms ({roles}); "
              f"{cpu['ok']}/{cpu['jobs']} accepted at {cpu['ok'] / cpu['wall']:.0f}/s from {extras['connections']} "
              f"connections, {cpu['per_group']:.1f} results a keeper group; floor (page + row, one RocksDB batch) "
              f"{cpu['floor'] * 1000:.3f} ms; goal <= 1 ms: {met}")
    for line in extras.get("profile", []):
        print(line)


def main() -> None:
    # Set here rather than at import: bench_sitemap_ingest borrows produce_page for its bot probe.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--spread", type=int, default=100_000, help="pages for the spread rows (0: skip them)")
    ap.add_argument("--direct", action="store_true",
                    help="write the spread pages straight into the node's store (default: the result path)")
    ap.add_argument("--page-kb", type=int, default=30, help="gzip size of each spread page")
    ap.add_argument("--results-rate", type=float, default=100.0, help="results/s during row (f) (0: skip it)")
    ap.add_argument("--new-pages", type=int, default=200, help="new pages for row (g) (0: skip it)")
    ap.add_argument("--consecutive", type=int, default=10, help="hits in a row that end a page of row (g)")
    ap.add_argument("--replicas", type=int, default=1, help="ingress replicas of the node")
    ap.add_argument("--results-cpu", type=int, default=2000,
                    help="results posted for row (i), the CPU per result (0: skip it); bench_results.py has more")
    ap.add_argument("--profile", default=None, help="py-spy the replica during row (e)'s last round into DIR")
    ap.add_argument("--tmp", default=None, help="where the deployment's data goes (default: the system's temp dir)")
    ap.add_argument("--ceiling-server", nargs=2, metavar=("PORT", "BODY_FILE"), help=argparse.SUPPRESS)
    ap.add_argument("--app-server", nargs=3, metavar=("PORT", "DATA_DIR", "CONFIG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ceiling_server:
        serve_ceiling(int(args.ceiling_server[0]), args.ceiling_server[1])
        return
    if args.app_server:
        serve_app(int(args.app_server[0]), args.app_server[1], args.app_server[2])
        return
    report(*run(args))


if __name__ == "__main__":
    main()
