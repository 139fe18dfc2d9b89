"""Chromium's lifecycle: one process we start and own, tabs handed out a bounded number at a time,
recycling after N renders or M minutes, a hard kill when Chromium does not exit, and reaping so no
zombie is left.

We start Chromium ourselves (its own session and process group, a fresh user-data dir) and attach
Playwright over CDP, rather than letting Playwright launch it: then we know its process group, can
SIGKILL the whole tree when it hangs, and reap it. With ``subreaper`` on (the CLI), this process also
adopts Chromium's orphans (renderers whose browser died) and reaps them, so none is left as a zombie
even where PID 1 does not reap.

A tab is a browser context plus one page for one device profile. Tabs are reused for up to
``page_reuse`` renders (a new renderer process per render costs about as much as the render itself
on two cores), with cookies and the rendered origins' storage cleared between renders; any error
retires the tab.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prerender_ray import logs

log = logs.get("worker.pool")

# Playwright's own launch switches that matter headless (chromiumSwitches.ts), plus the brief's.
SWITCHES = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-field-trial-config",
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-renderer-backgrounding",
    "--disable-back-forward-cache",
    "--disable-breakpad",
    "--disable-component-extensions-with-background-pages",
    "--disable-default-apps",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--disable-hang-monitor",
    "--disable-ipc-flooding-protection",
    "--disable-popup-blocking",
    "--disable-prompt-on-repost",
    "--disable-search-engine-choice-screen",
    "--disable-features=AvoidUnnecessaryBeforeUnloadCheckSync,DestroyProfileOnBrowserClose,HttpsUpgrades,"
    "HttpsFirstBalancedModeAutoEnable,LensOverlay,MediaRouter,PaintHolding,ThirdPartyStoragePartitioning,"
    "AvoidCorsURLLoaderRestartOnRedirect,OptimizationHints,NetworkTimeServiceQuerying,Translate,"
    "PreconnectToSearch,AimEnabled",
    "--force-color-profile=srgb",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-service-autorun",
    "--password-store=basic",
    "--use-mock-keychain",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)

# What Chromium sees of the worker's environment. It runs untrusted pages without a sandbox, so never
# the worker's credentials, the bypass token or Ray's: only what it needs to run, find fonts and
# locales, and reach the network through a configured proxy.
CHROMIUM_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG", "LANGUAGE", "LD_LIBRARY_PATH",
    "FONTCONFIG_FILE", "FONTCONFIG_PATH",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
})
CHROMIUM_ENV_PREFIXES = ("LC_", "XDG_")


def chromium_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k in CHROMIUM_ENV or k.startswith(CHROMIUM_ENV_PREFIXES)}


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


class BrowserError(RuntimeError):
    """Chromium could not be started or reached."""


# ------------------------------------------------------------------------------------ processes

STORAGE_TYPES = "local_storage,indexeddb,cache_storage,websql,file_systems,shader_cache"
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Chromium gets SIGKILL if the worker dies without closing it (it is in its own session, and a
    CDP port, unlike Playwright's pipe, does not end it)."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def set_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def group_members(pgid: int) -> list[int]:
    """Every process (zombies included) in process group ``pgid``."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            st = _stat(int(p.name))
            if st is not None and st[2] == pgid:
                out.append(int(p.name))
    return out


def reap_orphans(groups: set[int], exclude: set[int]) -> int:
    """Reap zombie children of this process that belong to one of ``groups`` (Chromium's, adopted
    as a subreaper) and are not in ``exclude`` (processes asyncio waits for). Returns how many."""
    me, n = os.getpid(), 0
    if not groups:
        return 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        pid = int(p.name)
        st = _stat(pid)
        if st is None or pid in exclude or st[1] != me or st[2] not in groups or st[0] != "Z":
            continue
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
            n += 1
    return n


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# -------------------------------------------------------------------------------------- Chromium


class Chromium:
    """One Chromium process and Playwright's CDP connection to it."""

    def __init__(self, generation: int, proc: asyncio.subprocess.Process, user_data_dir: Path):
        self.generation = generation
        self.proc = proc
        self.pid = proc.pid
        self.user_data_dir = user_data_dir
        self.browser: Any = None
        self.started = time.monotonic()
        self.renders = 0
        self.inflight = 0
        self.dead = False
        self.retiring = False
        self.closed = False
        self.on_dead: Callable[[Chromium], None] | None = None

    @classmethod
    async def launch(
        cls,
        playwright: Any,
        executable: str,
        extra: tuple[str, ...] = (),
        *,
        generation: int = 1,
        timeout_s: float = 30.0,
    ) -> Chromium:
        tmp = Path(tempfile.mkdtemp(prefix="prerender-chromium-"))
        stderr = open(tmp / "chromium.log", "wb")  # noqa: SIM115 - handed to the child
        try:
            proc = await asyncio.create_subprocess_exec(
                executable,
                *SWITCHES,
                *extra,
                f"--user-data-dir={tmp / 'profile'}",
                "about:blank",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
                env=chromium_env(os.environ),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BrowserError(f"cannot start {executable}: {e}") from None
        finally:
            stderr.close()
        self = cls(generation, proc, tmp)
        try:
            ws = await self._endpoint(timeout_s)
            self.browser = await playwright.chromium.connect_over_cdp(ws, timeout=timeout_s * 1000)
        except BaseException as e:
            await self.close(0.5)
            if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt)):
                raise
            raise BrowserError(f"Chromium did not come up: {e}; {self.stderr_tail()}") from None
        self.browser.on("disconnected", lambda _: self._disconnected())
        return self

    async def _endpoint(self, timeout_s: float) -> str:
        port_file = self.user_data_dir / "profile" / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise BrowserError(f"exited with {self.proc.returncode}")
            with contextlib.suppress(OSError):
                lines = port_file.read_text().splitlines()
                if len(lines) >= 2 and lines[0].isdigit():
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            await asyncio.sleep(0.02)
        raise BrowserError(f"no DevTools endpoint within {timeout_s:.0f} s")

    def stderr_tail(self, n: int = 5) -> str:
        with contextlib.suppress(OSError):
            lines = (self.user_data_dir / "chromium.log").read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-n:])
        return ""

    def _disconnected(self) -> None:
        if not self.dead:
            self.dead = True
            if not self.closed:
                log.warning(
                    "chromium disconnected",
                    pid=self.pid,
                    generation=self.generation,
                    exit=self.proc.returncode,
                )
            if self.on_dead:
                self.on_dead(self)

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.started

    def alive(self) -> bool:
        """Not known dead, and its process still running: a Chromium killed between jobs is found
        here before its tabs are handed out, even before its connection's close reaches us."""
        return not self.dead and self.proc.returncode is None and _running(self.pid)

    async def close(self, grace_s: float = 5.0) -> bool:
        """Disconnect, SIGTERM the process group, SIGKILL it after ``grace_s``, wait for the process
        (asyncio reaps it) and delete the profile. True when a hard kill was needed."""
        if self.closed:
            return False
        self.closed = True
        hard = False
        if self.browser is not None and not self.dead:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.browser.close(), grace_s)
        if self.proc.returncode is None:
            kill_group(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                hard = True
                log.warning("chromium ignored SIGTERM; killing its process group", pid=self.pid)
        kill_group(self.pid, signal.SIGKILL)  # renderers and helpers left in the group, if any
        if self.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 10)
        self.dead = True
        await asyncio.to_thread(shutil.rmtree, self.user_data_dir, True)
        return hard


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


def _running(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead (Linux /proc; elsewhere, assumed running)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"x")
