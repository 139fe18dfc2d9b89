"""The worker's Prometheus metrics, in a registry of its own (never the node's multiprocess one), and
the counters behind the periodic stats log line."""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # since the last stats line
    window: Tally = field(default_factory=Tally)
    window_render_ms: float = 0.0
    # since start
    total: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        r = self.registry
        self.renders = Counter(
            "prerender_worker_renders_total",
            "Renders by outcome and reason.",
            ["outcome", "reason"],
            registry=r,
        )
        self.render_seconds = Histogram(
            "prerender_worker_render_seconds",
            "Render time (navigation + settle + serialization).",
            ["outcome"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
            registry=r,
        )
        self.claims = Counter("prerender_worker_claims_total", "Claims by result.", ["result"], registry=r)
        self.jobs_claimed = Counter(
            "prerender_worker_jobs_claimed_total", "Jobs received from claims.", registry=r
        )
        self.skipped = Counter(
            "prerender_worker_jobs_skipped_total", "Claimed jobs never rendered.", ["reason"], registry=r
        )
        self.results = Counter(
            "prerender_worker_results_total", "Result posts by how they ended.", ["result"], registry=r
        )
        self.browser_events = Counter(
            "prerender_worker_browser_events_total",
            "Chromium replacements and hard kills.",
            ["event"],
            registry=r,
        )
        self.blocked = Counter("prerender_worker_blocked_requests_total",
                               "Requests the blocklist stopped (analytics, ads, consent, chat).", registry=r)
        self.egress_refused = Counter(
            "prerender_worker_egress_refused_total",
            "Connections the egress guard (--public-only) refused: private (an address that is not public), "
            "unresolved, command (not a connect) or busy (too many open).",
            ["reason"],
            registry=r,
        )
        self.in_flight = Gauge("prerender_worker_renders_in_flight", "Renders in progress.", registry=r)
        self.hosts = Gauge("prerender_worker_queue_hosts", "Queue hosts known.", registry=r)
        self.circuits = Gauge("prerender_worker_open_circuits", "Queue hosts in error backoff.", registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)

    def rendered(self, outcome: str, reason: str | None, render_ms: float) -> None:
        self.renders.labels(outcome, reason or "").inc()
        self.render_seconds.labels(outcome).observe(render_ms / 1000)
        self.window[outcome] += 1
        self.total[outcome] += 1
        self.window_render_ms += render_ms

    def count(self, what: str, n: int = 1) -> None:
        self.window[what] += n
        self.total[what] += n

    def take_window(self) -> dict:
        rendered = sum(self.window[o] for o in ("rendered", "redirected", "non-indexable", "error"))
        out: dict[str, int | None] = {k: v for k, v in sorted(self.window.items())}
        out["avg_render_ms"] = round(self.window_render_ms / rendered) if rendered else None
        self.window.clear()
        self.window_render_ms = 0.0
        return out
