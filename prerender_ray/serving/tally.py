"""Bounded tallies for bot analytics: the unrouted-path report (docs/serving.md#unrouted-tally) and label
budgets that keep metric cardinality finite.

Bot names may be derived from any User-Agent and paths come from the bots themselves, so neither can
be a metric label as is: a budget admits the first N distinct values of a dimension for the life of
the process and folds the rest into one overflow label.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prerender_ray.serving.origin_rules import bucket_for_unrouted

OVERFLOW = "overflow"  # the unrouted overflow bucket (as the reference)
LABEL_OVERFLOW = "~overflow"  # any other dimension past its budget (the reference's crawl overflow)
MAX_SAMPLE_PATH = 256  # characters of a bucket's sample path kept for the report (a bot chooses it)


class LabelBudget:
    """The first ``limit`` distinct values pass; later new ones become ``overflow``. Values in
    ``always`` (a bounded set the operator chose, such as the bot registry's names) pass without
    spending the budget, so made-up values cannot push them out."""

    def __init__(self, limit: int, overflow: str = LABEL_OVERFLOW, always: Iterable[str] = ()):
        self.limit = limit
        self.overflow = overflow
        self._always = frozenset(always)
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen or value in self._always:
            return value
        if len(self._seen) >= self.limit:
            return self.overflow
        self._seen.add(value)
        return value


@dataclass
class Bucket:
    count: int
    first_ms: int
    last_ms: int
    sample_path: str


@dataclass
class ClassTally:
    buckets: dict[str, Bucket] = field(default_factory=dict)
    overflowed: int = 0


class UnroutedTally:
    """Bot requests served without prerendering, per class and path bucket, drained every interval.

    Once a class holds ``max_buckets`` distinct buckets, further new buckets only count as overflow
    (nothing is evicted); so does a path whose first segment no site names (``bucket_for_unrouted``). ``record`` returns the bucket's metric label: the bucket, or ``overflow``
    once the lifetime label budget of the class is spent."""

    CLASSES = ("unclassified", "passthrough")

    def __init__(self, max_buckets: int = 200, top_n: int = 20):
        self.max_buckets = max_buckets
        self.top_n = top_n
        self._tally: dict[str, ClassTally] = {}
        self._labels = {c: LabelBudget(max_buckets, OVERFLOW) for c in self.CLASSES}

    def record(self, route_class: str, path: object, now_ms: int, source: str = "cdn") -> str | None:
        """Count one request; None for a class that is not tallied (prerender)."""
        if route_class not in self.CLASSES:
            return None
        bucket = bucket_for_unrouted(path, source)
        tally = self._tally.setdefault(route_class, ClassTally())
        if bucket is None:  # a junk segment: straight to overflow, spending neither budget
            tally.overflowed += 1
            return OVERFLOW
        found = tally.buckets.get(bucket)
        if found is not None:
            found.count += 1
            found.last_ms = now_ms
        elif len(tally.buckets) >= self.max_buckets:
            tally.overflowed += 1
        else:
            sample = path[:MAX_SAMPLE_PATH] if isinstance(path, str) else "/"
            tally.buckets[bucket] = Bucket(1, now_ms, now_ms, sample)
        return self._labels[route_class](bucket)

    def peek(self) -> dict[str, ClassTally]:
        return self._tally

    def drain(self) -> dict[str, ClassTally]:
        """Take the report and start a new one."""
        report, self._tally = self._tally, {}
        return report

    def lines(self, report: dict[str, ClassTally]) -> list[str]:
        """One warning line per class with rows (top N by count), and one for overflow."""
        out = []
        for cls, tally in report.items():
            rows = sorted(tally.buckets.items(), key=lambda kv: -kv[1].count)
            if rows:
                total = sum(b.count for _, b in rows)
                shown = ", ".join(f"{name} x{b.count} (e.g. {b.sample_path})"
                                  for name, b in rows[: self.top_n])
                more = f" +{len(rows) - self.top_n} more bucket(s)" if len(rows) > self.top_n else ""
                out.append(f"{cls}: {total} request(s) served without prerendering across {len(rows)} "
                           f"path bucket(s) - {shown}{more}")
            if tally.overflowed:
                out.append(f"{cls}: {tally.overflowed} request(s) in new path buckets past the cap of "
                           f"{self.max_buckets} or with no plausible first segment ({OVERFLOW})")
        return out


# ------------------------------------------------------------------------------------ bot misses

MAX_MISS_URL = 2_048  # characters of a missed URL kept (a bot chooses the URL)


@dataclass
class Missed:
    count: int
    first_ms: int
    last_ms: int
    last_bot: str


class MissTally:
    """The URLs bots asked for that had no cached page, per bot class: at most ``max_urls`` per class,
    the least recently asked one evicted first (a dict keeps insertion order; a repeat moves to the
    end), so the list is what bots want lately, with counts since each URL entered it."""

    def __init__(self, max_urls: int = 200):
        self.max_urls = max_urls
        self._by_class: dict[str, dict[str, Missed]] = {}
        self.evicted = 0

    def record(self, bot_class: str, url: str, bot: str, now_ms: int) -> None:
        if self.max_urls <= 0:
            return
        url = url[:MAX_MISS_URL]
        urls = self._by_class.setdefault(bot_class, {})
        found = urls.pop(url, None)
        if found is None:
            if len(urls) >= self.max_urls:
                del urls[next(iter(urls))]
                self.evicted += 1
            found = Missed(0, now_ms, now_ms, bot)
        found.count += 1
        found.last_ms = now_ms
        found.last_bot = bot
        urls[url] = found

    def top(self, limit: int) -> dict[str, list[dict]]:
        """Per class, the ``limit`` most asked URLs (ties: the most recent first)."""
        out = {}
        for cls, urls in sorted(self._by_class.items()):
            rows = sorted(urls.items(), key=lambda kv: (-kv[1].count, -kv[1].last_ms))[:limit]
            out[cls] = [{"url": u, "count": m.count, "firstMs": m.first_ms, "lastMs": m.last_ms,
                         "lastBot": m.last_bot} for u, m in rows]
        return out
