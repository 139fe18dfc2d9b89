"""What a render reports: jobs as claimed, the verdicts (docs/fleet-protocol.md#verdicts), and the
job_result wire format (docs/fleet-protocol.md#job-result). Plain functions over plain data; the
browser code only observes.

Comparisons use the shared canonical form (``prerender_ray.identity.urls.canonicalize_url``): ``C*`` keeps
every query parameter, ``C0`` none.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import brotli

from prerender_ray.identity.urls import UrlError, canonicalize_url
from prerender_ray.queue import job_options

RELAYED_HEADERS = (
    "etag",
    "last-modified",
    "link",
    "x-robots-tag",
    "retry-after",
    "cache-control",
    "content-type",
    "vary",
)
STORED_CONTENT_TYPE = "text/html; charset=utf-8"  # we serialize the DOM as UTF-8, whatever the origin sent

RENDERED, REDIRECTED, NON_INDEXABLE, ERROR = "rendered", "redirected", "non-indexable", "error"
NAVIGATION = "navigation"


class JobError(ValueError):
    """A claimed job the worker cannot use (it is skipped, never posted)."""


@dataclass(frozen=True)
class Job:
    id: str
    url: str
    device_type: str
    expires_at: float  # epoch ms; NaN when the server sent none (never skipped, no result retries)
    callback_origin: str
    is_from_sitemap: bool = False
    headers: dict[str, str] = field(default_factory=dict)  # main-frame navigation only
    render_budget_ms: int | None = None
    options: job_options.JobOptions = job_options.JobOptions()  # prerender-ray's renderOptions
    granted_by: str = ""  # the queue host that granted it (the worker's own record, not on the wire)

    @classmethod
    def parse(cls, obj: Any, granted_by: str = "") -> Job:
        if not isinstance(obj, dict):
            raise JobError("a job must be a JSON object")
        for name in ("id", "url", "callbackOrigin"):
            if not isinstance(obj.get(name), str) or not obj[name]:
                raise JobError(f"job.{name} must be a non-empty string")
        if not obj["url"].startswith(("http://", "https://")):
            raise JobError(f"job.url must be an absolute http(s) URL: {obj['url'][:200]!r}")
        origin = obj["callbackOrigin"].rstrip("/")
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise JobError(f"job.callbackOrigin must be a bare http(s) origin: {origin[:200]!r}")
        expires = obj.get("expiresAt")
        expires_at = (
            float(expires)
            if isinstance(expires, (int, float)) and not isinstance(expires, bool)
            else math.nan
        )
        headers = obj.get("headers")
        budget = obj.get("renderBudget")
        return cls(
            id=obj["id"],
            url=obj["url"],
            device_type=obj["deviceType"] if isinstance(obj.get("deviceType"), str) else "desktop",
            expires_at=expires_at,
            callback_origin=origin,
            is_from_sitemap=obj.get("isFromSitemap") is True,
            headers={str(k).lower(): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {},
            options=job_options.parse(obj.get(job_options.FIELD)),
            render_budget_ms=int(budget)
            if isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget > 0
            else None,
            granted_by=granted_by,
        )

    def lease_left_ms(self, now_ms: float) -> float:
        return math.inf if math.isnan(self.expires_at) else self.expires_at - now_ms

    def held(self, now_ms: float) -> bool:
        """Is the lease still ours? (A job without expiresAt counts as held, as in the reference.)"""
        return math.isnan(self.expires_at) or now_ms < self.expires_at


def parse_jobs(body: Any, granted_by: str = "") -> tuple[list[Job], list[str]]:
    """A claim body (already JSON-decoded, known to be a list) from the queue ``granted_by``: the usable
    jobs and one problem per unusable element."""
    jobs, problems = [], []
    for item in body:
        try:
            jobs.append(Job.parse(item, granted_by))
        except JobError as e:
            problems.append(str(e))
    return jobs, problems


# ------------------------------------------------------------------------------------------ URLs


@dataclass(frozen=True)
class UrlRules:
    """The two cacheKey knobs the worker must share with the server
    (docs/fleet-protocol.md#shared-cache-key-knobs)."""

    plus_is_space: bool = False
    trailing_slash: str = "strip"
    canonical_strict: bool = False

    def canon(self, url: str, allowlist: list[str] | tuple[str, ...]) -> str | None:
        try:
            return canonicalize_url(
                url, allowlist, plus_is_space=self.plus_is_space, trailing_slash=self.trailing_slash
            )
        except (UrlError, ValueError, TypeError):
            return None

    def c_all(self, url: str) -> str | None:
        return self.canon(url, ("*",))

    def c_none(self, url: str) -> str | None:
        return self.canon(url, ())

    def same_page(self, a: str, b: str) -> bool:
        """C0 equal: same origin and path (the redirect-bail test)."""
        ca, cb = self.c_none(a), self.c_none(b)
        return ca is not None and ca == cb

    def same_url(self, a: str, b: str) -> bool:
        """C* equal: the same URL, query included (the post-render redirect test)."""
        ca, cb = self.c_all(a), self.c_all(b)
        return ca is not None and ca == cb

    def canonical_verdict(self, canonical: str | None, current: str) -> str:
        """``self``, ``variant`` (the same document re-spelled) or ``elsewhere`` for a
        ``<link rel=canonical>`` href (already absolute) on a page at ``current``. No canonical, or a
        malformed one, is ``self``."""
        if not canonical:
            return "self"
        names = sorted({k for k, _ in parse_qsl(urlsplit(current).query, keep_blank_values=True)})
        mine, theirs = self.canon(current, names), self.canon(canonical, names)
        if theirs is None or mine is None:
            return "self"
        if mine == theirs:
            return "self"
        return "variant" if _loose(canonical) == _loose(current) else "elsewhere"


def _loose(url: str) -> tuple[str, str, str] | None:
    """The looser comparison: host, decoded path without trailing slash, form-style sorted query, no
    fragment."""
    try:
        p = urlsplit(url.strip())
    except ValueError:
        return None
    path = unquote(p.path).rstrip("/")
    query = urlencode(sorted(parse_qsl(p.query, keep_blank_values=True)))
    return (
        p.scheme.lower() + "://" + (p.hostname or "") + (f":{p.port}" if _explicit_port(p) else ""),
        path,
        query,
    )


def _explicit_port(p: Any) -> bool:
    try:
        port = p.port
    except ValueError:
        return False
    return port is not None and port != {"http": 80, "https": 443}.get(p.scheme.lower())


# -------------------------------------------------------------------------------------- verdicts


@dataclass
class Verdict:
    """What to report; ``keep_content`` says whether the serialized HTML goes with it."""

    status_code: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    redirected_to: str | None = None
    is_indexable: bool | None = None
    reason: str | None = None
    error: dict[str, str] | None = None
    keep_content: bool = False


def relayed_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """The allowlisted subset of an origin response's headers, lower-cased; repeated headers (given
    newline-joined, as the browser reports them) are comma-joined."""
    out = {}
    for k, v in (headers or {}).items():
        k = k.lower()
        if k in RELAYED_HEADERS and v is not None:
            out[k] = ", ".join(x.strip() for x in str(v).split("\n") if x.strip())
    return out


def error_verdict(
    name: str,
    message: str,
    *,
    phase: str | None = None,
    status: int | None = None,
    headers: dict[str, str] | None = None,
) -> Verdict:
    err = {"name": name or "Error", "message": message[:2000]}
    if phase:
        err["phase"] = phase
    return Verdict(
        status_code=status, headers=relayed_headers(headers) if status else {}, reason="error", error=err
    )


def navigation_error_verdict(name: str, message: str) -> Verdict:
    """``page.goto`` failed: a redirect loop is non-indexable, anything else an error
    (docs/fleet-protocol.md#verdicts)."""
    v = error_verdict(name, message, phase=NAVIGATION)
    if "ERR_TOO_MANY_REDIRECTS" in message:
        v.is_indexable, v.reason = False, "redirect-loop"
    return v


@dataclass(frozen=True)
class Hop:
    """One HTTP response of the navigation: the redirect hops first, the final document last."""

    url: str
    status: int
    headers: dict[str, str]


def navigation_verdict(job: Job, rules: UrlRules, hops: list[Hop]) -> Verdict | None:
    """Right after navigation, before settle: an HTTP redirect chain landing on another origin+path
    bails with the first hop's status and headers; a document status other than 200 is an
    http-error. None: go on and settle."""
    if not hops:
        return None
    final = hops[-1]
    if len(hops) > 1 and not rules.same_page(final.url, job.url):
        first = hops[0]
        status = first.status if 300 <= first.status < 400 else 302
        return Verdict(
            status_code=status,
            headers=relayed_headers(first.headers),
            redirected_to=final.url,
            reason="redirect",
        )
    if final.status != 200:
        return Verdict(
            status_code=final.status,
            headers=relayed_headers(final.headers),
            is_indexable=False,
            reason="http-error",
        )
    return None


@dataclass(frozen=True)
class Document:
    """What the settled page says about itself."""

    url: str  # the last document the main frame loaded (client-side redirects, not history.pushState)
    robots: tuple[str, ...] = ()  # content of every meta robots/googlebot
    canonical: str | None = None  # the first link rel=canonical, resolved
    status_meta: str | None = None  # <meta name="prerender-status-code">
    location_meta: str | None = None  # <meta name="prerender-header" content="Location: ...">


NOINDEX = re.compile(r"(^|[\s,])noindex([\s,]|$)|(^|[\s,])none([\s,]|$)", re.IGNORECASE)


def is_noindex(robots: tuple[str, ...]) -> bool:
    return any(NOINDEX.search(c or "") for c in robots)


def document_verdict(
    job: Job, rules: UrlRules, final: Hop, doc: Document, *, honour_status_meta: bool = True
) -> Verdict:
    """The settled 200 document: status meta, client-side redirect, noindex, canonical
    (docs/fleet-protocol.md#verdicts)."""
    headers = relayed_headers(final.headers)
    redirected_to = None if rules.same_url(doc.url, job.url) else doc.url
    meta_status = _status_meta(doc.status_meta) if honour_status_meta else None
    if meta_status is not None and meta_status != 200:
        if 300 <= meta_status < 400 and doc.location_meta:
            target = doc.location_meta.strip()
            if not rules.same_page(target, job.url) and rules.c_none(target) is not None:
                return Verdict(
                    status_code=meta_status, headers=headers, redirected_to=target, reason="redirect"
                )
        elif meta_status >= 400:
            # The rendered body goes with the verdict: the node serves it to bots with this status
            # (a reference node ignores content on a non-indexable result).
            return Verdict(status_code=meta_status, headers=headers, is_indexable=False, reason="http-error",
                           keep_content=True)
    reason = None
    if is_noindex(doc.robots):
        reason = "noindex"
    else:
        verdict = rules.canonical_verdict(doc.canonical, doc.url)
        if verdict == "elsewhere":
            reason = "canonical-mismatch"
        elif verdict == "variant" and rules.canonical_strict:
            reason = "canonical-variant"
    # Sitemap pages are stored even when non-indexable, and then without a reason.
    stored_anyway = reason is not None and job.is_from_sitemap
    return Verdict(
        status_code=final.status,
        headers=headers,
        redirected_to=redirected_to,
        is_indexable=reason is None,
        keep_content=reason is None or stored_anyway,
        reason=None if stored_anyway else reason,
    )


def _status_meta(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit() and len(value) <= 9):  # a page writes it: "²" is a digit
        return None
    n = int(value)
    return n if 100 <= n <= 599 else None


# ------------------------------------------------------------------------------------ wire format


def resolve_outcome(has_content: bool, redirected_to: str | None, is_indexable: bool | None,
                    reason: str | None = None) -> str:
    """The reference's precedence: content -> rendered; else redirectedTo -> redirected; else
    isIndexable false -> non-indexable; else error. A status page (http-error with its rendered
    body) is non-indexable, content or not."""
    if has_content and reason == "http-error" and is_indexable is False:
        return NON_INDEXABLE
    if has_content:
        return RENDERED
    if redirected_to:
        return REDIRECTED
    if is_indexable is False:
        return NON_INDEXABLE
    return ERROR


def build_metadata(job: Job, v: Verdict, render_ms: float, content_encoding: str | None,
                   summary: dict[str, int] | None = None, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Exactly the fields of docs/fleet-protocol.md#metadata-fields; absent means unset. The
    reference's fields, then prerender-ray's own (``renderSummary``, ``diagnostics``) that a
    reference server ignores."""
    headers = dict(v.headers)
    if content_encoding:
        headers["content-type"] = STORED_CONTENT_TYPE
        headers["content-encoding"] = content_encoding
    meta: dict[str, Any] = {"id": job.id, "url": job.url}
    if v.status_code is not None:
        meta["statusCode"] = v.status_code
    meta["headers"] = headers
    meta["renderTime"] = max(0, round(render_ms))
    if v.redirected_to:
        meta["redirectedTo"] = v.redirected_to
    if v.is_indexable is not None:
        meta["isIndexable"] = v.is_indexable
    meta["outcome"] = resolve_outcome(content_encoding is not None, v.redirected_to, v.is_indexable, v.reason)
    if content_encoding is None or meta["outcome"] == NON_INDEXABLE:
        meta["reason"] = v.reason or "error"
    if v.error:
        meta["error"] = dict(v.error)
    if summary is not None:
        meta["renderSummary"] = summary
    if report is not None:
        meta["diagnostics"] = report
    return meta


def encode_html(html: str, encoding: str) -> bytes:
    data = html.encode("utf-8", "replace")
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if encoding == "br":
        return brotli.compress(data, mode=brotli.MODE_TEXT, quality=10)
    raise ValueError(f"unsupported content encoding {encoding!r}")


def result_body(meta: dict[str, Any], content: bytes | None) -> tuple[bytes, dict[str, str]]:
    """The job_result request: metadata JSON then the encoded HTML, ``x-metadata-size`` = the JSON's
    byte length; no content-encoding HTTP header (it is announced inside the metadata)."""
    raw = json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return raw + (content or b""), {
        "content-type": "application/octet-stream",
        "x-metadata-size": str(len(raw)),
    }
