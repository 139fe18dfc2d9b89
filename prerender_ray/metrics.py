"""Every metric prerender-ray emits, in one catalog.

prometheus_client in multiprocess mode: each process of a node (ingress replicas, keeper, lease
table, store) writes its samples to files under the node's metrics directory, named by the
``PROMETHEUS_MULTIPROC_DIR`` environment variable that the controller gives every actor, and any
ingress replica renders the whole node at ``GET /metrics``. Gauges say how they combine across
processes (``livesum``, ``max``...). Without that variable (unit tests) metrics stay in-process.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from prerender_ray.processes import pid_alive

ENV = "PROMETHEUS_MULTIPROC_DIR"

# --- process health
loop_errors = Counter(
    "prerender_loop_errors_total", "Exceptions survived by a background loop.", ["loop"]
)

# --- queue
keeper_rows = Gauge("prerender_keeper_rows", "Schedule rows held by the keeper.", multiprocess_mode="livemax")
keeper_live = Gauge("prerender_keeper_live", "1 when the keeper is live.", multiprocess_mode="livemax")
keeper_load_seconds = Gauge(
    "prerender_keeper_load_seconds", "Duration of the keeper's last load.", multiprocess_mode="livemax"
)
keeper_unreadable_rows = Counter("prerender_keeper_unreadable_rows_total", "Schedule rows that failed to decode.")
keeper_repaired = Counter("prerender_keeper_repaired_total", "Rows the keeper repaired (expected 0).", ["how"])
keeper_publish_seconds = Histogram(
    "prerender_keeper_publish_seconds",
    "Time to publish the ready set.",
    buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)
queue_due = Gauge("prerender_queue_due", "Due schedule rows (in flight included).", multiprocess_mode="livemax")
queue_status = Gauge(
    "prerender_queue_status", "Queue status of this node (1 for the current one).", ["status"],
    multiprocess_mode="livemax",
)
claims = Counter("prerender_claim_jobs_total", "Jobs granted by claims.")
claim_health = Counter("prerender_claim_health_total", "Claim anomalies.", ["kind"])  # stale, wedged, refused, unconfirmed
leases_in_flight = Gauge("prerender_leases_in_flight", "Live, unreleased leases.", multiprocess_mode="livemax")
render_outcomes = Counter("prerender_render_outcomes_total", "Posted render results.", ["outcome", "detail"])
# A stored render whose bytes equal the page it replaces re-rendered for nothing: per route, so an
# operator sees which routes could render less often. change: new, changed, unchanged.
render_content = Counter("prerender_render_content_total", "Rendered pages stored, by content change.",
                         ["route", "change"])
# Bad renders (queue/guard.py): why is empty-shell, not-found, lost-text or lost-links; action is refused
# (the stored page kept), stored (no good page to keep) or accepted (a loss that held acceptAfter times).
render_guard = Counter("prerender_render_guard_total", "Bad renders judged by the guard.",
                       ["route", "why", "action"])
# Results acknowledged but not applied: duplicate (the grant was answered already: a replay or a
# retry after a lost 204) or superseded (the key was re-granted to another worker since).
results_ignored = Counter("prerender_results_ignored_total", "Render results acknowledged, not applied.",
                          ["reason"])
# Results whose renderSummary or diagnostics field was dropped in part (malformed or past its bounds);
# the result itself was applied as it would be without them.
diagnostics_dropped = Counter("prerender_diagnostics_dropped_total",
                              "Render results whose diagnostics fields were dropped in part.")
result_group_size = Histogram(
    "prerender_result_group_size", "Render results applied together by the keeper (one group).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
render_seconds = Histogram(
    "prerender_render_seconds", "Render time reported by the fleet.", ["status_class"],
    buckets=(0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
)
reconcile_rows = Counter("prerender_reconcile_rows_total", "Reconcile results.", ["kind"])  # missing, restored

# --- bots
bot_requests = Counter("prerender_bot_requests_total", "Bot requests.", ["bot", "device"])
bot_serves = Counter("prerender_bot_serves_total", "Bot serve outcomes.", ["source", "cache_status", "bot"])
route_serves = Counter("prerender_route_serves_total", "Serves per route.", ["route", "cache_status", "device"])
page_age_seconds = Histogram(
    "prerender_page_age_seconds", "Age of pages served from cache.", ["device"],
    buckets=(60, 600, 3600, 6 * 3600, 24 * 3600, 3 * 86400, 7 * 86400),
)
origin_fetch_seconds = Histogram(
    "prerender_origin_fetch_seconds", "Origin fetch time to response headers.", ["status", "reason"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
page_age_negative = Counter(
    "prerender_page_age_negative_total", "Pages served from cache with a lastCached in the future (clock skew).",
    ["bot", "device"],
)
status_pages_served = Counter("prerender_status_pages_served_total",
                              "Bot requests answered from cache with a page's own status (not 200).", ["status"])
# Per bot class (prerender_ray.serving.bots.BOT_CLASSES): how each was verified (the state, and the
# method that decided it: signature, dns, ranges, none), what its policy served (prerender, origin,
# deny) and the cache status; all bounded sets.
bot_class_serves = Counter("prerender_bot_class_serves_total", "Bot serves per class.",
                           ["bot_class", "verification", "method", "policy", "cache_status"])
# Every verification asked, per claimed class: method signature (outcome: web_bot_auth.REASONS or
# verified), dns or ranges (verification.OUTCOMES). Markdown answers per class served.
bot_verifications = Counter("prerender_bot_verifications_total", "Bot verifications by class, method and "
                            "outcome.", ["bot_class", "method", "outcome"])
bot_markdown_served = Counter("prerender_bot_markdown_served_total", "Bot requests answered with Markdown.",
                              ["bot_class"])
bot_page_age_seconds = Histogram(
    "prerender_bot_page_age_seconds", "Age of pages served from cache, per bot class and bot.", ["bot_class", "bot"],
    buckets=(60, 600, 3600, 6 * 3600, 24 * 3600, 3 * 86400, 7 * 86400),
)
# Web Bot Auth (prerender_ray/serving/web_bot_auth.py): signed bot requests, verified or why not
# (web_bot_auth.REASONS); a request without signature headers is not counted. Key-directory fetches: ok, failed.
bot_signatures = Counter("prerender_bot_signatures_total", "Signed bot requests by outcome.", ["outcome"])
key_directory_fetches = Counter("prerender_key_directory_fetches_total", "Signature agents' key-directory "
                                "fetches by outcome.", ["outcome"])
serve_errors = Counter("prerender_serve_errors_total", "Serve-path errors.", ["kind"])
# header-timeout, write-timeout, pipeline-full, head-too-large, evicted, refused (api/connections.py)
connections_closed = Counter("prerender_connections_closed_total", "Client connections an ingress closed "
                             "early.", ["reason"])
holder_reads = Counter("prerender_holder_reads_total",
                       "Pages read from a holder by a node that holds no copy.", ["outcome"])  # page, none, cached, failed, stale
holder_read_seconds = Histogram("prerender_holder_read_seconds", "One read of a page from a holder.",
                                buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
discovered = Counter("prerender_discovered_total", "Targets created by bot-miss discovery.")
# rate, ceiling, sites (too many tracked), busy (discoveries in flight), failed-claim, unverified-claim
# (prerender_ray.queue.discovery.REASONS)
discovery_refused = Counter("prerender_discovery_refused_total", "Bot-miss discoveries refused by the "
                            "discovery budget or a bot claim that is not verified.", ["reason"])
unrouted = Counter("prerender_unrouted_total", "Bot requests served without prerendering.", ["route_class", "bucket"])
# Markdown for agents (api/bot/markdown.py): converted, too-large, output-too-large, failed, timeout (a
# request stopped waiting), busy (too many in flight). Pages served from the Markdown cache are not counted.
markdown_conversions = Counter("prerender_markdown_conversions_total", "Markdown conversions by outcome.",
                               ["outcome"])
# llms.txt (api/bot/llms.py): builds of a site's document by outcome: built, timeout, failed, busy (the
# replica's builds at their cap; the request got the last copy, or a 503 without one).
llms_txt_builds = Counter("prerender_llms_txt_builds_total", "llms.txt document builds by outcome.", ["outcome"])
# IndexNow (actors/keeper/indexnow.py), counted per endpoint. URLs: queued, sent, dropped-queue-full (the
# oldest, past indexNow.maxQueued), dropped-failed (their submission failed maxAttempts times or was refused).
# Requests: ok, redirect (never followed), rejected (4xx), unavailable (429, 5xx), timeout, error, refused.
indexnow_urls = Counter("prerender_indexnow_urls_total", "URLs submitted to IndexNow by outcome.", ["outcome"])
indexnow_requests = Counter("prerender_indexnow_requests_total", "IndexNow submission requests by outcome.",
                            ["outcome"])

# --- replication and sitemaps
replication_lag_seconds = Histogram(
    "prerender_replication_lag_seconds", "Write-to-apply lag of replicated records.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
# Page-store writes made on this node (replicated copies not counted): kind page, a whole page record;
# kind freshness, the small record an unchanged render (or a revalidate) writes instead.
page_writes = Counter("prerender_page_writes_total", "Page-store records written by this node.", ["kind"])
page_write_bytes = Counter("prerender_page_write_bytes_total", "Bytes of page-store records written.", ["kind"])
replication_shipped_bytes = Counter(
    "prerender_replication_shipped_bytes_total", "Bytes of records shipped to peers (keys and records).",
    ["kind"],  # write (the outbox), repush (after an overflow or a restart), rebalance (a membership change)
)
replication_pending = Gauge(
    "prerender_replication_pending", "Records waiting to ship to a peer.", ["peer"], multiprocess_mode="livemax"
)
sitemap_entries = Counter("prerender_sitemap_entries_total", "Sitemap entries by action.", ["action"])
sitemap_documents = Counter("prerender_sitemap_documents_total", "Sitemap documents walked.", ["outcome"])  # ok, failed
sitemap_walks = Counter("prerender_sitemap_walks_total", "Sitemap walks by how they ended.", ["outcome"])
sitemap_walks_running = Gauge("prerender_sitemap_walks_running", "Sitemap walks running.", multiprocess_mode="livesum")
# robots.txt (sitemaps/robots.py): fetch outcomes (ok, unavailable, unreachable), and per domain and
# bot 1 where the policy serves a bot that the domain's robots.txt disallows.
robots_fetches = Counter("prerender_robots_fetches_total", "robots.txt fetches by outcome.", ["outcome"])
robots_conflicts = Gauge("prerender_robots_conflicts", "Bots served although robots.txt disallows them.",
                         ["domain", "bot"], multiprocess_mode="livemax")
config_warnings = Gauge("prerender_config_warnings", "Risky-config findings.", multiprocess_mode="livemax")
# The node's page log (storage/pagelog, written by the store before each pages-store batch): full is 1
# while it refuses writes (disk full, or another write error: results get 503 + Retry-After, nothing is
# stored); refused counts the batches it refused, by reason (full, error).
pagelog_full = Gauge("prerender_pagelog_full", "1 while the page log refuses writes.", multiprocess_mode="livemax")
pagelog_refused = Counter("prerender_pagelog_refused_total", "Page-store batches the page log refused.", ["reason"])
pagelog_settled = Counter("prerender_pagelog_settled_total", "Pages-store stubs the page log could not resolve, "
                          "settled: a newer record it held applied, or the page dropped for its holders or a "
                          "render to fill again (its copy lost).", ["how"])
pagelog_entries = Gauge("prerender_pagelog_entries", "Pages in the page log.", multiprocess_mode="livemax")
pagelog_disk_bytes = Gauge("prerender_pagelog_disk_bytes", "Bytes of the page log on disk.",
                           multiprocess_mode="livemax")
pagelog_live_bytes = Gauge("prerender_pagelog_live_bytes", "Bytes of live pages in the page log.",
                           multiprocess_mode="livemax")
pagelog_building = Gauge("prerender_pagelog_building", "1 while the page log is built from the pages store "
                         "(readers keep to RocksDB until it is complete).", multiprocess_mode="livemax")


# Every background loop's name: primed at 0, so a dashboard's error panel has a series before the
# first error (tests/test_metrics.py checks that each loop_errors label used in the code is listed).
LOOPS = ("bot-metrics", "bot-ranges", "content-signals", "controller", "indexnow", "keeper-load", "keeper-overrides", "keeper-publish", "keeper-status",
         "keeper-verify", "lease-sweep", "membership-check", "page-catch-up", "page-log", "rebalance", "rebuild", "reconcile", "robots-discovery", "session-revocations",
         "sitemap-daily", "sitemap-resume", "unrouted-report")


def prime() -> None:
    """Zero-valued series for the label sets a dashboard queries (absent would read as "no data")."""
    for loop in LOOPS:
        loop_errors.labels(loop)


def render() -> bytes:
    """Prometheus text for this node (every process in multiprocess mode, else this process)."""
    path = os.environ.get(ENV)
    if path and Path(path).is_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)
        return generate_latest(registry)
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY)


def prepare_dir(path: Path) -> None:
    """Create the node's metrics directory; forget gauges of processes that are gone."""
    path.mkdir(parents=True, exist_ok=True)
    for f in path.glob("*.db"):
        pid = f.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            multiprocess.mark_process_dead(int(pid), str(path))
