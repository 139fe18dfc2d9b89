"""The environment every benchmark that starts a local Ray sets before importing Ray: loopback only,
a fresh token (never a previous run's), no usage stats, no multiprocess metrics dir inherited."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path


def isolate() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
