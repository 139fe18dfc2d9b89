"""A posted render result's metadata (docs/fleet-protocol.md#metadata-fields): validated into a
``Result`` (a value out of range is a ``ResultError``, a 400), the part of it forwarded to the keeper,
and the outcome it says, or the one inferred for fleets that send none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prerender_ray.serving.answer import no_content

OUTCOMES = ("rendered", "redirected", "non-indexable", "error")
STORED_HEADERS = frozenset(
    {"etag", "last-modified", "link", "x-robots-tag", "retry-after", "cache-control", "content-type", "vary"})
ENCODINGS = ("gzip", "br", "identity")


class ResultError(ValueError):
    """Metadata the server cannot act on (the HTTP layer answers 400)."""


@dataclass
class Result:
    """A validated job_result: metadata plus the still-encoded content."""

    id: str
    url: str
    status_code: int | None
    headers: dict[str, str]
    content: bytes | None
    outcome: str
    reason: str | None
    redirected_to: str | None
    is_indexable: bool | None
    render_time: float | None
    error: dict | None

    @classmethod
    def parse(cls, meta: Any, content: bytes | None) -> Result:
        """Validate every field this service reads or stores; a value out of range is a
        ``ResultError`` naming the field (a 400: the fleet must not retry it as a lease conflict)."""
        if not isinstance(meta, dict):
            raise ResultError("metadata must be a JSON object")
        key = meta.get("id")
        if not isinstance(key, str) or not key:
            raise ResultError("metadata.id (the claimed job id) is required")
        outcome = meta.get("outcome")
        if outcome is not None and outcome not in OUTCOMES:
            raise ResultError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
        headers = meta.get("headers") or {}
        if not isinstance(headers, dict):
            raise ResultError("metadata.headers must be an object")
        indexable = meta.get("isIndexable")
        if indexable is not None and not isinstance(indexable, bool):
            raise ResultError("metadata.isIndexable must be a boolean")
        error = meta.get("error")
        if error is not None and not isinstance(error, dict):
            raise ResultError("metadata.error must be an object")
        redirected = _text(meta, "redirectedTo", MAX_TEXT)
        status = _status_code(meta.get("statusCode"))
        if content and status is not None and no_content(status):  # the reference fleet sends content with 200
            raise ResultError(f"metadata.statusCode {status} carries no content (RFC 9110), but content was "
                              f"posted with it")
        return cls(
            id=key,
            url=_text(meta, "url", MAX_TEXT) or "",
            status_code=status,
            headers=_headers(headers),
            content=content or None,
            outcome=outcome or "",
            reason=_text(meta, "reason", MAX_REASON),
            redirected_to=redirected or None,
            is_indexable=indexable,
            render_time=_render_time(meta.get("renderTime")),
            error=error,
        )

    @property
    def content_encoding(self) -> str:
        return (self.headers.get("content-encoding") or "identity").strip().lower()


MAX_TEXT = 64 * 1024  # url / redirectedTo: far above any real URL, far below the body cap
# The most metadata JSON of one result the ingress parses (more is a 413, refused unparsed: 10 MB of
# JSON took a second and 255 MiB of the event loop that serves bots). The reference fleet's is a few
# KiB (the URLs and the allowlisted headers); prerender-ray's worker adds a diagnostics report when
# asked: five lists of at most diagnostics.MAX_LIST_BYTES and a screenshot of at most 512 KiB of
# base64, about 1 MiB with the longest URLs and headers this module takes (the worker stays under this).
MAX_METADATA_BYTES = 2 * 1024 * 1024
MAX_REASON = 200
MAX_HEADER_VALUE = 8192
MAX_RENDER_TIME_MS = 86_400_000  # a day: the render budget is seconds; more is a broken clock


# What the keeper reads of a result's metadata (docs/fleet-protocol.md#metadata-fields), and of its
# headers: all the ingress forwards, so a fleet's other fields never ride an actor call.
METADATA_FIELDS = ("id", "url", "statusCode", "headers", "renderTime", "redirectedTo", "isIndexable", "outcome",
                   "reason", "error", "renderSummary", "diagnostics")
FORWARDED_HEADERS = STORED_HEADERS | {"content-encoding"}


def forwarded(meta: dict) -> dict:
    """The fields of ``meta`` (parsed by ``Result.parse`` already, at most ``MAX_METADATA_BYTES`` of
    JSON) the keeper reads: a fleet's other fields never ride an actor call."""
    out = {name: meta[name] for name in METADATA_FIELDS if name in meta}
    headers = out.get("headers")
    if isinstance(headers, dict):
        out["headers"] = {k: v for k, v in headers.items() if k.lower() in FORWARDED_HEADERS}
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _status_code(value: Any) -> int | None:
    """An HTTP status: an integer 100-599 (an integral float too, as JSON allows), or absent."""
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or value != int(value) or not 100 <= value <= 599:
        raise ResultError(f"metadata.statusCode must be an integer from 100 to 599, not {_shown(value)}")
    return int(value)


def _render_time(value: Any) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_RENDER_TIME_MS:
        raise ResultError(f"metadata.renderTime must be a number of milliseconds from 0 to "
                          f"{MAX_RENDER_TIME_MS}, not {_shown(value)}")
    return value


def _text(meta: dict, name: str, limit: int) -> str | None:
    value = meta.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ResultError(f"metadata.{name} must be a string")
    if len(value) > limit:
        raise ResultError(f"metadata.{name} is longer than {limit} characters")
    return value


def _headers(headers: dict) -> dict[str, str]:
    """Lower-cased names; a value is text (a number is written out), absent values dropped. Stored
    headers are served back to crawlers, so a control character in one is refused, not stored."""
    out = {}
    for name, value in headers.items():
        if value is None:
            continue
        if isinstance(value, str):
            text = value
        elif _is_number(value) and math.isfinite(value):
            text = str(value)
        else:
            raise ResultError(f"metadata.headers[{_shown(name)}] must be a string")
        low = name.lower()
        if low in STORED_HEADERS or low == "content-encoding":
            if len(text) > MAX_HEADER_VALUE or any(c in text for c in "\r\n\0"):
                raise ResultError(f"metadata.headers[{_shown(name)}] holds a control character or is "
                                  f"longer than {MAX_HEADER_VALUE} characters")
        out[low] = text
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def resolve_outcome(r: Result, indexable: bool | None) -> str:
    """The posted outcome, or the legacy inference for fleets that do not send one."""
    if r.outcome:
        return r.outcome
    if (r.status_code == 200 and r.content) or indexable is True:
        return "rendered"
    if r.redirected_to:
        return "redirected"
    if indexable is False:
        return "non-indexable"
    return "error"
