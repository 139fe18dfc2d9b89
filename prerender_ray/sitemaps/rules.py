"""The pure decisions of sitemap ingestion (docs/sitemaps.md).

What a urlset's entries become (kept, filtered, invalid), what each kept entry does to its target
(render, create, skip, duplicate, reattach), and what the prune scan does to targets that left the
document (keep, defer, unlink). The result document a walk reports, the advisory claim on a running
refresh and when the daily refresh fires are ``refresh.py``'s. No I/O here: the walk reads and writes
through the stores and feeds what it read to these functions.

Deliberate difference from the reference: a loc that is not http(s), or (with ``domains`` set) names
a host or port it does not allow, is invalid.
Kept on purpose: an empty urlset prunes nothing (``Partition.reconciles``), since an empty document
is more often a publishing glitch than an intent, and unlinking only stops attribution anyway.
"""

from __future__ import annotations

import errno
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Literal, NamedTuple

from prerender_ray.config.model import Config
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
