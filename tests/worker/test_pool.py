"""Chromium's lifecycle with a real browser: recycling, a hard kill when it ignores SIGTERM, a browser
that dies mid-run, and nothing left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from playwright.async_api import async_playwright

from prerender_ray.worker import outcome as oc
from prerender_ray.worker.chromium import group_members
from prerender_ray.worker.options import find_chromium
from prerender_ray.worker.pool import BrowserPool
from prerender_ray.worker.render import Renderer, RenderOptions
from tests.worker.site import Origin

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="needs Debian's chromium (apt install chromium)"),
]


def job(url: str) -> oc.Job:
    return oc.Job(
        id=f"{url}|desktop",
        url=url,
        device_type="desktop",
        expires_at=float("nan"),
        callback_origin="http://127.0.0.1:1",
    )


def gone(pgid: int, timeout: float = 10.0) -> bool:
    """No process of the group is left, zombies included (PID 1 or we reap them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def origin():
    o = Origin().start()
    yield o
    o.stop()


async def rig(**kw):
    pw = await async_playwright().start()
    events: list[str] = []
    pool = BrowserPool(pw, find_chromium(), concurrency=1, on_event=events.append, **kw)
    renderer = Renderer(pool, oc.UrlRules(), RenderOptions())
    pool.setup_tab = renderer.setup_tab
    await pool.start()
    return pw, pool, renderer, events


async def test_the_browser_is_replaced_after_n_renders_and_the_old_one_leaves_nothing(origin: Origin) -> None:
    pw, pool, renderer, events = await rig(recycle_pages=2)
    try:
        first = pool.current
        for i in range(3):
            assert (await renderer.render(job(f"{origin.base}/js/r{i}"))).html
        assert pool.current is not first and pool.current.generation == 2 and events == ["recycle-pages"]
        assert gone(first.pid) and not first.user_data_dir.exists()
    finally:
        last = pool.current.pid
        await pool.close()
        await pw.stop()
    assert gone(last)


async def test_a_browser_that_ignores_sigterm_is_killed_and_reaped(origin: Origin) -> None:
    pw, pool, renderer, events = await rig(recycle_minutes=0.0, close_grace_s=1.0)
    try:
        first = pool.current
        first.browser.close = _never  # the CDP close hangs, and the process ignores SIGTERM (stopped)
        os.kill(first.pid, signal.SIGSTOP)
        assert (await renderer.render(job(f"{origin.base}/js/k1"))).html  # recycled at once (age 0)
        assert pool.current is not first
        for _ in range(100):
            if "hard-kill" in events:
                break
            await __import__("asyncio").sleep(0.1)
        assert "hard-kill" in events and first.proc.returncode == -signal.SIGKILL
        assert gone(first.pid)
    finally:
        await pool.close()
        await pw.stop()


async def _never() -> None:
    await __import__("asyncio").sleep(3600)


async def test_a_browser_that_dies_is_an_error_for_its_render_and_the_next_one_gets_a_new_browser(
    origin: Origin,
) -> None:
    import asyncio

    pw, pool, renderer, events = await rig()
    try:
        first = pool.current
        task = asyncio.create_task(renderer.render(job(f"{origin.base}/hang")))
        for _ in range(100):
            if origin.requests("/hang"):
                break
            await asyncio.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)  # the browser process crashes mid-render
        r = await task
        assert r.verdict.error is not None and r.html is None
        assert (await renderer.render(job(f"{origin.base}/js/after-browser-crash"))).html
        assert pool.current is not first and "crash" in events
        assert gone(first.pid)
    finally:
        await pool.close()
        await pw.stop()


async def test_a_browser_killed_between_jobs_fails_no_job_even_before_its_connection_drops(origin: Origin) -> None:
    pw, pool, renderer, events = await rig()
    try:
        assert (await renderer.render(job(f"{origin.base}/js/before-kill"))).html  # a tab is kept
        await asyncio.sleep(1)  # its check-in (in the background) is done: the next checkout does not wait
        first = pool.current
        os.kill(first.pid, signal.SIGKILL)
        time.sleep(0.5)  # blocking: the event loop has not seen the connection close
        r = await renderer.render(job(f"{origin.base}/js/after-kill"))
        assert r.verdict.error is None and r.html, r.verdict.error  # before: TargetClosedError
        assert pool.current is not first
    finally:
        await pool.close()
        await pw.stop()


async def test_a_chromium_that_will_not_start_is_retried_with_backoff_not_per_job(tmp_path) -> None:
    broken = tmp_path / "chromium"
    broken.write_text("#!/bin/sh\necho 'cannot open display' >&2\nexit 3\n")
    broken.chmod(0o755)
    pw = await async_playwright().start()
    events: list[str] = []
    pool = BrowserPool(pw, str(broken), concurrency=1, on_event=events.append)
    try:
        with pytest.raises(Exception, match="did not come up|exited with 3"):
            await pool.start()
        assert pool.launch_failures == 1 and 0 < pool.unavailable_s() <= 1.0
        generation = pool.generation
        with pytest.raises(Exception, match="next attempt in"):
            await pool.start()  # within the backoff: refused at once, nothing launched
        assert pool.generation == generation and pool.launch_failures == 1
        await asyncio.sleep(pool.unavailable_s() + 0.05)
        with pytest.raises(Exception, match="did not come up|exited with 3"):
            await pool.start()
        assert pool.launch_failures == 2 and 1.0 < pool.unavailable_s() <= 2.0  # doubled
        assert events.count("launch-failed") == 2
        pool.executable = find_chromium()  # the operator fixed it
        await asyncio.sleep(pool.unavailable_s() + 0.05)
        chromium = await pool.start()
        assert chromium.alive() and pool.launch_failures == 0 and pool.unavailable_s() == 0
    finally:
        await pool.close()
        await pw.stop()
