"""The one configuration model: every option, its default and its constraints.

Snake_case is the canonical spelling; the reference plugin's camelCase names are accepted as aliases
so an existing deployment's options carry over. Durations are milliseconds (ints), or strings such as
``"30s"``, ``"6h"`` and ``"7d"``. Loading from YAML, unknown-key reporting and the environment secrets
live in ``config/loading.py``.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": SECOND, "m": MINUTE, "h": HOUR, "d": DAY, None: 1}


def _duration(value: Any) -> Any:
    """Accept ``90000`` or ``"90s"``; anything else is left for the int validator to reject (and a
    ValueError for a string past a float's range)."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            ms = float(m.group(1)) * _UNIT_MS[m.group(2)]
            if not math.isfinite(ms):  # 400 nines are an infinite float: int() would raise OverflowError
                raise ValueError("not a duration: too many digits")
            return int(ms)
    return value


def duration_ms(value: Any) -> int:
    """``90000`` or ``"90s"`` (ms, s, m, h, d) as milliseconds; ValueError for anything else."""
    ms = _duration(value)
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise ValueError(f"not a duration: {value!r} (milliseconds, or a number with ms, s, m, h or d)")
    return ms


# The longest duration: a century. Times are stored as 64-bit milliseconds, which a due time of now
# plus "9" * 300 + "d" would overflow where it is written (a 500, or a keeper's write failing).
MAX_DURATION_MS = 100 * 365 * DAY
Duration = Annotated[int, BeforeValidator(_duration), Field(le=MAX_DURATION_MS)]
PositiveDuration = Annotated[int, BeforeValidator(_duration), Field(gt=0, le=MAX_DURATION_MS)]
NonNegDuration = Annotated[int, BeforeValidator(_duration), Field(ge=0, le=MAX_DURATION_MS)]
NonEmptyStr = Annotated[str, Field(min_length=1)]

ROLES = ("admin", "viewer", "fleet")


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
        loc_by_alias=False,
    )


# --------------------------------------------------------------------------------------------- server


class Tls(Model):
    cert_file: str = Field(
        "",
        description="TLS certificate for the ingress (https callbackOrigin, as the reference fleet expects off loopback).",
    )
    key_file: str = Field("", description="TLS private key for the ingress.")


class Server(Model):
    host: str = Field("127.0.0.1", description="Address the ingress binds on every node.")
    port: int = Field(
        9926, ge=1, le=65535, description="Ingress port (a `prerender-port` node label overrides)."
    )
    replicas: int = Field(2, ge=1, le=32, description="Ingress replicas per node, sharing the port.")
    node_name: str = Field(
        "", description="Stable node name; default the host name; `prerender-node` label wins."
    )
    advertise_host: str = Field(
        "", description="Host the fleet and peers use for this node; default its Ray IP."
    )
    data_dir: str = Field("./data", description="Where each node keeps its RocksDB stores.")
    max_body_bytes: int = Field(
        10 * 1024 * 1024, ge=1024,
        description="Largest request body accepted (413). A bot request's body (methods other than GET "
                    "and HEAD) is streamed to the origin as it arrives, never held whole.",
    )
    header_timeout: PositiveDuration = Field(
        10_000,
        description="Deadline for a request's headers, from the connection's open or the first byte of "
                    "a further keep-alive request; a client slower than that is disconnected.",
    )
    keep_alive_timeout: PositiveDuration = Field(
        30_000, description="An idle keep-alive connection is closed after this long without a request."
    )
    write_timeout: PositiveDuration = Field(
        30_000,
        description="A client that does not take what it is sent for this long (writing paused with "
                    "64 KiB or more waiting, or bytes still waiting after the connection was closed), "
                    "or less than 16 KiB of it, is disconnected, its answer cut short.",
    )
    max_connections: int = Field(
        10_000, ge=16, le=1_000_000,
        description="Open client connections per ingress replica. Over it, a new connection replaces the "
                    "one that has waited longest without a request being served (headers still "
                    "arriving, or idle), or is closed at once when every connection is serving. Lowered "
                    "to half the process's open-file limit (raised toward twice this first).",
    )
    max_html_bytes: int = Field(
        20 * 1024 * 1024, ge=1024,
        description="Largest decoded page: a render result whose gzip/br body decodes to more is refused "
                    "(413); a stored or origin body is never decoded past it for a bot or the admin view.",
    )
    trusted_proxies: list[str] = Field(
        [],
        description="IPs/CIDRs of reverse proxies in front of the ingress: only their `X-Forwarded-For` "
        "and `X-Forwarded-Proto` are believed (client = right-most untrusted hop); empty: the TCP peer, "
        "always.",
    )
    tls: Tls = Tls()  # server.trusted_proxies entries are checked by config/loading.py


# -------------------------------------------------------------------------------------------- ingress


class Report(Model):
    enabled: bool = Field(
        True, description="Tally bot requests served without prerendering (unrouted paths)."
    )
    interval: Annotated[int, BeforeValidator(_duration), Field(ge=1000)] = Field(
        300_000, description="How often the unrouted tally is logged and reset."
    )
    max_buckets: int = Field(
        200, ge=1, description="Distinct path buckets per class before further ones only count as overflow."
    )
    top_n: int = Field(20, ge=1, description="Buckets listed per log line.")


class Ingress(Model):
    mode: Literal["prefix", "forwarded"] = Field(
        "prefix",
        description="How bots reach us: `prefix` (`/p/<absolute-url>`) or `forwarded` (behind a CDN).",
    )
    bot_path_prefix: NonEmptyStr = Field(
        "/p/", description="Prefix mode: path prefix before the absolute target URL."
    )
    device_type_source: Literal["header", "path"] = Field(
        "header", description="Forwarded mode: device from a header or from the first path segment."
    )
    device_type_header: NonEmptyStr = Field(
        "x-device-type",
        description="Header naming the device type (unknown values fall back to the first supported).",
    )
    forwarded_host_header: NonEmptyStr = Field(
        "x-forwarded-host",
        description="Forwarded mode: header with the original host (validated against injection).",
    )
    forwarded_proto_header: NonEmptyStr = Field(
        "x-forwarded-proto", description="Forwarded mode: header with the original scheme."
    )
    default_protocol: Literal["https", "http"] = Field(
        "https", description="Forwarded mode: scheme when the protocol header is absent."
    )
    # Entries are compiled (and bad ones dropped with a warning) by prerender_ray.identity.routes.
    routes: list[Any] = Field(
        default_factory=list,
        description="Ordered `{match: exact|prefix|contains, path, mode?, queryParams?, renderInterval?, deviceTypes?, guard?, scroll?, block?}`; first match wins (`guard`, `scroll`, `block`: a boolean, or fields of `render.guard` / `render.scroll` / `render.block` for the route).",
    )
    exclude_path_patterns: list[Any] = Field(
        default_factory=lambda: ["/search/"],
        description="Substrings whose paths are always proxied (passthrough), checked before `routes`.",
    )
    report: Report = Report()

    @field_validator("bot_path_prefix")
    @classmethod
    def _rooted(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must start with '/'")
        return v


class DeviceTypes(Model):
    supported: Annotated[list[NonEmptyStr], Field(min_length=1)] = Field(
        ["desktop", "mobile", "tablet"],
        description="Device types the service knows; the first is the fallback.",
    )
    default: list[NonEmptyStr] = Field(
        ["desktop", "mobile"], description="Devices scheduled for every target."
    )

    @field_validator("supported")
    @classmethod
    def _lower(cls, v: list[str]) -> list[str]:
        out = [d.lower() for d in v]
        if len(set(out)) != len(out):
            raise ValueError("device types must be unique")
        return out

    @model_validator(mode="after")
    def _default_supported(self) -> DeviceTypes:
        unknown = [d for d in self.default if d.lower() not in self.supported]
        if unknown:
            raise ValueError(f"default device types {unknown} are not in supported {self.supported}")
        return self


class CacheKey(Model):
    delimiter: NonEmptyStr = Field(
        "|", description="Joins the key attributes. Changing any cacheKey option re-keys everything."
    )
    attributes: Annotated[list[Literal["url", "deviceType"]], Field(min_length=1)] = Field(
        ["url", "deviceType"], description="Attribute order of a cache key."
    )
    query_params: list[str] = Field(
        ["page"], description="Global query allowlist (prefix mode): `[*]` keeps all, `[]` drops all."
    )
    decode_reserved: list[str] = Field(
        [":", ",", "@"],
        description="Reserved characters whose escapes are decoded, from `: , @ ; $ ' ( ) ! *`.",
    )
    trailing_slash: Literal["strip", "preserve"] = Field(
        "strip", description="`strip` one trailing slash (never the root) or `preserve` it."
    )
    plus_is_space: bool = Field(False, description="Fold `%20` to `+` in query values before sorting.")

    @field_validator("attributes")
    @classmethod
    def _attributes(cls, v: list[str]) -> list[str]:
        if "url" not in v or len(set(v)) != len(v):
            raise ValueError("must name url once, and each attribute at most once")
        return v


# --------------------------------------------------------------------------------------------- origin


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


class DebugHeader(Model):
    key: NonEmptyStr = Field(
        "x-harper-prerender-debug",
        description="Request header that adds the x-harper-* debug headers to a response.",
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


class PeerRescue(Model):
    enabled: bool = Field(
        False, description="Fetch a page from its owner when the local copy is missing or unreadable."
    )
    header: NonEmptyStr = Field("x-harper-peer-token", description="Header carrying the peer token.")
    token: str = Field(
        "",
        json_schema_extra={"secret": True},
        description="Peer token (secret; prefer valueEnv); empty disables peer rescue.",
    )
    value_env: str = Field("", description="Environment variable holding the peer token.")
    timeout_ms: PositiveDuration = Field(500, description="Deadline of a peer page fetch.")


class Cluster(Model):
    replicas: int = Field(
        3, ge=1, le=64,
        description="How many nodes hold each URL's target and pages: the first R of its rendezvous order, "
        "the owner first (every node when there are fewer). 1 keeps one copy: a node lost is its pages lost.",
    )
    holder_read_timeout_ms: PositiveDuration = Field(
        250, description="Deadline of one read from a holder by a node that holds no copy: the next holder "
        "is asked after it, the slower ones still heard; once every holder was asked, three deadlines more."
    )
    holder_cache_bytes: int = Field(
        16 * 1024 * 1024, ge=0, le=1 << 32,
        description="Bytes of pages read from holders that each ingress replica keeps (0: none).",
    )
    holder_cache_ttl_ms: PositiveDuration = Field(
        30_000, description="How long a page read from a holder is served from that cache."
    )


class LiveOverrides(Model):
    enabled: bool = Field(
        True, description="Admins may change the live options (routes, default interval, sitemap boost, bot policies) at runtime."
    )


class Management(Model):
    enabled: bool = Field(True, description="Serve the admin API and console.")
    overrides: LiveOverrides = LiveOverrides()
    proxy_to_owner: bool = Field(True, description="Explain asks the owning node for its schedule row.")
    peer_timeout_ms: PositiveDuration = Field(2_500, description="Deadline of admin calls to other nodes.")
    snapshot_table_counts: bool = Field(True, description="Show the exact target and page counts in the overview.")
    page_size: int = Field(50, ge=1, le=1000, description="Rows per page in admin lists.")
    openapi: Literal["off", "admin"] = Field(
        "off",
        description="`/openapi.json`, the list of every route: `off` (404; the port also faces bots), or "
                    "`admin` (admins only).",
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


HOST_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}$")
MAX_BLOCK_HOSTS = 200


def clean_host(value: str) -> str:
    """A host name lower-cased without its trailing dot; ValueError for anything else (a ``*`` or ``?``
    would widen the worker's CDP pattern past the host)."""
    value = value.strip().lower().strip(".")
    if not HOST_NAME.match(value):
        raise ValueError(f"not a host name: {value[:100]!r}")
    return value


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


# ----------------------------------------------------------------------------------------------- auth


class User(Model):
    name: NonEmptyStr
    password_env: str = ""
    password_hash: str = ""
    roles: Annotated[list[Literal["admin", "viewer", "fleet"]], Field(min_length=1)]

    @model_validator(mode="after")
    def _one_secret(self) -> User:
        if bool(self.password_env) == bool(self.password_hash):
            raise ValueError(f"user {self.name!r} needs exactly one of passwordEnv or passwordHash")
        if self.password_hash and not self.password_hash.startswith("pbkdf2_sha256$"):
            raise ValueError("passwordHash must come from `prerender-ray config hash-password`")
        return self


class Auth(Model):
    users: list[User] = Field(
        [],
        description="`{name, passwordEnv | passwordHash, roles: [admin|viewer|fleet]}`; none = loopback only.",
    )
    session_secret: str = Field(
        "",
        json_schema_extra={"secret": True},
        description="Key signing admin sessions and cursors (secret; prefer sessionSecretEnv); empty: "
        "a random key per deployment, made by `prerender-ray up`.",
    )
    session_secret_env: str = Field("", description="Env var holding the cookie-signing key; default random.")
    session_ttl: PositiveDuration = Field(12 * HOUR, description="Lifetime of an admin session cookie.")
    max_failed_logins_per_minute: int = Field(
        10, ge=1, description="Failed logins allowed per client and minute."
    )


# -------------------------------------------------------------------------------------------- the rest


BotClass = Literal["search", "ai-search", "ai-training", "social", "seo-tool", "other"]
BOT_CLASSES: tuple[str, ...] = get_args(BotClass)


class Bot(Model):
    name: NonEmptyStr
    match: NonEmptyStr
    bot_class: BotClass | None = None  # None: the built-in entry's class of this name, else other


class Analytics(Model):
    enabled: bool = Field(True, description="Count bot requests by bot name.")
    record_unmatched: bool = Field(
        True, description="Also count requests whose user agent matches no known bot."
    )
    derive_unknown_bots: bool = Field(
        True, description="Derive a bot name from an unknown bot-like user agent. A user agent is read up to "
                          "its first 1,024 characters."
    )
    missed_urls: int = Field(
        200, ge=0, le=10_000, description="URLs without a cached page kept per bot class for the admin "
        "`bots` report (the least recently asked evicted first; 0: none)."
    )
    # None = the built-in registry (prerender_ray.serving.bots.DEFAULT_BOTS); a list replaces it wholesale.
    bots: list[Bot] | None = Field(
        None, description="`{name, match, botClass?}` bot registry replacing the built-in one (null = built-in)."
    )


MAX_BOT_NAME = 100
MAX_DENY_BODY = 1024
MAX_RANGE_FILES = 50


class BotPolicy(Model):
    serve: Literal["prerender", "origin", "deny"] = Field(
        "prerender", description="`prerender` (the cache, then a miss as usual), `origin` (proxied to "
        "the origin: no cache read, no render) or `deny` (`bots.denyStatus` with `bots.denyBody`)."
    )
    discover: bool = Field(True, description="A miss the origin answers with an indexable page makes it a target.")
    require_signature: bool = Field(
        False, description="Only a request with a valid Web Bot Auth signature (`bots.webBotAuth`) gets this policy; "
        "any other is served as a failed claim (`bots.failedClass`, never discovers), whatever `whileUnverified` "
        "says: a missing signature never turns up later."
    )


def _bot_names(value: Any) -> Any:
    if isinstance(value, dict):
        for name in value:
            if not isinstance(name, str) or not 0 < len(name) <= MAX_BOT_NAME:
                raise ValueError(f"a bot name is 1 to {MAX_BOT_NAME} characters: {str(name)[:120]!r}")
    return value


def _host_suffixes(value: Any) -> Any:
    if isinstance(value, dict):
        value = _bot_names(value)
        return {k: [clean_host(h) if isinstance(h, str) else h for h in v] if isinstance(v, list) else v
                for k, v in value.items()}
    return value


class Verify(Model):
    enabled: bool = Field(
        False, description="Check that a request claiming a verifiable crawler comes from its operator "
        "(reverse DNS confirmed forward, or the operator's published IP ranges)."
    )
    deadline_ms: Annotated[int, BeforeValidator(_duration), Field(ge=1, le=5_000)] = Field(
        50, description="Longest a request waits for a check; then it is served unverified-for-now and the "
        "check finishes in the background."
    )
    lookup_timeout_ms: Annotated[int, BeforeValidator(_duration), Field(ge=10, le=30_000)] = Field(
        2_000, description="Deadline of one background check (both DNS lookups); past it the claim is unverified."
    )
    ttl: PositiveDuration = Field(6 * HOUR, description="How long a verified or failed answer is remembered per address.")
    retry_after: PositiveDuration = Field(
        MINUTE, description="How long an unverified answer (a lookup that timed out or errored) is remembered."
    )
    cache_size: int = Field(10_000, ge=1, le=1_000_000, description="Addresses remembered (least recent evicted).")
    max_pending: int = Field(64, ge=1, le=10_000, description="Checks running at once; further claims are unverified.")
    builtin_dns: bool = Field(
        True, description="Use the built-in reverse-DNS domains (Google, Bing, Apple, Yandex, Baidu, Amazon ...; "
        "`prerender_ray.serving.verification.BUILTIN_DNS`)."
    )
    dns: Annotated[dict[str, list[str]], BeforeValidator(_host_suffixes)] = Field(
        {}, description="Bot name -> domains its reverse DNS must be in (`googlebot.com` allows "
        "`crawl-1.googlebot.com`), then confirmed forward; replaces a built-in entry of that name."
    )
    ranges: Annotated[dict[str, list[str]], BeforeValidator(_bot_names)] = Field(
        {}, description="Bot name -> the operator's published IP ranges: absolute file paths or the operator's "
        "http(s) URLs (JSON `{prefixes: [{ipv4Prefix}|{ipv6Prefix}]}` or one CIDR a line); a bot with ranges is "
        "checked by them."
    )
    range_refresh: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND)] = Field(
        HOUR, description="How often the range files and URLs are read again (a bad read keeps the previous ranges)."
    )
    max_range_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="Largest range file read.")
    max_prefixes: int = Field(50_000, ge=1, le=1_000_000, description="Prefixes kept per range file.")
    while_unverified: Literal["claimed", "failed"] = Field(
        "claimed", description="A claim not verified yet (past the deadline, or its lookup timed out) is served "
        "as the bot it claims (`claimed`) or as a failed claim (`failed`)."
    )

    @field_validator("ranges")
    @classmethod
    def _files(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        if sum(len(files) for files in v.values()) > MAX_RANGE_FILES:
            raise ValueError(f"at most {MAX_RANGE_FILES} range files")
        for f in (f.strip() for files in v.values() for f in files):
            if f.startswith(("https://", "http://")):
                parts = urlsplit(f)
                if not parts.hostname or parts.username or parts.password or len(f) > 2048:
                    raise ValueError(f"a range URL is http(s)://host/path, without credentials: {f[:120]!r}")
            elif not f.startswith("/"):
                # every ingress replica reads them, in processes whose working directory is Ray's
                raise ValueError("a range source is an absolute path or an http(s) URL")
        return v


class DiscoveryBudget(Model):
    per_minute: int = Field(
        60, ge=0, le=100_000, description="New targets bot misses may make per site (the URL's host) and minute "
        "on each node, split over its ingress replicas (a minute's worth at once); 0: none. A URL with a target "
        "already costs nothing."
    )
    max_unrendered: int = Field(
        1_000, ge=0, le=1_000_000, description="Discovered targets per site that have had no render result yet, "
        "across the cluster (each owner node counts its share of the URLs); at it, misses of that site make "
        "no new target until results come."
    )


MAX_SIGNATURE_AGENTS = 64
MAX_AGENT_BOTS = 64  # bot names one signature agent may verify


def _agent_origins(value: Any) -> Any:
    """``https://host[:port]`` (``http`` for a loopback host only), as an origin: lower-cased, default port
    and a trailing ``/`` dropped."""
    if not isinstance(value, list):
        return value
    if len(value) > MAX_SIGNATURE_AGENTS:
        raise ValueError(f"at most {MAX_SIGNATURE_AGENTS} signature agents")
    out: list[Any] = []
    for entry in value:
        rest: dict[str, Any] = {}
        if isinstance(entry, dict):  # {origin, bots}: the origin spelled as a plain entry's
            rest, entry = dict(entry), entry.get("origin")
        if not isinstance(entry, str):
            return value  # the list validator says what is wrong
        text = entry.strip()
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError:
            raise ValueError(f"a signature agent is an origin such as https://agent.example: {text[:120]!r}") from None
        host = (parts.hostname or "").lower()
        loopback = host == "localhost" or _is_loopback_ip(host)
        if (parts.scheme.lower() not in ("https", "http") or not host or parts.username or parts.password
                or parts.path not in ("", "/") or parts.query or parts.fragment
                or (parts.scheme.lower() == "http" and not loopback)):
            raise ValueError(f"a signature agent is an https origin such as https://agent.example (http only on a "
                             f"loopback host): {text[:120]!r}")
        scheme = parts.scheme.lower()
        name = f"[{host}]" if ":" in host else host
        default = {"http": 80, "https": 443}[scheme]
        origin = f"{scheme}://{name}" if port in (None, default) else f"{scheme}://{name}:{port}"
        out.append({**rest, "origin": origin})
    return out


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SignatureAgent(Model):
    origin: str = Field(description="The agent's origin, e.g. `https://chatgpt.com`.")
    bots: list[Annotated[str, Field(min_length=1, max_length=MAX_BOT_NAME)]] | None = Field(
        None, max_length=MAX_AGENT_BOTS, description="The bot names (as `analytics.bots` names them, "
        "case-insensitive) its signature verifies; another name it signs for is `agent-mismatch`. Unset: any name but "
        "those verified by reverse DNS or ranges (`bots.verify.dns`, `ranges`, the built-in domains)."
    )


class WebBotAuthConfig(Model):
    agents: Annotated[list[SignatureAgent], BeforeValidator(_agent_origins)] = Field(
        [], description="Signature agents whose HTTP Message Signatures are verified (Web Bot Auth): an origin "
        "(`https://chatgpt.com`) or `{origin, bots}`. Their key directories are fetched, and a valid signature "
        "makes a request verified for the bot names the agent covers. Empty: off. A signature by any other agent "
        "counts as none and fetches nothing."
    )
    skew: Annotated[int, BeforeValidator(_duration), Field(ge=0, le=10 * MINUTE)] = Field(
        MINUTE, description="Clock difference allowed on a signature's `created` and `expires`."
    )
    max_age: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND, le=DAY)] = Field(
        5 * MINUTE, description="A signature is accepted this long after its `created` (the replay window), "
        "and never past its `expires`."
    )
    key_ttl: Annotated[int, BeforeValidator(_duration), Field(ge=MINUTE)] = Field(
        HOUR, description="How long an agent's key directory is used before it is fetched again (the last good "
        "copy stays in use while a fetch fails)."
    )
    retry_after: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND)] = Field(
        MINUTE, description="Least time between two fetches of one agent's key directory (a failed one, or one "
        "asked for by an unknown key id)."
    )
    fetch_timeout_ms: Annotated[int, BeforeValidator(_duration), Field(ge=100, le=60_000)] = Field(
        5_000, description="Deadline of one key-directory fetch, whole."
    )
    max_directory_bytes: int = Field(
        64 * 1024, ge=1024, le=1024 * 1024, description="Largest key directory read."
    )


class ContentSignals(Model):
    apply_as_defaults: bool = Field(
        False, description="A site's robots.txt `Content-Signal` (search, ai-input, ai-train) and `Content-Usage` "
        "(aipref: search, train-ai) lines set the policy of the matching class (search, ai-search, ai-training) "
        "for that site where the operator set none (`bots.classes`, `bots.named`): `allowed` for a yes, `refused` "
        "for a no. Read from the robots.txt discovery fetched (`robots`)."
    )
    allowed: BotPolicy = Field(BotPolicy(), description="Policy of a class whose use the site allows.")
    refused: BotPolicy = Field(
        BotPolicy(serve="deny", discover=False), description="Policy of a class whose use the site refuses."
    )


class Bots(Model):
    default: BotPolicy = Field(BotPolicy(), description="Policy of a class `classes` does not name.")
    classes: dict[BotClass, BotPolicy] = Field(
        {"search": BotPolicy()},
        description="Policy per bot class (search, ai-search, ai-training, social, seo-tool, other; "
        "`analytics.bots`). `search` (Googlebot, Bingbot ...) is prerendered by default: an explicit choice, "
        "since Google renders JavaScript itself and calls dynamic rendering a workaround.",
    )
    named: Annotated[dict[str, BotPolicy], BeforeValidator(_bot_names)] = Field(
        {}, description="Policy per bot name (e.g. `Googlebot`, case-insensitive), over its class's."
    )
    deny_status: int = Field(403, ge=400, le=599, description="Status of a `deny` answer.")
    deny_body: str = Field(
        "Forbidden", max_length=MAX_DENY_BODY, description="Body of a `deny` answer (text/plain)."
    )
    failed_class: BotClass = Field(
        "other", description="A claim that fails verification is served as this class (never by its name)."
    )
    verify: Verify = Verify()
    web_bot_auth: WebBotAuthConfig = WebBotAuthConfig()
    discovery: DiscoveryBudget = DiscoveryBudget()
    content_signals: ContentSignals = ContentSignals()

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
    if parts.scheme == "http" and not (parts.hostname == "localhost" or _is_loopback_ip(parts.hostname)):
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


class Logging(Model):
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of every process."
    )
    json_lines: Literal["auto", "always", "never"] = Field(
        "auto", description="JSON lines (`auto`: when not on a TTY)."
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
        False, description="Allow origin fetches to any host with an empty `domains` (open proxy)."
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
