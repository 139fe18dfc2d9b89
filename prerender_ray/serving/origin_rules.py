"""Rules for a bot request that reaches the origin: what we send, what we relay back, and the
decisions around it (staging pinning, discovery candidacy, the render-now serving policy).

Header names compare case-insensitively throughout: configured names are lowercased before use, so
a lowercase spoof of a mixed-case configured header is still caught.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from prerender_ray.config.origin import Origin, Staging
from prerender_ray.config.render import RenderNow
from prerender_ray.serving.negotiation import parse_accept_encoding

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded: hop-by-hop, what we set ourselves, the bot's credentials, the framing of a
# body the outgoing client re-frames (content-length), Range: a miss relays the whole page (a
# 206 is refused), which the bot's Range must not turn into a byte of it; and Max-Forwards, with
# which a proxy before the origin answers an OPTIONS (or a TRACE: never sent) itself.
_ALWAYS_IGNORED = HOP_BY_HOP | {
    "host",
    "user-agent",
    "accept-encoding",
    "cookie",
    "authorization",
    "content-length",
    "range",
    "max-forwards",
}
# The client's address as a client may claim it: never forwarded, or the origin's rate limits and
# allowlists would take a bot's word for who it is. A bypass sends the address we know instead
# (``client``); a shared miss sends none (``origin_request_headers``).
CLIENT_ADDRESS = frozenset({"x-forwarded-for", "x-real-ip", "true-client-ip", "cf-connecting-ip", "forwarded",
                            "x-client-ip", "x-cluster-client-ip", "fastly-client-ip"})
# Forwarded, but not told apart when misses share a fetch: they name the request (a CDN sets them anew
# for each), never which page it gets; the cache answers every client alike as well.
PER_CLIENT = frozenset({"cf-ray", "x-request-id", "x-amzn-trace-id", "x-cloud-trace-context", "traceparent",
                        "tracestate"})


def shared_fetch_key(forward: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """What of the headers sent to the origin tells misses apart for one shared fetch."""
    return tuple(pair for pair in forward if pair[0].lower() not in PER_CLIENT)


VALIDATORS = frozenset({"if-none-match", "if-modified-since", "if-match", "if-unmodified-since", "if-range"})

# Origin response headers relayed to the bot; everything else (set-cookie, CDN headers) is dropped.
RELAYED_HEADERS = frozenset(
    {
        "content-type",
        "content-encoding",
        "content-length",
        "cache-control",
        "expires",
        "etag",
        "last-modified",
        "vary",
        "x-robots-tag",
        "retry-after",
    }
)
# Relayed on a 3xx only: a redirect without its target is useless (the reference drops it).
REDIRECT_HEADERS = frozenset({"location"})

_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_UNSAFE_VALUE = re.compile(r"[\r\n\x00]")
PRERENDER_MIMES = frozenset({"text/html", "application/xhtml+xml"})
# `none` means noindex, nofollow (Google's robots directives); the reference checks noindex alone.
_NOINDEX = frozenset({"noindex", "none"})


@lru_cache(maxsize=32)
def _ignored(names: tuple[str, ...]) -> frozenset[str]:
    return _ALWAYS_IGNORED | CLIENT_ADDRESS | {n.strip().lower() for n in names if n.strip()}


def ignored_request_headers(origin: Origin, debug_key: str, render_now: RenderNow) -> frozenset[str]:
    """Lowercase names of downstream headers never forwarded to the origin.

    Beyond the reference: the render-now token and miss headers, so the token never leaks."""
    return _ignored(
        (
            origin.security_token.header,
            debug_key,
            render_now.header,
            render_now.miss_header,
            *origin.ignored_headers,
        )
    )


def origin_request_headers(
    request_headers: Iterable[tuple[str, str]],
    *,
    device_type: str,
    origin: Origin,
    debug_key: str,
    render_now: RenderNow,
    strip_validators: bool = False,
    client: str | None = None,
) -> list[tuple[str, str]]:
    """The headers of the origin fetch for a bot request carrying ``request_headers`` (pairs).

    Our own first: the device's user agent, the security token under its configured casing (sent
    even when empty), ``accept-encoding`` (``origin_coding``), ``x-forwarded-for: client`` when given (the address
    we know: the TCP peer, or the client a trusted proxy forwards for); then every downstream header
    not ignored (a client's claims of its own address, ``CLIENT_ADDRESS``, are). Headers named by
    ``Connection`` are hop-by-hop too (RFC 9110 section 7.6.1); malformed names and values that could
    split a header are dropped."""
    pairs = [(name.lower(), value) for name, value in request_headers]
    ignored = ignored_request_headers(origin, debug_key, render_now)
    named_by_connection = {
        token.strip().lower() for name, value in pairs if name == "connection" for token in value.split(",")
    }
    out = [
        ("user-agent", origin.user_agents.for_device(device_type)),
        (origin.security_token.header, origin.security_token.value),
        ("accept-encoding", origin_coding(", ".join(value for name, value in pairs if name == "accept-encoding"))),
    ]
    if client and not _UNSAFE_VALUE.search(client):
        out.append(("x-forwarded-for", client))
    for name, value in pairs:
        if name in ignored or name in named_by_connection or (strip_validators and name in VALIDATORS):
            continue
        if not _FIELD_NAME.fullmatch(name) or _UNSAFE_VALUE.search(value):
            continue
        out.append((name, value))
    return out


def origin_coding(accept_encoding: str) -> str:
    """What the origin is asked for: gzip when the bot accepts it, else identity. So its answer is
    passed through, never decoded for the bot: a gzip answer decoded for one that does not accept it
    took up to ``server.maxHtmlBytes`` (20 MB) of the event loop, for a few KB from the origin. Two
    values only, so misses that differ in their Accept-Encoding alone still share fetches by the two."""
    return "gzip" if parse_accept_encoding(accept_encoding).q("gzip") > 0 else "identity"


def relay_headers(
    status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str] | None
) -> dict[str, str]:
    """The origin response headers relayed to the bot, lowercase; repeated fields joined by ", "."""
    if headers is None:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    allowed = RELAYED_HEADERS | REDIRECT_HEADERS if 300 <= status < 400 else RELAYED_HEADERS
    out: dict[str, str] = {}
    for name, value in pairs:
        name = name.lower()
        if name in allowed:
            out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def staging_ip(staging: Staging, request_headers: Mapping[str, str]) -> str | None:
    """The IP to pin the origin connection to, when staging applies to this request: a valid IP is
    configured, the header name is non-empty and the request carries that header non-empty."""
    header = staging.header.strip().lower()
    if not staging.ip or not header or not (request_headers.get(header) or "").strip():
        return None
    try:
        return str(ipaddress.ip_address(staging.ip))
    except ValueError:
        return None


def is_prerender_candidate(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an origin response (lowercase ``headers``) may enter the render schedule: a 200 HTML
    page without a noindex robots directive (``googlebot: noindex`` counts)."""
    if status != 200:
        return False
    mime = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if mime not in PRERENDER_MIMES:
        return False
    for directive in headers.get("x-robots-tag", "").split(","):
        directive = directive.strip().lower()
        if ":" in directive:
            directive = directive.split(":", 1)[1].strip()
        if directive in _NOINDEX:
            return False
    return True


MissMode = Literal["prerender", "origin"]
_MISS_MODES: dict[str, MissMode] = {"prerender": "prerender", "origin": "origin"}


@dataclass(frozen=True, slots=True)
class ServingPolicy:
    authorized: bool = False
    skip_cache: bool = False
    miss_mode: MissMode = "origin"
    miss_mode_explicit: bool = False


_UNAUTHORIZED = ServingPolicy()


def _utf8(value: str) -> bytes:
    # compare_digest takes str only when ASCII; header values may be latin-1
    return value.encode("utf-8", "surrogatepass")


def _cache_control_tokens(value: str) -> set[str]:
    return {item.split("=", 1)[0].strip().lower() for item in value.split(",")}


def serving_policy(
    render_now: RenderNow, *, route_class: str, method: str, request_headers: Mapping[str, str]
) -> ServingPolicy:
    """The render-now policy (docs/serving.md#render-now). Authorized only for a GET on a prerender route
    with the feature enabled and the header equal to the non-empty token, compared in constant time."""
    header = render_now.header.strip().lower()
    if not (
        render_now.enabled and header and render_now.token and route_class == "prerender" and method == "GET"
    ):
        return _UNAUTHORIZED
    presented = request_headers.get(header)
    if presented is None or not hmac.compare_digest(_utf8(presented), _utf8(render_now.token)):
        return _UNAUTHORIZED
    skip = bool(_cache_control_tokens(request_headers.get("cache-control", "")) & {"no-cache", "no-store"})
    asked = _MISS_MODES.get(
        (request_headers.get(render_now.miss_header.strip().lower()) or "").strip().lower()
    )
    if asked is None:
        return ServingPolicy(True, skip, render_now.default_miss_mode, False)
    return ServingPolicy(True, skip, asked, True)


MAX_BUCKET_SEGMENT = 64  # characters of a first segment that names an unrouted bucket
# What a canonical URL's path segment is made of (printable ASCII, percent-encoded past it)
_BUCKET_SEGMENT = re.compile(rf"[!-.0-~]{{1,{MAX_BUCKET_SEGMENT}}}")


def bucket_for_unrouted(path: object, source: str = "cdn") -> str | None:
    """The unrouted-tally bucket: the first path segment, with ``/*`` when the path goes deeper;
    ``/`` for the root, empty or non-string paths. Sources other than ``cdn`` get a suffix. None for
    a segment no site names (over ``MAX_BUCKET_SEGMENT`` characters, or not a canonical URL's): a
    client chooses it, so it gets no bucket or metric label of its own."""
    bucket = "/"
    if isinstance(path, str):
        segment, deeper, _ = path.removeprefix("/").partition("/")
        if segment:
            if _BUCKET_SEGMENT.fullmatch(segment) is None:
                return None
            bucket = f"/{segment}/*" if deeper else f"/{segment}"
    return bucket if source == "cdn" else f"{bucket} ({source})"
