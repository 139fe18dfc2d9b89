"""The whole loop, end to end, with a real browser: a site on 127.0.0.1 whose pages build their content
with a script, a sitemap listing them, prerender-ray on its defaults (one node's real parts without Ray: ``tests.localnode``; RocksDB, HTTP), the
render worker, and bots that receive the script-built HTML.

Also: a noindex page ends suppressed, and a 301 retires its source and adopts the destination. The
noindex page is a discovered target (``PUT /render_targets``), not a sitemap entry: for sitemap jobs the
reference fleet stores non-indexable pages rather than reporting them (docs/fleet-protocol.md#verdicts).
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time

import httpx
import pytest
import pytest_asyncio

from prerender_ray.queue.leases import RELEASE_GRACE_MS
from prerender_ray.worker.main import Worker
from prerender_ray.worker.options import WorkerOptions, find_chromium
from tests.localnode import LocalNode
from tests.support import put_target, ready
from tests.worker.site import Origin

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="needs Debian's chromium (apt install chromium)"),
]

DEBUG = {"x-harper-prerender-debug": "1"}
PAGES = ["/js/e1", "/js/e2", "/js/e3", "/moved"]


@pytest.fixture(scope="module")
def site():
    o = Origin().start()
    o.sitemap_paths = PAGES
    yield o
    o.stop()


CONFIG = {"fleet": {"drainPeriod": "30s"}}  # the default: the last test stops and starts the node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("e2e") / "data", CONFIG)
    yield d
    d.stop(drain=False)  # whatever the stopped worker abandoned is no test's business


@pytest_asyncio.fixture(scope="module")
async def worker(node):
    w = Worker(
        WorkerOptions(
            queues=[node.url],
            concurrency=2,
            chromium=find_chromium(),
            status_interval_s=0.5,
            stats_interval_s=3600,
        )
    )
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(w.ready.wait(), 60)
    yield w
    w.stop()
    assert await asyncio.wait_for(task, 60) == 0


async def until(predicate, timeout: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def bot(client: httpx.AsyncClient, node, url: str, **headers: str) -> httpx.Response:
    return await client.get(f"{node.url}/p/{url}", headers={**DEBUG, **headers})


async def target(client: httpx.AsyncClient, node, url: str) -> dict | None:
    r = await client.get(f"{node.url}/render_targets", params={"url": url})
    return r.json() if r.status_code == 200 else None


async def test_a_sitemap_of_script_built_pages_ends_as_rendered_html_served_to_bots(
    node, site, worker
) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(
            f"{node.url}/sitemaps",
            json={"url": f"{site.base}/sitemap.xml", "revalidate": True, "background": False},
        )
        if r.status_code == 404:
            pytest.skip("POST /sitemaps is not served by this build")
        assert r.status_code == 200, r.text
        for path in PAGES[:3]:
            url = site.base + path
            hit = await until(lambda url=url: _hit(client, node, url), what=f"a rendered page for {url}")
            n = path.rsplit("/", 1)[1]
            assert f"built by script: item {n}" in hit.text  # built by the page's script, in Chromium
            assert "<script src" not in hit.text and "app.js" not in hit.text
            assert hit.headers["content-encoding"] == "gzip"  # asked with accept-encoding: gzip
            etag, modified = hit.headers.get("etag"), hit.headers.get("last-modified")
            assert etag or modified
            if etag:
                again = await bot(client, node, url, **{"accept-encoding": "gzip", "if-none-match": etag})
                assert again.status_code == 304 and again.content == b""
            if modified:
                again = await bot(client, node, url, **{"if-modified-since": modified})
                assert again.status_code == 304
    await until(lambda: _counted(worker, "rendered", 3), timeout=10, what="the worker to count them")


async def _hit(client: httpx.AsyncClient, node, url: str) -> httpx.Response | None:
    r = await bot(client, node, url, **{"accept-encoding": "gzip"})
    return r if r.status_code == 200 and r.headers.get("x-harper-cache") == "hit" else None


async def test_a_301_in_the_sitemap_retires_its_source_and_the_destination_gets_rendered(
    node, site, worker
) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        if (await client.get(f"{node.url}/sitemaps")).status_code == 404:
            pytest.skip("the sitemaps API is not served by this build")
        src, dst = site.base + "/moved", site.base + "/js/moved-here"
        if await target(client, node, src) is None and await target(client, node, dst) is None:
            put_target(node.url, src, nextRenderTime=1)  # this test alone: the source is due now
        await until(lambda: _absent(client, node, src), what="the 301's source to be retired")
        adopted = await until(lambda: target(client, node, dst), what="the 301's destination to be adopted")
        assert adopted["state"] != "suppressed"
        hit = await until(lambda: _hit(client, node, dst), what="the destination to be rendered")
        assert "built by script: item moved-here" in hit.text


async def _absent(client: httpx.AsyncClient, node, url: str) -> bool:
    return await target(client, node, url) is None


async def test_a_noindex_page_ends_suppressed(node, site, worker) -> None:
    url = site.base + "/noindex"
    put_target(node.url, url, nextRenderTime=1)
    async with httpx.AsyncClient(timeout=60) as client:
        t = await until(lambda: _suppressed(client, node, url), what="the noindex target to be suppressed")
        assert t["suppressedReason"] == "noindex"
    # the node applies the result before it answers the post; the worker counts after the answer
    await until(lambda: _counted(worker, "non-indexable"), timeout=10, what="the worker to count it")


async def _counted(worker, outcome: str, n: int = 1) -> bool:
    return worker.metrics.total[outcome] >= n


async def _suppressed(client: httpx.AsyncClient, node, url: str) -> dict | None:
    t = await target(client, node, url)
    return t if t and t.get("state") == "suppressed" else None


async def test_validators_are_the_rendered_pages_own_and_move_only_when_it_changes(node, site, worker) -> None:
    """The shell's ETag never reaches a bot; a re-render of the same page keeps ETag and
    Last-Modified (a crawler's 304 stays honest) and a changed page gets new ones."""
    text = {"now": "first version"}
    site.extra["/live/v"] = lambda req: (200, {"content-type": "text/html; charset=utf-8", "etag": '"shell"',
                                               "last-modified": "Mon, 01 Jan 2024 00:00:00 GMT",
                                               "cache-control": "no-cache"},  # Chromium asks every time
                                         f"<html><body><p>{text['now']}</p></body></html>".encode())
    url = site.base + "/live/v"
    async with httpx.AsyncClient(timeout=60) as client:
        put_target(node.url, url, nextRenderTime=1)
        first = await until(lambda: _hit(client, node, url), what="the first render")
        assert first.headers["etag"] not in ('"shell"', 'W/"shell"')
        assert first.headers["last-modified"] != "Mon, 01 Jan 2024 00:00:00 GMT"

        async def rerendered() -> httpx.Response:
            stamp = (await _hit(client, node, url)).headers["x-harper-cache-timestamp"]
            # due again once the last lease's release grace is over (a claim inside it is refused, and
            # a refused key waits a minute)
            await asyncio.sleep(RELEASE_GRACE_MS / 1000 + 0.5)
            put_target(node.url, url, nextRenderTime=1)
            return await until(lambda: _newer(client, node, url, stamp), what="a re-render")

        same = await rerendered()
        assert same.headers["etag"] == first.headers["etag"]
        assert same.headers["last-modified"] == first.headers["last-modified"]
        text["now"] = "second version"
        changed = await rerendered()
        assert changed.headers["etag"] != first.headers["etag"] and "second version" in changed.text
        again = await bot(client, node, url, **{"if-none-match": first.headers["etag"]})
        assert again.status_code == 200 and "second version" in again.text
        assert (await bot(client, node, url, **{"if-none-match": changed.headers["etag"]})).status_code == 304


async def _newer(client: httpx.AsyncClient, node, url: str, stamp: str) -> httpx.Response | None:
    hit = await _hit(client, node, url)
    return hit if hit is not None and hit.headers["x-harper-cache-timestamp"] != stamp else None


SPA_SHELL = (b"<!DOCTYPE html><html><head><title>shop</title><script>"
             b"addEventListener('DOMContentLoaded', () => {"
             b"  const meta = (name, content) => { const m = document.createElement('meta');"
             b"    m.name = name; m.content = content; document.head.appendChild(m); };"
             b"  const app = document.getElementById('app');"
             b"  if (location.pathname === '/spa/old') { meta('prerender-status-code', '301');"
             b"    meta('prerender-header', 'Location: /spa/new'); app.textContent = 'moved'; }"
             b"  else { meta('prerender-status-code', '404'); app.innerHTML = '<h1>Page not found</h1>'; }"
             b"});</script></head><body><div id=app></div></body></html>")


async def test_an_spas_not_found_view_and_meta_redirect_reach_bots_with_their_status(node, site, worker) -> None:
    """The app answers every path 200 with its shell; the rendered page's status meta is what a bot
    gets: a 404 with the rendered not-found view, a 301 to the resolved Location."""
    for path in ("/spa/missing", "/spa/old"):
        site.extra[path] = lambda req: (200, {"content-type": "text/html; charset=utf-8"}, SPA_SHELL)
    missing, old = site.base + "/spa/missing", site.base + "/spa/old"
    async with httpx.AsyncClient(timeout=60) as client:
        plain = await bot(client, node, missing)
        assert plain.status_code == 200  # before a render: the origin's shell (a soft 404)
        for url in (missing, old):
            put_target(node.url, url, nextRenderTime=1)

        async def cached(url: str) -> httpx.Response | None:
            r = await bot(client, node, url)
            return r if r.headers.get("x-harper-source") == "cache" else None

        gone = await until(lambda: cached(missing), what="the rendered 404")
        assert gone.status_code == 404 and "Page not found" in gone.text and "<script" not in gone.text
        moved = await until(lambda: cached(old), what="the rendered 301")
        assert moved.status_code == 301 and moved.headers["location"] == site.base + "/spa/new"
        assert (await target(client, node, old)) is None  # the redirect retired its source


async def test_a_shell_only_render_does_not_replace_the_stored_page(node, site, worker) -> None:
    """The site's script breaks after a good render: Chromium renders the bare app shell, the stored
    page keeps being served and the explainer shows the refused render."""
    broken = {"now": False}
    article = "".join(f"<p>Paragraph {i} of a real article, with <a href='/a/{i}'>a link</a>.</p>" for i in range(40))

    def handle(req):
        body = "<div id=app></div><script src='/missing.js'></script>" if broken["now"] else article
        return 200, {"content-type": "text/html; charset=utf-8", "cache-control": "no-cache"}, \
            f"<html><head><title>Article</title></head><body>{body}</body></html>".encode()

    site.extra["/live/shell"] = handle
    url = site.base + "/live/shell"
    async with httpx.AsyncClient(timeout=60) as client:
        put_target(node.url, url, nextRenderTime=1)
        first = await until(lambda: _hit(client, node, url), what="the first render")
        assert "Paragraph 39" in first.text
        broken["now"] = True
        await asyncio.sleep(RELEASE_GRACE_MS / 1000 + 0.5)
        put_target(node.url, url, nextRenderTime=1)

        async def refused() -> dict | None:
            r = await client.post(f"{node.url}/prerender_admin/explain", json={"url": url})
            return r.json()["rows"]["refusedRender"]

        record = await until(refused, what="the refused render")  # of either device: both render now
        assert record["cacheKey"].startswith(url) and record["otherDevice"] == (not record["cacheKey"].endswith("|desktop"))
        assert record["why"] == "empty-shell" and record["new"]["textChars"] == 0
        assert record["stored"]["links"] == 40
        await asyncio.sleep(0.6)  # past the ingress's page-store catch-up (250 ms)
        again = await _hit(client, node, url)
        assert again is not None and again.text == first.text


async def test_a_web_components_shadow_text_reaches_a_bot(node, site, worker) -> None:
    """A custom element whose content lives in its (open) shadow root is served as declarative
    shadow DOM: a bot that runs no script still gets the text."""
    url = site.base + "/shadow"
    async with httpx.AsyncClient(timeout=60) as client:
        put_target(node.url, url, nextRenderTime=1)
        hit = await until(lambda: _hit(client, node, url), what="the rendered web components")
        assert '<template shadowrootmode="open">' in hit.text and "shadow text" in hit.text
        assert "nested text" in hit.text and "<script" not in hit.text


async def test_a_section_that_loads_on_intersection_reaches_a_bot(node, site, worker) -> None:
    """Lazy content: the worker scrolls a page that watches intersections (render.scroll auto), so the
    section and the image's real src are in what bots get."""
    url = site.base + "/lazy"
    async with httpx.AsyncClient(timeout=60) as client:
        put_target(node.url, url, nextRenderTime=1)
        hit = await until(lambda: _hit(client, node, url), what="the rendered lazy page")
        assert "lazy section: item lazy" in hit.text and 'src="/img/lazy.png"' in hit.text


async def test_render_with_diagnostics_brings_back_what_the_page_threw_and_a_screenshot(node, site, worker) -> None:
    """"Why is this page blank": diagnose makes the key due with the flag, prerender-ray's worker
    reports the page's exception, its noise (bounded), the request the blocklist stopped and one
    screen as JPEG, and the node keeps it with the render history."""
    url = site.base + "/noisy"
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(f"{node.url}/prerender_admin/diagnose", json={"url": url, "deviceType": "desktop"})
        assert r.status_code == 200, r.text
        key = r.json()["cacheKey"]

        async def report() -> dict | None:
            got = (await client.get(f"{node.url}/prerender_admin/diagnostics", params={"cacheKey": key})).json()
            return got if got.get("reports") else None

        got = await until(report, what="the diagnostics report")
        [rep] = got["reports"]
        assert any("widget exploded" in e["message"] for e in rep["exceptions"])
        assert rep["truncated"]["console"] > 0 and len(rep["console"]) == 200
        assert base64.b64decode(rep["screenshot"]["data"])[:3] == b"\xff\xd8\xff"
        [entry] = got["renderHistory"]
        assert entry["outcome"] == "rendered" and entry["errors"] >= 1001 and entry["chars"] > 0


async def test_a_stop_drains_and_a_start_takes_over_no_result_of_a_granted_job_is_lost(
    node, site, worker
) -> None:
    """Last: it stops the module's node as `down` or SIGTERM to `up` does, with renders in flight and
    jobs claimed but not started, and starts it again on the same data dir. Before: the stop closed
    the port at once; the worker's results failed after its ~7 s of retries and their keys waited out
    the 10-minute lease."""
    gate = threading.Event()  # the pages answer once the stop is under way: renders are in flight
    reached: list[str] = []

    def slow(req):
        reached.append(req.path)
        gate.wait(60)
        return 200, {"content-type": "text/html; charset=utf-8"}, \
            f"<html><body><h1>drained</h1><p>{req.path}</p></body></html>".encode()

    paths = ["/drain/1", "/drain/2"]
    for path in paths:
        site.extra[path] = slow
    urls = [site.base + path for path in paths]
    results = lambda kind: worker.metrics.registry.get_sample_value(  # noqa: E731
        "prerender_worker_results_total", {"result": kind}) or 0.0
    kinds = ("delivered", "failed", "expired", "not-held", "rejected")
    before = {k: results(k) for k in kinds}
    keys = [key for url in urls for key in put_target(node.url, url, nextRenderTime=1)["cacheKeys"]]

    async def rendering() -> bool:
        return len(reached) >= 2  # both of the worker's slots wait on the origin

    await until(rendering, timeout=60, what="renders in flight")
    stopping = asyncio.create_task(asyncio.to_thread(node.stop))
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            async def paused() -> bool:
                rows = (await client.get(f"{node.url}/queue_status")).json()
                return [r["status"] for r in rows if r["node"] == "node-a"] == ["paused"]

            await until(paused, timeout=30, what="the stopping node to say paused")
            assert (await client.post(f"{node.url}/render_queue/claim", json={"limit": 5})).json() == []
        assert not stopping.done()  # granted jobs are out: the node waits for their results
    finally:
        gate.set()
    stopped = await asyncio.wait_for(stopping, 120)
    [drained] = stopped["drain"]["nodes"]
    assert drained["ended"] == "drained" and drained["awaitingResults"] == 0, stopped
    assert not ready(node.url)  # it really stopped

    await asyncio.to_thread(node.restart)  # same data dir and port; the fixture stops it

    async def all_delivered() -> bool:  # a job claimed but not started renders once the gate opens,
        return results("delivered") - before["delivered"] >= len(keys)  # its post may land after the start

    await until(all_delivered, timeout=60, what="every granted job's result delivered")
    after = {k: results(k) - before[k] for k in kinds}
    assert after["delivered"] >= len(keys), after
    assert {k: v for k, v in after.items() if k != "delivered"} == dict.fromkeys(kinds[1:], 0), after
    async with httpx.AsyncClient(timeout=60) as client:
        for url in urls:  # each was rendered and stored during the drain: nothing waits out a lease
            hit = await until(lambda url=url: _hit(client, node, url), timeout=30, what=f"{url} served rendered")
            assert "<h1>drained</h1>" in hit.text

        async def live() -> bool:
            rows = (await client.get(f"{node.url}/queue_status")).json()
            return [r["status"] for r in rows if r["node"] == "node-a"] in (["empty"], ["queued"])

        await until(live, timeout=60, what="the started node to say its real status")
