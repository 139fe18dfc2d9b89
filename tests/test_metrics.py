"""Metric names a dashboard depends on."""

from __future__ import annotations

import re
from pathlib import Path

from prerender_ray import metrics

ROOT = Path(__file__).parents[1]


def test_every_loop_that_counts_its_errors_is_primed() -> None:
    used = set()
    for folder in ("prerender_ray", "actors", "api", "worker"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r'loop_errors\.labels\("([^"]+)"\)', path.read_text()))
    assert used and used <= set(metrics.LOOPS), sorted(used - set(metrics.LOOPS))
