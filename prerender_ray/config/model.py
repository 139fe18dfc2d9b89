"""The one configuration model: every option, its default and its constraints.

Here is its root, ``Config``, with the option paths loading treats specially (secrets, unsupported and
moved reference keys); its sections live beside it: ``base`` (the base ``Model``, durations, host
names), ``service`` (server, ingress, cluster, management, auth), ``origin`` (origin fetches, sitemaps,
robots.txt), ``render`` (pages, render, queue, fleet), ``bots`` and ``outputs`` (Markdown, llms.txt,
IndexNow).

Snake_case is the canonical spelling; the reference plugin's camelCase names are accepted as aliases
so an existing deployment's options carry over. Durations are milliseconds (ints), or strings such as
``"30s"``, ``"6h"`` and ``"7d"``. Loading from YAML, unknown-key reporting and the environment secrets
live in ``config/loading.py``.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from prerender_ray.config.base import Model
from prerender_ray.config.bots import Analytics, Bots
from prerender_ray.config.origin import Origin, Robots, Sitemap
from prerender_ray.config.outputs import IndexNow, LlmsTxt, Markdown
from prerender_ray.config.render import Fleet, Page, Queue, Render, RenderNow, Scan
from prerender_ray.config.service import (
    Auth,
    CacheKey,
    Cluster,
    DebugHeader,
    DeviceTypes,
    Ingress,
    Logging,
    Management,
    PeerRescue,
    Server,
)


class Config(Model):
    domains: list[str] = Field(
        [],
        description="Origins we prerender and fetch (bot misses, sitemaps, redirects); others are refused. "
        "An entry is `host` (the scheme's default port only: 80 for http, 443 for https), `host:port`, "
        "or `host:*` (any port); IPv6 as `[::1]`, `[::1]:8080`. Not a URL: no scheme or path "
        "(empty: any host, loopback only)."
    )
    allow_any_domain: bool = Field(
        False, description="Allow origin fetches to any host with an empty `domains` (open proxy); off "
        "loopback, only to public addresses (never the node's own network, loopback or link-local)."
    )
    server: Server = Server()
    ingress: Ingress = Ingress()
    device_types: DeviceTypes = DeviceTypes()
    cache_key: CacheKey = CacheKey()
    origin: Origin = Origin()
    debug_header: DebugHeader = DebugHeader()
    render_now: RenderNow = RenderNow()
    peer_rescue: PeerRescue = PeerRescue()
    cluster: Cluster = Cluster()
    management: Management = Management()
    page: Page = Page()
    render: Render = Render()
    scan: Scan = Scan()
    sitemap: Sitemap = Sitemap()
    robots: Robots = Robots()
    queue: Queue = Queue()
    fleet: Fleet = Fleet()
    auth: Auth = Auth()
    analytics: Analytics = Analytics()
    markdown: Markdown = Markdown()
    llms_txt: LlmsTxt = LlmsTxt()
    index_now: IndexNow = IndexNow()
    bots: Bots = Bots()
    logging: Logging = Logging()

    @field_validator("domains")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        # as serving.origin_policy.parse_entry keeps an entry; config/loading.py checks each one
        return [d.strip().lower() for d in v if d.strip()]

    @model_validator(mode="after")
    def _keys_parse(self) -> Config:
        clash = [d for d in self.device_types.supported if self.cache_key.delimiter in d]
        if clash:
            raise ValueError(f"device types {clash} contain the cache key delimiter {self.cache_key.delimiter!r}")
        return self


# Secret leaves: shown only as set/unset, filled from their *_env variable at load time.
SECRET_PATHS = {  # secret leaf -> the option naming its environment variable
    "origin.security_token.value": "origin.security_token.value_env",
    "render_now.token": "render_now.value_env",
    "peer_rescue.token": "peer_rescue.value_env",
    "fleet.mqtt.password": "fleet.mqtt.password_env",
    "auth.session_secret": "auth.session_secret_env",
}
# Reference options that this design does not implement; accepted with a warning, never an error.
UNSUPPORTED_PATHS = (
    "invalidation",
    "crawl_stats",
    "render.demand",
    "management.analytics",
    "management.overrides.subscribe",
    "management.overrides.sync_interval",
    "sitemap.worker_index",
    "queue.claim_floor",
    "queue.claim_scan_cap",
    "queue.ready.enabled",
    "queue.ready.sweep_interval",
    "queue.ready.sweep_cap",
    "queue.keeper.enabled",
    # reference options with nothing to drive here: the overview's counts are exact and live, a page
    # read is a local RocksDB get, no orphan sweep exists (reconcile repairs), bulk writes batch by
    # their own sizes, and the queue-state document is computed when asked
    "management.scan_cap",
    "management.backlog_snapshot_interval",
    "page.blob_read_budget_ms",
    "render.orphan_sweep",
    "scan.batch_size",
    "scan.yield_every",
    "queue.keeper.state_interval",
)
# Reference keys that moved (old top-level path -> new path).
MOVED_PATHS = {
    "bot_path_prefix": "ingress.bot_path_prefix",
    "exclude_path_patterns": "ingress.exclude_path_patterns",
    "url.query_params": "cache_key.query_params",
    "security_token": "origin.security_token",
    "staging": "origin.staging",
    "user_agents": "origin.user_agents",
    "ignored_headers": "origin.ignored_headers",
    "sitemap_user_agent": "sitemap.user_agent",
    "crawl_stats.bots": "analytics.bots",
}
