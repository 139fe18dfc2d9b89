"""The pure decisions of sitemap ingestion (docs/sitemaps.md).

What a urlset's entries become (kept, filtered, invalid), what each kept entry does to its target
(render, create, skip, duplicate, reattach), what the prune scan does to targets that left the
document (keep, defer, unlink), the result document a walk reports, the advisory claim on a
running refresh, and when the daily refresh fires. No I/O here: the walk reads and writes through
the stores and feeds what it read to these functions.

Deliberate differences from the reference:
- a loc that is not http(s), or (with ``domains`` set) names a host or port it does not allow, is invalid;
- the result also counts ``invalid`` entries (with a capped sample) and ``unknownChangefreq``;
- ``sitemapsDiscovered`` counts distinct documents (at most ``sitemap.max_documents``); repeats and
  cycles go to ``repeatedChildren``, child listings past the cap to ``sitemapsSkipped``;
- a claim row stamped further in the future than the stale window is taken over (clock skew).
Kept on purpose: an empty urlset prunes nothing (``Partition.reconciles``), since an empty document
is more often a publishing glitch than an intent, and unlinking only stops attribution anyway.
"""

from __future__ import annotations

import errno
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from enum import Enum, StrEnum
from typing import Any, Literal, NamedTuple
from zoneinfo import ZoneInfo

from pydantic.alias_generators import to_camel

from prerender_ray.config.model import Config
from prerender_ray.config.origin import Sitemap as SitemapConfig
from prerender_ray.config.render import Page
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.routes import Classification
from prerender_ray.identity.urls import url_parts, url_path
from prerender_ray.queue.schedule import CHANGEFREQ_MS, changefreq_interval
from prerender_ray.serving.origin_policy import compiled
from prerender_ray.sitemaps.parser import SitemapEntry
from prerender_ray.timeutil import minute

Classify = Callable[[str], Classification]
Canonicalize = Callable[[str | tuple[str, str, str, str], Sequence[str]], str]  # a URL or its url_parts

SAMPLE_TEXT = 300  # characters of an outside string (a loc, a robots.txt line) that a sample keeps


class InvalidEntry(NamedTuple):
    loc: str | None
    message: str


def sample_text(text: str) -> str:
    """``text`` as a sample keeps it: cut at ``SAMPLE_TEXT``, its length said. libxml2 allows a 10 MB
    loc, and the result is re-encoded into the progress row after every document."""
    return text if len(text) <= SAMPLE_TEXT else f"{text[:SAMPLE_TEXT]}… ({len(text)} characters)"


@dataclass(slots=True)
class Partition:
    """One urlset split (docs/sitemaps.md#partitioning-a-urlset): ``incoming`` maps canonical URL ->
    entry (the last loc wins)."""

    incoming: dict[str, SitemapEntry] = field(default_factory=dict)
    filtered: dict[str, int] = field(default_factory=lambda: {"passthrough": 0, "unclassified": 0})
    invalid: list[InvalidEntry] = field(default_factory=list)
    unknown_changefreq: int = 0
    total: int = 0  # every entry, invalid and duplicates included: the filtered share's base

    @property
    def filtered_count(self) -> int:
        return self.filtered["passthrough"] + self.filtered["unclassified"]

    @property
    def reconciles(self) -> bool:
        """Only a non-empty urlset is reconciled: an empty one keeps its targets attributed
        (docs/sitemaps.md#an-empty-urlset-prunes-nothing)."""
        return self.total > 0


def partition_entries(
    entries: Iterable[SitemapEntry] | None,
    classify: Classify,
    canonicalize: Canonicalize,
    into: Partition | None = None,
) -> Partition:
    """Classify each entry's path as the serve path would and key prerender entries canonically.

    One bad entry never spoils the document: it lands in ``invalid`` with a message and the rest go on.
    ``into`` continues an earlier partition of the same document (a streamed body, chunk by chunk).
    """
    out = Partition() if into is None else into
    if entries is None:
        return out
    for entry in entries:
        out.total += 1
        loc = entry.loc
        if not loc:
            out.invalid.append(InvalidEntry(loc, "missing <loc>"))
            continue
        try:
            parts = url_parts(loc)  # parsed once: the path classifies, then the parts are keyed
        except ValueError:
            out.invalid.append(InvalidEntry(loc, "not a valid absolute http(s) URL"))
            continue
        try:
            verdict = classify(parts[2])
            if verdict.route_class != "prerender":
                out.filtered[verdict.route_class] += 1
                continue
            out.incoming[canonicalize(parts, verdict.allowlist)] = entry
        except ValueError as e:  # the canonicalizer's refusal (UrlError) of this one entry
            out.invalid.append(InvalidEntry(loc, describe_error(e)))
            continue
        if entry.changefreq is not None and entry.changefreq not in CHANGEFREQ_MS:
            out.unknown_changefreq += 1
    return out


def canonicalizer(cfg: Config) -> Canonicalize:
    """The key a bot read computes (``canonicalize_url`` with the cache-key options). Like the ingress,
    it refuses a host outside a non-empty ``domains``: no bot could ever read that target's page."""
    key = KeyFormat.from_config(cfg).canonicalize
    domains = compiled(tuple(cfg.domains))

    def keyed(url: str | tuple[str, str, str, str], allowlist: Sequence[str]) -> str:
        canonical = key(url, allowlist)
        if domains and (why := domains.url_refusal(canonical)):
            raise ValueError(why)
        return canonical

    return keyed


def filtered_share(filtered: int, total: int) -> int:
    """Percent of entries filtered, rounded half up as JavaScript's Math.round does."""
    return math.floor(100 * filtered / total + 0.5) if total > 0 else 0


class FilteredLog(NamedTuple):
    level: Literal["error", "info"]
    message: str


def filtered_log(sitemap_url: str, partition: Partition, warn_percent: int) -> FilteredLog | None:
    """Nothing when nothing was filtered; an error at or above ``sitemap.filtered_warn_percent``."""
    n = partition.filtered_count
    if n == 0:
        return None
    share = filtered_share(n, partition.total)
    f = partition.filtered
    counts = f"passthrough {f['passthrough']}, unclassified {f['unclassified']}"
    if share >= warn_percent:
        return FilteredLog(
            "error",
            f"{share}% of the {partition.total} entries of {sitemap_url} are not prerender routes "
            f"({counts}); check ingress.routes",
        )
    return FilteredLog("info", f"{n} of the {partition.total} entries of {sitemap_url} filtered ({counts})")


class Action(StrEnum):
    RENDER = "render"  # revalidate: put with the first render now
    CREATE = "create"  # no target: put with a jittered first render
    SKIP = "skip"  # already attributed to this document: nothing to write
    DUPLICATE = "duplicate"  # claimed earlier in this walk by another document: nothing to write
    REATTACH = "reattach"  # unowned, or owned by a document outside this walk: patch, clock kept


COUNTED_AS: dict[Action, str] = {
    Action.RENDER: "created",
    Action.CREATE: "created",
    Action.SKIP: "skipped",
    Action.DUPLICATE: "duplicates",
    Action.REATTACH: "updated",
}


class _NoTarget(Enum):
    NO_TARGET = "NO_TARGET"  # the point read found no target row (distinct from sitemapUrl None)


NO_TARGET = _NoTarget.NO_TARGET


def fast_action(url: str, *, known_keys: Collection[str] | None, revalidate: bool) -> Action | None:
    """The decision that needs no read, or None: revalidate renders, a known key skips."""
    if revalidate:
        return Action.RENDER
    if known_keys is not None and url in known_keys:
        return Action.SKIP
    return None


def fast_actions(incoming: Mapping[str, Any], *, known_keys: Collection[str] | None, revalidate: bool
                 ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """``fast_action`` for a whole document in one pass (a walk lists a million URLs): the
    (url, entry) pairs to render and those to read; every other URL skips."""
    if revalidate:
        return list(incoming.items()), []
    known = known_keys or ()
    return [], [item for item in incoming.items() if item[0] not in known]


def decide_action(
    url: str,
    sitemap_url: str,
    existing: str | None | _NoTarget,
    *,
    visited: Collection[str],
    known_keys: Collection[str] | None = None,
    revalidate: bool = False,
) -> Action:
    """The order of docs/sitemaps.md#reconcile-actions. ``existing`` is the target's ``sitemapUrl``
    (None when unattributed) or ``NO_TARGET``; ``visited`` holds the documents this walk already
    dequeued, failed ones included."""
    fast = fast_action(url, known_keys=known_keys, revalidate=revalidate)
    if fast is not None:
        return fast
    if existing is NO_TARGET:
        return Action.CREATE
    if existing is not None and not isinstance(existing, str):
        raise TypeError(f"existing must be a sitemap URL, None or NO_TARGET, not {type(existing).__name__}")
    if existing == sitemap_url:
        return Action.SKIP
    if existing is not None and existing in visited:
        return Action.DUPLICATE
    return Action.REATTACH


class TargetWrite(NamedTuple):
    """``put`` replaces the target (lifting suppression) and writes its schedule rows; ``patch``
    touches only these fields and never the schedule, so the render clock keeps running."""

    op: Literal["put", "patch"]
    url: str
    sitemap_url: str
    render_interval: int
    next_render_time: int | None = None  # None on a put: the store jitters the first render


def target_write(
    action: Action, url: str, sitemap_url: str, entry: SitemapEntry, page_cfg: Page, now_ms: int
) -> TargetWrite | None:
    interval = changefreq_interval(entry.changefreq, page_cfg)
    if action is Action.RENDER:
        return TargetWrite("put", url, sitemap_url, interval, minute(now_ms))
    if action is Action.CREATE:
        return TargetWrite("put", url, sitemap_url, interval)
    if action is Action.REATTACH:
        return TargetWrite("patch", url, sitemap_url, interval)
    return None


@dataclass(slots=True)
class BatchPlan:
    """What one batch of a urlset's entries writes: puts as columns (all for one sitemap), patches
    (``REATTACH``) and the count of each action."""

    urls: list[str] = field(default_factory=list)
    intervals: list[int] = field(default_factory=list)
    dues: list[int | None] = field(default_factory=list)  # None: the store jitters the first render
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    counts: dict[Action, int] = field(default_factory=dict)


def plan_batch(
    sitemap_url: str,
    items: Sequence[tuple[str, SitemapEntry]],
    existing: Sequence[str | None | _NoTarget] | None,
    *,
    visited: Collection[str],
    revalidate: bool,
    page_cfg: Page,
    now_ms: int,
) -> BatchPlan:
    """``decide_action`` then ``target_write`` for every (canonical URL, entry) of a batch whose fast
    actions are already taken out; ``existing`` is each URL's attribution as read, or None when
    nothing was read (a revalidating walk). Same outcome entry by entry, without a call and a tuple
    per URL: a million-URL walk goes through here."""
    plan = BatchPlan()
    counts, interval_of = plan.counts, {}
    render_due = minute(now_ms)
    if existing is None and items:  # nothing read: every URL is put, as a create or a render now
        for freq in {entry.changefreq for _, entry in items}:
            interval_of[freq] = changefreq_interval(freq, page_cfg)
        plan.urls = [url for url, _ in items]
        plan.intervals = [interval_of[entry.changefreq] for _, entry in items]
        plan.dues = [render_due if revalidate else None] * len(items)
        counts[Action.RENDER if revalidate else Action.CREATE] = len(items)
        return plan
    for i, (url, entry) in enumerate(items):
        held = NO_TARGET if existing is None else existing[i]
        if revalidate:
            action = Action.RENDER
        elif held is NO_TARGET:
            action = Action.CREATE
        else:
            action = decide_action(url, sitemap_url, held, visited=visited)
        counts[action] = counts.get(action, 0) + 1
        if action is Action.SKIP or action is Action.DUPLICATE:
            continue
        freq = entry.changefreq
        interval = interval_of.get(freq)
        if interval is None:
            interval = interval_of[freq] = changefreq_interval(freq, page_cfg)
        if action is Action.REATTACH:
            plan.patches.append((url, {"sitemap_url": sitemap_url, "render_interval": interval}))
        else:
            plan.urls.append(url)
            plan.intervals.append(interval)
            plan.dues.append(render_due if action is Action.RENDER else None)
    return plan


def first_renders(revalidate: bool, page: Page, first_render: str = "now") -> dict:
    """When a walk's new pages get their first render, for the walk's answer: now with
    ``revalidate`` or ``render.firstRender: now``, else at a fixed point within each page's cadence
    (its changefreq, ``page.ttl`` without one), so that no day has a herd."""
    if revalidate:
        return {"when": "now", "note": "every listed page is due this minute; the fleet renders them as it claims"}
    if first_render == "now":
        return {"when": "now", "note": "every new page is due this minute, ranked behind older overdue work; "
                "its next render falls at a fixed point within its cadence (render.firstRender)"}
    longest = max(changefreq_interval(f, page) for f in (*CHANGEFREQ_MS, None))
    return {"when": "spread", "defaultCadenceMs": changefreq_interval(None, page), "longestCadenceMs": longest,
            "note": "a new page's first render falls at a fixed point within its cadence (its changefreq, "
                    "page.ttl without one); send revalidate: true to render every listed page now"}


def still_listed(candidates: set[str], listing: str, entries: Iterable[SitemapEntry],
                 classify: Classify, canonicalize: Canonicalize, into: dict[str, str]) -> None:
    """Record in ``into`` which of ``candidates`` (targets of a sitemap being deleted) the remaining
    sitemap ``listing`` still lists, keyed as a walk would; the first listing found keeps a URL."""
    for url in partition_entries(entries, classify, canonicalize).incoming:
        if url in candidates and url not in into:
            into[url] = listing


class PruneAction(StrEnum):
    KEEP = "keep"  # still listed: becomes a known key
    DEFER = "defer"  # gone, but no longer a prerender route: left attributed for the repair sweep
    UNLINK = "unlink"  # gone: sitemapUrl cleared; the target keeps rendering as a discovered one


def prune_action(url: str, incoming: Mapping[str, object], classify: Classify) -> PruneAction:
    if url in incoming:
        return PruneAction.KEEP
    routed = classify(url_path(url)).route_class == "prerender"
    return PruneAction.UNLINK if routed else PruneAction.DEFER


@dataclass(slots=True)
class PruneScan:
    """Phase A over the targets attributed to one urlset: the scan always completes (``examined`` is
    exact) while ``known_keys`` and ``departed`` stop growing at ``collect_cap``."""

    sitemap_url: str
    incoming: Mapping[str, object]
    classify: Classify
    collect_cap: int
    known_keys: set[str] = field(default_factory=set)
    departed: list[str] = field(default_factory=list)
    examined: int = 0
    deferred: int = 0

    def add(self, url: str) -> PruneAction:
        self.examined += 1
        action = prune_action(url, self.incoming, self.classify)
        if action is PruneAction.KEEP:
            if len(self.known_keys) < self.collect_cap:
                self.known_keys.add(url)
        elif action is PruneAction.DEFER:
            self.deferred += 1
        elif len(self.departed) < self.collect_cap:
            self.departed.append(url)
        return action

    @property
    def truncated(self) -> bool:
        return len(self.departed) >= self.collect_cap


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
_ERRNO_PREFIX = re.compile(r"^\[Errno -?\d+\] ")


def describe_error(error: object) -> str:
    """One line for an error and its ``__cause__`` chain, joined with ': ', each with its ``(CODE)``.

    Anything raised or rejected reads sensibly: a bare string, None, an exception with an empty
    message (its class name), an OSError (its errno name). Repeats down the chain are said once.
    """
    parts: list[str] = []
    seen: set[int] = set()
    current: object = error
    while current is not None and id(current) not in seen and len(parts) < 8:
        seen.add(id(current))
        part = _describe_one(current)
        if not parts or parts[-1] != part:
            parts.append(part)
        current = current.__cause__ if isinstance(current, BaseException) else None
    return ": ".join(parts) if parts else "unknown error"


def _describe_one(error: object) -> str:
    if not isinstance(error, BaseException):
        return str(error) or repr(error)
    message = str(error)
    code = getattr(error, "code", None)
    if isinstance(error, OSError) and error.errno is not None:
        message = _ERRNO_PREFIX.sub("", message)
        code = code or errno.errorcode.get(error.errno)
    message = message or type(error).__name__
    if code not in (None, "") and not isinstance(code, bool) and f"({code})" not in message:
        message = f"{message} ({code})"
    return message


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
