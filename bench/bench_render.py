"""Render worker benchmark: renders per second through the worker and a real deployment, beside a bare
Playwright loop over the same pages, in the same run.

Run: ``.venv/bin/python bench/bench_render.py [--pages 200] [--concurrency 2] [--rounds 2]
[--lazy-every 4] [--tracker-pages 60] [--guard-rounds 2]``

- The pages: ``--pages`` local pages on 127.0.0.1 (a threaded origin in this process), each with a
  stylesheet and a script that fetches a JSON document and writes it into the page, so the content
  is built by JavaScript. Every ``--lazy-every``-th page also has a section below the fold that
  loads when it scrolls into view (the worker's auto scroll does it; the other pages are not scrolled).
- Worker: a single-node deployment on a local Ray (defaults, desktop only), every page a target due
  now; ``prerender-ray``'s worker (in this process, ``--concurrency`` pages at once) claims, renders,
  settles, strips scripts, gzips and posts every page; timed from the first granted claim to the
  last delivered result (claims, results and the server's processing included).
- Bare loop: Playwright launching the same Chromium with the same switches, ``--concurrency`` tabs,
  each doing ``page.goto(url)`` + ``page.content()`` over the same pages (no settle, no post).
- Rounds alternate bare / worker so drift on the shared machine hits both; the figures are the best
  round of each and the ratio of those, and the ratio of each round's pair.
- Blocklist: ``--tracker-pages`` pages that load two tag-manager / analytics scripts in their head
  (stand-ins on a local server taking 150 ms each, reached under their real host names through
  Chromium's host resolver rules, each sending a beacon), rendered by the worker with the default
  blocklist and without it (``--no-default-blocklist``), rounds alternating; the time saved per page.
- Egress guard: ``--guard-rounds`` rounds of the pages rendered by a worker with ``--public-only``
  (every connection through its SOCKS5 guard, 127.0.0.1 listed as a private host) and without,
  alternating; renders per second and the mean render time of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ray_env import isolate  # noqa: E402

isolate()

import httpx  # noqa: E402 (after isolate(): Ray reads the environment at import)

PAGE = """<!doctype html><html><head><meta charset=utf-8><title>Product {n}</title>
<link rel=stylesheet href="/style.css"><script src="/app.js" defer></script></head>
<body><header><h1>Product {n}</h1><nav><a href="/p/{prev}">prev</a> <a href="/p/{next}">next</a></nav></header>
<main><div id=app>loading</div><section>{filler}</section></main></body></html>"""
APP = b"""fetch('/api/' + location.pathname.split('/').pop() + '.json').then(r => r.json()).then(d => {
  const el = document.getElementById('app');
  el.innerHTML = '<h2>' + d.title + '</h2><ul>' + d.items.map(i => '<li>' + i + '</li>').join('') + '</ul>';
});"""
CSS = b"body{font-family:sans-serif;margin:2em} #app{border:1px solid #ccc}"
LAZY = """<div style="height:3000px"></div><div id=more></div><script>
new IntersectionObserver((es, io) => es.forEach(e => {{ if (!e.isIntersecting) return; io.disconnect();
  fetch('/api/lazy-{n}.json').then(r => r.json()).then(d => {{ const s = document.createElement('section');
  s.textContent = 'lazy section ' + d.title; document.body.appendChild(s); }}); }})).observe(document.getElementById('more'));
</script>"""
TRACKER_HOSTS = ("www.googletagmanager.com", "www.google-analytics.com")
TRACKED = """<!doctype html><html><head><meta charset=utf-8><title>Tracked {n}</title>
<script src="http://{a}:{port}/gtm.js"></script><script src="http://{b}:{port}/analytics.js"></script>
<script src="/app.js" defer></script></head><body><main><div id=app>loading</div></main></body></html>"""
TRACKER_JS = b"new Image().src = '/collect?v=1'; fetch('/collect?t=pageview', {method: 'POST', body: 'x'});"


def start_tracker() -> tuple[ThreadingHTTPServer, int]:
    """The stand-in for third-party tag scripts: each takes 150 ms, as a remote one does."""

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _answer(self) -> None:
            time.sleep(0.15)
            body = TRACKER_JS if self.path.endswith(".js") else b""
            self.send_response(200)
            self.send_header("content-type", "text/javascript")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, httpd.server_address[1]


def start_origin(lazy_every: int = 0, tracker_port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    filler = "<p>" + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 40 + "</p>"

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self) -> None:
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            p = self.path.split("?")[0]
            if p.startswith("/p/"):
                n = int(p.rsplit("/", 1)[1])
                lazy = LAZY.format(n=n) if lazy_every and n % lazy_every == 0 else ""
                body, ctype = (
                    PAGE.format(n=n, prev=n - 1, next=n + 1, filler=filler + lazy).encode(),
                    "text/html; charset=utf-8",
                )
            elif p.startswith("/t/"):
                n = int(p.rsplit("/", 1)[1])
                a, b = TRACKER_HOSTS
                body, ctype = TRACKED.format(n=n, a=a, b=b, port=tracker_port).encode(), "text/html; charset=utf-8"
            elif p == "/app.js":
                body, ctype = APP, "text/javascript"
            elif p == "/style.css":
                body, ctype = CSS, "text/css"
            elif p.startswith("/api/"):
                n = p.rsplit("/", 1)[1].removesuffix(".json")
                body = json.dumps(
                    {"title": f"built by script {n}", "items": [f"feature {i}" for i in range(8)]}
                ).encode()
                ctype = "application/json"
            else:
                body, ctype = b"no", "text/plain"
            self.send_response(200 if ctype != "text/plain" else 404)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


async def bare_loop(chromium: str, urls: list[str], concurrency: int) -> tuple[float, int, int]:
    """Seconds for goto + content over ``urls`` with ``concurrency`` tabs; pages whose content the
    script had built by then, and lazy sections they had."""
    from playwright.async_api import async_playwright

    from prerender_ray.worker.chromium import SWITCHES

    args = [s for s in SWITCHES if not s.startswith(("--remote-debugging", "--headless"))]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, headless=True, args=args)
        pages = [await (await browser.new_context()).new_page() for _ in range(concurrency)]
        await pages[0].goto(urls[0])  # warm-up, as the worker's browser is already up
        queue = list(urls)
        built = lazy = 0

        async def tab(page) -> None:
            nonlocal built, lazy
            while queue:
                url = queue.pop()
                await page.goto(url)
                html = await page.content()
                built += "built by script" in html
                lazy += "<section>lazy section" in html  # not the script's own text

        t0 = time.perf_counter()
        await asyncio.gather(*(tab(p) for p in pages))
        dt = time.perf_counter() - t0
        await browser.close()
    return dt, built, lazy


async def worker_run(
    chromium: str, node: str, urls: list[str], concurrency: int, revalidate: bool, quiet_ms: int | None = None,
    **options: object,
) -> tuple[float, dict]:
    """Seconds from the first granted claim to the last result; the worker's totals, with the lazy
    sections its HTML had (``lazy``) and the requests its blocklist stopped."""
    from prerender_ray.worker.main import Worker
    from prerender_ray.worker.options import WorkerOptions

    async with httpx.AsyncClient(timeout=60) as client:
        if revalidate:
            r = await client.post(f"{node}/render_targets", json={"action": "revalidate", "urls": urls})
            r.raise_for_status()
        else:
            for i in range(0, len(urls), 50):
                await asyncio.gather(
                    *(
                        client.put(f"{node}/render_targets", json={"url": u, "nextRenderTime": 1})
                        for u in urls[i : i + 50]
                    )
                )
    await asyncio.sleep(1.5)  # the keeper publishes its ready set every second
    kw: dict = {} if quiet_ms is None else {"settle_quiet_ms": quiet_ms}
    kw.update(options)
    w = Worker(
        WorkerOptions(
            queues=[node],
            concurrency=concurrency,
            chromium=chromium,
            status_interval_s=0.5,
            stats_interval_s=3600,
            discover=False,
            **kw,
        )
    )
    first: list[float] = []
    claim = w.client.claim

    async def timed_claim(host: str, limit: int):  # type: ignore[no-untyped-def]
        r = await claim(host, limit)
        if r.jobs and not first:
            first.append(time.perf_counter())
        return r

    w.client.claim = timed_claim  # type: ignore[method-assign]
    lazy, render_ms = 0, []
    deliver = w.deliver

    async def counted(job, verdict, html, ms, *a, **k):  # type: ignore[no-untyped-def]
        nonlocal lazy
        lazy += bool(html and "<section>lazy section" in html)
        render_ms.append(ms)
        return await deliver(job, verdict, html, ms, *a, **k)

    w.deliver = counted  # type: ignore[method-assign]
    task = asyncio.create_task(w.run())
    def done():
        return sum(w.metrics.total[o] for o in ("rendered", "redirected", "non-indexable", "error"))
    deadline = time.monotonic() + 600
    while done() < len(urls) and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.05)
    end = time.perf_counter()
    w.stop()
    await task
    mean = sum(render_ms) / len(render_ms) if render_ms else 0.0
    return end - (first[0] if first else end), {**w.metrics.total, "lazy": lazy, "render_ms": round(mean)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--settle-quiet", type=int, help="the worker's --settle-quiet (default: its default)")
    ap.add_argument("--lazy-every", type=int, default=4, help="every Nth page has a lazy section (0: none)")
    ap.add_argument("--tracker-pages", type=int, default=60, help="pages with third-party tags (0: skip)")
    ap.add_argument("--guard-rounds", type=int, default=2,
                    help="rounds of the pages with --public-only's egress guard and without (0: skip)")
    args = ap.parse_args()

    from prerender_ray import logs
    from tests.support import RayCluster, deploy_on

    logs.setup(level="warning")

    tracker, tracker_port = start_tracker()
    httpd, origin = start_origin(args.lazy_every, tracker_port)
    urls = [f"{origin}/p/{i}" for i in range(args.pages)]
    tracked = [f"{origin}/t/{i}" for i in range(args.tracker_pages)]
    lazy_pages = sum(1 for i in range(args.pages) if args.lazy_every and i % args.lazy_every == 0)
    resolve = ",".join(f"MAP {h} 127.0.0.1" for h in TRACKER_HOSTS)
    cluster = RayCluster.start()
    bare: list[tuple[float, int, int]] = []
    work: list[tuple[float, dict]] = []
    blocking: dict[bool, list[tuple[float, dict]]] = {True: [], False: []}
    guarded: dict[bool, list[tuple[float, dict]]] = {True: [], False: []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = deploy_on(cluster, Path(tmp) / "data", {"deviceTypes": {"default": ["desktop"]}})
            for r in range(args.rounds):
                bare.append(asyncio.run(bare_loop(args.chromium, urls, args.concurrency)))
                work.append(
                    asyncio.run(
                        worker_run(
                            args.chromium,
                            d.url,
                            urls,
                            args.concurrency,
                            revalidate=r > 0,
                            quiet_ms=args.settle_quiet,
                        )
                    )
                )
                print(
                    f"round {r + 1}: bare {args.pages / bare[-1][0]:.2f}/s, "
                    f"worker {args.pages / work[-1][0]:.2f}/s {work[-1][1]}",
                    flush=True,
                )
            for r in range(args.rounds if tracked else 0):
                for on in (True, False):
                    blocking[on].append(asyncio.run(worker_run(
                        args.chromium, d.url, tracked, args.concurrency, revalidate=r > 0 or not on,
                        chromium_args=(f"--host-resolver-rules={resolve}",), block_defaults=on)))
                    t, totals = blocking[on][-1]
                    print(f"tracker round {r + 1}, blocklist {'on' if on else 'off'}: "
                          f"{len(tracked) / t:.2f}/s, render {totals['render_ms']} ms, "
                          f"blocked {totals.get('blocked-requests', 0)}", flush=True)
            for r in range(args.guard_rounds):
                for on in (True, False):
                    guard_opts: dict = {"public_only": True, "private_hosts": ("127.0.0.1",)} if on else {}
                    guarded[on].append(asyncio.run(worker_run(
                        args.chromium, d.url, urls, args.concurrency, revalidate=True, quiet_ms=args.settle_quiet,
                        **guard_opts)))
                    t, totals = guarded[on][-1]
                    print(f"guard round {r + 1}, {'--public-only' if on else 'direct'}: {args.pages / t:.2f}/s, "
                          f"render {totals['render_ms']} ms", flush=True)
            d.stop()
    finally:
        cluster.shutdown()
        httpd.shutdown()
        tracker.shutdown()
    best_bare = min(b[0] for b in bare)
    best_work = min(w[0] for w in work)
    print(
        f"render benchmark: {args.pages} local pages, concurrency {args.concurrency}, {args.rounds} rounds, "
        f"Chromium {args.chromium}"
    )
    print(f"{'':52}{'renders/s':>12}{'script-built':>14}{'lazy sections':>15}")
    print(
        f"{'bare Playwright loop (goto + content)':52}{args.pages / best_bare:>12.2f}"
        f"{min(b[1] for b in bare):>10}/{args.pages}{min(b[2] for b in bare):>11}/{lazy_pages}"
    )
    print(
        f"{'worker + deployment (claim, settle, strip, gzip, post)':52}{args.pages / best_work:>12.2f}"
        f"{'all' if all(w[1].get('rendered', 0) >= args.pages for w in work) else 'NOT all':>14}"
        f"{min(w[1]['lazy'] for w in work):>11}/{lazy_pages}"
    )
    print(f"{'ratio worker / bare (best rounds)':52}{best_bare / best_work:>12.2f}   (goal >= 0.80)")
    per_round = sorted(b[0] / w[0] for b, w in zip(bare, work, strict=True))
    print(f"{'ratio per round (bare and worker back to back)':52}"
          f"{'  '.join(f'{r:.2f}' for r in per_round):>12}   median {per_round[len(per_round) // 2]:.2f}")
    if blocking[True]:
        on, off = (min(t for t, _ in blocking[b]) for b in (True, False))
        ms_on, ms_off = (min(x["render_ms"] for _, x in blocking[b]) for b in (True, False))
        print(f"blocklist: {len(tracked)} pages loading 2 third-party tags (150 ms each, local stand-ins)")
        print(f"{'':52}{'renders/s':>12}{'mean render ms':>16}")
        print(f"{'worker, default blocklist':52}{len(tracked) / on:>12.2f}{ms_on:>16}")
        print(f"{'worker, --no-default-blocklist':52}{len(tracked) / off:>12.2f}{ms_off:>16}")
        print(f"{'saved per page (render time, best rounds)':52}{ms_off - ms_on:>12} ms   ratio {off / on:.2f}x")

    if guarded[True]:
        on, off = (min(t for t, _ in guarded[b]) for b in (True, False))
        ms_on, ms_off = (min(x["render_ms"] for _, x in guarded[b]) for b in (True, False))
        ok = all(x.get("rendered", 0) >= args.pages for _, x in guarded[True])
        print(f"egress guard: the {args.pages} pages with --public-only (every connection through the worker's "
              f"SOCKS5 guard) and direct, rounds alternating")
        print(f"{'':52}{'renders/s':>12}{'mean render ms':>16}")
        print(f"{'worker, direct':52}{args.pages / off:>12.2f}{ms_off:>16}")
        print(f"{'worker, --public-only' + ('' if ok else ' (NOT all rendered)'):52}{args.pages / on:>12.2f}{ms_on:>16}")
        print(f"{'ratio guarded / direct (best rounds)':52}{off / on:>12.2f}")


if __name__ == "__main__":
    main()
