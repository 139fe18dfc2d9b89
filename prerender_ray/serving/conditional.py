"""Conditional GET/HEAD (RFC 9110 sec. 13): If-None-Match, then If-Modified-Since, downgrading a 200 to 304.

Only a 200 is ever downgraded. If-None-Match, when present, decides alone (weak comparison: ``W/``
is ignored on both sides); If-Modified-Since is consulted only without it. Anything unparseable
means "no match", so garbage from a client can only cost it a full response, never a wrong 304.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime

# The 200's headers a 304 keeps; debug headers are added by the caller after the downgrade.
NOT_MODIFIED_HEADERS = frozenset({"cache-control", "expires", "date", "etag", "last-modified", "vary", "age"})

# One list member: optional W/, then a quoted opaque tag or (tolerated, as origins send them) a bare
# token; then a comma or the end.
_MEMBER = re.compile(r'\s*(?:[Ww]/)?("[^"]*"|[^",\s]+)\s*(?:,|\Z)')
_EMPTY_MEMBER = re.compile(r"\s*,")
_BLANK_TAIL = re.compile(r"\s+\Z")
# A longer If-None-Match is not compared: the full answer is always a correct one, and a head may be
# 64 KiB (14,000 tags took 20 ms a request to parse).
MAX_IF_NONE_MATCH = 8 * 1024


def _opaque(etag: str) -> str:
    """The tag without its weakness marker, as weak comparison sees it."""
    etag = etag.strip()
    return etag[2:].lstrip() if etag[:2].upper() == "W/" else etag


def parse_if_none_match(value: str) -> list[str] | None:
    """The opaque tags listed, or None when the value is malformed anywhere."""
    tags: list[str] = []
    pos, end = 0, len(value)
    while pos < end:
        if m := _EMPTY_MEMBER.match(value, pos):  # empty list members are allowed (RFC 9110 section 5.6.1)
            pos = m.end()
            continue
        if _BLANK_TAIL.match(value, pos):  # not value[pos:].isspace(): a copy per member was quadratic
            break
        m = _MEMBER.match(value, pos)
        if not m or m.end() == pos:
            return None
        tags.append(m.group(1))
        pos = m.end()
    return tags


def etag_matches(if_none_match: str, etag: str | None) -> bool:
    """Weak comparison of the response ETag against an If-None-Match value (``*`` matches any)."""
    if if_none_match.strip() == "*":
        return True
    if not etag or not _opaque(etag) or len(if_none_match) > MAX_IF_NONE_MATCH:
        return False
    tags = parse_if_none_match(if_none_match)
    return tags is not None and _opaque(etag) in tags


def _http_date(value: str) -> float | None:
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" or no zone: HTTP dates are GMT
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def not_modified_since(if_modified_since: str, last_modified: str | None) -> bool:
    """True when both dates parse and Last-Modified is at or before If-Modified-Since."""
    if not last_modified:
        return False
    since, modified = _http_date(if_modified_since), _http_date(last_modified)
    return since is not None and modified is not None and modified <= since


def is_not_modified(status: int, headers: Mapping[str, str], request_headers: Mapping[str, str]) -> bool:
    """Whether a response (``status``, lowercase ``headers``) becomes a 304 for this request."""
    if status != 200:
        return False
    inm = request_headers.get("if-none-match")
    if inm and inm.strip():
        return etag_matches(inm, headers.get("etag"))
    ims = request_headers.get("if-modified-since")
    return ims is not None and not_modified_since(ims, headers.get("last-modified"))


def not_modified_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of the 304 that replaces a 200 with ``headers``."""
    return {k: v for k, v in headers.items() if k in NOT_MODIFIED_HEADERS}


def conditional_response(
    status: int, headers: Mapping[str, str], request_headers: Mapping[str, str]
) -> dict[str, str] | None:
    """The 304's headers when the request's validators match this response, else None."""
    if is_not_modified(status, headers, request_headers):
        return not_modified_headers(headers)
    return None
