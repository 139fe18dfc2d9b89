"""Status pages: a render's own verdict stored as the page bots receive.

A single-page app answers every path with 200 and its shell; the rendered page says what it is with
``<meta name="prerender-status-code" content="404">`` (or a 3xx with ``prerender-header``
``Location: ...``). The verdict drives scheduling (the suppression and redirect lanes of
``queue/results.py``, unchanged); this module says what is stored under the URL's keys so a crawler
gets the 404 or the 301 rather than the shell's 200 (a soft 404).

A status page is served until ``render.statusPages.keepFor`` past the later of its verdict and the
next recheck its lane scheduled, so a standing verdict never lapses between rechecks, and it outlives
a retired target (a tombstone of that length). A recheck renews it; a render that is a page again
replaces it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urljoin, urlsplit

from prerender_ray.serving.origin_policy import compiled, origin_of
from prerender_ray.storage.pages import Page

REDIRECT_STATUSES = frozenset({301, 302, 307, 308})
# Headers of a rendered not-found page kept as they are for rendered pages (validators excluded: a
# status page is never answered 304); a redirect keeps only how long it may be cached.
_PAGE_HEADERS = frozenset({"link", "x-robots-tag", "retry-after", "cache-control", "content-type", "vary"})
_REDIRECT_HEADERS = frozenset({"cache-control"})
# The reference fleet posts a verdict without a body: bots get this with the page's status.
DEFAULT_BODY = (b"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><meta name=\"robots\" content=\"noindex\">"
                b"<title>%d</title></head><body><h1>%d</h1></body></html>")
MAX_LOCATION = 8192


def is_gone_status(status: int | None) -> bool:
    """A client-error verdict that becomes a status page. 401/403 (auth), 408/429 (transient) never
    get here: their lanes retry without a verdict about the page."""
    return status is not None and 400 <= status <= 499 and status not in (401, 403, 408, 429)


def resolved(page_url: str, ref: str | None) -> str | None:
    """``ref`` (a redirect target, absolute or relative to the page) as an absolute http(s) URL, or
    None when it is no URL reference: empty, over-long, holding whitespace or a control character,
    another scheme, or no host."""
    text = (ref or "").strip()
    if not text or len(text) > MAX_LOCATION or any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in text):
        return None
    try:
        url = urljoin(page_url, text)
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is no number)
    except ValueError:
        return None
    return url if parts.scheme in ("http", "https") and parts.hostname else None


def location_of(page_url: str, redirected_to: str | None, domains: Sequence[str]) -> str | None:
    """The Location a redirect verdict may send bots to, or None: resolved against the page's URL, on
    a ``domains`` host (with no ``domains``, the page's own host and port), so a stored page never
    sends a crawler off the site."""
    url = resolved(page_url, redirected_to)
    if url is None:
        return None
    if domains:
        return url if compiled(tuple(domains)).url_allowed(url) else None
    # Host and port as a browser reads them, as the domains check does: urlsplit reads
    # https://evil.example\@shop.example/ as shop.example, a browser as evil.example.
    there, here = origin_of(url), origin_of(page_url)
    return url if there is not None and here is not None and there[1:] == here[1:] else None


def gone_page(key: str, status: int, *, content: bytes | None, headers: Mapping[str, str], now: int,
              expires_at: int) -> Page:
    """A 4xx page: the rendered body (in its posted coding) or, from a fleet that sends none, a
    small page naming the status."""
    kept = {k: v for k, v in headers.items() if k in _PAGE_HEADERS}
    if content:
        coding = (headers.get("content-encoding") or "identity").strip().lower()
        if coding != "identity":
            kept["content-encoding"] = coding
        body = content
    else:
        kept["content-type"] = "text/html; charset=utf-8"
        kept.pop("vary", None)
        body = DEFAULT_BODY % (status, status)
    kept["x-harper-rendered"] = "1"
    return Page(cache_key=key, status_code=status, headers=kept, content=body, last_cached=now,
                expires_at=expires_at, is_indexable=False)


def redirect_page(key: str, status: int, location: str, *, headers: Mapping[str, str], now: int,
                  expires_at: int) -> Page:
    kept = {k: v for k, v in headers.items() if k in _REDIRECT_HEADERS}
    kept["location"] = location
    kept["x-harper-rendered"] = "1"
    return Page(cache_key=key, status_code=status, headers=kept, content=b"", last_cached=now,
                expires_at=expires_at, is_indexable=False)
