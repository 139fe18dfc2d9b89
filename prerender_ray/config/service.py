"""The sections that run the service and let it be reached: the server, the ingress (how bots reach
it, device types, cache keys, the debug header), the cluster and peer rescue, management, admin
auth and logging."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from prerender_ray.config.base import HOUR, Model, NonEmptyStr, PositiveDuration, _duration

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

    @field_validator("host")
    @classmethod
    def _bindable(cls, v: str) -> str:
        # what a listener binds: a bracketed IPv6 literal is a URL's spelling, which bind cannot resolve
        v = v.strip()
        if v.startswith("[") or v.endswith("]"):
            raise ValueError("a bracketed IPv6 literal cannot be bound: write it without brackets (::1), or "
                             "give a host name or an IPv4 address such as 127.0.0.1 or 0.0.0.0")
        return v


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


class DebugHeader(Model):
    key: NonEmptyStr = Field(
        "x-harper-prerender-debug",
        description="Request header that adds the x-harper-* debug headers to a response.",
    )


# -------------------------------------------------------------------------------------------- cluster


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


# ----------------------------------------------------------------------------------------- management


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


# ----------------------------------------------------------------------------------------------- auth


ROLES = ("admin", "viewer", "fleet")


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


# -------------------------------------------------------------------------------------------- logging


class Logging(Model):
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of every process."
    )
    json_lines: Literal["auto", "always", "never"] = Field(
        "auto", description="JSON lines (`auto`: when not on a TTY)."
    )
