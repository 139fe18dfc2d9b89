"""`prerender-ray render` as a process: it renders, survives its Chromium being killed, reaps what is
left of it, and stops cleanly on SIGTERM with nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prerender_ray.worker.chromium import group_members
from prerender_ray.worker.options import find_chromium
from tests.support import wait_for
from tests.worker.site import FakeQueue, Origin

CLI = [sys.executable, "-m", "prerender_ray.cli.main", "render"]


def test_bad_options_exit_2_with_one_line() -> None:
    out = subprocess.run(
        [*CLI, "--queue", "ftp://x", "--chromium", sys.executable],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PRERENDER_WORKER_USER": ""},
    )
    assert out.returncode == 2 and "--queue must be an http(s) URL" in out.stderr
    out = subprocess.run(
        [*CLI, "--queue", "http://127.0.0.1:1", "--password-env", "NOPE_NOT_SET", "--chromium", sys.executable],  # noqa: E501
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "NOPE_NOT_SET is not set" in out.stderr


def test_a_plain_http_queue_off_loopback_is_warned_about_at_start() -> None:
    # a Chromium that cannot start (false) ends the worker before it sends anything to a queue
    out = subprocess.run(
        [*CLI, "--queue", "http://10.0.0.5:9926", "--queue", "http://127.0.0.1:1", "--queue", "http://localhost:2",
         "--queue", "http://[::1]:4", "--queue", "https://10.0.0.6:3", "--chromium", shutil.which("false") or "false"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PRERENDER_WORKER_USER": ""},
    )
    assert out.returncode == 1, out.stdout[-2000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    warned = [(line["level"], line.get("queue")) for line in lines if "cleartext" in line["event"]]
    assert warned == [("warning", "http://10.0.0.5:9926")]


def _chromium_of(worker: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == worker and b"--remote-debugging-port=0" in cmd:
                out.append(int(p.name))
    return out


@pytest.mark.browser
@pytest.mark.skipif(find_chromium() is None, reason="needs Debian's chromium (apt install chromium)")
def test_the_worker_process_survives_a_chromium_crash_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    origin, queue = Origin().start(), FakeQueue().start()
    queue.jobs = [queue.job(f"{origin.base}/js/cli-1")]
    # the second job is announced the way a node announces work (`queued`), not found by the idle poll 15 s on
    queue.status_rows = [{"node": "a", "hostname": "127.0.0.1", "status": "empty", "updatedTime": 1, "url": queue.base}]
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [
            *CLI,
            "--queue",
            queue.base,
            "--concurrency",
            "1",
            "--status-interval",
            "0.2",
            "--worker-id",
            "cli-test",
            "--stats-interval",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PRERENDER_WORKER_USER": ""},
    )
    groups: set[int] = set()
    try:
        wait_for(lambda: len(queue.results()) == 1, timeout=90, what="the first result")
        assert queue.results()[0]["outcome"] == "rendered"
        first = _chromium_of(proc.pid)
        assert len(first) == 1
        groups.add(first[0])
        os.kill(first[0], signal.SIGKILL)  # Chromium dies between jobs
        queue.jobs.append(queue.job(f"{origin.base}/js/cli-2"))
        queue.status_rows = [{**queue.status_rows[0], "status": "queued", "updatedTime": 2}]
        wait_for(lambda: len(queue.results()) == 2, timeout=90, what="a result after the crash")
        assert queue.results()[1]["outcome"] == "rendered", queue.results()[1].get("error")
        groups.update(_chromium_of(proc.pid))
        assert len(groups) == 2
        # the dead browser's processes, renderers included, are gone: none left as a zombie
        wait_for(lambda: not group_members(first[0]), timeout=15, what="the crashed Chromium's group to go")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
        queue.stop()
        origin.stop()
    for g in groups:
        wait_for(lambda g=g: not group_members(g), timeout=15, what=f"Chromium group {g} to go")
    lines = [
        json.loads(line)
        for line in (tmp_path / "worker.log").read_text().splitlines()
        if line.startswith("{")
    ]
    events = [line.get("event") for line in lines]
    assert "render worker started" in events and "render worker stopped" in events
    assert "worker stats" in events  # the periodic stats line
    totals = next(line for line in lines if line.get("event") == "worker totals")
    assert totals["rendered"] == 2
