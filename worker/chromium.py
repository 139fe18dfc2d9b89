"""One Chromium process we start and own: its launch switches and environment, its process group
(killed whole, its zombies reaped) and Playwright's CDP connection to it.

We start Chromium ourselves (its own session and process group, a fresh user-data dir) and attach
Playwright over CDP, rather than letting Playwright launch it: then we know its process group, can
SIGKILL the whole tree when it hangs, and reap it. With ``subreaper`` on (the CLI), this process also
adopts Chromium's orphans (renderers whose browser died) and reaps them, so none is left as a zombie
even where PID 1 does not reap.
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
from collections.abc import Callable, Mapping
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


class BrowserError(RuntimeError):
    """Chromium could not be started or reached."""


# ------------------------------------------------------------------------------------ processes

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
