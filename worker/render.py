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
from prerender_ray.worker import outcome as oc
from prerender_ray.worker.blocklist import Blocklist
from prerender_ray.worker.pool import BrowserError, BrowserPool, Tab

log = logs.get("worker.render")

BLOCKED_TYPES = frozenset({"image", "media", "font"})
BLOCKED_CDP_TYPES = frozenset({"Image", "Media", "Font"})
UNTRACKED_TYPES = BLOCKED_TYPES | {"eventsource", "websocket", "manifest"}
LONG_REQUEST_S = 5.0
TIMER_MS = 1000  # setTimeout delays up to this count as pending work
TIMER_WAIT_S = 3.0  # at most this long in total is spent waiting for them
SLACK_S = 2.0  # the outer deadline's margin over the budget (Playwright's own timeouts fire first)
TAB_WAIT_S = 30.0  # longest wait for a tab (a free slot, Chromium starting) before a render fails
MAX_SHADOW_ROOTS = 5000  # open shadow roots serialized per page (declarative shadow DOM)
MAX_SHADOW_DEPTH = 32  # shadow roots inside shadow roots

# Executable script types (HTML's JavaScript MIME type essences, modules, import maps and speculation
# rules); data blocks such as application/ld+json stay.
SCRIPT_TYPES = [
    "",
    "module",
    "importmap",
    "speculationrules",
    "application/ecmascript",
    "application/javascript",
    "application/x-ecmascript",
    "application/x-javascript",
    "text/ecmascript",
    "text/javascript",
    "text/javascript1.0",
    "text/javascript1.1",
    "text/javascript1.2",
    "text/javascript1.3",
    "text/javascript1.4",
    "text/javascript1.5",
    "text/jscript",
    "text/livescript",
    "text/x-ecmascript",
    "text/x-javascript",
]

# Runs before any page script (every document of a tab): counts the page's pending short timers,
# fetch/XHR requests and inserted scripts, stylesheets and frames still loading, so settling sees work
# the moment the page starts it (a debounce, a fetch chained on another, a lazy chunk) instead of
# waiting out a long quiet window. The page's own functions are wrapped, not changed.
INIT_JS = """(() => {
  if (window.__prerenderSettle) return;
  const st = window.__prerenderSettle = {timers: new Map(), fetches: new Map(), next: 0};
  const setT = window.setTimeout, clearT = window.clearTimeout;
  window.setTimeout = function (fn, delay, ...args) {
    const ms = Number(delay) || 0;
    if (typeof fn !== 'function' || ms > %(timer_ms)d) return setT.call(this, fn, delay, ...args);
    let id;
    const wrapped = function () { st.timers.delete(id); return fn.apply(this, arguments); };
    id = setT.call(this, wrapped, delay, ...args);
    st.timers.set(id, performance.now() + ms);
    return id;
  };
  window.clearTimeout = function (id) { st.timers.delete(id); return clearT.call(this, id); };
  const start = () => {
    const id = ++st.next;
    st.fetches.set(id, performance.now());
    return () => st.fetches.delete(id);
  };
  if (window.fetch) {
    const f = window.fetch;
    window.fetch = function () {
      const done = start();
      try { const p = f.apply(this, arguments); p.then(done, done); return p; } catch (e) { done(); throw e; }
    };
  }
  const send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.send = function () {
    const done = start();
    this.addEventListener('loadend', done, {once: true});
    try { return send.apply(this, arguments); } catch (e) { done(); throw e; }
  };
  // scripts, stylesheets and frames a script inserts: pending until they load or fail
  const watch = el => {
    const loads = (el.tagName === 'SCRIPT' && el.src) || el.tagName === 'IFRAME'
      || (el.tagName === 'LINK' && /\\bstylesheet\\b/i.test(el.rel || '') && el.href);
    if (!loads) return;
    const done = start();
    el.addEventListener('load', done, {once: true});
    el.addEventListener('error', done, {once: true});
  };
  new MutationObserver(records => {
    for (const r of records) for (const n of r.addedNodes) if (n.nodeType === 1) {
      watch(n);
      if (n.firstElementChild) {
        n.querySelectorAll('script[src], link[rel~="stylesheet" i], iframe').forEach(watch);
      }
    }
  }).observe(document, {childList: true, subtree: true});
})()"""

# After network quiet: waits for the main thread to be idle, then reports what is still pending and,
# when nothing is, what the page says about itself and its serialization: a clone of the document
# without executable scripts (the live page is left alone, in case it turns out not to be settled).
CHECK_JS = """([scriptTypes, maxChars, longMs, ignoreTimers, maxShadowRoots, maxShadowDepth]) => new Promise(resolve => {
  const check = () => {
    const st = window.__prerenderSettle, now = performance.now();
    let timer = 0;
    if (st) for (const due of st.timers.values()) timer = Math.max(timer, due - now);
    const out = {
      complete: document.readyState === 'complete',
      ready: ('prerenderReady' in window) ? window.prerenderReady === true : null,
      timer: Math.max(0, timer),
      fetches: st ? Array.from(st.fetches.values()).filter(t => now - t < longMs).length : 0,
      doc: null,
    };
    const settled = out.ready === true
      || (out.ready === null && out.complete && !out.fetches && (!out.timer || ignoreTimers));
    if (settled) out.doc = describe();
    resolve(out);
  };
  const describe = () => {
    const all = (root, s) => Array.from(root.querySelectorAll(s));
    const robots = all(document, 'meta[name]')
      .filter(m => /^(robots|googlebot)$/i.test(m.getAttribute('name').trim()))
      .map(m => m.getAttribute('content') || '');
    const link = document.querySelector('link[rel~="canonical" i][href]');
    const statusMeta = document.querySelector('meta[name="prerender-status-code" i]');
    const loc = all(document, 'meta[name="prerender-header" i]').map(m => m.getAttribute('content') || '')
      .find(c => /^\\s*location\\s*:/i.test(c));
    let location = null;
    try { if (loc) location = new URL(loc.replace(/^\\s*location\\s*:/i, '').trim(), document.baseURI).href; }
    catch (e) { location = null; }
    const root = document.documentElement.cloneNode(true);
    const fragments = [root];
    // Open shadow roots become declarative shadow DOM (outerHTML drops them), their constructed
    // stylesheets as <style>; closed roots are out of a page script's reach and stay out. Bounded:
    // past maxShadowRoots, or maxShadowDepth roots deep, the rest keep their light DOM only.
    let roots = 0;
    const shadows = (live, copy, depth) => {
      const a = document.createTreeWalker(live, NodeFilter.SHOW_ELEMENT);
      const b = document.createTreeWalker(copy, NodeFilter.SHOW_ELEMENT);
      const pairs = [];
      for (let x = a.nextNode(), y = b.nextNode(); x && y; x = a.nextNode(), y = b.nextNode()) {
        const sr = x.shadowRoot;
        if (sr && sr.mode === 'open' && roots < maxShadowRoots && depth < maxShadowDepth) {
          roots++;
          pairs.push([sr, y]);
        }
      }
      for (const [sr, host] of pairs) {  // after the walk: a template inserted during it would shift it
        const t = document.createElement('template');
        t.setAttribute('shadowrootmode', 'open');
        if (sr.delegatesFocus) t.setAttribute('shadowrootdelegatesfocus', '');
        for (const n of sr.childNodes) t.content.appendChild(n.cloneNode(true));
        shadows(sr, t.content, depth + 1);
        for (const sheet of Array.from(sr.adoptedStyleSheets || []).reverse()) {
          try {
            const style = document.createElement('style');
            style.textContent = Array.from(sheet.cssRules, r => r.cssText).join('\\n');
            t.content.insertBefore(style, t.content.firstChild);
          } catch (e) { /* a sheet whose rules cannot be read */ }
        }
        fragments.push(t.content);
        host.insertBefore(t, host.firstChild);
      }
    };
    shadows(document.documentElement, root, 0);
    const types = new Set(scriptTypes);
    const preloads = 'link[rel~="modulepreload" i], link[rel~="preload" i][as="script" i]';
    for (const f of fragments) {
      for (const s of all(f, 'script')) {
        const t = (s.getAttribute('type') || '').split(';')[0].trim().toLowerCase();
        if (!s.hasAttribute('type') || types.has(t)) s.remove();
      }
      for (const l of all(f, preloads)) l.remove();
    }
    const doctype = document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '';
    const html = doctype + root.outerHTML;
    return {
      url: window.location.href, robots, canonical: link ? link.href : null,
      statusMeta: statusMeta ? statusMeta.getAttribute('content') : null, location,
      chars: html.length, html: html.length <= maxChars ? html : null,
    };
  };
  if (window.requestIdleCallback) requestIdleCallback(check, {timeout: 250}); else setTimeout(check, 0);
})"""


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
    """A render's result: the verdict, the HTML to attach (if any), how long it took and how many of
    its requests the blocklist stopped."""

    verdict: oc.Verdict
    html: str | None
    render_ms: float
    blocked: int = 0


class SettleTimeout(Exception):
    pass


def origin_of(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}".lower()


@dataclass
class JobState:
    """What the tab's route handler and request listeners need while a job renders."""

    origin: str
    token_header: str = ""
    token: str = ""
    main_headers: dict[str, str] = field(default_factory=dict)
    inflight: dict[Any, float] = field(default_factory=dict)
    blocked: int = 0  # requests the blocklist failed
    last_activity: float = field(default_factory=time.monotonic)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        self.changed.set()

    async def wait_quiet(self, quiet_s: float, deadline: float) -> None:
        """Until no tracked request has been in flight for ``quiet_s`` (a request older than
        ``LONG_REQUEST_S`` stops counting; the moment it does counts as activity)."""
        while True:
            now = time.monotonic()
            young = [t0 for t0 in self.inflight.values() if now - t0 < LONG_REQUEST_S]
            if young:
                wait = LONG_REQUEST_S - (now - min(young))
            else:
                last = max([self.last_activity, *(t0 + LONG_REQUEST_S for t0 in self.inflight.values())])
                idle = now - last
                if idle >= quiet_s:
                    return
                wait = quiet_s - idle
            if now >= deadline:
                raise SettleTimeout("the page did not settle within its render budget")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), max(0.001, min(wait, deadline - now)))


class Renderer:
    """Renders jobs in the pool's tabs."""

    def __init__(self, pool: BrowserPool, rules: oc.UrlRules, opts: RenderOptions):
        self.pool = pool
        self.rules = rules
        self.opts = opts

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
                if ev.get("resourceType") in BLOCKED_CDP_TYPES or self.opts.blocklist.blocks(url):
                    if st is not None and ev.get("resourceType") not in BLOCKED_CDP_TYPES:
                        st.blocked += 1
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

        await tab.context.add_init_script(INIT_JS % {"timer_ms": TIMER_MS})
        cdp.on("Fetch.requestPaused", paused)
        page.on("request", started)
        page.on("requestfinished", ended)
        page.on("requestfailed", ended)
        await self._intercept(tab, None)

    async def _intercept(self, tab: Tab, st: JobState | None) -> None:
        """Pause only what this job needs paused (one CDP call, and only when that changes)."""
        patterns = [{"urlPattern": "*", "resourceType": t} for t in sorted(BLOCKED_CDP_TYPES)]
        patterns += self.opts.blocklist.patterns()
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
        blocked = 0
        try:
            async with asyncio.timeout(TAB_WAIT_S + budget_s + SLACK_S):
                async with self.pool.tab(job.device_type) as tab:
                    deadline = time.monotonic() + budget_s
                    try:
                        async with asyncio.timeout(budget_s + SLACK_S):
                            verdict, html = await self._render(tab, job, deadline, progress)
                    except BaseException:
                        tab.poisoned = True
                        raise
                    finally:
                        blocked = tab.state.blocked if tab.state is not None else 0
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
        return Rendered(verdict, html, (time.monotonic() - t0) * 1000, blocked)

    async def _render(
        self, tab: Tab, job: oc.Job, deadline: float, progress: dict[str, str]
    ) -> tuple[oc.Verdict, str | None]:
        page = tab.page
        origin = origin_of(job.url)
        tab.origins.add(origin)
        st = JobState(
            origin=origin,
            token_header=self.opts.bypass_header,
            token=self.opts.bypass_token,
            main_headers=job.headers,
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
        bail = oc.navigation_verdict(job, self.rules, hops)
        if bail is not None:
            return bail, None
        final = hops[-1]
        tab.origins.add(origin_of(final.url))

        # 2. settle, read and serialize
        progress["phase"] = "settle"
        try:
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
        tab.origins.add(origin_of(doc["url"]))
        if doc["html"] is None and doc["chars"]:
            return oc.error_verdict(
                "ContentTooLarge",
                f"the serialized page has {doc['chars']} characters, more than {self.opts.max_html_bytes}",
            ), None
        document = oc.Document(
            url=doc["url"],
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
            mark = st.last_activity
            args = [SCRIPT_TYPES, self.opts.max_html_bytes, int(LONG_REQUEST_S * 1000), timer_budget <= 0,
                    MAX_SHADOW_ROOTS, MAX_SHADOW_DEPTH]
            try:
                state = await asyncio.wait_for(
                    page.evaluate(CHECK_JS, args), max(0.001, deadline - time.monotonic())
                )
            except TimeoutError:
                raise SettleTimeout("the page did not settle within its render budget") from None
            except Exception as e:
                if _navigated(e):
                    continue  # a client-side redirect: settle the new document
                raise
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


def _young(st: JobState) -> bool:
    now = time.monotonic()
    return any(now - t0 < LONG_REQUEST_S for t0 in st.inflight.values())


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


def _is_main_frame(req: Any, page: Any) -> bool:
    try:
        return req.frame == page.main_frame
    except Exception:
        return False


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
