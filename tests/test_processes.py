"""pid_alive: a running process, a zombie and a reaped one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from prerender_ray.processes import pid_alive


def test_a_running_process_is_alive_and_an_exited_one_is_not_even_before_it_is_reaped() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while pid_alive(child.pid):  # a zombie until reaped: already gone
        assert time.monotonic() < deadline, "the exited child still counts as alive"
        time.sleep(0.02)
    child.wait()
    assert not pid_alive(child.pid)
