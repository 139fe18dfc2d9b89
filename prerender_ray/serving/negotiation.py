"""Content-encoding negotiation for a stored body (RFC 9110 section 12.5.3), and transcoding between codings.

A page is stored once, in the renderer's coding (gzip by default, or br). A request gets that body as
stored when its ``Accept-Encoding`` allows it and asks for nothing it prefers; otherwise the body is
decoded and re-encoded on the fly. Unlike the reference, q-values are honoured (``gzip;q=0`` refuses
gzip), tokens are case-insensitive, ``*`` covers codings not listed, ``identity;q=0`` is honoured when
another coding is acceptable, and every negotiated response carries ``Vary: Accept-Encoding``.
"""

from __future__ import annotations

import gzip
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import brotli

from prerender_ray.decoding import MAX_HTML_BYTES, DecodeError, decode

# A body may be a view into the stored record: sent without a copy (uvicorn's httptools protocol
# writes any bytes-like object to the transport).
Body = bytes | memoryview

# Codings this module can produce, in the order that breaks a tie between equal q-values.
PREFERENCE = ("br", "gzip", "identity")
# RFC 9110 section 8.4.1.3: a recipient should treat x-gzip as gzip.
_ALIASES = {"x-gzip": "gzip"}
# Identity is acceptable unless refused (RFC 9110 section 12.5.3), but ranks below any coding the client
# lists: "gzip;q=0.5" still gets gzip.
_IDENTITY_DEFAULT_Q = 0.001
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
GZIP_LEVEL = 6  # zlib's default level, as the reference's on-the-fly gzip
BROTLI_QUALITY = 2  # cheap enough per request; the renderer's stored br uses a higher quality


class EncodingError(ValueError):
    """A body is not valid in the coding its headers name."""


class UnsupportedEncoding(EncodingError):
    """A coding this module can neither decode nor produce."""


def normalize_coding(value: str | None) -> str:
    """A content-coding name as compared here: lowercase, aliases folded, empty meaning identity."""
    name = (value or "").strip().lower()
    return _ALIASES.get(name, name) or "identity"


@dataclass(frozen=True, slots=True)
class AcceptEncoding:
    """A parsed ``Accept-Encoding``: explicit q-values per coding, and the ``*`` q-value if listed."""

    codings: Mapping[str, float] = field(default_factory=dict)
    wildcard: float | None = None

    def q(self, coding: str) -> float:
        coding = normalize_coding(coding)
        if coding in self.codings:
            return self.codings[coding]
        if self.wildcard is not None:
            return self.wildcard
        return _IDENTITY_DEFAULT_Q if coding == "identity" else 0.0


def _qvalue(params: list[str]) -> float | None:
    """The item's q (1 when absent), or None when the q parameter is garbage."""
    q = 1.0
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() != "q":
            continue
        try:
            q = float(value.strip())
        except ValueError:
            return None
        if not (math.isfinite(q) and 0.0 <= q <= 1.0):
            return None
    return q


MAX_CODINGS = 64  # items of an Accept-Encoding read (browsers and crawlers send up to six)


def parse_accept_encoding(value: str | None) -> AcceptEncoding:
    """Parse leniently: a malformed item is skipped, so pure garbage leaves identity only.

    An absent or empty header also means identity only (the reference's behaviour; RFC 9110 lets a
    server pick identity when the client states no preference). A coding listed twice keeps its
    lowest q, so a refusal is never overridden. Only the first ``MAX_CODINGS`` items are read: a head
    may be 64 KiB, and 40,000 empty items took 12 ms a request."""
    codings: dict[str, float] = {}
    wildcard: float | None = None
    for item in (value or "").split(",", MAX_CODINGS)[:MAX_CODINGS]:
        name, *params = item.split(";")
        name = name.strip().lower()
        if not _TOKEN.fullmatch(name):
            continue
        q = _qvalue(params)
        if q is None:
            continue
        if name == "*":
            wildcard = q if wildcard is None else min(wildcard, q)
        else:
            name = normalize_coding(name)
            codings[name] = min(q, codings.get(name, q))
    return AcceptEncoding(codings, wildcard)


def choose_encoding(stored: str, accept: AcceptEncoding) -> str:
    """The coding to send: the stored one when its q is positive and ties the best q on offer;
    otherwise the best of br, gzip, identity (ties in that order); identity when all are refused."""
    stored = normalize_coding(stored)
    best = max(accept.q(c) for c in (*PREFERENCE, stored))
    if best <= 0.0:
        return "identity"  # nothing acceptable: identity is what any client can read (RFC 9110 sec. 12.5.3)
    if accept.q(stored) == best:
        return stored
    return next(c for c in PREFERENCE if accept.q(c) == best)


def decode_body(body: Body, coding: str, max_bytes: int = MAX_HTML_BYTES) -> Body:
    """``body`` decoded, streamed and refused (EncodingError) past ``max_bytes`` decoded bytes: a
    stored page is re-decoded for every client that cannot take its coding. Identity is passed
    through: there is nothing to expand."""
    coding = normalize_coding(coding)
    if coding == "identity":
        return body
    if coding not in ("gzip", "br"):
        raise UnsupportedEncoding(f"cannot decode content-encoding {coding!r}")
    try:
        return decode(body, coding, max_bytes)
    except DecodeError as e:
        raise EncodingError(f"body is not valid {coding}: {e}") from e


def encode_body(body: Body, coding: str) -> Body:
    coding = normalize_coding(coding)
    if coding == "identity":
        return body
    if coding == "gzip":
        return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
    if coding == "br":
        return brotli.compress(body, mode=brotli.MODE_TEXT, quality=BROTLI_QUALITY)
    raise UnsupportedEncoding(f"cannot encode content-encoding {coding!r}")


def transcode(body: Body, source: str, target: str, max_bytes: int = MAX_HTML_BYTES) -> Body:
    """``body`` (coded in ``source``) re-coded in ``target``; the same bytes when they agree."""
    source, target = normalize_coding(source), normalize_coding(target)
    if source == target:
        return body
    return encode_body(decode_body(body, source, max_bytes), target)


def add_vary(vary: str | None, name: str = "Accept-Encoding") -> str:
    """``vary`` with ``name`` listed once; ``*`` already covers everything."""
    if not vary or not vary.strip():
        return name
    listed = {token.strip().lower() for token in vary.split(",")}
    if "*" in listed or name.lower() in listed:
        return vary
    return f"{vary}, {name}"


def _weak(etag: str) -> str:
    etag = etag.strip()
    return etag if etag[:2].upper() == "W/" else f"W/{etag}"


def negotiate(
    headers: Mapping[str, str], body: Body, accept_encoding: str | None, *, head: bool = False,
    max_bytes: int = MAX_HTML_BYTES,
) -> tuple[dict[str, str], Body]:
    """Headers and body to send for ``body``, coded as ``headers['content-encoding']`` says.

    Sets or removes ``content-encoding``, recomputes ``content-length`` and adds
    ``Vary: Accept-Encoding``. A re-coded body gets a weak ETag (other bytes, same content), as
    nginx does, so weak If-None-Match comparison still matches. HEAD gets exactly the GET's headers,
    coding and length included, and no body. An empty body is sent uncoded: there is nothing to
    decode. Raises UnsupportedEncoding or EncodingError when the stored body cannot be re-coded
    (over ``max_bytes`` decoded included).
    """
    out = dict(headers)
    source = normalize_coding(out.get("content-encoding"))
    if body:
        target = choose_encoding(source, parse_accept_encoding(accept_encoding))
        sent = transcode(body, source, target, max_bytes)
    else:
        target, sent = "identity", body
    if target == "identity":
        out.pop("content-encoding", None)
    else:
        out["content-encoding"] = target
    if sent is not body and out.get("etag"):
        out["etag"] = _weak(out["etag"])
    out["content-length"] = str(len(sent))
    out["vary"] = add_vary(out.get("vary"))
    return out, b"" if head else sent
