"""Chromium's lifecycle: one process we start and own, tabs handed out a bounded number at a time,
recycling after N renders or M minutes, a hard kill when Chromium does not exit, and reaping so no
zombie is left.

How Chromium is started, killed and reaped is worker/chromium.py's; this module decides when.

A tab is a browser context plus one page for one device profile. Tabs are reused for up to
``page_reuse`` renders (a new renderer process per render costs about as much as the render itself
on two cores), with cookies and the rendered origins' storage cleared between renders; any error
retires the tab.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from prerender_ray import logs
from prerender_ray.worker.chromium import BrowserError, Chromium, kill_group, reap_orphans

log = logs.get("worker.pool")

# Viewport and user agent per device type (Playwright's device registry); desktop keeps Chrome's own
# user agent, as the reference fleet does. Unknown device types render as desktop.
DEVICES: dict[str, dict[str, Any]] = {
    "desktop": {
        "viewport": {"width": 1366, "height": 768},
        "device_scale_factor": 1,
        "is_mobile": False,
        "has_touch": False,
    },
    "mobile": {
        "viewport": {"width": 393, "height": 659},
        "screen": {"width": 393, "height": 852},
        "device_scale_factor": 3,
        "is_mobile": True,
        "has_touch": True,
        "user_agent": "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
    },
    "tablet": {
        "viewport": {"width": 810, "height": 1080},
        "device_scale_factor": 2,
        "is_mobile": True,
        "has_touch": True,
        "user_agent": "Mozilla/5.0 (iPad; CPU OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
    },
}


def device_profile(device: str) -> tuple[str, dict[str, Any]]:
    name = device if device in DEVICES else "desktop"
    return name, DEVICES[name]


LAUNCH_BACKOFF_MAX_S = 60.0

STORAGE_TYPES = "local_storage,indexeddb,cache_storage,websql,file_systems,shader_cache"

# ------------------------------------------------------------------------------------------ tabs


async def _quietly(aw: Any, timeout: float = 5.0) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(aw, timeout)


@dataclass
class Tab:
    """A context and its page for one device on one Chromium. ``state`` is the render's (per job)."""

    chromium: Chromium
    device: str
    context: Any
    page: Any
    cdp: Any = None
    uses: int = 0
    poisoned: bool = False
    crashed: bool = False
    origins: set[str] = field(default_factory=set)  # origins rendered since the last reset
    state: Any = None
    patterns: Any = None  # the Fetch interception patterns in force
    main_frame_id: str = ""


class BrowserPool:
    """Hands out at most ``concurrency`` tabs at once, on the current Chromium; launches, recycles and
    kills Chromium as needed. ``setup_tab`` (the renderer's) wires a new page's routing and events."""

    def __init__(
        self,
        playwright: Any,
        executable: str,
        *,
        concurrency: int,
        extra_args: tuple[str, ...] = (),
        page_reuse: int = 50,
        recycle_pages: int = 500,
        recycle_minutes: float = 30.0,
        close_grace_s: float = 5.0,
        setup_tab: Callable[[Tab], Any] | None = None,
        on_event: Callable[[str], None] | None = None,
    ):
        self.playwright = playwright
        self.executable = executable
        self.extra_args = extra_args
        self.concurrency = concurrency
        self.page_reuse = max(1, page_reuse)
        self.recycle_pages = max(1, recycle_pages)
        self.recycle_s = recycle_minutes * 60
        self.close_grace_s = close_grace_s
        self.setup_tab = setup_tab
        self.on_event = on_event or (lambda _: None)
        self.slots = asyncio.Semaphore(concurrency)
        self.current: Chromium | None = None
        self.generation = 0
        self.free: list[Tab] = []
        self.all: set[Chromium] = set()  # every Chromium not yet closed
        self.launched: set[int] = set()  # pids (= process groups) of every Chromium we started
        self._launch_lock = asyncio.Lock()
        self._closing: set[asyncio.Task] = set()
        self.closed = False
        # A Chromium that will not start (binary gone, disk full, out of memory) is retried after
        # 1, 2, 4 ... LAUNCH_BACKOFF_MAX_S seconds, not once per job: no launch storm, and the claim
        # loop stops claiming while ``unavailable_s()`` is positive.
        self.launch_failures = 0
        self._retry_at = 0.0

    def needs_launch(self) -> bool:
        """No live Chromium (it crashed, or the last launches failed): launch before taking work."""
        return self.launch_failures > 0 or self.current is None or not self.current.alive()

    def unavailable_s(self) -> float:
        """Seconds until the next launch attempt after failed ones; 0 when a render may start now."""
        return max(0.0, self._retry_at - time.monotonic()) if self.launch_failures else 0.0

    # ------------------------------------------------------------------------------- browsers

    async def start(self) -> Chromium:
        return await self._chromium()

    async def _chromium(self) -> Chromium:
        async with self._launch_lock:
            cur = self.current
            if cur is not None and cur.alive():
                if cur.renders >= self.recycle_pages:
                    self._retire(cur, "recycle-pages")
                elif cur.age_s >= self.recycle_s:
                    self._retire(cur, "recycle-age")
                else:
                    return cur
            elif cur is not None:
                self._retire(cur, "crash")
            if self.closed:
                raise BrowserError("the browser pool is closed")
            wait = self.unavailable_s()
            if wait > 0:
                raise BrowserError(f"Chromium failed to start {self.launch_failures} time(s); next attempt in {wait:.0f} s")
            self.generation += 1
            try:
                chromium = await Chromium.launch(
                    self.playwright, self.executable, self.extra_args, generation=self.generation
                )
            except BrowserError as e:
                self.launch_failures += 1
                delay = min(LAUNCH_BACKOFF_MAX_S, 2.0 ** (self.launch_failures - 1))
                self._retry_at = time.monotonic() + delay
                self.on_event("launch-failed")
                log.error("chromium did not start", error=str(e), failures=self.launch_failures, retry_in_s=delay)
                raise
            self.launch_failures = 0
            chromium.on_dead = self._on_dead
            self.launched.add(chromium.pid)
            self.all.add(chromium)
            self.current = chromium
            log.info(
                "chromium started",
                pid=chromium.pid,
                generation=chromium.generation,
                version=chromium.browser.version,
            )
            return chromium

    def _on_dead(self, chromium: Chromium) -> None:
        if chromium is self.current:
            self.current = None
            self.on_event("crash")
        self._maybe_close(chromium)

    def _retire(self, chromium: Chromium, why: str) -> None:
        if chromium is self.current:
            self.current = None
        if chromium.retiring:
            return
        chromium.retiring = True
        if why != "crash":
            self.on_event(why)
        log.info(
            "retiring chromium",
            pid=chromium.pid,
            generation=chromium.generation,
            reason=why,
            renders=chromium.renders,
            age_s=round(chromium.age_s),
        )
        for tab in [t for t in self.free if t.chromium is chromium]:
            self.free.remove(tab)
        self._maybe_close(chromium)

    def _maybe_close(self, chromium: Chromium) -> None:
        if chromium.inflight == 0 and not chromium.closed and (chromium.retiring or chromium.dead):
            task = asyncio.get_running_loop().create_task(self._close(chromium))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close(self, chromium: Chromium) -> None:
        self.free = [t for t in self.free if t.chromium is not chromium]
        if chromium is self.current:
            self.current = None
        try:
            if await chromium.close(self.close_grace_s):
                self.on_event("hard-kill")
        except Exception as e:  # pragma: no cover - close is best effort and must not kill the loop
            log.error("closing chromium failed", pid=chromium.pid, error=repr(e))
            kill_group(chromium.pid)
        finally:
            self.all.discard(chromium)
            self.reap()

    def reap(self) -> int:
        """Reap adopted Chromium orphans (only meaningful with the subreaper bit set)."""
        managed = {c.pid for c in self.all}
        return reap_orphans(self.launched, managed)

    # ----------------------------------------------------------------------------------- tabs

    @contextlib.asynccontextmanager
    async def tab(self, device: str) -> AsyncIterator[Tab]:
        """A tab for ``device``, exclusively, for one render. Blocks while ``concurrency`` are out.
        Giving the tab back (clearing cookies and storage) runs in the background, so the caller can
        post its result meanwhile; the slot frees when that is done."""
        await self.slots.acquire()
        try:
            tab = await self._checkout(device)
        except BaseException:
            self.slots.release()
            raise
        try:
            yield tab
        except BaseException:
            tab.poisoned = True
            raise
        finally:
            task = asyncio.get_running_loop().create_task(self._checkin_release(tab))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _checkin_release(self, tab: Tab) -> None:
        try:
            await self._checkin(tab)
        finally:
            self.slots.release()

    async def _checkout(self, device: str) -> Tab:
        chromium = await self._chromium()
        name, profile = device_profile(device)
        chromium.inflight += 1
        chromium.renders += 1
        for t in [t for t in self.free if t.crashed or t.page.is_closed()]:  # a tab that died while idle
            self.free.remove(t)
            asyncio.get_running_loop().create_task(_quietly(t.context.close()))
        for i, t in enumerate(self.free):
            if t.chromium is chromium and t.device == name:
                del self.free[i]
                t.uses += 1
                return t
        try:
            context = await chromium.browser.new_context(
                **profile, service_workers="block", accept_downloads=False
            )
            page = await context.new_page()
            tab = Tab(chromium, name, context, page, uses=1)
            page.on("crash", lambda _: setattr(tab, "crashed", True))
            tab.cdp = await context.new_cdp_session(page)
            if self.setup_tab is not None:
                await self.setup_tab(tab)
        except BaseException:
            chromium.inflight -= 1
            self._maybe_close(chromium)
            raise
        return tab

    async def _checkin(self, tab: Tab) -> None:
        chromium = tab.chromium
        try:
            keep = (
                not tab.poisoned
                and not tab.crashed
                and tab.uses < self.page_reuse
                and chromium.alive()
                and chromium is self.current
                and not self.closed
            )
            if keep:
                try:
                    await asyncio.wait_for(self._reset(tab), 5)
                except Exception:
                    keep = False
            if keep:
                self.free.append(tab)
            elif chromium.alive():
                if tab.poisoned and not tab.crashed:
                    # a render that failed may have left its renderer spinning (an endless script); a
                    # hung renderer outlives its closed context and stalls later navigations: end it
                    await _quietly(tab.cdp.send("Page.crash"), 2)
                await _quietly(tab.context.close(), 5)
        finally:
            chromium.inflight -= 1
            self._maybe_close(chromium)

    async def _reset(self, tab: Tab) -> None:
        """Between renders: no cookies and no storage of the origins just rendered (in parallel)."""
        origins, tab.origins = tab.origins, set()
        await asyncio.gather(
            tab.context.clear_cookies(),
            *(
                tab.cdp.send("Storage.clearDataForOrigin", {"origin": o, "storageTypes": STORAGE_TYPES})
                for o in origins
            ),
        )

    # ---------------------------------------------------------------------------------- close

    async def close(self) -> None:
        """Close every Chromium (hard-killing any that hangs) and reap."""
        self.closed = True
        self.free.clear()
        self.current = None
        await asyncio.gather(*[c.close(self.close_grace_s) for c in list(self.all)], return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        self.all.clear()
        self.reap()

    def kill_now(self) -> None:
        """Last resort (a second signal, or the drain deadline at exit): SIGKILL every Chromium group."""
        for pid in self.launched:
            kill_group(pid)

