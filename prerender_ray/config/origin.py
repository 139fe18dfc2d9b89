"""The sections on what is fetched from the origin: origin fetches (the security token, staging pin,
user agents and limits), sitemap walks and robots.txt."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, field_validator

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
)


class SecurityToken(Model):
    header: NonEmptyStr = Field(
        "x-harper-renderer-bypass", description="Header carrying the security token on origin fetches."
    )
    value: str = Field(
        "",
        json_schema_extra={"secret": True},
        description="Security token sent to the origin (secret; prefer valueEnv).",
    )
    value_env: str = Field("", description="Environment variable holding the security token.")


class Staging(Model):
    ip: str = Field("", description="Pin origin fetches of requests carrying the staging header to this IP.")
    header: str = Field("x-harper-staging", description="Request header that turns staging pinning on.")

    @field_validator("ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        if v:
            ipaddress.ip_address(v)  # ValueError names the problem
        return v


_UA_TAIL = "HarperProxy/1.0"


class UserAgents(Model):
    model_config = ConfigDict(extra="allow")  # one entry per supported device type
    desktop: str = (
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/W.X.Y.Z "
        f"Safari/537.36 {_UA_TAIL}"
    )
    mobile: str = (
        "Mozilla/5.0 (Linux; Android 11; Pixel 5) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/W.X.Y.Z "
        f"Mobile Safari/537.36 {_UA_TAIL}"
    )
    tablet: str = (
        "Mozilla/5.0 (Linux; Android 7.0; Pixel C Build/NRD90M; wv) AppleWebKit/537.36 (KHTML, like Gecko) "
        f"Version/4.0 Chrome/52.0.2743.98 Safari/537.36 {_UA_TAIL}"
    )

    def for_device(self, device: str) -> str:
        if device in type(self).model_fields:
            return getattr(self, device) or self.desktop
        return (self.model_extra or {}).get(device) or self.desktop


class Origin(Model):
    security_token: SecurityToken = SecurityToken()
    staging: Staging = Staging()
    user_agents: UserAgents = Field(
        UserAgents(), description="User agent per device type for origin fetches (desktop is the fallback)."
    )
    ignored_headers: list[str] = Field([], description="Bot request headers never forwarded to the origin.")
    max_response_header_bytes: int = Field(
        65536, ge=16384, le=1048576, description="Largest origin response head accepted."
    )
    connect_timeout_ms: PositiveDuration = Field(5_000, description="Deadline to connect to the origin.")
    read_timeout_ms: PositiveDuration = Field(
        15_000, description="Deadline for each read from the origin (headers and body)."
    )
    max_body_bytes: int = Field(20 * 1024 * 1024, ge=1024, description="Largest origin body relayed.")
    proxy_other_methods: bool = Field(
        True,
        description="Proxy a bot's POST, PUT, PATCH, DELETE and OPTIONS requests to the origin, with their body "
                    "and the security token (the reference proxies every method; other ones, TRACE included, are a "
                    "405 here). false: answer them 405 (Allow: GET, HEAD) and send nothing, for an origin that "
                    "lets the token skip its bot or firewall checks.",
    )


# ------------------------------------------------------------------------------------------- sitemaps


class Sitemap(Model):
    refresh_time: NonEmptyStr = Field(
        "12:00", description="Local time (HH:MM) of the daily refresh of every root sitemap."
    )
    timezone: NonEmptyStr = Field("America/New_York", description="IANA time zone of refreshTime.")
    filtered_warn_percent: int = Field(
        50, ge=0, le=100, description="Share of entries filtered by routes that logs an error."
    )
    node: str = Field("", description="Node that runs the daily refresh of every root; empty disables it.")
    background: bool = Field(True, description="Sitemap walks run in the background by default.")
    stale_run_ms: PositiveDuration = Field(
        10 * MINUTE, description="A running walk without progress for this long may be taken over."
    )
    removed_sample_cap: int = Field(20, ge=0, description="URLs listed in a result's removedSample.")
    failed_cap: int = Field(
        100, ge=0, description="Failed children listed in a result (the rest are counted)."
    )
    user_agent: NonEmptyStr = Field("HarperSitemapCrawler/1.0", description="User agent of sitemap fetches.")
    max_bytes: int = Field(50 * 1024 * 1024, ge=1024, description="Cap on one document, decompressed.")
    max_entries: int = Field(50_000, ge=1, description="Cap on entries per document.")
    max_documents: int = Field(1_000, ge=1, description="Cap on documents per walk.")
    fetch_timeout_ms: PositiveDuration = Field(60_000, description="Deadline of one sitemap document fetch.")
    lastmod_within: NonNegDuration = Field(
        HOUR, description="A refresh whose entry's lastmod is newer than the page's last render makes it "
        "due within this window, paced by key (0: due at once)."
    )

    @field_validator("refresh_time")
    @classmethod
    def _hhmm(cls, v: str) -> str:
        if not re.fullmatch(r"([01]?\d|2[0-3]):[0-5]\d", v.strip()):
            raise ValueError("must be HH:MM")
        return v.strip()

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo

        try:
            ZoneInfo(v)
        except Exception as e:
            raise ValueError(f"unknown time zone {v!r}") from e
        return v


class RobotsDiscovery(Model):
    enabled: bool = Field(
        False, description="Fetch every domain's robots.txt on an interval and walk the sitemaps it lists "
        "(on the node named by sitemap.node)."
    )
    interval: Annotated[int, BeforeValidator(_duration), Field(ge=MINUTE)] = Field(
        DAY, description="How often robots.txt discovery runs."
    )


class Robots(Model):
    max_bytes: int = Field(
        500 * 1024, ge=1024, le=10 * 1024 * 1024,
        description="robots.txt is read and parsed up to this many bytes (500 KiB, what Google reads).",
    )
    max_sitemaps: int = Field(
        50, ge=0, le=1000, description="Sitemap: lines walked per robots.txt (the rest are reported)."
    )
    fetch_timeout_ms: PositiveDuration = Field(10 * SECOND, description="Deadline of one robots.txt fetch.")
    ttl: NonNegDuration = Field(
        DAY, description="A robots.txt fetched more recently than this is reused by discovery."
    )
    discovery: RobotsDiscovery = RobotsDiscovery()
