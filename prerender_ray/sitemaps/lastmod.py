"""A sitemap entry's ``lastmod``: what time it names, and which entries of a refreshed urlset say their
page changed since the document's previous walk (docs/sitemaps.md#lastmod).

- A W3C datetime (``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD``, or a date with a time and a zone; what
  ``datetime.fromisoformat`` reads) names the start of the period it gives: ``2024-05-20`` is
  midnight UTC that day, so a page last rendered during that day is not older than it (the
  comparison happens at the value's own precision). A time without a zone is read as UTC.
- Unparseable: ignored (the page renders on its cadence) and counted.
- In the future (later than this walk): ignored and counted; the next walk after it has passed sees
  it, since it is then newer than this walk.
- Only entries newer than the previous walk of the same document are candidates: older ones were
  weighed by that walk (whose check time the document's row keeps as ``walkedAt``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prerender_ray.sitemaps.parser import SitemapEntry

_YEAR_MONTH = re.compile(r"^(\d{4})(?:-(\d{2}))?$")
_MAX_TEXT = 64  # longer is no datetime: refused before the parse


def lastmod_ms(text: str | None) -> int | None:
    """Epoch ms of a ``lastmod`` (the start of the period it names), or None when it is not a datetime."""
    if not text or len(text) > _MAX_TEXT:
        return None
    text = text.strip()
    try:
        m = _YEAR_MONTH.match(text)
        at = datetime(int(m[1]), int(m[2] or 1), 1) if m else datetime.fromisoformat(text)
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    try:
        return int(at.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):  # year 1 with a negative offset, and the like
        return None


@dataclass(slots=True)
class ChangedEntries:
    """What one urlset's lastmods say: ``changed`` maps canonical URL -> lastmod (epoch ms) for the
    entries newer than the previous walk and not in the future."""

    changed: dict[str, int] = field(default_factory=dict)
    invalid: int = 0
    future: int = 0


def changed_entries(incoming: Mapping[str, SitemapEntry], since: int | None, now: int) -> ChangedEntries:
    """The entries of ``incoming`` whose lastmod lies in ``(since, now]`` (``since`` None: the document's
    first walk, every past lastmod counts). Parses each distinct text once (a site often stamps many
    entries alike)."""
    out = ChangedEntries()
    seen: dict[str, int | None] = {}
    for url, entry in incoming.items():
        text = entry.lastmod
        if text is None:
            continue
        if text in seen:
            at = seen[text]
        else:
            at = seen[text] = lastmod_ms(text)
        if at is None:
            out.invalid += 1
        elif at > now:
            out.future += 1
        elif since is None or at > since:
            out.changed[url] = at
    return out
