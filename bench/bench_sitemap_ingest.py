"""Sitemap ingestion end to end: URLs/s and peak RSS, beside lxml's bare iterparse of the same bytes.

Run: .venv/bin/python bench/bench_sitemap_ingest.py [--docs 20] [--per-doc 50000] [--bot-probe]

Generates an index of 20 urlset children x 50,000 URLs (1,000,000 URLs, every fourth child gzip),
serves it from 127.0.0.1 (``python -m http.server`` in its own process), starts a fresh single-node
deployment with its own local Ray (``prerender-ray up --detach``), and then, in one run:
- times lxml's bare ``iterparse`` over the same files (the ceiling; the tuned url-tag idiom too);
- POSTs the index as a background walk and polls its progress row until it completes: URLs/s from
  the row's startedAt to finishedAt, every URL read, decided, written as a target and scheduled;
- walks it again (nothing changed: every URL skips) for the steady-state re-walk rate;
- reads the peak RSS (VmHWM) of every process of the deployment;
- stops the deployment and reads the schedule store: a histogram of first due times, as a share of
  each row's cadence (``render.firstRender: now``: all at once), and of the render after the first,
  on each URL's slot (a flat histogram means no render herd in the steady state);
- simulates a fleet claiming at a given rate from the keeper's real ranking (``Rules.put_many`` into a
  ``Ranking``, one claim a simulated second) and prints time-to-first-render of a new sitemap under
  ``firstRender: now`` and ``staggered`` side by side, with an overdue backlog that must go first.
  ``--fleet-only`` runs just that (seconds, no deployment).

With ``--bot-probe`` it also serves bots while it ingests: a cached page (produced as in
bench_serving) is fetched by one crawler connection at 50 requests/s, for 10 s on the idle node and
then throughout the first walk, and the hit's latency is printed for both. The probe's load then
counts in that run's ingest figures, so compare those only with runs made without it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sitemap_parse import SITEMAP_NS, generate, run_bare, run_tuned  # noqa: E402

from prerender_ray.actors import deploy  # noqa: E402
from prerender_ray.config.loading import parse  # noqa: E402
from prerender_ray.queue.ranking import Ranking  # noqa: E402
from prerender_ray.queue.schedule import ScheduleRow  # noqa: E402
from prerender_ray.queue.targets import Rules  # noqa: E402
from prerender_ray.storage.rocks import Store  # noqa: E402

BIN = Path(sys.executable).parent
GOALS = {"rate": 50_000, "ratio": 0.25, "rss_mb": 400}


def serve(directory: Path) -> tuple[subprocess.Popen, str]:
    port = deploy.free_port()
    cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port),
           "--directory", str(directory)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(base + "/", timeout=1)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the sitemap server did not start")


def up(data_dir: Path, port: int) -> str:
    cfg = data_dir.parent / "prerender.yaml"
    cfg.write_text(f"server:\n  port: {port}\n  replicas: 1\nlogging:\n  level: warning\n"
                   "sitemap:\n  fetchTimeoutMs: 300000\n")
    subprocess.run([str(BIN / "prerender-ray"), "up", "--config", str(cfg), "--data-dir", str(data_dir),
                    "--detach", "--timeout", "180"], check=True, stdout=subprocess.DEVNULL)
    return f"http://127.0.0.1:{port}"


def down(data_dir: Path) -> None:
    subprocess.run([str(BIN / "prerender-ray"), "down", "--data-dir", str(data_dir)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def walk(client: httpx.Client, base: str, root: str, total: int) -> dict:
    r = client.post(f"{base}/sitemaps", json={"url": root}, timeout=60)
    r.raise_for_status()
    assert r.json()["sitemaps"][0]["started"], r.text
    last = 0.0
    while True:
        time.sleep(0.25)
        row = client.get(f"{base}/sitemap_refresh", params={"root": root}, timeout=30).json()
        if row["state"] != "running":
            return row
        if time.monotonic() - last > 5:
            last = time.monotonic()
            seen = row["created"] + row["skipped"] + row["updated"] + row["duplicates"]
            print(f"  ... {row['sitemapsProcessed']}/{row['sitemapsDiscovered']} documents, "
                  f"{seen:,}/{total:,} URLs", flush=True)


def bot_probe(url: str, stop: threading.Event, seconds: float = 3600.0, rate: float = 50.0) -> list[float]:
    """A crawler's steady light load on one connection: latencies (ms) of cache hits of ``url``,
    ``rate`` a second, until ``stop`` is set or ``seconds`` have passed."""
    from bench_serving import ACCEPT, ETAG, UA

    latencies: list[float] = []
    headers = {"user-agent": UA, "accept-encoding": ACCEPT}
    with httpx.Client(headers=headers, timeout=10) as client:
        due = time.monotonic()
        end = due + seconds
        while not stop.is_set() and time.monotonic() < end:
            t = time.perf_counter()
            r = client.get(url)
            latencies.append((time.perf_counter() - t) * 1000)
            if r.status_code != 200 or r.headers.get("etag") != ETAG:  # the stored page, not a fresh render
                raise RuntimeError(f"the probe's page was not a cache hit: {r.status_code} {r.headers}")
            due += 1 / rate
            stop.wait(max(0.0, due - time.monotonic()))
    return latencies


def latency_line(latencies: list[float]) -> str:
    from bench_keeper import pct

    return (f"p50 {pct(latencies, 0.5):5.2f} ms  p95 {pct(latencies, 0.95):5.2f} ms  "
            f"p99 {pct(latencies, 0.99):6.2f} ms  max {max(latencies):6.2f} ms  ({len(latencies):,} requests)")


def processes(data_dir: Path, extra: dict[str, int]) -> dict[str, dict]:
    """Every process of the deployment (named by its Ray process title) and ``extra``: peak RSS
    (VmHWM, MB) and CPU seconds so far (user + system)."""
    record = deploy.Record.read(data_dir)
    pids = {pid: "" for pid in (deploy.our_processes(record, data_dir) if record else [])}
    pids.update({pid: name for name, pid in extra.items()})
    out: dict[str, dict] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid, name in pids.items():
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            hwm = next(int(x.split()[1]) for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if x.startswith("VmHWM:"))
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, StopIteration):
            continue
        if not name:
            name = title.split()[0].rsplit("/", 1)[-1][:40]
            name = name[5:].split(".")[0] if name.startswith("ray::") else name
        out[f"{name} ({pid})"] = {"rss": hwm / 1024, "cpu": (int(stat[11]) + int(stat[12])) / tick}
    return out


def first_render_histogram(data_dir: Path, t0: int, buckets: int = 10) -> tuple[dict[int, Counter], dict[int, Counter]]:
    """cadence -> (share of the cadence at which a row first comes due -> rows), and the same for the
    render after the first (``Rules.after_first_render`` from the first due time, as the planner
    files it when the first result lands)."""
    rules = Rules(parse({}, {}).config)
    first: dict[int, Counter] = {}
    second: dict[int, Counter] = {}

    def tenth(at: int, cadence: int) -> int:
        return min(max(int((at - t0) / cadence * buckets), 0), buckets - 1)

    for path in (data_dir / "nodes").glob("*/schedule"):
        db = Store(path, read_only=True)
        for k, v in db.items():
            row = ScheduleRow.decode(k, v)
            cadence = row.effective_interval
            if row.next_render_time is None or not cadence:
                continue
            first.setdefault(cadence, Counter())[tenth(row.next_render_time, cadence)] += 1
            after = rules.after_first_render(rules.url_of(row.cache_key), cadence, row.next_render_time)
            second.setdefault(cadence, Counter())[tenth(after, cadence)] += 1
        db.close()
    return first, second


def print_histogram(title: str, hist: dict[int, Counter]) -> None:
    print(title)
    print("  cadence   " + "".join(f"{b / 10:>8.1f}" for b in range(10)))
    for cadence in sorted(hist):
        counts = hist[cadence]
        print(f"  {cadence / 3_600_000:>6.0f} h " + "".join(f"{counts[b]:>8,}" for b in range(10)))


def simulate_fleet(pages: int, rate: int, mode: str, backlog: int) -> dict:
    """A new sitemap of ``pages`` URLs (two devices each, daily) put at t0 on a keeper that already holds
    ``backlog`` URLs an hour overdue; a fleet claims ``rate`` jobs a simulated second from the real
    ranking (``top_k``, claimed keys leave it). Seconds from t0 to each new key's claim, and when the
    last backlog key and the first new key were claimed."""
    rules = Rules(parse({"render": {"firstRender": mode}}, {}).config)
    t0 = 1_780_000_000_000
    ranking = Ranking(lambda route: rules.cfg.render.default_interval,
                      boost=rules.cfg.queue.ready.sitemap_boost)
    old = [f"https://old.test/p/{i}" for i in range(backlog)]
    new = [f"https://shop.test/p/{i}" for i in range(pages)]
    _, rows = rules.put_many(old, [None] * backlog, [None] * backlog, [t0 - 3_600_000] * backlog, now=t0, node=None)
    ranking.upsert_many(rows, lambda key: None)
    _, rows = rules.put_many(new, ["https://shop.test/sitemap.xml"] * pages, [None] * pages, [None] * pages,
                             now=t0, node=None)
    ranking.upsert_many(rows, lambda key: None)
    dues = sorted({due for _, due, _, _ in rows})
    waits: list[float] = []
    last_old = first_new = None
    t, i = t0, 0
    while len(ranking):
        got = ranking.top_k(rate, t)
        if not got:  # nothing due: on to the next due minute
            while i < len(dues) and dues[i] <= t:
                i += 1
            t = dues[i]
            continue
        for key in got:
            ranking.remove(key)
            if key.startswith("https://old.test/"):
                last_old = t
            else:
                first_new = t if first_new is None else first_new
                waits.append((t - t0) / 1000)
        t += 1000
    return {"waits": waits, "last_old": None if last_old is None else (last_old - t0) / 1000,
            "first_new": None if first_new is None else (first_new - t0) / 1000}


def fleet_figure(pages: int, rate: int, backlog: int) -> None:
    from bench_keeper import pct

    def hms(seconds: float) -> str:
        return f"{seconds / 3600:5.1f} h" if seconds >= 5400 else f"{seconds / 60:5.1f} m"

    print(f"time to first render of a new sitemap: {pages:,} pages x 2 devices, a fleet claiming {rate}/s, "
          f"{backlog:,} pages already an hour overdue (daily cadence)")
    print(f"  {'render.firstRender':<20}{'p50':>9}{'p99':>9}{'max':>9}   overdue backlog")
    for mode in ("now", "staggered"):
        t = time.perf_counter()
        sim = simulate_fleet(pages, rate, mode, backlog)
        w = sim["waits"]
        order = ("all claimed before the first new page" if sim["last_old"] is None or sim["first_new"] is None
                 or sim["last_old"] < sim["first_new"] else
                 f"last claimed at {hms(sim['last_old'])}, first new page at {hms(sim['first_new'])}")
        print(f"  {mode:<20}{hms(pct(w, 0.5)):>9}{hms(pct(w, 0.99)):>9}{hms(max(w)):>9}   {order}"
              f"  ({time.perf_counter() - t:.1f} s simulated)")
    print(f"  (now: the fleet's pace, {2 * pages / rate / 3600:.1f} h for the last page; staggered: the jitter, "
          "whatever the fleet's rate)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--per-doc", type=int, default=50_000)
    ap.add_argument("--bot-probe", action="store_true", help="serve bots at 50 requests/s while ingesting")
    ap.add_argument("--fleet-pages", type=int, default=100_000, help="pages of the simulated new sitemap")
    ap.add_argument("--fleet-rate", type=int, default=20, help="jobs a second the simulated fleet claims")
    ap.add_argument("--fleet-backlog", type=int, default=5_000, help="pages already overdue when it lands")
    ap.add_argument("--fleet-only", action="store_true", help="only the fleet simulation (no deployment)")
    args = ap.parse_args()
    if args.fleet_only:
        fleet_figure(args.fleet_pages, args.fleet_rate, args.fleet_backlog)
        return
    total = args.docs * args.per_doc
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root_dir = Path(tmp)
        site = root_dir / "site"
        site.mkdir()
        paths = generate(site, args.docs, args.per_doc)
        server, base_site = serve(site)
        index = "".join(f"<sitemap><loc>{base_site}/{p.name}</loc></sitemap>" for p in paths)
        (site / "index.xml").write_text(f'<?xml version="1.0"?><sitemapindex xmlns="{SITEMAP_NS}">{index}'
                                        "</sitemapindex>")
        raw = sum(p.stat().st_size for p in paths)
        print(f"index of {len(paths)} children x {args.per_doc:,} = {total:,} URLs; "
              f"{sum(p.suffix == '.gz' for p in paths)} gzip; {raw / 1e6:.0f} MB served")
        bare = tuned = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            assert run_bare(paths) == total
            bare = min(bare, time.perf_counter() - t)
            t = time.perf_counter()
            assert run_tuned(paths) == total
            tuned = min(tuned, time.perf_counter() - t)
        data_dir = root_dir / "data"
        stop = threading.Event()  # the bot probe's
        try:
            base = up(data_dir, deploy.free_port())
            probe_idle = probe_walk = None
            if args.bot_probe:
                from bench_serving import page_html, produce_page

                hit = produce_page(base, page_html()[1])
                probe_idle = bot_probe(hit, stop, seconds=10)
                pool = ThreadPoolExecutor(1)
                probing = pool.submit(bot_probe, hit, stop)
            extra = {"http.server": server.pid, "bench": os.getpid()}
            before = processes(data_dir, extra)
            t0 = int(time.time() * 1000)
            with httpx.Client() as client:  # one client: a new one per poll costs an SSL context
                first = walk(client, base, f"{base_site}/index.xml", total)
                if args.bot_probe:
                    stop.set()
                    probe_walk = probing.result(timeout=30)
                    pool.shutdown()
                during = processes(data_dir, extra)
                second = walk(client, base, f"{base_site}/index.xml", total)
            after = processes(data_dir, extra)
        finally:
            stop.set()
            down(data_dir)
            server.terminate()
        hist, steady = first_render_histogram(data_dir, t0)

    def rate(row: dict) -> float:
        return total / ((row["finishedAt"] - row["startedAt"]) / 1000)

    assert first["state"] == "completed" and first["created"] == total, first
    ingest, rewalk = rate(first), rate(second)
    print(f"lxml iterparse, bare (ceiling)     : {total / bare:>10,.0f} URLs/s")
    print(f"lxml iterparse, url tag + clear    : {total / tuned:>10,.0f} URLs/s")
    print(f"ingest end to end (first walk)     : {ingest:>10,.0f} URLs/s  "
          f"({(first['finishedAt'] - first['startedAt']) / 1000:.1f} s, {first['created']:,} created)")
    print(f"re-walk, nothing changed           : {rewalk:>10,.0f} URLs/s  ({second['skipped']:,} skipped)")
    print(f"ratio ingest / bare iterparse      : {ingest * bare / total:.2f}  (goal >= {GOALS['ratio']})")
    print(f"goal >= {GOALS['rate']:,} URLs/s end to end : {'met' if ingest >= GOALS['rate'] else 'NOT met'}")
    print("per process: peak RSS (VmHWM); CPU per URL in the first walk and in the re-walk")
    for name, p in sorted(after.items(), key=lambda kv: -kv[1]["rss"]):
        cpu1 = during[name]["cpu"] - before.get(name, {"cpu": 0})["cpu"] if name in during else 0
        cpu2 = p["cpu"] - during.get(name, {"cpu": 0})["cpu"]
        print(f"  {name:<32} {p['rss']:6.0f} MB  {cpu1 * 1e6 / total:6.1f} us/URL  "
              f"{cpu2 * 1e6 / total:6.1f} us/URL")
    cpu1 = sum(during[n]["cpu"] - before.get(n, {"cpu": 0})["cpu"] for n in during)
    cpu2 = sum(after[n]["cpu"] - during.get(n, {"cpu": 0})["cpu"] for n in after)
    print(f"  {'all processes':<32} {'':>9}  {cpu1 * 1e6 / total:6.1f} us/URL  "
          f"{cpu2 * 1e6 / total:6.1f} us/URL  (first walk on 2 idle cores: {2 * total / cpu1:,.0f} URLs/s)")
    if probe_idle and probe_walk:
        print("bot cache hits, one connection at 50 requests/s (this run's ingest figures include them):")
        print(f"  idle node                        {latency_line(probe_idle)}")
        print(f"  during the first walk            {latency_line(probe_walk)}")
    print_histogram("first due times, as a share of each row's cadence (rows per tenth), per cadence "
                    "(render.firstRender: now, so all at once):", hist)
    print_histogram("the render after the first, on each URL's slot (the steady state), per cadence:", steady)
    print("  (flat is the goal: the reference's fnv1a32(url) mod cadence covers at most 2^32 ms = 49.7 days,\n"
          "   so it put 365-day first renders in their first 14%; prerender-ray scales xxh64 onto the cadence)")
    fleet_figure(args.fleet_pages, args.fleet_rate, args.fleet_backlog)


if __name__ == "__main__":
    main()
