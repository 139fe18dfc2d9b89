"""The serve decision for one bot request, pure: which answer a cached page or an origin response
becomes (status, headers, body), given the request's headers.

The order is fixed (docs/serving.md#response-headers): the stored or relayed headers -> content-coding
negotiation (q-values honoured, ``Vary: Accept-Encoding``) -> the conditional downgrade to 304 (a 200 only) ->
the debug headers, added last so they survive a 304. HEAD gets exactly the GET's headers and no body.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prerender_ray.decoding import MAX_HTML_BYTES
from prerender_ray.serving.conditional import conditional_response, is_not_modified, not_modified_headers
from prerender_ray.serving.negotiation import Body, EncodingError, negotiate
from prerender_ray.serving.origin_rules import relay_headers
from prerender_ray.serving.responses import age_seconds, cached_headers
from prerender_ray.storage.pages import Expiring, PageMeta, freshness

# What x-harper-cache says (docs/serving.md#cache-statuses). `unreadable` replaces the reference's
# blob-* reasons: a page is read in-process from RocksDB, so the only failure is a record that does not
# decode.
CacheStatus = Literal["hit", "swr", "stale", "miss", "skip", "bypass", "peer-rescue", "unreadable"]
Source = Literal["cache", "origin", "rendered"]
SERVED_FROM_CACHE = ("hit", "swr")
# Statuses that never carry content (RFC 9110 sections 6.4.1, 15.3.6), so there is nothing to negotiate;
# 1xx too. A length or body sent with one is read by the client as the start of the next response.
_NO_BODY = frozenset({204, 205, 304})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a field name (RFC 9110 section 5.1)
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # controls but tab (what uvicorn refuses)


@dataclass(slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: Body = b""
    encoded: Sequence[tuple[bytes, bytes]] = ()  # headers already encoded for ASGI, sent first

    def asgi_headers(self) -> list[tuple[bytes, bytes]]:
        return [*self.encoded, *asgi_headers(self.headers)] if self.encoded else asgi_headers(self.headers)


@dataclass(slots=True)
class Prepared:
    """A stored page negotiated for one Accept-Encoding: everything of its reply but ``age``, the
    conditional downgrade and debug headers, which depend on the moment and the request. Pure data,
    so the ingress may keep it with the page and reuse it for the next request alike."""

    status: int
    headers: dict[str, str]
    body: Body
    encoded: list[tuple[bytes, bytes]]
    not_modified: list[tuple[bytes, bytes]]  # the 304's headers (but age), encoded


def verdict(page: Expiring | None, now: int, swr_ttl: int, *, skip: bool = False) -> CacheStatus:
    """``hit``/``swr`` when the page may be served; otherwise why not: ``skip`` (an authorized
    no-cache request), ``stale`` (past its SWR window) or ``miss`` (no page)."""
    if skip:
        return "skip"
    if page is None:
        return "miss"
    return freshness(page, now, swr_ttl) or "stale"


def no_content(status: int) -> bool:
    """Whether an answer with ``status`` never carries content (and so no Content-Length)."""
    return status < 200 or status in _NO_BODY


def _finish(status: int, headers: dict[str, str], body: Body, request_headers: Mapping[str, str],
            debug: Mapping[str, str] | None, conditional: bool = True) -> Reply:
    not_modified = conditional_response(status, headers, request_headers) if conditional else None
    if not_modified is not None:
        status, headers, body = 304, not_modified, b""
    if debug:
        headers.update(debug)
    return Reply(status, headers, body)


def prepare(page: PageMeta, body: Body, accept_encoding: str | None,
            max_bytes: int = MAX_HTML_BYTES) -> Prepared:
    """Negotiate a stored page for ``accept_encoding``. Raises EncodingError (UnsupportedEncoding
    included) when the stored body cannot be re-coded into what the client accepts, or would decode
    to more than ``max_bytes``; and for a 1xx, which is no final answer (the bot gets the origin).
    A 204, 205 or 304 is sent without a body or a length, whatever was stored with it."""
    headers = cached_headers(page, 0)
    headers.pop("age", None)
    if no_content(page.status_code):
        if page.status_code < 200:
            raise EncodingError(f"a stored {page.status_code} page is no final answer")
        headers.pop("content-length", None)
        headers.pop("content-encoding", None)
        return Prepared(page.status_code, headers, b"", asgi_headers(headers), [])
    headers, sent = negotiate(headers, body, accept_encoding, max_bytes=max_bytes)
    return Prepared(page.status_code, headers, sent, asgi_headers(headers),
                    asgi_headers(not_modified_headers(headers)))


def prepared_reply(p: Prepared, *, last_cached: int | None, now: int, request_headers: Mapping[str, str],
                   head: bool = False, debug: Mapping[str, str] | None = None) -> Reply:
    """The reply for one request from a prepared page: ``age`` on a 200, the 304 when the request's
    validators match, the debug headers last; HEAD gets the same headers and no body."""
    age = age_seconds(last_cached, now) if p.status == 200 else None
    extra: dict[str, str] = {} if age is None else {"age": str(age)}
    if debug:
        extra.update(debug)
    if p.status == 200 and ("if-none-match" in request_headers or "if-modified-since" in request_headers) \
            and is_not_modified(200, p.headers, request_headers):
        return Reply(304, extra, b"", p.not_modified)  # age is on the 304 allowlist, debug comes last
    return Reply(p.status, extra, b"" if head else p.body, p.encoded)


def page_reply(page: PageMeta, body: Body, *, now: int, request_headers: Mapping[str, str],
               head: bool = False, debug: Mapping[str, str] | None = None) -> Reply:
    """A stored page as a bot receives it (``prepare`` then ``prepared_reply``)."""
    return prepared_reply(prepare(page, body, request_headers.get("accept-encoding")),
                          last_cached=page.last_cached, now=now, request_headers=request_headers, head=head,
                          debug=debug)


def origin_reply(status: int, origin_headers: Iterable[tuple[str, str]] | Mapping[str, str], body: bytes, *,
                 request_headers: Mapping[str, str], head: bool = False, conditional: bool = True,
                 debug: Mapping[str, str] | None = None, max_bytes: int = MAX_HTML_BYTES) -> Reply:
    """An origin answer relayed: the allowed headers (Location on a 3xx), the body negotiated like
    a cached one when its coding is one we can re-code, otherwise relayed as the origin coded it.
    ``conditional`` False leaves validators to the origin (methods other than GET/HEAD)."""
    headers = relay_headers(status, origin_headers)
    if no_content(status):
        headers.pop("content-length", None)
        return _finish(status, headers, b"", request_headers, debug, conditional)
    try:
        headers, sent = negotiate(headers, body, request_headers.get("accept-encoding"), head=head,
                                  max_bytes=max_bytes)
    except EncodingError:  # a coding we cannot decode (or a bomb): the bot gets it as sent
        headers["content-length"] = str(len(body))
        sent = b"" if head else body
    return _finish(status, headers, sent, request_headers, debug, conditional)


def error_reply(status: int, message: str, **extra: str) -> Reply:
    """A JSON error of ours (4xx for the bot's own input, 502/504 for an origin failure)."""
    import json

    body = json.dumps({"error": message, **extra}, separators=(",", ":")).encode()
    return Reply(status, {"content-type": "application/json", "content-length": str(len(body)),
                          "cache-control": "no-store"}, body)


def encode_header(value: str) -> bytes:
    """A header name or value as bytes: latin-1, the inverse of how the ingress decodes a request's
    (a bot's bytes go back as they came); text latin-1 cannot hold (stored headers are JSON text, the
    config's values) goes as the UTF-8 its writer meant."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


def asgi_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """Header pairs for ASGI. A header whose name is not a token or whose value holds a control
    character (one that could split a response, or that uvicorn would refuse with a 500) is dropped."""
    names, values = "".join(headers), "".join(headers.values())
    if "" not in headers and _TOKEN.fullmatch(names) and not _BAD_VALUE.search(values):  # the usual case
        return [(encode_header(name), encode_header(value)) for name, value in headers.items()]
    return [(encode_header(name), encode_header(value)) for name, value in headers.items()
            if _TOKEN.fullmatch(name) and not _BAD_VALUE.search(value)]


def route_label(route_path: str | None, route_class: str | None) -> str:
    """The route dimension of serve metrics: the matched route's path, else the class
    (docs/serving.md#metrics-and-the-unrouted-tally)."""
    return route_path or route_class or "unrouted"
