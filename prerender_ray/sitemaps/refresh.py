"""A sitemap refresh as a whole (docs/sitemaps.md): the result document a walk reports (also its
progress snapshot), the advisory claim on a running refresh, and when the daily refresh fires. No I/O
here, as in ``rules.py``, whose per-document decisions the result counts.

Deliberate differences from the reference:
- the result also counts ``invalid`` entries (with a capped sample) and ``unknownChangefreq``;
- ``sitemapsDiscovered`` counts distinct documents (at most ``sitemap.max_documents``); repeats and
  cycles go to ``repeatedChildren``, child listings past the cap to ``sitemapsSkipped``;
- a claim row stamped further in the future than the stale window is taken over (clock skew).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from pydantic.alias_generators import to_camel

from prerender_ray.config.origin import Sitemap as SitemapConfig
from prerender_ray.sitemaps.rules import (
    COUNTED_AS,
    Action,
    InvalidEntry,
    Partition,
    PruneScan,
    describe_error,
    sample_text,
)
from prerender_ray.timeutil import minute


@dataclass(slots=True)
class RefreshResult:
    """The result of one walk (docs/sitemaps.md#result-document), also its progress snapshot. ``removed``
    and ``invalid`` are exact; only their samples are capped. ``failed`` keeps ``failed_cap`` entries
    and counts the rest."""

    removed_sample_cap: int = 20
    failed_cap: int = 100
    created: int = 0
    updated: int = 0
    skipped: int = 0
    duplicates: int = 0
    deferred: int = 0
    removed: int = 0
    invalid: int = 0
    unknown_changefreq: int = 0
    sitemaps_processed: int = 0
    sitemaps_discovered: int = 0  # distinct documents taken in this walk, at most sitemap.max_documents
    repeated_children: int = 0  # index listings of a document already seen: cycles and duplicates
    sitemaps_skipped: int = 0  # child listings past sitemap.max_documents: counted, never held nor fetched
    filtered: dict[str, int] = field(default_factory=lambda: {"passthrough": 0, "unclassified": 0})
    removed_sample: list[str] = field(default_factory=list)
    invalid_sample: list[dict[str, str | None]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    failed_overflow: int = 0
    truncated_scans: list[dict[str, Any]] = field(default_factory=list)
    lastmod_due: int = 0  # pages a lastmod newer than their last render made due (paced)
    lastmod_invalid: int = 0  # lastmods that are no datetime: ignored
    lastmod_future: int = 0  # lastmods later than the walk: ignored until a walk after them

    @classmethod
    def from_config(cls, sitemap_cfg: SitemapConfig) -> RefreshResult:
        return cls(removed_sample_cap=sitemap_cfg.removed_sample_cap, failed_cap=sitemap_cfg.failed_cap)

    def count(self, action: Action, n: int = 1) -> None:
        name = COUNTED_AS[action]
        setattr(self, name, getattr(self, name) + n)

    def add_partition(self, sitemap_url: str, partition: Partition) -> None:
        for route_class, n in partition.filtered.items():
            self.filtered[route_class] += n
        self.add_invalid(sitemap_url, partition.invalid)
        self.unknown_changefreq += partition.unknown_changefreq

    def add_invalid(self, sitemap_url: str, invalid: Sequence[InvalidEntry]) -> None:
        """Invalid entries (or an index's unusable child locs): counted exactly, sampled (clipped) up
        to the cap."""
        self.invalid += len(invalid)
        for bad in invalid[: max(self.removed_sample_cap - len(self.invalid_sample), 0)]:
            loc = None if bad.loc is None else sample_text(bad.loc)
            self.invalid_sample.append({"sitemapUrl": sitemap_url, "loc": loc, "error": sample_text(bad.message)})

    def add_prune(self, scan: PruneScan) -> None:
        """The scan's deferrals and, when it hit the cap, its truncation record."""
        self.deferred += scan.deferred
        if scan.truncated:
            self.truncated_scans.append(
                {"sitemapUrl": scan.sitemap_url, "examined": scan.examined, "collected": len(scan.departed)}
            )

    def add_removed(self, urls: Sequence[str]) -> None:
        self.removed += len(urls)
        self.removed_sample.extend(urls[: max(self.removed_sample_cap - len(self.removed_sample), 0)])

    def add_failed(self, url: str, error: object) -> None:
        if len(self.failed) < self.failed_cap:
            self.failed.append({"url": url, "error": describe_error(error)})
        else:
            self.failed_overflow += 1

    def snapshot(self) -> RefreshResult:
        """A copy that later counting cannot reach (an already persisted progress row stays as it was)."""
        return replace(
            self,
            filtered=dict(self.filtered),
            removed_sample=list(self.removed_sample),
            invalid_sample=[dict(x) for x in self.invalid_sample],
            failed=[dict(x) for x in self.failed],
            truncated_scans=[dict(x) for x in self.truncated_scans],
        )

    def as_dict(self) -> dict[str, Any]:
        """The wire form, in the reference's names; healthy empty values are [] and 0, never absent."""
        s = self.snapshot()
        return {to_camel(f.name): getattr(s, f.name) for f in fields(s) if f.name not in _CAPS}


_CAPS = ("removed_sample_cap", "failed_cap")


class ClaimCheck(NamedTuple):
    allowed: bool
    reason: str | None = None  # why a refresh was refused
    warning: str | None = None  # a takeover or an unreadable row: worth a log line


def check_refresh_claim(
    root: str, row: Mapping[str, Any] | BaseException | None, *, now_ms: int, stale_run_ms: int
) -> ClaimCheck:
    """The advisory guard of docs/sitemaps.md#runs-claims-and-takeover. ``row`` is the root's progress
    row, None when absent, or the exception its read raised (a guard that cannot read must not block
    the work)."""
    if isinstance(row, BaseException):
        return ClaimCheck(True, warning=f"refresh row of {root} unreadable ({describe_error(row)})")
    if row is None or row.get("state") != "running":
        return ClaimCheck(True)
    node = row.get("node") or "another node"
    updated = _epoch_ms(row.get("updatedAt"))
    age = math.inf if updated is None else now_ms - updated
    if -stale_run_ms <= age < stale_run_ms:
        ago = max(math.floor(age / 1000 + 0.5), 0)
        return ClaimCheck(False, reason=f"a refresh on {node} is already running (last progress {ago}s ago)")
    last = "unreadable" if updated is None else f"{age / 1000:.0f}s ago"  # negative: stamped in the future
    return ClaimCheck(True, warning=f"Taking over the refresh of {root} from {node} (last progress {last})")


def _epoch_ms(value: Any) -> float | None:
    """Epoch ms from a stored time (a number, or ISO-8601 text, UTC unless it says); None if unreadable."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    try:
        at = datetime.fromisoformat(value.strip())
    except (AttributeError, TypeError, ValueError):
        return None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000


def daily_refresh_key(sitemap_cfg: SitemapConfig, node_name: str) -> str | None:
    """What the daily-refresh timer of ``node_name`` should be armed with: ``"HH:MM|zone"``, or None
    when the schedule is off (``sitemap.node`` empty) or pinned to another node. A change re-arms."""
    if not sitemap_cfg.node or sitemap_cfg.node != node_name:
        return None
    return f"{sitemap_cfg.refresh_time}|{sitemap_cfg.timezone}"


def next_daily_refresh(refresh_time: str, zone: str | tzinfo, now_ms: int) -> int:
    """Epoch ms of the next ``HH:MM`` wall-clock time in ``zone`` strictly after ``now_ms``.

    The offset is the zone's at that instant (DST-aware); a time skipped by a spring-forward gap fires
    at the instant the pre-gap offset gives (02:30 becomes 03:30), a repeated one at its first
    occurrence. Unparseable parts of ``refresh_time`` become 0, as in the reference.
    """
    tz = ZoneInfo(zone) if isinstance(zone, str) else zone
    at = time(*_hhmm(refresh_time))
    today: date = datetime.fromtimestamp(now_ms / 1000, tz).date()
    fire = minute(int(datetime.combine(today, at, tzinfo=tz).timestamp() * 1000))
    if fire <= now_ms:  # passed today; tomorrow's is about 24 h later, so it lies ahead
        fire = minute(int(datetime.combine(today + timedelta(days=1), at, tzinfo=tz).timestamp() * 1000))
    return fire


def _hhmm(text: str) -> tuple[int, int]:
    parts = (str(text).split(":") + ["0"])[:2]
    hour, minute_of_hour = (int(p) if re.fullmatch(r"[0-9]{1,2}", p.strip()) else 0 for p in parts)
    return (hour if hour < 24 else 0), (minute_of_hour if minute_of_hour < 60 else 0)
