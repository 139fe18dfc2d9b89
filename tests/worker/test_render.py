"""The worker with a real Chromium against a real origin on 127.0.0.1 and a fake queue: what it reports
for each kind of page (docs/fleet-protocol.md#verdicts), what it sends where (#bypass-token), and that
it keeps going through pages that hang, crash or never settle."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import signal
import time

import pytest
import pytest_asyncio

from prerender_ray.worker.main import Worker
from prerender_ray.worker.options import WorkerOptions, find_chromium
from tests.worker.site import FakeQueue, Origin, ThirdParty
from tests.worker.site import page as site_page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="needs Debian's chromium (apt install chromium)"),
]

TOKEN = "bypass-secret"


class Rig:
    def __init__(self) -> None:
        self.third = ThirdParty().start()
        self.origin = Origin(self.third.base).start()
        self.queue = FakeQueue().start()
        self.worker: Worker | None = None
        self.task: asyncio.Task | None = None

    async def start(self, **kw) -> Worker:
        opts = dict(
            queues=[self.queue.base],
            concurrency=2,
            chromium=find_chromium(),
            bypass_token=TOKEN,
            status_interval_s=0,
            idle_ms=200,
            min_backoff_ms=100,
            max_backoff_ms=500,
            max_html_bytes=1_000_000,
            stats_interval_s=3600,
            block_hosts=("analytics.localhost",),  # *.localhost is loopback to Chromium, no DNS
        )
        opts.update(kw)
        self.worker = Worker(WorkerOptions(**opts))
        self.task = asyncio.create_task(self.worker.run())
        await asyncio.wait_for(self.worker.ready.wait(), 60)
        return self.worker

    async def render(self, *jobs: dict, timeout: float = 60) -> dict[str, dict]:
        """Queue ``jobs``; their results by id, with ``html`` decoded."""
        self.queue.jobs.extend(jobs)
        return await self.results({j["id"] for j in jobs}, timeout)

    async def results(self, ids: set[str], timeout: float = 60) -> dict[str, dict]:
        got: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = {m["id"]: m for m in self.queue.results() if m["id"] in ids}
            if len(got) == len(ids):
                for m in got.values():
                    c = m.pop("_content")
                    m["html"] = gzip.decompress(c).decode() if c else None
                return got
            await asyncio.sleep(0.1)
        raise AssertionError(f"no result for {ids - set(got)} within {timeout} s")

    def url(self, path: str) -> str:
        return self.origin.base + path

    def job(self, path: str, **kw) -> dict:
        return self.queue.job(self.url(path), **kw)

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            assert await asyncio.wait_for(self.task, 60) == 0
        for s in (self.queue, self.origin, self.third):
            s.stop()


@pytest_asyncio.fixture(scope="module")
async def rig():
    r = Rig()
    await r.start()
    yield r
    await r.stop()


async def one(rig: Rig, path: str, **kw) -> dict:
    return (await rig.render(rig.job(path, **kw)))[rig.url(path) + "|" + kw.get("device", "desktop")]


# ------------------------------------------------------------------------------------- rendering


async def test_a_script_built_page_is_rendered_without_its_scripts_and_gzipped(rig: Rig) -> None:
    m = await one(rig, "/js/1")
    assert m["outcome"] == "rendered" and m["statusCode"] == 200 and m["isIndexable"] is True
    assert "built by script: item 1" in m["html"] and m["html"].startswith("<!DOCTYPE html>")
    assert "<script" not in m["html"].replace('<script type="application/ld+json">', "")  # JSON-LD stays
    assert "application/ld+json" in m["html"]
    assert m["headers"] == {
        "etag": '"js-1"',
        "cache-control": "max-age=60",
        "content-type": "text/html; charset=utf-8",
        "content-encoding": "gzip",
    }
    assert set(m) == {
        "id",
        "url",
        "statusCode",
        "headers",
        "renderTime",
        "isIndexable",
        "outcome",
        "html",
        "_headers",
        "renderSummary",  # prerender-ray's own, which a reference server ignores
    }
    assert m["renderSummary"] == {"errors": 0, "blocked": 0, "failed": 0, "chars": len(m["html"]), "scrollSteps": 0}
    assert not rig.origin.requests("/img/1.png")  # images are blocked


async def test_a_page_waits_for_prerender_ready_and_for_a_short_timer(rig: Rig) -> None:
    res = await rig.render(rig.job("/late"), rig.job("/debounce"))
    late, debounce = res[rig.url("/late") + "|desktop"], res[rig.url("/debounce") + "|desktop"]
    assert "ready at last" in late["html"] and late["renderTime"] >= 1000
    assert "after timer: item debounced" in debounce["html"]


async def test_noindex_is_non_indexable_without_content_unless_the_job_comes_from_a_sitemap(rig: Rig) -> None:
    m = await one(rig, "/noindex")
    assert (m["outcome"], m["reason"], m["isIndexable"], m["html"]) == (
        "non-indexable",
        "noindex",
        False,
        None,
    )
    assert m["headers"] == {"content-type": "text/html; charset=utf-8", "x-robots-tag": "noarchive"}
    s = (await rig.render(rig.job("/noindex", key="sitemap-noindex", sitemap=True)))["sitemap-noindex"]
    assert (
        s["outcome"] == "rendered"
        and s["isIndexable"] is False
        and "reason" not in s
        and "hidden" in s["html"]
    )
    c = await one(rig, "/canonical-elsewhere")
    assert (c["outcome"], c["reason"]) == ("non-indexable", "canonical-mismatch")


async def test_http_errors_redirects_and_loops_are_reported_as_the_reference_fleet_does(rig: Rig) -> None:
    res = await rig.render(
        *(rig.job(p) for p in ("/missing", "/moved", "/loop", "/client-redirect", "/status-meta",
                               "/status-meta-twice"))
    )
    missing, moved, loop, client, meta, twice = (
        res[rig.url(p) + "|desktop"]
        for p in ("/missing", "/moved", "/loop", "/client-redirect", "/status-meta", "/status-meta-twice")
    )
    assert (missing["outcome"], missing["reason"], missing["statusCode"]) == (
        "non-indexable",
        "http-error",
        404,
    )
    assert missing["headers"]["x-robots-tag"] == "noindex"
    assert (moved["outcome"], moved["reason"], moved["statusCode"]) == ("redirected", "redirect", 301)
    assert moved["redirectedTo"] == rig.url("/js/moved-here") and moved["headers"] == {
        "cache-control": "max-age=3600"
    }
    assert "isIndexable" not in moved and moved["html"] is None
    assert (loop["outcome"], loop["reason"], loop["isIndexable"]) == ("non-indexable", "redirect-loop", False)
    assert "ERR_TOO_MANY_REDIRECTS" in loop["error"]["message"] and loop["error"]["phase"] == "navigation"
    assert "statusCode" not in loop
    assert client["outcome"] == "rendered" and client["redirectedTo"] == rig.url("/js/landed")
    assert "built by script: item landed" in client["html"]
    assert (meta["outcome"], meta["statusCode"], meta["reason"]) == ("non-indexable", 410, "http-error")
    assert "<p>gone</p>" in meta["html"]  # the rendered not-found view goes with the verdict
    # duplicate metas: the first status and the first Location header count, relative to the page
    assert (twice["outcome"], twice["statusCode"], twice["redirectedTo"]) == ("redirected", 301, rig.url("/js/first"))


def _serve(rig: Rig, path: str, body: str, head: str = "", query: str = "") -> None:
    """``path`` answers ``body``; with ``query``, a request without it is redirected (302) to it first."""
    def handle(req):
        if query and "?" not in req.path:
            return 302, {"location": f"{path}?{query}"}, b""
        return 200, {"content-type": "text/html; charset=utf-8"}, site_page(path, body, head=head)
    rig.origin.extra[path] = handle


async def test_a_url_a_script_writes_without_loading_a_document_is_no_redirect(rig: Rig) -> None:
    """history.replaceState/pushState load nothing: the DOM stays the job's own page, never the
    rewritten URL's (or any script could overwrite the cached render of any other path, the home page
    first). A new document in the main frame (script navigation, meta refresh, HTTP 30x) is a redirect,
    reported with the URL that document loaded from, whatever URL it then writes."""
    _serve(rig, "/ugc", "<script>history.replaceState(null,'','/')</script><h1>owned</h1>")
    _serve(rig, "/ugc-push", "<script>history.pushState(null,'','/')</script><h1>owned</h1>")
    _serve(rig, "/ugc-hash", "<script>location.hash = 'top'; history.replaceState(null,'','/#x')</script><h1>owned</h1>")
    _serve(rig, "/assigns", "<p>going</p>", head="<script>location.href = '/js/assigned'</script>")
    _serve(rig, "/refreshes", "<p>going</p>", head='<meta http-equiv="refresh" content="0; url=/js/refreshed">')
    _serve(rig, "/to-ugc", "<p>going</p>", head="<script>location.href = '/ugc'</script>")
    _serve(rig, "/paged", "<h1>page two</h1>", query="page=2")
    paths = ("/ugc", "/ugc-push", "/ugc-hash", "/assigns", "/refreshes", "/to-ugc", "/paged")
    res = await rig.render(*(rig.job(p) for p in paths))
    ugc, push, hashed, assigns, refreshes, to_ugc, paged = (res[rig.url(p) + "|desktop"] for p in paths)
    for m in (ugc, push, hashed):
        assert (m["outcome"], m["statusCode"], m.get("redirectedTo")) == ("rendered", 200, None), m
        assert "<h1>owned</h1>" in m["html"]
    assert (assigns["outcome"], assigns["redirectedTo"]) == ("rendered", rig.url("/js/assigned"))
    assert "built by script: item assigned" in assigns["html"]
    assert (refreshes["outcome"], refreshes["redirectedTo"]) == ("rendered", rig.url("/js/refreshed"))
    assert "built by script: item refreshed" in refreshes["html"]
    # a real redirect to a page that then rewrites its URL: the page it loaded, not the URL it wrote
    assert (to_ugc["outcome"], to_ugc["redirectedTo"]) == ("rendered", rig.url("/ugc"))
    assert "<h1>owned</h1>" in to_ugc["html"]
    assert (paged["outcome"], paged["redirectedTo"]) == ("rendered", rig.url("/paged?page=2"))
    assert "page two" in paged["html"]
    diag = (await rig.render(rig.job("/ugc", key="ugc-diag", renderOptions={"diagnostics": True})))["ugc-diag"]
    assert "redirectedTo" not in diag and any(
        e["event"] == "navigated" and e["detail"].startswith(f"within the document to {rig.url('/')}:")
        for e in diag["diagnostics"]["timeline"])  # the explainer says what the page tried


async def test_the_device_profile_sets_viewport_and_user_agent_and_job_headers_reach_the_document(
    rig: Rig,
) -> None:
    res = await rig.render(rig.job("/device", device="mobile", headers={"X-Job": "j1"}), rig.job("/device"))
    mobile, desktop = res[rig.url("/device") + "|mobile"], res[rig.url("/device") + "|desktop"]
    assert "width=393 touch=true" in mobile["html"] and "iPhone" in mobile["html"]
    assert "width=1366 touch=false" in desktop["html"] and "HeadlessChrome" in desktop["html"]
    docs = rig.origin.requests("/device")
    assert [d.headers.get("x-job") for d in docs].count("j1") == 1


async def test_the_bypass_token_goes_to_the_origin_only(rig: Rig) -> None:
    res = await rig.render(rig.job("/third-party"), rig.job("/moved-away"))
    assert res[rig.url("/third-party") + "|desktop"]["outcome"] == "rendered"
    assert res[rig.url("/moved-away") + "|desktop"]["redirectedTo"] == rig.third.base + "/landing"
    for path in ("/third-party", "/app.js", "/moved-away"):
        assert all(s.headers.get("x-harper-renderer-bypass") == TOKEN for s in rig.origin.requests(path)), (
            path
        )
    assert rig.third.requests("/lib.js") and rig.third.requests("/landing")
    assert not any(
        "x-harper-renderer-bypass" in s.headers for s in rig.third.seen
    )  # not even after a redirect
    assert not any("x-harper-renderer-bypass" in s.headers for s in rig.queue.seen)


# --------------------------------------------------------------------------------------- faults


async def test_pages_that_throw_hang_or_never_settle_end_in_their_budget_and_the_worker_goes_on(
    rig: Rig,
) -> None:
    res = await rig.render(
        rig.job("/throws"),
        rig.job("/busy", renderBudget=2500),
        rig.job("/never-ready", renderBudget=2000),
        rig.job("/hang", renderBudget=2000),
        rig.job("/js/after"),
    )
    def get(p):
        return res[rig.url(p) + "|desktop"]
    assert get("/throws")["outcome"] == "rendered" and "before the throw" in get("/throws")["html"]
    busy, never, hang = get("/busy"), get("/never-ready"), get("/hang")
    assert (busy["outcome"], busy["error"]["name"], busy["statusCode"]) == ("error", "SettleTimeout", 200)
    assert never["outcome"] == "error" and "prerenderReady" in never["error"]["message"]
    assert (
        hang["outcome"] == "error" and hang["error"].get("phase") == "navigation" and "statusCode" not in hang
    )
    for m in (busy, never, hang):
        assert 1500 <= m["renderTime"] <= 15_000
    assert get("/js/after")["outcome"] == "rendered"


async def test_a_huge_page_is_rendered_and_one_past_the_limit_is_an_error(rig: Rig) -> None:
    res = await rig.render(rig.job("/huge/20000"), rig.job("/huge/30000"))  # about 0.8 and 1.2 MB
    ok, big = res[rig.url("/huge/20000") + "|desktop"], res[rig.url("/huge/30000") + "|desktop"]
    assert ok["outcome"] == "rendered" and ok["html"].count("of a very long page") == 20000
    assert big["outcome"] == "error" and big["error"]["name"] == "ContentTooLarge"


async def test_a_crashed_tab_is_an_error_and_the_next_page_renders(rig: Rig) -> None:
    from prerender_ray.worker.chromium import group_members

    job = rig.job("/hang", key="crash-me", renderBudget=15_000)
    # Only this job's request counts: an earlier test's /hang in the log (and its renderer, or the
    # previous page's, still busy) made this kill the wrong process under load.
    seen_before = len(rig.origin.seen)
    rig.queue.jobs.append(job)
    chromium = rig.worker.pool.current
    deadline = time.monotonic() + 20
    renderers: list[int] = []
    since: dict[int, int] = {}  # each renderer's CPU ticks when first seen after the page was asked for
    while time.monotonic() < deadline and not renderers:  # the hanging page's renderer spins a core
        if any(s.path == "/hang" for s in rig.origin.seen[seen_before:]):
            for p in group_members(chromium.pid):
                if p not in since and _is_renderer(p):
                    since[p] = _cpu(p)
            await asyncio.sleep(0.25)
            # 0.2 s of CPU since then, however long it took: on a loaded machine (a clean run's start,
            # every test worker starting its Ray, each a scheduling group of its own) the spinning
            # renderer got less than 0.2 s in any half second, and was never found
            renderers = [p for p, t in since.items() if _cpu(p) - t >= 20]
        else:
            await asyncio.sleep(0.2)
    assert renderers, "no busy renderer found"
    # Every renderer, not only the busy ones: a busy one can be an earlier page's still finishing while
    # the hanging page's has not started to spin (one clean run of five killed only that one, and the
    # hanging page ran out its budget).
    for p in {*renderers, *(p for p in group_members(chromium.pid) if _is_renderer(p))}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    res = await rig.render(rig.job("/js/after-crash"))
    crashed = (await rig.results({"crash-me"}))["crash-me"]
    assert crashed["outcome"] == "error" and crashed["renderTime"] < 14_000
    assert res[rig.url("/js/after-crash") + "|desktop"]["outcome"] == "rendered"


def _is_renderer(pid: int) -> bool:
    try:
        return b"--type=renderer" in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


def _cpu(pid: int) -> int:
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(f[11]) + int(f[12])


async def test_a_job_with_under_30_s_of_lease_is_skipped_and_never_posted(rig: Rig) -> None:
    before = len(rig.origin.requests("/js/short-lease"))
    rig.queue.jobs.append(rig.job("/js/short-lease", key="short", lease_ms=29_000))
    await rig.render(rig.job("/js/after-short"))
    await asyncio.sleep(0.5)
    assert not [m for m in rig.queue.results() if m["id"] == "short"]
    assert len(rig.origin.requests("/js/short-lease")) == before


async def test_a_lease_that_expires_mid_render_is_never_posted() -> None:
    r = Rig()
    try:
        w = await r.start(min_lease_left_ms=0, concurrency=1)
        r.queue.jobs.append(r.job("/slow", key="expires", lease_ms=800))
        await r.render(r.job("/js/after-expiry"))
        deadline = time.monotonic() + 10
        def expired():
            return w.metrics.registry.get_sample_value("prerender_worker_results_total", {"result": "expired"}) or 0
        while expired() < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert expired() == 1
        assert not [m for m in r.queue.results() if m["id"] == "expires"]
        assert r.origin.requests("/slow")  # it was rendered, just not reported
    finally:
        await r.stop()


async def test_the_worker_rides_out_a_queue_that_answers_garbage_then_recovers(rig: Rig) -> None:
    rig.queue.mode = "garbage"
    await asyncio.sleep(1.0)
    rig.queue.mode = "unavailable"
    await asyncio.sleep(0.6)
    rig.queue.mode = "ok"
    res = await rig.render(rig.job("/js/after-garbage"))
    assert res[rig.url("/js/after-garbage") + "|desktop"]["outcome"] == "rendered"
    assert (
        rig.worker.metrics.registry.get_sample_value(
            "prerender_worker_claims_total", {"result": "unavailable"}
        )
        >= 2
    )


async def test_a_chromium_that_will_not_restart_pauses_claiming_instead_of_failing_every_job(tmp_path) -> None:
    broken = tmp_path / "chromium"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    r = Rig()
    try:
        w = await r.start(concurrency=1)
        assert (await r.render(r.job("/js/before-break")))[r.url("/js/before-break") + "|desktop"]["outcome"] == "rendered"
        w.pool.executable = str(broken)
        os.killpg(w.pool.current.pid, signal.SIGKILL)  # Chromium dies and cannot come back
        for _ in range(100):  # the claim loop notices and tries the relaunch itself, before any claim
            if w.pool.launch_failures >= 1:
                break
            await asyncio.sleep(0.1)
        claims_before = len(r.queue.claims())
        waiting = [r.job(f"/js/held-{i}") for i in range(3)]
        r.queue.jobs.extend(waiting)
        await asyncio.sleep(2.5)
        assert len(r.queue.jobs) == 3  # nothing claimed while Chromium cannot start
        assert len(r.queue.claims()) == claims_before
        assert w.pool.launch_failures >= 1
        w.pool.executable = find_chromium()  # fixed: the next attempt (within the backoff) succeeds
        got = await r.results({j["id"] for j in waiting}, timeout=60)
        assert {m["outcome"] for m in got.values()} == {"rendered"}
        assert w.pool.launch_failures == 0
    finally:
        await r.stop()


async def test_open_shadow_roots_are_serialized_as_declarative_shadow_dom(rig: Rig) -> None:
    m = await one(rig, "/shadow")
    html = m["html"]
    assert m["outcome"] == "rendered", m.get("error")
    # the custom element's own text, its constructed stylesheet and a nested root, as DSD
    assert '<x-card><template shadowrootmode="open"><style>p { color: rebeccapurple; }</style>' in html
    assert "<p>shadow text <slot></slot></p>" in html and "light child</x-card>" in html
    assert '<x-inner><template shadowrootmode="open"><b>nested text</b></template></x-inner>' in html
    assert "window.bad" not in html  # scripts inside shadow roots are stripped too
    assert "closed text" not in html  # a closed root is out of reach (documented)
    assert '<template shadowrootmode="open"><span>declarative text</span></template>' in html  # kept


async def test_thousands_of_nested_shadow_roots_are_bounded(rig: Rig) -> None:
    from prerender_ray.worker.render import MAX_SHADOW_DEPTH, MAX_SHADOW_ROOTS

    m = await one(rig, "/shadow-many", renderBudget=60_000)  # the bounds under test are count and depth, not time
    assert m["outcome"] == "rendered", m.get("error")
    count = m["html"].count('<template shadowrootmode="open">')
    assert count == MAX_SHADOW_ROOTS and "<u>bottom</u>" not in m["html"]  # 60 deep > MAX_SHADOW_DEPTH
    assert MAX_SHADOW_DEPTH < 60 and MAX_SHADOW_ROOTS < 160 * MAX_SHADOW_DEPTH  # both bounds bind here


async def test_a_blocklisted_host_is_never_asked_and_the_render_counts_it(rig: Rig) -> None:
    assert rig.worker is not None
    before = rig.worker.metrics.total["blocked-requests"]
    m = await one(rig, "/tracked")
    assert m["outcome"] == "rendered" and "tracked page" in m["html"]
    assert rig.third.requests("/track.js") == []  # stopped inside Chromium
    assert rig.third.requests("/lib.js")  # a host not on the list loads as before
    assert m["renderSummary"]["blocked"] == 1
    deadline = time.monotonic() + 10  # the worker counts after its post: the result may arrive first
    while rig.worker.metrics.total["blocked-requests"] != before + 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert rig.worker.metrics.total["blocked-requests"] == before + 1


# ------------------------------------------------------------- lazy content, route options, diagnostics


async def test_a_lazy_section_loaded_on_intersection_is_in_the_stored_page(rig: Rig) -> None:
    m = await one(rig, "/lazy")  # auto: the page observes intersections and is taller than a screen
    assert m["outcome"] == "rendered", m.get("error")
    assert "lazy section: item lazy" in m["html"] and 'src="/img/lazy.png"' in m["html"]
    assert m["renderSummary"]["scrollSteps"] >= 1
    off = (await rig.render(rig.job("/lazy", key="lazy-off|desktop", renderOptions={"scroll": {"mode": "off"}})))
    assert "lazy section" not in off["lazy-off|desktop"]["html"]  # what the scroll adds
    plain = await one(rig, "/js/7")  # watches nothing: auto does not scroll it
    assert plain["renderSummary"]["scrollSteps"] == 0 and "built by script: item 7" in plain["html"]


async def test_an_endless_feed_that_throws_on_every_scroll_stops_at_its_steps_or_budget(rig: Rig) -> None:
    steps = {"mode": "bottom", "maxSteps": 8, "budgetMs": 10_000}
    # the scroll's budget also holds the page's load and first quiet wait: 1.5 s left no step at all on
    # a loaded CI run (two cores, four test workers and Chromium); 4 s still ends far short of 200 steps
    budget = {"mode": "bottom", "maxSteps": 200, "budgetMs": 4000}
    got = await rig.render(rig.job("/feed", key="feed-steps|desktop", renderOptions={"scroll": steps}),
                           rig.job("/feed", key="feed-budget|desktop", renderOptions={"scroll": budget}))
    by_steps, by_budget = got["feed-steps|desktop"], got["feed-budget|desktop"]
    assert by_steps["outcome"] == "rendered" and by_steps["renderSummary"]["scrollSteps"] == 8
    assert "post 1" in by_steps["html"]  # the feed grew as it was scrolled
    assert by_budget["outcome"] == "rendered" and 0 < by_budget["renderSummary"]["scrollSteps"] < 200
    assert by_steps["renderSummary"]["errors"] >= 8  # every scroll threw: counted, not fatal


async def test_a_routes_blocklist_adds_hosts_for_its_jobs_only(rig: Rig) -> None:
    blocked = {"block": {"hosts": ["chat.localhost"]}}
    got = await rig.render(rig.job("/widget", key="widget-blocked|desktop", renderOptions=blocked))
    assert got["widget-blocked|desktop"]["renderSummary"]["blocked"] == 1
    assert rig.third.requests("/chat.js") == []
    plain = await one(rig, "/widget")  # no route override: the host loads
    assert plain["renderSummary"]["blocked"] == 0 and rig.third.requests("/chat.js")


async def test_a_diagnostics_job_reports_errors_requests_timeline_and_a_bounded_screenshot(rig: Rig) -> None:
    import base64

    from prerender_ray.worker.diagnostics import MAX_ITEMS, MAX_SCREENSHOT_BYTES

    got = await rig.render(rig.job("/noisy", key="noisy-diag|desktop", renderOptions={"diagnostics": True}))
    m = got["noisy-diag|desktop"]
    assert m["outcome"] == "rendered", m.get("error")
    d = m["diagnostics"]
    assert any("widget exploded" in e["message"] for e in d["exceptions"])
    assert {"level": "warning", "text": "deprecated thing"}.items() <= d["console"][0].items()
    assert len(d["console"]) == MAX_ITEMS and d["truncated"]["console"] > 0  # 1,001 lines: bounded
    assert any("127.0.0.1:9/refused" in r["url"] for r in d["failedRequests"])
    assert [r["url"].split("/")[-1] for r in d["blockedRequests"]] == ["track.js"]
    events = [e["event"] for e in d["timeline"]]
    assert events[0] == "tab" and "navigated" in events and "check" in events and events[-1] == "serialized"
    assert d["chars"] == m["renderSummary"]["chars"] > 0
    shot = d["screenshot"]
    jpeg = base64.b64decode(shot["data"])
    assert jpeg[:3] == b"\xff\xd8\xff" and len(jpeg) <= MAX_SCREENSHOT_BYTES  # one screen of a 50,000 px page
    assert shot["type"] == "image/jpeg" and shot["height"] < 50_000
    assert m["renderSummary"]["errors"] >= 1001 and m["renderSummary"]["blocked"] == 1
    plain = await one(rig, "/noisy")  # a normal job: the counts only
    assert "diagnostics" not in plain and plain["renderSummary"]["errors"] >= 1001
