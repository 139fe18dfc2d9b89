"""Rendering one job in a tab: navigate with the device's profile, send the bypass header to the
origin only, block images/media/fonts, wait for the page to settle, read what it says about itself,
strip executable scripts and serialize. The decisions are ``outcome``'s; this module observes.

Settled means: the document's ``load`` fired, then either ``window.prerenderReady === true`` (when the
page defines it), or: no request in flight for ``settle_quiet_ms``, the main thread idle, no fetch or
XHR the page started still open and no short timer (<= 1 s) of the page still pending (timers are
waited for at most 3 s in all, so a polling loop does not hold a render). Requests older than
``LONG_REQUEST_S`` (a long poll, a hanging beacon) no longer hold settling back; event streams never
do. The last settle check serializes a clone of the document in the same call, so a page that is
settled costs one round trip after ``load``. The whole render fits in the job's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from prerender_ray import logs
from prerender_ray.config.render import Scroll
from prerender_ray.queue import job_options
from prerender_ray.rpc import wait_for
from prerender_ray.worker import outcome as oc
from prerender_ray.worker.blocklist import Blocklist
from prerender_ray.worker.chromium import BrowserError
from prerender_ray.worker.diagnostics import SCREENSHOT_TIMEOUT_MS, Recorder, screenshot
from prerender_ray.worker.job_state import LONG_REQUEST_S, JobState, SettleTimeout, _pending, _young
from prerender_ray.worker.page_js import CHECK_JS, INIT_JS, SCRIPT_TYPES, SCROLL_JS
from prerender_ray.worker.pool import BrowserPool, Tab

log = logs.get("worker.render")

BLOCKED_TYPES = frozenset({"image", "media", "font"})
BLOCKED_CDP_TYPES = frozenset({"Image", "Media", "Font"})
UNTRACKED_TYPES = BLOCKED_TYPES | {"eventsource", "websocket", "manifest"}
TIMER_MS = 1000  # setTimeout delays up to this count as pending work
TIMER_WAIT_S = 3.0  # at most this long in total is spent waiting for them
SLACK_S = 2.0  # the outer deadline's margin over the budget (Playwright's own timeouts fire first)
TAB_WAIT_S = 30.0  # longest wait for a tab (a free slot, Chromium starting) before a render fails
MAX_SHADOW_ROOTS = 5000  # open shadow roots serialized per page (declarative shadow DOM)
MAX_SHADOW_DEPTH = 32  # shadow roots inside shadow roots

@dataclass
class RenderOptions:
    budget_ms: int = 20_000
    settle_quiet_ms: int = 50
    max_html_bytes: int = 20 * 1024 * 1024
    bypass_header: str = "x-harper-renderer-bypass"
    bypass_token: str = ""
    honour_status_meta: bool = True
    blocklist: Blocklist = field(default_factory=Blocklist.of)


@dataclass
class Rendered:
    """A render's result: the verdict, the HTML to attach (if any), how long it took, its counts
    (``renderSummary``) and, when the job asked, its diagnostics report."""

    verdict: oc.Verdict
    html: str | None
    render_ms: float
    summary: dict[str, int] = field(default_factory=dict)
    report: dict[str, Any] | None = None


def origin_of(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}".lower()


class Renderer:
    """Renders jobs in the pool's tabs."""

    def __init__(self, pool: BrowserPool, rules: oc.UrlRules, opts: RenderOptions):
        self.pool = pool
        self.rules = rules
        self.opts = opts
        self._blocklists: dict[tuple[tuple[str, ...], bool], Blocklist] = {}

    # ---------------------------------------------------------------------------- tab wiring

    async def setup_tab(self, tab: Tab) -> None:
        """Once per tab: the listeners that count requests in flight, and request interception.

        Interception is Chromium's Fetch domain on our own CDP session rather than ``page.route``:
        Playwright re-applies a route's header overrides to every redirect hop, which would hand the
        bypass token to whatever host the origin redirects to. Chromium never carries an override
        across a redirect, and only requests matching the patterns pause: images, media and fonts
        (failed as blocked by client) and, while a job needs them, the job's origin (bypass token)
        and its main-frame document (the job's headers)."""
        page = tab.page
        cdp = tab.cdp
        tab.patterns = None
        tree = await cdp.send("Page.getFrameTree")
        tab.main_frame_id = tree["frameTree"]["frame"]["id"]

        async def paused(ev: dict) -> None:
            rid = ev["requestId"]
            try:
                st: JobState | None = tab.state
                url = ev["request"]["url"]
                blocklist = st.blocklist if st is not None else self.opts.blocklist
                if ev.get("resourceType") in BLOCKED_CDP_TYPES or blocklist.blocks(url):
                    if st is not None and ev.get("resourceType") not in BLOCKED_CDP_TYPES:
                        st.rec.on_blocked(url)
                    await cdp.send("Fetch.failRequest", {"requestId": rid, "errorReason": "BlockedByClient"})
                    return
                extra: dict[str, str] = {}
                if st is not None:
                    if st.token and origin_of(url) == st.origin:
                        extra[st.token_header] = st.token
                    if (
                        st.main_headers
                        and ev.get("resourceType") == "Document"
                        and ev.get("frameId") == tab.main_frame_id
                        and not ev.get("redirectedRequestId")
                    ):
                        extra.update(st.main_headers)
                if not extra:
                    await cdp.send("Fetch.continueRequest", {"requestId": rid})
                    return
                names = {k.lower() for k in extra}
                headers = [
                    {"name": k, "value": v}
                    for k, v in ev["request"].get("headers", {}).items()
                    if k.lower() not in names
                ]
                headers += [{"name": k, "value": v} for k, v in extra.items()]
                await cdp.send("Fetch.continueRequest", {"requestId": rid, "headers": headers})
            except Exception:  # the tab is gone, or the request was cancelled meanwhile
                pass

        def started(req: Any) -> None:
            st: JobState | None = tab.state
            if st is not None and req.resource_type not in UNTRACKED_TYPES:
                st.inflight[req] = time.monotonic()
                st.touch()

        def ended(req: Any) -> None:
            st: JobState | None = tab.state
            if st is not None and st.inflight.pop(req, None) is not None:
                st.touch()

        def failed(req: Any) -> None:
            ended(req)
            st: JobState | None = tab.state
            error = req.failure or ""
            if st is not None and "BLOCKED_BY_CLIENT" not in error:  # ours are counted as blocked
                st.rec.on_failed(req.url, error, req.resource_type)

        # Where the page landed is the URL of the last document the main frame committed, as Chromium
        # reports it on our own CDP session: Page.frameNavigated fires only when a new document loads
        # (a script or meta refresh navigating, an HTTP redirect), never for history.pushState,
        # replaceState or a fragment change. location.href follows those, and anything read in the
        # page's own world (performance entries, the settle check's result) its scripts can patch:
        # either would let any page file its DOM under any other path of its origin.
        def committed(ev: dict) -> None:
            st: JobState | None = tab.state
            frame = ev.get("frame") or {}
            if st is not None and not frame.get("parentId") and frame.get("url"):
                st.document_url = frame["url"] + (frame.get("urlFragment") or "")
                st.documents += 1

        def console(msg: Any) -> None:
            st: JobState | None = tab.state
            if st is not None:
                st.rec.on_console(msg.type, msg.text, (msg.location or {}).get("url") or "")

        def uncaught(error: Any) -> None:
            st: JobState | None = tab.state
            if st is not None:
                st.rec.on_exception(str(error))

        await tab.context.add_init_script(INIT_JS % {"timer_ms": TIMER_MS})
        cdp.on("Fetch.requestPaused", paused)
        cdp.on("Page.frameNavigated", committed)
        await cdp.send("Page.enable")
        page.on("request", started)
        page.on("requestfinished", ended)
        page.on("requestfailed", failed)
        page.on("console", console)
        page.on("pageerror", uncaught)
        await self._intercept(tab, None)

    async def _intercept(self, tab: Tab, st: JobState | None) -> None:
        """Pause only what this job needs paused (one CDP call, and only when that changes)."""
        patterns = [{"urlPattern": "*", "resourceType": t} for t in sorted(BLOCKED_CDP_TYPES)]
        patterns += (st.blocklist if st is not None else self.opts.blocklist).patterns()
        if st is not None and st.token:
            patterns.append({"urlPattern": f"{st.origin}/*"})
        if st is not None and st.main_headers:
            patterns.append({"urlPattern": "*", "resourceType": "Document"})
        if patterns != tab.patterns:
            await tab.cdp.send("Fetch.enable", {"patterns": patterns})
            tab.patterns = patterns

    # ---------------------------------------------------------------------------------- render

    async def render(self, job: oc.Job, *, budget_ms: float | None = None) -> Rendered:
        """Render ``job``; never raises (except cancellation): every failure is an error verdict.
        The budget starts once a tab is ready (waiting for one, or for Chromium to start, is bounded
        by ``TAB_WAIT_S``); ``renderTime`` covers both."""
        t0 = time.monotonic()
        budget_s = (budget_ms or job.render_budget_ms or self.opts.budget_ms) / 1000
        progress = {"phase": "tab"}
        rec = Recorder(detailed=job.options.diagnostics)
        shot: dict[str, Any] | None = None
        extra_s = SCREENSHOT_TIMEOUT_MS / 1000 + 1 if job.options.diagnostics else 0.0
        try:
            async with asyncio.timeout(TAB_WAIT_S + budget_s + SLACK_S + extra_s):
                async with self.pool.tab(job.device_type) as tab:
                    rec.mark("tab", "ready")
                    deadline = time.monotonic() + budget_s
                    try:
                        async with asyncio.timeout(budget_s + SLACK_S):
                            verdict, html = await self._render(tab, job, deadline, progress, rec)
                        if job.options.diagnostics and not tab.crashed:
                            shot = await screenshot(tab.page)
                    except BaseException:
                        tab.poisoned = True
                        raise
                    finally:
                        tab.state = None
                    if verdict.error is not None:  # a timeout may have left the renderer stuck: a fresh tab
                        tab.poisoned = True
        except TimeoutError:
            if progress["phase"] == "tab":
                message = f"no tab became free within {TAB_WAIT_S:.0f} s"
            else:
                message = f"render exceeded its budget of {budget_s * 1000:.0f} ms"
            phase = oc.NAVIGATION if progress["phase"] == "navigation" else None
            verdict, html = oc.error_verdict("TimeoutError", message, phase=phase), None
        except BrowserError as e:
            verdict, html = oc.error_verdict("BrowserError", str(e)), None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            verdict, html = oc.error_verdict(_error_name(e), _message(e)), None
        if verdict.error is not None:
            rec.mark("error", f"{verdict.error.get('name')}: {verdict.error.get('message')}")
        report = rec.report(shot) if job.options.diagnostics else None
        return Rendered(verdict, html, (time.monotonic() - t0) * 1000, rec.summary(), report)

    def _blocklist(self, job: oc.Job) -> Blocklist:
        """The worker's blocklist with the job's route overrides (a few distinct ones: cached)."""
        block = job.options.block
        if block == job_options.DEFAULT_BLOCK:
            return self.opts.blocklist
        found = self._blocklists.get((block.hosts, block.defaults))
        if found is None:
            if len(self._blocklists) >= 64:
                self._blocklists.clear()
            found = self._blocklists[(block.hosts, block.defaults)] = self.opts.blocklist.for_job(
                block.hosts, defaults=block.defaults)
        return found

    async def _render(
        self, tab: Tab, job: oc.Job, deadline: float, progress: dict[str, str], rec: Recorder
    ) -> tuple[oc.Verdict, str | None]:
        page = tab.page
        origin = origin_of(job.url)
        tab.origins.add(origin)
        st = JobState(
            origin=origin,
            token_header=self.opts.bypass_header,
            token=self.opts.bypass_token,
            main_headers=job.headers,
            blocklist=self._blocklist(job),
            rec=rec,
        )
        tab.state = st
        await self._intercept(tab, st)

        def left_ms() -> float:
            return max(1.0, (deadline - time.monotonic()) * 1000)

        # 1. navigation
        progress["phase"] = "navigation"
        try:
            response = await page.goto(job.url, wait_until="domcontentloaded", timeout=left_ms())
        except Exception as e:
            if tab.crashed:
                return oc.error_verdict(
                    "PageCrashed", "the tab crashed during navigation", phase=oc.NAVIGATION
                ), None
            return oc.navigation_error_verdict(_error_name(e), _message(e)), None
        if response is None:
            return oc.error_verdict(
                "NavigationError", "navigation produced no response", phase=oc.NAVIGATION
            ), None
        hops = await _hops(response)
        rec.mark("navigated", f"HTTP {response.status} after {len(hops) - 1} redirect(s)")
        bail = oc.navigation_verdict(job, self.rules, hops)
        if bail is not None:
            return bail, None
        final = hops[-1]
        tab.origins.add(origin_of(final.url))

        # 2. settle, read and serialize
        progress["phase"] = "settle"
        try:
            rec.scroll_steps = await self._scroll(page, st, deadline, job.options.scroll)
            doc = await self._settle(page, st, deadline)
        except SettleTimeout as e:
            return oc.error_verdict("SettleTimeout", str(e), status=final.status, headers=final.headers), None
        except Exception as e:
            if tab.crashed:
                return oc.error_verdict("PageCrashed", "the tab crashed while rendering"), None
            if _is_timeout(e):
                return oc.error_verdict(
                    "SettleTimeout",
                    f"the page did not settle within its render budget: {_message(e)}",
                    status=final.status,
                    headers=final.headers,
                ), None
            return oc.error_verdict(
                _error_name(e), _message(e), status=final.status, headers=final.headers
            ), None
        landed = st.document_url or final.url
        if not self.rules.same_url(doc["url"], landed):
            rec.mark("navigated", f"within the document to {doc['url']}: no redirect, {landed} is what rendered")
        tab.origins.add(origin_of(landed))
        rec.chars = doc["chars"]
        rec.mark("serialized", f"{doc['chars']} characters")
        if doc["html"] is None and doc["chars"]:
            return oc.error_verdict(
                "ContentTooLarge",
                f"the serialized page has {doc['chars']} characters, more than {self.opts.max_html_bytes}",
            ), None
        document = oc.Document(
            url=landed,
            robots=tuple(doc["robots"]),
            canonical=doc["canonical"],
            status_meta=doc["statusMeta"],
            location_meta=doc["location"],
        )
        verdict = oc.document_verdict(
            job, self.rules, final, document, honour_status_meta=self.opts.honour_status_meta
        )
        html = doc["html"] if verdict.keep_content else None
        if verdict.keep_content and not html:
            verdict = oc.error_verdict("EmptyDocument", "the page serialized to nothing")
        elif html is not None and len(html.encode("utf-8", "replace")) > self.opts.max_html_bytes:
            return oc.error_verdict(
                "ContentTooLarge", f"the serialized page is larger than {self.opts.max_html_bytes} bytes"
            ), None
        return verdict, html

    async def _scroll(self, page: Any, st: JobState, deadline: float, opts: Scroll) -> int:
        """Scroll a screen at a time so that lazy sections load (each step waits for the requests it
        started), then back to the top; the number of steps taken. Stops at the bottom (a step that
        found the page no taller), after ``max_steps`` or at ``budget_ms``, and always leaves a quarter
        of the render budget for settling: an endless feed ends the scroll, never the render."""
        if opts.mode == "off":
            return 0
        start = time.monotonic()
        end = min(start + opts.budget_ms / 1000, deadline - (deadline - start) / 4)
        quiet_s = self.opts.settle_quiet_ms / 1000
        steps, last = 0, -1
        try:
            await page.wait_for_load_state("load", timeout=max(1.0, (end - start) * 1000))
            await st.wait_quiet(quiet_s, end)
            while steps < opts.max_steps:
                left = end - time.monotonic()
                if left <= 0:
                    break
                mark = st.last_activity
                at = await wait_for(page.evaluate(SCROLL_JS, [opts.mode == "auto" and not steps]), left)
                if at is None:
                    break  # auto: nothing on the page waits for scrolling
                steps += 1
                if at["pending"] or st.last_activity != mark or _young(st):
                    await st.wait_quiet(quiet_s, end)  # the step started work: let it land first
                if at["bottom"]:
                    if at["height"] == last:
                        break  # at the bottom, and the last step added nothing
                    last = at["height"]
        except (SettleTimeout, TimeoutError):
            pass  # the scroll's budget is spent: settle what is there
        except Exception as e:
            if not _navigated(e) and not _is_timeout(e):
                raise
        if steps:
            with contextlib.suppress(Exception):
                await wait_for(page.evaluate("window.scrollTo(0, 0)"), max(0.001, deadline - time.monotonic()))
            st.rec.mark("scrolled", f"{steps} step(s) in {round((time.monotonic() - start) * 1000)} ms")
        return steps

    async def _settle(self, page: Any, st: JobState, deadline: float) -> dict[str, Any]:
        """Wait until settled; the document's description and serialization."""
        quiet_s = self.opts.settle_quiet_ms / 1000
        timer_budget = TIMER_WAIT_S  # total time spent waiting for the page's short timers
        ready = False  # the page said window.prerenderReady = true: no network wait any more
        for _ in range(100):  # a page that keeps navigating by script ends here or in the budget
            left = deadline - time.monotonic()
            if left <= 0:
                raise SettleTimeout("the page did not settle within its render budget")
            await page.wait_for_load_state("load", timeout=left * 1000)
            if not ready:
                await st.wait_quiet(quiet_s, deadline)
            mark, loaded = st.last_activity, st.documents
            args = [SCRIPT_TYPES, self.opts.max_html_bytes, int(LONG_REQUEST_S * 1000), timer_budget <= 0,
                    MAX_SHADOW_ROOTS, MAX_SHADOW_DEPTH]
            try:
                state = await wait_for(
                    page.evaluate(CHECK_JS, args), max(0.001, deadline - time.monotonic())
                )
            except TimeoutError:
                raise SettleTimeout("the page did not settle within its render budget") from None
            except Exception as e:
                if _navigated(e):
                    st.rec.mark("navigated", "a script replaced the document")
                    continue  # a client-side redirect: settle the new document
                raise
            if st.documents != loaded:
                st.rec.mark("navigated", "a new document loaded during the check")
                continue  # the check may have read the old document: settle the new one
            st.rec.mark("check", _pending(state, st))
            if state["ready"] is False:
                try:
                    await page.wait_for_function(
                        "() => window.prerenderReady === true",
                        polling=50,
                        timeout=max(1.0, (deadline - time.monotonic()) * 1000),
                    )
                except Exception as e:
                    if _navigated(e):
                        continue
                    if _is_timeout(e):
                        raise SettleTimeout(
                            "window.prerenderReady never became true within the render budget"
                        ) from None
                    raise
                ready = True
                continue  # now ready: the next check serializes
            if state["doc"] is not None and (
                state["ready"] is True or (st.last_activity == mark and not _young(st))
            ):
                return state["doc"]
            if st.last_activity != mark:
                continue
            if state["fetches"]:
                await asyncio.sleep(0.01)  # a request the browser has not reported yet
            elif state["timer"] and timer_budget > 0:
                wait = max(0.0, min(state["timer"] / 1000, timer_budget, deadline - time.monotonic()))
                timer_budget -= wait
                await asyncio.sleep(wait + 0.005)
        raise SettleTimeout("the page kept navigating")


async def _hops(response: Any) -> list[oc.Hop]:
    """The navigation's HTTP responses, first hop first, the final document last."""
    final = oc.Hop(response.url, response.status, dict(response.headers))
    hops = [final]
    req = response.request.redirected_from
    while req is not None and len(hops) < 50:
        r = await req.response()
        if r is not None:
            hops.insert(0, oc.Hop(r.url, r.status, dict(r.headers)))
        req = req.redirected_from
    return hops


def _error_name(e: BaseException) -> str:
    name = getattr(e, "name", None)
    return name if isinstance(name, str) and name else type(e).__name__


def _message(e: BaseException) -> str:
    msg = getattr(e, "message", None) or str(e) or type(e).__name__
    msg = msg.split("\nCall log:")[0].strip()
    return msg.removeprefix("Page.goto: ")[:2000]


def _is_timeout(e: BaseException) -> bool:
    return type(e).__name__ == "TimeoutError" or "Timeout" in _error_name(e)


def _navigated(e: BaseException) -> bool:
    msg = _message(e)
    return (
        "Execution context was destroyed" in msg or "navigation" in msg.lower() and "context" in msg.lower()
    )
