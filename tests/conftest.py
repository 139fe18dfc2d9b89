"""Shared fixtures. Ray is started once per session, lazily, on loopback, with its own token."""

from __future__ import annotations

import os
import secrets

# Before anything imports ray: loopback only, and a token of this session (never one left behind).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.pop("PRERENDER_CONFIG", None)

import pytest  # noqa: E402

from tests.support import RayCluster  # noqa: E402


@pytest.fixture(scope="session")
def ray_cluster():
    cluster = RayCluster.start()
    yield cluster
    cluster.shutdown()
