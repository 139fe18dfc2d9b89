"""The sections on what is derived from rendered pages for agents and search engines: Markdown, llms.txt
and IndexNow submissions."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator, model_validator

from prerender_ray.config.base import (
    MINUTE,
    SECOND,
    Model,
    NonEmptyStr,
    NonNegDuration,
    PositiveDuration,
    _duration,
    is_loopback,
)
from prerender_ray.config.bots import BotClass


class Markdown(Model):
    enabled: bool = Field(
        True,
        description="Serve a rendered 200 page (cached, or rendered for the request by render-now or "
        "`render.onMiss`) as Markdown to a request whose `Accept` prefers `text/markdown` over `text/html` "
        "(the origin's answer to a miss is never converted).",
    )
    max_input_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="Largest decoded page converted; a larger one is served as HTML."
    )
    max_output_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest Markdown served; a page converting to more is served as HTML."
    )
    timeout_ms: PositiveDuration = Field(
        2 * SECOND, description="How long a request waits for a conversion before it is served HTML."
    )
    cache_bytes: int = Field(
        32 * 1024 * 1024, ge=0,
        description="Converted pages kept per ingress replica (gzip-coded Markdown, by page version; 0: none).",
    )
    for_bots: list[NonEmptyStr] = Field(
        [], description="Bot names (as `analytics.bots` names them, any case) that always get Markdown."
    )
    for_classes: list[BotClass] = Field(
        [], description="Bot classes (`bots`: the class a request is served as) that always get Markdown."
    )


class LlmsTxt(Model):
    enabled: bool = Field(
        False,
        description="Serve `/llms.txt` for a site (prefix mode `/p/<origin>/llms.txt`, forwarded mode `/llms.txt`): "
        "its rendered pages grouped by sitemap, each with its title, description and the URL that serves its Markdown.",
    )
    sites: list[str] = Field(
        [], description="Hosts whose llms.txt is served, as `domains` entries; empty: every host `domains` allows "
        "(none while `domains` is empty).",
    )
    sitemaps: list[str] = Field(
        [], description="Sections listed: sitemap URLs, or URL prefixes ending in `*`; empty: every sitemap's pages, "
        "and pages of no sitemap under 'Other pages'.",
    )
    max_entries: int = Field(1000, ge=1, le=50_000, description="Most pages listed; past it the list is cut, with a note.")
    include_discovered: bool = Field(
        False, description="Also list pages whose target only a bot's miss made (`bots.discovery`: anyone can send "
        "misses, so their URLs and titles are anyone's); a sitemap listing the URL or a `PUT /render_targets` "
        "confirms it.",
    )
    max_bytes: int = Field(
        512 * 1024, ge=4096, le=16 * 1024 * 1024, description="Largest document; past it the list is cut, with a note."
    )
    max_age: PositiveDuration = Field(
        10 * MINUTE, description="A document this old is rebuilt on its next request (which is served the old one)."
    )
    min_age: NonNegDuration = Field(
        30 * SECOND, description="A document younger than this is not rebuilt for new renders on the node; once "
        "older, the next request after a render rebuilds it.",
    )
    build_timeout: PositiveDuration = Field(30 * SECOND, description="Deadline of one build of a site's document.")

    @field_validator("sites")
    @classmethod
    def _sites(cls, v: list[str]) -> list[str]:  # each entry parsed as `domains` are (config/loading.py)
        return [d.strip().lower() for d in v if d.strip()]

    @field_validator("sitemaps")
    @classmethod
    def _sitemaps(cls, v: list[str]) -> list[str]:
        if any(not s.strip() or s.strip() == "*" for s in v):
            raise ValueError("a sitemaps entry is a sitemap URL or a URL prefix ending in '*'")
        return [s.strip() for s in v]


INDEXNOW_KEY = re.compile(r"[A-Za-z0-9-]{8,128}")
INDEXNOW_BATCH = 10_000  # the protocol's most URLs in one submission


def _indexnow_endpoint(url: str) -> str:
    """An IndexNow endpoint: an https URL (http only to a loopback host, for a local fake)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.fragment:
        raise ValueError(f"an endpoint is an https URL such as https://api.indexnow.org/indexnow, not {url!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(f"endpoint {url!r}: http only to a loopback host; use https")
    return url.strip()


class IndexNow(Model):
    enabled: bool = Field(
        False, description="Tell search engines (IndexNow) about pages whose rendered content changed: the owner "
        "of each URL submits it, batched per host, to `endpoints`. Only hosts in `hosts`."
    )
    key: str = Field(
        "", description="The IndexNow key (8-128 of a-z, A-Z, 0-9, '-'); served as text at `/<key>.txt` on each "
        "of `hosts` (prefix mode `/p/<origin>/<key>.txt`)."
    )
    hosts: list[str] = Field(
        [], description="Host names whose changed pages are submitted; each must be the host of a `domains` entry "
        "(config/loading.py checks it)."
    )
    endpoints: Annotated[list[Annotated[str, BeforeValidator(_indexnow_endpoint)]], Field(min_length=1, max_length=8)] = (
        Field(["https://api.indexnow.org/indexnow"], description="IndexNow endpoints each batch is posted to.")
    )
    flush_interval: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND)] = Field(
        MINUTE, description="How often queued URLs are submitted (a host's queue that reaches `batchSize` sooner)."
    )
    batch_size: int = Field(INDEXNOW_BATCH, ge=1, le=INDEXNOW_BATCH, description="Most URLs in one submission.")
    include_discovered: bool = Field(
        False, description="Also submit pages whose target only a bot's miss made (`bots.discovery`: anyone can "
        "send misses); a sitemap listing the URL or a `PUT /render_targets` confirms it.",
    )
    min_interval: NonNegDuration = Field(
        10 * SECOND, description="Rate limit: least time between two requests to one endpoint."
    )
    max_queued: int = Field(
        100_000, ge=1, le=1_000_000, description="URLs waiting per endpoint; past it the oldest are dropped (counted)."
    )
    max_attempts: int = Field(
        3, ge=1, le=10, description="Tries of one submission (a timeout, a connection error, 429 or 5xx is tried "
        "again after `retryBackoff`, doubled each time); then its URLs are dropped (counted)."
    )
    retry_backoff: PositiveDuration = Field(5 * SECOND, description="Wait before the first retry of a submission.")
    timeout_ms: Annotated[int, BeforeValidator(_duration), Field(ge=100, le=60_000)] = Field(
        10_000, description="Deadline of one submission request, whole."
    )

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if v and not INDEXNOW_KEY.fullmatch(v):
            raise ValueError("the key is 8-128 characters of a-z, A-Z, 0-9 and '-'")
        return v

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, v: list[str]) -> list[str]:
        return [h.strip().lower() for h in v if h.strip()]

    @model_validator(mode="after")
    def _complete(self) -> IndexNow:
        if self.enabled and (not self.key or not self.hosts):
            raise ValueError("indexNow.enabled needs a key and at least one host")
        return self
