"""Render worker benchmark: renders per second through the worker and a real deployment, beside a bare
Playwright loop over the same pages, in the same run.

Run: ``.venv/bin/python bench/bench_render.py [--pages 200] [--concurrency 2] [--rounds 2]``

- The pages: ``--pages`` local pages on 127.0.0.1 (a threaded origin in this process), each with a
  stylesheet and a script that fetches a JSON document and writes it into the page, so the content
  is built by JavaScript.
- Worker: a single-node deployment on a local Ray (defaults, desktop only), every page a target due
  now; ``prerender-ray``'s worker (in this process, ``--concurrency`` pages at once) claims, renders,
  settles, strips scripts, gzips and posts every page; timed from the first granted claim to the
  last delivered result (claims, results and the server's processing included).
- Bare loop: Playwright launching the same Chromium with the same switches, ``--concurrency`` tabs,
  each doing ``page.goto(url)`` + ``page.content()`` over the same pages (no settle, no post).
- Rounds alternate bare / worker so drift on the shared machine hits both; the figures are the best
  round of each and the ratio of those, and the ratio of each round's pair.
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


def start_origin() -> tuple[ThreadingHTTPServer, str]:
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
                body, ctype = (
                    PAGE.format(n=n, prev=n - 1, next=n + 1, filler=filler).encode(),
                    "text/html; charset=utf-8",
                )
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


async def bare_loop(chromium: str, urls: list[str], concurrency: int) -> tuple[float, int]:
    """Seconds for goto + content over ``urls`` with ``concurrency`` tabs; and pages whose content
    the script had built by then."""
    from playwright.async_api import async_playwright

    from prerender_ray.worker.pool import SWITCHES

    args = [s for s in SWITCHES if not s.startswith(("--remote-debugging", "--headless"))]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, headless=True, args=args)
        pages = [await (await browser.new_context()).new_page() for _ in range(concurrency)]
        await pages[0].goto(urls[0])  # warm-up, as the worker's browser is already up
        queue = list(urls)
        built = 0

        async def tab(page) -> None:
            nonlocal built
            while queue:
                url = queue.pop()
                await page.goto(url)
                html = await page.content()
                built += "built by script" in html

        t0 = time.perf_counter()
        await asyncio.gather(*(tab(p) for p in pages))
        dt = time.perf_counter() - t0
        await browser.close()
    return dt, built


async def worker_run(
    chromium: str, node: str, urls: list[str], concurrency: int, revalidate: bool, quiet_ms: int | None = None
) -> tuple[float, dict]:
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
    kw = {} if quiet_ms is None else {"settle_quiet_ms": quiet_ms}
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
    task = asyncio.create_task(w.run())
    def done():
        return sum(w.metrics.total[o] for o in ("rendered", "redirected", "non-indexable", "error"))
    deadline = time.monotonic() + 600
    while done() < len(urls) and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.05)
    end = time.perf_counter()
    w.stop()
    await task
    return end - (first[0] if first else end), dict(w.metrics.total)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--settle-quiet", type=int, help="the worker's --settle-quiet (default: its default)")
    args = ap.parse_args()

    from prerender_ray import logs
    from tests.support import RayCluster, deploy_on

    logs.setup(level="warning")

    httpd, origin = start_origin()
    urls = [f"{origin}/p/{i}" for i in range(args.pages)]
    cluster = RayCluster.start()
    bare: list[tuple[float, int]] = []
    work: list[tuple[float, dict]] = []
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
            d.stop()
    finally:
        cluster.shutdown()
        httpd.shutdown()
    best_bare = min(b[0] for b in bare)
    best_work = min(w[0] for w in work)
    print(
        f"render benchmark: {args.pages} local pages, concurrency {args.concurrency}, {args.rounds} rounds, "
        f"Chromium {args.chromium}"
    )
    print(f"{'':52}{'renders/s':>12}{'script-built':>14}")
    print(
        f"{'bare Playwright loop (goto + content)':52}{args.pages / best_bare:>12.2f}"
        f"{min(b[1] for b in bare):>10}/{args.pages}"
    )
    print(
        f"{'worker + deployment (claim, settle, strip, gzip, post)':52}{args.pages / best_work:>12.2f}"
        f"{'all' if all(w[1].get('rendered', 0) == args.pages for w in work) else 'NOT all':>14}"
    )
    print(f"{'ratio worker / bare (best rounds)':52}{best_bare / best_work:>12.2f}   (goal >= 0.80)")
    per_round = sorted(b[0] / w[0] for b, w in zip(bare, work, strict=True))
    print(f"{'ratio per round (bare and worker back to back)':52}"
          f"{'  '.join(f'{r:.2f}' for r in per_round):>12}   median {per_round[len(per_round) // 2]:.2f}")


if __name__ == "__main__":
    main()
