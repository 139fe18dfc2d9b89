"""How Chromium is started: with a minimal environment, none of the worker's secrets."""

from __future__ import annotations

import os

import pytest

from prerender_ray.worker.chromium import BrowserError, Chromium
from prerender_ray.worker.options import find_chromium

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="needs Debian's chromium (apt install chromium)"),
]


async def test_chromium_is_started_with_a_minimal_environment(tmp_path, monkeypatch) -> None:
    # Chromium runs untrusted pages without a sandbox: before, it got the worker's whole environment
    # (its fleet password, the bypass token, Ray's token when `up --with-worker` started it).
    seen = tmp_path / "env"
    fake = tmp_path / "chromium"
    fake.write_text(f"#!/bin/sh\nenv > {seen}\nexit 3\n")
    fake.chmod(0o755)
    for k in ("RAY_AUTH_TOKEN", "RAY_ADDRESS", "PRERENDER_WORKER_PASSWORD", "PRERENDER_WORKER_BYPASS_TOKEN",
              "ORIGIN_TOKEN"):
        monkeypatch.setenv(k, "s3cret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    with pytest.raises(BrowserError, match="exited with 3"):
        await Chromium.launch(None, str(fake), timeout_s=10)
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert env["PATH"] == os.environ["PATH"] and env["LC_ALL"] == "C.UTF-8"
    assert not [k for k in env if k.startswith("RAY_")]
    assert not [k for k, v in env.items() if "s3cret" in v]
