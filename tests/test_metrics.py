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


def test_every_series_and_label_the_dashboard_queries_is_in_the_catalog() -> None:
    """In ms, without a node: each queried name is a metric of prerender_ray/metrics.py (with its
    sample suffix) and each label a query groups or filters by is one of that metric's labels."""
    import json

    from prometheus_client import Counter, Histogram

    catalog = {}
    for m in vars(metrics).values():
        if hasattr(m, "_name") and hasattr(m, "_labelnames"):
            base = m._name
            names = ([f"{base}_total"] if isinstance(m, Counter) else
                     [f"{base}_{s}" for s in ("bucket", "count", "sum")] if isinstance(m, Histogram) else [base])
            catalog.update(dict.fromkeys(names, set(m._labelnames) | ({"le"} if isinstance(m, Histogram) else set())))
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    for expr in (t["expr"] for p in dashboard["panels"] for t in p["targets"]):
        for name in re.findall(r"\bprerender_[a-z_]+", expr):
            assert name in catalog, (name, expr)
            used = {label for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.replace(" ", "").split(",")}
            used |= set(re.findall(rf"{name}\{{([a-z_]+)=", expr))
            assert used - {"instance"} <= catalog[name], (name, sorted(used - catalog[name]), expr)
