"""The sections on when and how pages are rendered: page lifetimes, render-now, the render section (status
pages, on-miss renders, the guard, scrolling, blocked hosts, suppression, retries, reconcile), the
render queue and the fleet's broadcast."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator

from prerender_ray.config.base import (
    DAY,
    HOUR,
    MINUTE,
    SECOND,
    Model,
    NonEmptyStr,
    NonNegDuration,
    PositiveDuration,
    _duration,
    clean_host,
)


class Page(Model):
    ttl: PositiveDuration = Field(
        DAY, description="Render interval for sitemap entries without a usable changefreq."
    )
    min_ttl: PositiveDuration = Field(
        6 * HOUR, description="Floor for changefreq-derived intervals (`hourly` and `always` become this)."
    )
    swr_ttl: NonNegDuration = Field(
        3 * HOUR, description="Stale-while-revalidate: how long after expiry a page is still served."
    )


class RenderNow(Model):
    enabled: bool = Field(False, description="Let authorized bot requests render a page on demand.")
    header: str = Field("x-harper-render-now", description="Request header carrying the render-now token.")
    token: str = Field(
        "",
        json_schema_extra={"secret": True},
        description="Render-now token (secret; prefer valueEnv); empty disables the feature.",
    )
    value_env: str = Field("", description="Environment variable holding the render-now token.")
    miss_header: str = Field(
        "x-harper-render-miss", description="Request header choosing `prerender` or `origin` on a miss."
    )
    default_miss_mode: Literal["prerender", "origin"] = Field(
        "prerender", description="Miss mode of an authorized request without the miss header."
    )
    timeout_ms: Annotated[int, BeforeValidator(_duration), Field(ge=1)] = Field(
        30_000, description="How long a render-now request waits for the render."
    )
    poll_interval_ms: Annotated[int, BeforeValidator(_duration), Field(ge=10)] = Field(
        250, description="How often a render-now request looks for the new page."
    )
    fallback: Literal["origin", "stale", "error"] = Field(
        "origin", description="After the timeout: `origin`, `stale` (the cached page) or `error` (504)."
    )


# --------------------------------------------------------------------------------------------- render


class Gone(Model):
    recheck_interval: PositiveDuration = Field(
        14 * DAY, description="Recheck interval of a target suppressed for 404/410."
    )
    max_strikes: int = Field(
        2, ge=1, description="Consecutive 404/410 verdicts before the target is deleted."
    )


class Suppression(Model):
    recheck_interval: PositiveDuration = Field(
        7 * DAY, description="Recheck interval of a suppressed (non-indexable) target."
    )
    max_strikes: int = Field(
        4, ge=1, description="Consecutive non-indexable verdicts before the target is deleted."
    )
    gone: Gone = Gone()


class FailureRetry(Model):
    fast_retries: int = Field(2, ge=0, description="Failures retried at lease expiry before backing off.")
    backoff_factor: float = Field(2, ge=1, description="Growth of the wait per further failure.")
    max_backoff: PositiveDuration = Field(
        7 * DAY, description="Longest wait after failures (never below the page's cadence)."
    )
    non_sitemap_penalty: float = Field(
        4, ge=1, description="Extra factor for failing pages not listed in a sitemap."
    )


class Redirects(Model):
    max_strikes: int = Field(
        4, ge=1, description="Temporary redirects in a row before the source target is retired."
    )


class Reconcile(Model):
    enabled: bool = Field(True, description="Periodically restore schedule rows missing for owned targets.")
    interval: Annotated[int, BeforeValidator(_duration), Field(ge=1000)] = Field(
        6 * HOUR, description="How often reconcile runs."
    )
    start_delay: NonNegDuration = Field(5 * MINUTE, description="Delay of the first reconcile after start.")
    start_jitter: NonNegDuration = Field(
        5 * MINUTE, description="Per-node stagger added to the first reconcile."
    )
    max_restores: int = Field(5_000, ge=1, description="Cap on rows restored per reconcile pass.")


class OnMiss(Model):
    enabled: bool = Field(
        False, description="A bot's miss of a page never cached (prerender route, GET) makes it due at once "
        "and waits for its render (concurrent misses of a key share one wait); then the origin answers."
    )
    wait_ms: PositiveDuration = Field(8 * SECOND, description="How long such a miss waits for the render.")


class StatusPages(Model):
    enabled: bool = Field(
        True, description="Serve a rendered page's own status to bots: a `prerender-status-code` 4xx with the "
        "rendered body, a 301/302/307/308 with its `Location` (an allowed host only)."
    )
    keep_for: PositiveDuration = Field(
        30 * DAY, description="How long a status page is served after its verdict (or its target's "
        "retirement); a recheck renews it."
    )


class Scroll(Model):
    mode: Literal["auto", "bottom", "off"] = Field(
        "auto", description="Scroll before the settle check so lazy sections load: auto (only pages that "
        "watch scrolling or intersections and are taller than the screen), bottom (every page), off."
    )
    max_steps: int = Field(20, ge=1, le=200, description="Screens scrolled at most (an endless feed stops here).")
    budget_ms: PositiveDuration = Field(
        3 * SECOND, le=60 * SECOND, description="Time spent scrolling at most (within the render budget; "
        "a quarter of that budget is always left for settling)."
    )


MAX_BLOCK_HOSTS = 200


def _block_host(value: Any) -> Any:
    return clean_host(value) if isinstance(value, str) else value


BlockHost = Annotated[str, BeforeValidator(_block_host)]


class Block(Model):
    hosts: tuple[BlockHost, ...] = Field(
        (), max_length=MAX_BLOCK_HOSTS, description="Hosts (and their subdomains) whose requests a render "
        "fails, added to the worker's list."
    )
    defaults: bool = Field(
        True, description="Keep the worker's maintained list of analytics, tag-manager, ad, consent and "
        "chat hosts (false: only `hosts` and the worker's own --block-host)."
    )


MAX_MARKERS = 50
MAX_MARKER_CHARS = 500


def _marker(value: Any) -> Any:
    """A plain marker is any text; ``re:`` ones must compile (a typo would match nothing, silently)."""
    if isinstance(value, str) and value.startswith("re:"):
        try:
            re.compile(value[3:].encode(), re.IGNORECASE | re.DOTALL)
        except re.error as e:
            raise ValueError(f"not a regular expression: {value[3:]!r}: {e}") from None
    return value


Marker = Annotated[str, Field(min_length=1, max_length=MAX_MARKER_CHARS), BeforeValidator(_marker)]


class Guard(Model):
    enabled: bool = Field(
        True, description="A bad render (an empty shell, the site's not-found view, or one that lost most of "
        "the stored page's text or links) keeps the stored page and goes to the failure lane."
    )
    min_text_chars: int = Field(
        20, ge=0, description="Visible text (characters outside tags, scripts and styles) below which a render "
        "is an empty shell; 0 turns this check off."
    )
    not_found_markers: tuple[Marker, ...] = Field(
        (), max_length=MAX_MARKERS, description="Text of the site's not-found view (case-insensitive, in the "
        "visible text or title), or `re:<regex>` searched in the markup outside scripts."
    )
    keep_fraction: float = Field(
        0.3, ge=0, le=1, description="A render keeping less than this share of the stored page's text or "
        "links has lost them (0 turns this check off)."
    )
    min_stored_chars: int = Field(
        500, ge=0, description="Lost text counts only when the stored page has at least this much visible text."
    )
    min_stored_links: int = Field(
        20, ge=0, description="Lost links count only when the stored page has at least this many links."
    )
    accept_after: int = Field(
        3, ge=0, description="A loss of text or links refused this many times in a row is a real change: the "
        "next such render is stored (0: never). Empty shells and not-found views are never accepted."
    )


class Render(Model):
    default_interval: PositiveDuration = Field(
        DAY, description="Cadence of targets without a route or stored interval."
    )
    first_render: Literal["now", "staggered"] = Field(
        "now", description="When a new target (sitemap, PUT, discovery) is first due: now (ranked behind "
        "older overdue work), its next render then on the URL's slot within the cadence; or staggered "
        "over the cadence (the reference)."
    )
    status_pages: StatusPages = StatusPages()
    on_miss: OnMiss = OnMiss()
    guard: Guard = Guard()
    scroll: Scroll = Scroll()
    block: Block = Block()
    suppression: Suppression = Suppression()
    failure_retry: FailureRetry = FailureRetry()
    redirects: Redirects = Redirects()
    reconcile: Reconcile = Reconcile()


class Scan(Model):
    collect_cap: int = Field(
        100_000, ge=1, description="Cap on URLs collected by bulk operations (revalidate, sitemap prune)."
    )


# ---------------------------------------------------------------------------------------------- queue


class Ready(Model):
    capacity: int = Field(5_000, ge=0, description="Size of the ready set published by the keeper.")
    sitemap_boost: float = Field(2, ge=1, description="Score multiplier of sitemap-listed pages.")


class Keeper(Model):
    publish_interval: Annotated[int, BeforeValidator(_duration), Field(ge=100)] = Field(
        SECOND, description="How often the keeper publishes the ready set."
    )
    verify_interval: NonNegDuration = Field(
        HOUR, description="How often the keeper verifies its rows against RocksDB (0 = never)."
    )


class Queue(Model):
    job_lease_time: Annotated[int, BeforeValidator(_duration), Field(ge=2 * MINUTE)] = Field(
        10 * MINUTE,
        description="Lease of a claimed job (minimum 2 minutes: the fleet skips jobs with < 30 s left).",
    )
    status_sync_interval: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND)] = Field(
        MINUTE, description="How often a node re-resolves its pause intent and status."
    )
    max_claim_limit: int = Field(25, ge=1, le=1000, description="Largest `limit` a claim may ask for.")
    max_leases: int = Field(4_096, ge=1, description="Capacity of a node's lease table.")
    ready: Ready = Ready()
    keeper: Keeper = Keeper()


# ---------------------------------------------------------------------------------------------- fleet


class Mqtt(Model):
    url: str = Field(
        "", description="Broker URL, e.g. mqtt://127.0.0.1:1883, without credentials (`username`, `passwordEnv`); "
        "empty disables the broadcast."
    )
    topic_prefix: NonEmptyStr = Field(
        "queue_status", description="Topic prefix: status goes to `<prefix>/<host>`, retained."
    )
    username: str = Field("", description="Broker user name.")
    password: str = Field("", description="Broker password (secret; prefer passwordEnv).")
    password_env: str = Field("", description="Environment variable holding the broker password.")
    client_id: str = Field("", description="Client id prefix (default `prerender-ray-<node>`).")

    @field_validator("url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if v and not re.match(r"^(mqtt|mqtts|ws|wss)://[^/\s]+", v):
            raise ValueError("must be mqtt://, mqtts://, ws:// or wss:// with a host")
        parts = urlsplit(v)
        if parts.username or parts.password:  # the client never logs in with them; the config view shows them
            raise ValueError("must not carry credentials: set fleet.mqtt.username and fleet.mqtt.passwordEnv instead")
        return v


class Fleet(Model):
    mqtt: Mqtt = Mqtt()
    drain_period: Annotated[int, BeforeValidator(_duration), Field(ge=0, le=10 * MINUTE)] = Field(
        30 * SECOND,
        description="On a stop (SIGTERM, Ctrl-C, `prerender-ray down`) each node first says `paused` "
        "(retained MQTT message, `GET /queue_status`; claims get `[]`), then keeps accepting results "
        "for the leases it granted for at most this long, ending early once none is outstanding; "
        "0: stop right after saying paused.",
    )
