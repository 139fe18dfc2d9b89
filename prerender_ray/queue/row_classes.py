"""What the ranking (``ranking.py``) is built from: the classes its rows are grouped into (route,
carried cadence, sitemap flag), the buckets that hold a class's keys by due instant, range counts over
a class's due instants (one class, or every class in one array), a row's score within its class and
the galloping search along a class; and the brute-force oracle that scores every row, which pins the
ranking's merge in tests and benchmarks.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from prerender_ray.queue.schedule import cadence_of, score
from prerender_ray.timeutil import finite, minute, positive

CHANGES_MIN = 256  # changes a class's queue-state snapshot takes before a rebuild is cheaper

Route = Hashable  # an opaque route label from the caller (None = no route matched)
CadenceFor = Callable[[Route], Any]  # route -> its configured cadence in ms
RouteOf = Callable[[str], Route]  # cache key -> route
IsLeased = Callable[[str], bool]
Ready = tuple[str, int, float, bool]  # cache key, due at, score, from sitemap


class Held(NamedTuple):
    """One held row as the keeper sees it."""

    key: str
    due: int | None
    from_sitemap: bool
    interval: float | None  # the carried cadence; None when absent or junk
    route: Route


class _Class:
    __slots__ = ("added", "buckets", "cadence", "carried", "dues", "ordered", "removed", "route", "sitemap",
                 "snap", "undated")

    def __init__(self, route: Route, carried: float | None, sitemap: bool, cadence: float | None):
        self.route = route
        self.carried = carried
        self.sitemap = sitemap
        self.cadence = cadence  # what scores divide by; None = raw lateness (config gave junk)
        self.buckets: dict[int, _Bucket] = {}
        self.dues: list[int] = []  # due instants with a bucket; sorted when ``ordered``
        self.ordered = True
        self.undated: _Bucket | None = None  # rows with no due time: held, never due
        # the queue-state's counts: due instants and running row counts as of the last rebuild, and
        # the due instants of the rows added and taken out since; None until a state is asked
        self.snap: tuple[np.ndarray, np.ndarray] | None = None
        self.added: list[int] = []
        self.removed: list[int] = []

    def note(self, due: int, sign: int) -> None:
        """A dated row came (+1) or went (-1). Past a quarter of the snapshot, rebuilding is cheaper."""
        if self.snap is not None:
            (self.added if sign > 0 else self.removed).append(due)
            if len(self.added) + len(self.removed) > max(CHANGES_MIN, len(self.snap[0]) >> 2):
                self.forget()

    def forget(self) -> None:
        """Drop the kept counts: the next queue-state rebuilds them."""
        self.snap, self.added, self.removed = None, [], []

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """The due instants and running row counts, rebuilt when dropped (the changes restart)."""
        if self.snap is None:
            dues = self.sorted_dues()
            counts = np.fromiter(map(len, map(self.buckets.__getitem__, dues)), np.int64, len(dues))
            prefix = np.concatenate(([0], np.cumsum(counts)))
            self.snap, self.added, self.removed = (np.array(dues, dtype=np.int64), prefix), [], []
        return self.snap

    def counts(self) -> Counts:
        """Rows due at or before given instants, from the snapshot and the changes since (the
        per-class path, when no joint window holds the instants asked)."""
        dues, prefix = self.snapshot()
        return Counts(dues, prefix, self.added, self.removed)

    def sorted_dues(self) -> list[int]:
        if not self.ordered:
            self.dues.sort()  # mostly appends in order, so near-linear
            self.ordered = True
        return self.dues


class Counts:
    """Range counts over one class's due instants: the snapshot's running counts plus those of the
    changes since, each found for every instant asked in one vectorized search (numpy), instead of
    a walk over every bucket or a bisect per instant."""

    __slots__ = ("added", "dues", "prefix", "removed")

    def __init__(self, dues: np.ndarray, prefix: np.ndarray, added: list[int], removed: list[int]):
        self.dues, self.prefix = dues, prefix
        self.added = np.sort(np.array(added, dtype=np.int64))
        self.removed = np.sort(np.array(removed, dtype=np.int64))

    @property
    def total(self) -> int:
        return int(self.prefix[-1]) + len(self.added) - len(self.removed)

    def upto(self, ts: Sequence[float]) -> np.ndarray:
        """Rows due at or before each of ``ts``."""
        at = np.asarray(ts, dtype=np.float64)
        out = self.prefix[np.searchsorted(self.dues, at, "right")]
        if len(self.added):
            out = out + np.searchsorted(self.added, at, "right")
        if len(self.removed):
            out = out - np.searchsorted(self.removed, at, "right")
        return out


class _Joint:
    """Every class's snapshot in one sorted array, so one search counts every class at every instant.

    Class i's due instants are clipped into a window of instants [lo, lo + span) and offset by
    i x span. Clipping keeps the counts exact for every instant asked inside the window (a due
    before it is before them all; one after it, after them all). Kept while the classes and their
    snapshots are the same objects and the instants asked stay inside the window."""

    __slots__ = ("base", "classes", "dues", "lo", "offsets", "prefix", "snaps", "span", "totals")

    def __init__(self, classes: tuple[_Class, ...], lo: int, span: int):
        self.classes, self.lo, self.span = classes, lo, span
        snaps = [cls.snapshot() for cls in classes]
        self.snaps = tuple(snaps)  # the objects, not their ids: a freed one's id may come back
        self.offsets = np.arange(len(classes), dtype=np.int64) * span
        self.dues = np.concatenate([np.clip(d, lo, lo + span - 1) - lo + off for (d, _), off in zip(snaps, self.offsets)]
                                   or [np.zeros(0, np.int64)])
        self.totals = np.array([p[-1] for _, p in snaps], dtype=np.int64)
        self.prefix = np.concatenate(([0], np.cumsum(np.concatenate(
            [np.diff(p) for _, p in snaps] or [np.zeros(0, np.int64)]))))
        self.base = np.concatenate(([0], np.cumsum(self.totals)[:-1])) if len(classes) else self.totals

    def holds(self, classes: tuple[_Class, ...], qmin: float, qmax: float) -> bool:
        return (len(classes) == len(self.classes) and all(map(operator.is_, classes, self.classes))
                and all(map(operator.is_, (cls.snap for cls in classes), self.snaps))
                and self.lo <= qmin and qmax <= self.lo + self.span - 2)

    def upto(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of class i due at or before ``at[i, j]``, and each class's rows: the snapshot's, plus
        the rows added since and less those taken out (each gathered from every class into one
        sorted array the same way)."""
        q = np.floor(at).astype(np.int64) - self.lo + self.offsets[:, None]
        out = self.prefix[np.searchsorted(self.dues, q, "right")] - self.base[:, None]
        totals = self.totals
        changed = [(i, cls) for i, cls in enumerate(self.classes) if cls.added or cls.removed]
        if changed:
            lo, span = self.lo, self.span
            offsets = self.offsets[np.fromiter((i for i, _ in changed), np.int64, len(changed))]
            for sign, side in ((1, operator.attrgetter("added")), (-1, operator.attrgetter("removed"))):
                lens = np.fromiter((len(side(cls)) for _, cls in changed), np.int64, len(changed))
                flat = np.fromiter(chain.from_iterable(side(cls) for _, cls in changed), np.int64, int(lens.sum()))
                where = np.sort(np.clip(flat, lo, lo + span - 1) - lo + np.repeat(offsets, lens))
                start = np.searchsorted(where, self.offsets, "left")
                out = out + sign * (np.searchsorted(where, q, "right") - start[:, None])
                totals = totals + sign * (np.searchsorted(where, self.offsets + span, "left") - start)
        return out, totals


class _Tie(tuple):
    """Buckets of different classes tied on score and due time: walked as one run, merged by key."""

    __slots__ = ()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(chain.from_iterable(tuple.__iter__(self))))


class _Bucket(list):
    """The sorted cache keys of one class due at one instant (``due`` None: never due)."""

    __slots__ = ("cls", "due")

    cls: _Class
    due: int | None


def _new_bucket(cls: _Class, due: int | None) -> _Bucket:
    """A third of a Python ``__init__``'s cost (an ingest makes a bucket for most new rows)."""
    bucket = _Bucket()
    bucket.cls, bucket.due = cls, due
    return bucket


def _due_value(due: Any) -> int | None:
    n = finite(due)
    return None if n is None else int(n)


def _carried(interval: Any) -> float | None:
    if interval is None:
        return None
    return interval if type(interval) is int and interval > 0 else positive(interval)


def _score(cls: _Class, due: int, now_min: int, boost: float) -> float:
    """``schedule.score`` specialised to a class (int due, positive or absent cadence): same floats."""
    lateness = now_min - due if now_min > due else 0
    ratio = lateness / cls.cadence if cls.cadence is not None else float(lateness)
    return ratio * boost if cls.sitemap else ratio


def _run_end(cls: _Class, lo: int, end: int, now_min: int, boost: float, limit: tuple[float, int]) -> int:
    """First index in ``[lo, end)`` of ``cls.dues`` whose (-score, due) is not ahead of ``limit``.

    (-score, due) strictly increases along a class, so gallop (1, 2, 4 ... steps) then bisect: a run
    of r buckets costs O(log r) scores, and the common case, classes taking turns, costs one.
    """
    dues = cls.dues

    def rank(due: int) -> tuple[float, int]:
        return -_score(cls, due, now_min, boost), due

    step = 1
    while lo < end:
        probe = min(lo + step, end) - 1
        if rank(dues[probe]) >= limit:
            return bisect_left(dues, limit, lo, probe, key=rank)
        lo = probe + 1
        step *= 2
    return end


def top_k_bruteforce(
    rows: Iterable[Held | tuple[str, Any, bool, Any, Route]],
    k: int,
    now: int,
    *,
    cadence_for: CadenceFor,
    boost: float = 2.0,
    is_leased: IsLeased | None = None,
) -> list[Ready]:
    """The oracle: score every due row with ``schedule.score`` at minute resolution, sort, take k."""
    now_min = minute(now)
    scored = []
    for key, due, from_sitemap, interval, route in rows:
        at = _due_value(due)
        if at is None or at > now or (is_leased is not None and is_leased(key)):
            continue
        cadence = cadence_of(interval, cadence_for(route))
        scored.append((-score(at, now_min, cadence, bool(from_sitemap), boost), at, key, bool(from_sitemap)))
    scored.sort()
    return [(key, due, -neg, flag) for neg, due, key, flag in scored[:k]]
