"""The keeper's in-memory queue: every owned schedule row, grouped into classes, ranked on demand.

A class is (route, carried cadence, sitemap flag). Within a class the cadence and the boost are
constant, so a row's score only grows with lateness: ordering a class by due time orders it by score,
and the class head is its best row. Top-K is then a k-way merge over class heads instead of a sort of
every row.

Memory is the constraint (250,000 rows in about 200 bytes each), so a row is not an object. A row is
its cache-key string, held once, referenced twice: from the ``_where`` dict (key -> its bucket) and
from the bucket itself, a sorted list of the keys of one class due at one instant. Due time, cadence,
flag and route live on the bucket and its class, shared by every row in them. A bulk upsert appends
to buckets that are not due yet and sorts each it disordered once, when it comes due or is read
(``_settle``): a sitemap ingest puts a million rows into future buckets nobody reads for hours, or
(new pages first) into one bucket due now, sorted once per publish instead of once per row.

Scores are computed at minute resolution (``now`` floored to the minute) so they are stable within a
minute; ties break on due time, then cache key, so the order is total and the brute-force oracle
(``row_classes.top_k_bruteforce``) pins the merge exactly.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, filterfalse, islice
from typing import Any

import numpy as np

from prerender_ray.queue.row_classes import (
    CadenceFor,
    Held,
    IsLeased,
    Ready,
    Route,
    RouteOf,
    _Bucket,
    _carried,
    _Class,
    _due_value,
    _Joint,
    _new_bucket,
    _run_end,
    _score,
    _Tie,
)
from prerender_ray.timeutil import HOUR_MS, MINUTE_MS, minute, positive

LATENESS_EDGES = (0.25, 1.0, 2.0, 4.0)  # in cadences; five bins: [0, .25) ... [4, inf)
_HORIZONS = (("next15m", 15 * MINUTE_MS), ("next60m", HOUR_MS), ("next24h", 24 * HOUR_MS))
_HIST_HOURS = 24
JOINT_MARGIN = 30 * 24 * HOUR_MS  # a joint snapshot's window reaches this far past the instants asked


class Ranking:
    """Every held row, ranked by the reference's score. Not thread-safe: one actor owns it."""

    def __init__(self, cadence_for: CadenceFor, *, boost: float = 2.0):
        self._cadence_for = cadence_for
        self._boost = boost
        self._where: dict[str, _Bucket] = {}
        # future buckets a bulk upsert left out of key order (id -> bucket): each is sorted once, when
        # it comes due (before a merge) or is read; never one in the plan (see upsert_many)
        self._unsorted: dict[int, _Bucket] = {}
        self._classes: dict[tuple[Route, float | None, bool], _Class] = {}
        # top_k's cached merge: valid for one minute, from _plan_now until the next due instant
        self._plan: list[Iterable[str]] | None = None
        self._plan_complete = False
        self._plan_min = self._plan_now = 0
        self._plan_next: float = 0
        self._plan_want = 0
        self._joint: _Joint | None = None  # the queue-state's counts of every class in one array

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def keys(self) -> Iterable[str]:
        """Every held key (a live view: not to be iterated across a change)."""
        return self._where.keys()

    # ------------------------------------------------------------------------------------- rows

    def upsert(self, key: str, due: Any, from_sitemap: bool, interval: Any, route: Route = None) -> None:
        """Hold ``key`` with these values, replacing what was held. A junk ``interval`` (0, -1,
        NaN, text) is held as none, so the row's cadence comes from its route's config."""
        if due is not None and type(due) is not int:
            due = _due_value(due)
        ident = (route, _carried(interval), bool(from_sitemap))
        old = self._where.get(key)
        if old is not None:
            o = old.cls
            if old.due == due and (o.route, o.carried, o.sitemap) == ident:
                return
            key = self._take_out(key, old)  # reuse the held string: one copy per row
        self._put(key, due, ident)

    def upsert_many(self, rows: Iterable[tuple[str, Any, bool, Any]], route_of: RouteOf, *,
                    delimiter: str | None = "|") -> int:
        """``upsert`` for a store walk: rows of (key, due, from_sitemap, interval). Returns the count.

        Built for load speed. A walk yields keys in order, so the device variants of a URL arrive
        together: ``route_of`` is asked once per URL (the text before the last ``delimiter``, for keys
        laid out ``<url><delimiter><device>``; ``None`` for any other layout, whose variants share no
        prefix), and a row that shares its predecessor's class and due time appends to the same
        bucket. A device variant
        that carries its predecessor's very value objects (as ``Rules.put_many`` builds them) skips
        the checks.
        """
        where, classes, unsorted = self._where, self._classes, self._unsorted
        for c in classes.values():  # a bulk change: the queue-state rebuilds its counts once, after it
            c.forget()
        url: str | None = None
        route: Route = None
        bucket: _Bucket | None = None  # None: the next row looks its bucket up
        last_due = last_interval = last_sitemap = last_route = None
        raw: tuple = (None, None, None)  # the previous row's values as given
        delim = delimiter or ""  # without one, ``url`` stays None and no branch below reads it
        n = 0
        for key, due, from_sitemap, interval in rows:
            n += 1
            if bucket is not None and due is raw[0] and from_sitemap is raw[1] and interval is raw[2] \
                    and url is not None and key.startswith(url) and key.find(delim, len(url)) < 0 \
                    and key not in where:
                due = last_due  # a device variant of the previous row: same values, same bucket
            else:
                raw = (due, from_sitemap, interval)
                if url is None or not key.startswith(url) or key.find(delim, len(url)) >= 0:
                    # the URL and its delimiter: a variant's rest holds no further delimiter (a longer
                    # URL that merely starts with this one does)
                    cut = key.rfind(delimiter) if delimiter else -1
                    url = key[: cut + len(delim)] if cut >= 0 else None  # a non-key shares no route
                    route = route_of(key)
                if interval is not None and (type(interval) is not int or interval <= 0):
                    interval = _carried(interval)
                if from_sitemap is not True and from_sitemap is not False:
                    from_sitemap = bool(from_sitemap)
                if due is not None and type(due) is not int:
                    due = _due_value(due)
                if key in where:
                    self.upsert(key, due, from_sitemap, interval, route)
                    bucket = None
                    continue
                if due != last_due or interval != last_interval or from_sitemap is not last_sitemap \
                        or route is not last_route or bucket is None:
                    last_due, last_interval, last_sitemap, last_route = due, interval, from_sitemap, route
                    cls = classes.get((route, interval, from_sitemap))
                    found = None if cls is None or due is None else cls.buckets.get(due)
                    if found is None:  # a new class or bucket
                        bucket = self._put(key, due, (route, interval, from_sitemap))
                        continue
                    bucket = found
            if bucket[-1] < key:
                bucket.append(key)
            else:
                # sorted once, before the next merge reads it: a bucket due already (a new sitemap's rows,
                # firstRender: now, a million in one minute) drops the plan that holds it; an insort per
                # row would move the whole bucket each time
                unsorted[id(bucket)] = bucket
                bucket.append(key)
                if due is not None and due < self._plan_next:
                    self._plan = None
            where[key] = bucket
        return n

    def remove(self, key: str) -> bool:
        bucket = self._where.pop(key, None)
        if bucket is None:
            return False
        self._take_out(key, bucket)
        return True

    def get(self, key: str) -> Held | None:
        bucket = self._where.get(key)
        if bucket is None:
            return None
        cls = bucket.cls
        return Held(key, bucket.due, cls.sitemap, cls.carried, cls.route)

    def rows(self) -> Iterator[Held]:
        self._settle()
        for cls in list(self._classes.values()):
            buckets = [*cls.buckets.values(), *([cls.undated] if cls.undated else [])]
            for bucket in buckets:
                for key in bucket:
                    yield Held(key, bucket.due, cls.sitemap, cls.carried, cls.route)

    def drop_where(self, predicate: Callable[[str], bool]) -> int:
        """Remove every row whose key matches (rows this node no longer owns). Returns the count.

        Each bucket that loses rows is filtered once: taken out one by one, each row shifted the
        bucket's tail (a join moved a quarter of 667,000 rows held in a few minute-buckets, as a bulk
        put leaves them: 14-17 s of the old owner's loop before its hand-off could start)."""
        where = self._where
        doomed: dict[int, tuple[_Bucket, list[str]]] = {}
        for key, bucket in where.items():
            if predicate(key):
                entry = doomed.get(id(bucket))
                if entry is None:
                    doomed[id(bucket)] = (bucket, [key])
                else:
                    entry[1].append(key)
        n = 0
        for bucket, keys in doomed.values():
            n += len(keys)
            if len(keys) < 16:
                for key in keys:
                    self.remove(key)
                continue
            gone = set(keys)
            for key in keys:
                del where[key]
            bucket[:] = [key for key in bucket if key not in gone]  # the same list: a plan holding it sees this
            bucket.cls.forget()  # a bulk change: the queue-state rebuilds its counts once
            if not bucket:
                self._unsorted.pop(id(bucket), None)
                self._drop_empty(bucket)
        return n

    def reclassify(self, cadence_for: CadenceFor, *, route_of: RouteOf | None = None,
                   boost: float | None = None) -> int:
        """Apply a config change in memory, no reload. A new default or route cadence re-prices the
        classes of rows without a carried cadence; a new route list (``route_of``) may also move
        rows between routes. Returns how many rows moved."""
        self._cadence_for = cadence_for
        self._plan = None
        if boost is not None:
            self._boost = boost
        for cls in self._classes.values():
            if cls.carried is None:
                cls.cadence = positive(cadence_for(cls.route))
        if route_of is None:
            return 0
        moves = [(row, r) for row in self.rows() if (r := route_of(row.key)) != row.route]
        for row, r in moves:
            self.upsert(row.key, row.due, row.from_sitemap, row.interval, r)
        return len(moves)

    def _put(self, key: str, due: int | None, ident: tuple[Route, float | None, bool]) -> _Bucket:
        cls = self._classes.get(ident)
        if cls is None:
            route, carried, sitemap = ident
            cadence = carried if carried is not None else positive(self._cadence_for(route))
            cls = self._classes[ident] = _Class(route, carried, sitemap, cadence)
        bucket = cls.undated if due is None else cls.buckets.get(due)
        if bucket is None:
            bucket = _new_bucket(cls, due)
            if due is None:
                cls.undated = bucket
            else:
                cls.buckets[due] = bucket
                if cls.ordered and cls.dues and due < cls.dues[-1]:
                    if cls.snap is not None:  # steady state (a queue-state was asked): keep them in order
                        insort(cls.dues, due)
                    else:  # a load: one sort later beats an insort per bucket
                        cls.ordered = False
                        cls.dues.append(due)
                else:
                    cls.dues.append(due)
                if due < self._plan_next:  # a bucket the plan does not know: due, or due sooner
                    if due <= self._plan_now:
                        self._plan = None
                    else:
                        self._plan_next = due
        if not bucket or bucket[-1] < key:
            bucket.append(key)
        else:
            insort(bucket, key)
        if due is not None and cls.snap is not None:
            cls.note(due, 1)
        self._where[key] = bucket
        return bucket

    def _settle(self, now: int | None = None) -> None:
        """Sort the disordered buckets due at ``now`` or before (all of them when None)."""
        unsorted = self._unsorted
        if not unsorted:
            return
        if now is None:
            ready = list(unsorted)
        else:
            ready = [i for i, b in unsorted.items() if b.due is not None and b.due <= now]
        for i in ready:
            unsorted.pop(i).sort()

    def _take_out(self, key: str, bucket: _Bucket) -> str:
        """Take ``key`` out of its bucket, dropping an emptied bucket and class; returns the held string."""
        if self._unsorted and (disordered := self._unsorted.pop(id(bucket), None)) is not None:
            disordered.sort()
        i = bisect_left(bucket, key)
        held = bucket[i]
        del bucket[i]
        if bucket.due is not None and bucket.cls.snap is not None:
            bucket.cls.note(bucket.due, -1)
        if not bucket:
            self._drop_empty(bucket)
        return held

    def _drop_empty(self, bucket: _Bucket) -> None:
        """An emptied bucket leaves its class, and an emptied class the ranking."""
        cls = bucket.cls
        if bucket.due is None:
            cls.undated = None
        else:
            del cls.buckets[bucket.due]
            dues = cls.sorted_dues()
            del dues[bisect_left(dues, bucket.due)]
        if not cls.buckets and cls.undated is None:
            del self._classes[(cls.route, cls.carried, cls.sitemap)]

    # ---------------------------------------------------------------------------------- ranking

    def top_k(self, k: int, now: int, is_leased: IsLeased | None = None) -> list[str]:
        """Cache keys of the best ``k`` due rows, best first, leased keys skipped.

        The merge (``_merge``) orders buckets, not rows, and its order only changes when the minute
        does, a due bucket appears, or config changes; so it is kept as a plan and each call walks
        it, filtering leased keys, at C speed. Buckets are live lists: rows that leave or join a
        planned bucket are seen without a rebuild. A plan that runs short is rebuilt deeper.
        """
        if k <= 0:
            return []
        plan = self._plan
        if plan is None or self._plan_min != minute(now) or not self._plan_now <= now < self._plan_next:
            self._plan_want = 2 * k
            plan = self._replan(now)
        while True:
            keys: Iterable[str] = chain.from_iterable(plan)
            if is_leased is not None:
                keys = filterfalse(is_leased, keys)
            out = list(islice(keys, k))
            if len(out) >= k or self._plan_complete:
                return out
            self._plan_want *= 2
            plan = self._replan(now)

    def top_k_of(self, keys: Iterable[str], k: int, now: int, is_leased: IsLeased | None = None) -> list[str]:
        """``top_k`` when only ``keys`` can pass ``is_leased`` (the rest would be skipped): the same
        answer, in the same order (-score, due, key), at the cost of ``keys`` instead of every due row
        (a keeper fenced on all but a few keys would otherwise walk them all on every publish)."""
        if k <= 0:
            return []
        now_min, boost, where = minute(now), self._boost, self._where
        scored = []
        for key in keys:
            bucket = where.get(key)
            if bucket is None or bucket.due is None or bucket.due > now:
                continue
            scored.append((-_score(bucket.cls, bucket.due, now_min, boost), bucket.due, key))
        scored.sort()
        out = []
        for _, _, key in scored:
            if is_leased is None or not is_leased(key):
                out.append(key)
                if len(out) >= k:
                    break
        return out

    def _replan(self, now: int) -> list[Iterable[str]]:
        self._settle(now)  # the merge reads the buckets due by now
        plan, self._plan_complete, self._plan_next = self._merge(now, self._plan_want)
        self._plan, self._plan_min, self._plan_now = plan, minute(now), now
        return plan

    def _merge(self, now: int, want: int) -> tuple[list[Iterable[str]], bool, float]:
        """K-way merge over class heads on (-score, due): buckets in rank order until they hold at
        least ``want`` rows. Returns (plan, whether it holds every due row, next due instant).

        The current class keeps emitting, without heap traffic, while its next bucket still beats
        every other head (found by galloping). Buckets of different classes that tie on score and
        due become one ``_Tie`` entry, merged by key when walked.
        """
        now_min = minute(now)
        boost = self._boost
        heap = []
        horizon: float = math.inf
        for cls in self._classes.values():
            if cls.buckets:
                dues = cls.sorted_dues()
                end = bisect_right(dues, now)
                if end < len(dues) and dues[end] < horizon:
                    horizon = dues[end]
                if end:
                    due = dues[0]
                    heap.append((-_score(cls, due, now_min, boost), due, cls.buckets[due][0], 0, end, cls))
        heapq.heapify(heap)
        heappop, heappush = heapq.heappop, heapq.heappush
        plan: list[Iterable[str]] = []
        rows = 0
        while heap and rows < want:
            neg, due, _, pos, end, cls = heappop(heap)
            if heap and heap[0][0] == neg and heap[0][1] == due:
                group = [(pos, end, cls)]
                while heap and heap[0][0] == neg and heap[0][1] == due:
                    group.append(heappop(heap)[3:])
                tied = [c.buckets[due] for _, _, c in group]
                plan.append(_Tie(tied))
                rows += sum(map(len, tied))
                for pos, end, cls in group:
                    if pos + 1 < end:
                        nxt = cls.dues[pos + 1]
                        heappush(heap, (-_score(cls, nxt, now_min, boost), nxt, cls.buckets[nxt][0],
                                        pos + 1, end, cls))
                continue
            dues, buckets = cls.dues, cls.buckets
            stop = _run_end(cls, pos + 1, end, now_min, boost, heap[0][:2]) if heap else end
            if stop == pos + 1:
                bucket = buckets[due]
                plan.append(bucket)
                rows += len(bucket)
            else:
                run = list(map(buckets.__getitem__, dues[pos:stop]))
                plan.extend(run)
                rows += sum(map(len, run))
            if stop < end:
                nxt = dues[stop]
                heappush(heap, (-_score(cls, nxt, now_min, boost), nxt, buckets[nxt][0], stop, end, cls))
        return plan, not heap, horizon

    def score_of(self, key: str, now: int) -> float | None:
        """The score ``top_k`` ranks ``key`` by (0 when not yet due); None when not held or undated."""
        bucket = self._where.get(key)
        if bucket is None or bucket.due is None:
            return None
        return _score(bucket.cls, bucket.due, minute(now), self._boost)

    def entries(self, keys: Iterable[str], now: int) -> list[Ready]:
        """(key, due, score, from_sitemap) for held keys, in the given order: the ready set's report."""
        now_min, boost, out = minute(now), self._boost, []
        for key in keys:
            bucket = self._where.get(key)
            if bucket is not None and bucket.due is not None:
                cls = bucket.cls
                out.append((key, bucket.due, _score(cls, bucket.due, now_min, boost), cls.sitemap))
        return out

    # ------------------------------------------------------------------------------ queue state

    def state(self, now: int, leased: Iterable[str] = ()) -> dict[str, Any]:
        """Exact queue-state counts.

        ``now``: rows due (split sitemap / discovered) and how many of them are in ``leased``.
        ``coming``: rows due in (now, now + 15 min / 60 min / 24 h], and per hour ahead (hour i is
        (now + i h, now + (i+1) h]). ``lateness``: due rows by lateness in cadences (a row is in
        the bin of the highest edge with lateness >= edge x cadence), per lane and per route.
        ``dueHistogram``: hourly counts of due times in [now - 24 h, now + 24 h). ``classes``: rows,
        due rows and oldest due time per class. Within a class each count is a range of due times,
        so it comes from running counts of bucket sizes and a search, not from a walk over rows; the
        running counts are kept between calls, with the rows added and taken out since, every class
        in one array (``_Joint``), so one search answers every class at every instant.
        """
        now_min = minute(now)
        hour_edges = [now + h * HOUR_MS for h in range(_HIST_HOURS + 1)]
        # [a, b) bins: rows due before b are the rows due at or before b - 1 (due instants are ints)
        hist_ends = [now - 1 + (h - _HIST_HOURS) * HOUR_MS for h in range(2 * _HIST_HOURS + 1)]
        # every instant a class is counted at, in one search: ahead, the histogram, then lateness
        ahead = [now, *(now + span for _, span in _HORIZONS), *hour_edges, *hist_ends]
        nh, na = len(_HORIZONS), len(ahead) - len(hist_ends)
        held = tuple(self._classes.values())
        # rows at least edge x cadence late; raw lateness (no cadence) counts in ms
        cadences = np.array([cls.cadence or 1 for cls in held], dtype=np.float64)
        at = np.concatenate((np.broadcast_to(np.asarray(ahead, dtype=np.float64), (len(held), len(ahead))),
                             now_min - cadences[:, None] * np.asarray(LATENESS_EDGES)[None, :]), axis=1)
        upto, totals = self._counts(held, at)
        class_due = upto[:, 0]
        # bin i: at least edge i, less than edge i + 1
        edges = np.concatenate((upto[:, :1], upto[:, len(ahead):], np.zeros((len(held), 1), np.int64)), axis=1)
        late_bins = edges[:, :-1] - edges[:, 1:]
        sitemap = np.array([cls.sitemap for cls in held], dtype=bool)
        late_sitemap, late_discovered = late_bins[sitemap].sum(0), late_bins[~sitemap].sum(0)
        labels = ["default" if cls.route is None else str(cls.route) for cls in held]
        late_by_route: dict[str, np.ndarray] = {}
        for label, bins in zip(labels, late_bins):
            late_by_route[label] = late_by_route[label] + bins if label in late_by_route else bins
        coming = {name: int((upto[:, 1 + i] - class_due).sum()) for i, (name, _) in enumerate(_HORIZONS)}
        by_hour = (upto[:, 2 + nh:na] - upto[:, 1 + nh:na - 1]).sum(0)  # (a, b] hours ahead
        counts = upto[:, na:len(ahead)]  # [a, b) around now
        before, after = int(counts[:, 0].sum()), int((totals - counts[:, -1]).sum())
        hist = (counts[:, 1:] - counts[:, :-1]).sum(0)
        due_sitemap, due_discovered = int(class_due[sitemap].sum()), int(class_due[~sitemap].sum())
        undated = 0
        classes = []
        for cls, label, total, due in zip(held, labels, totals.tolist(), class_due.tolist()):
            held_undated = len(cls.undated) if cls.undated else 0
            undated += held_undated
            classes.append({"route": label, "cadence": cls.cadence, "carried": cls.carried is not None,
                            "fromSitemap": cls.sitemap, "rows": total + held_undated, "due": due,
                            "oldestDue": dues[0] if (dues := cls.sorted_dues()) else None})
        where = self._where
        in_flight = sum(1 for key in set(leased)
                        if (b := where.get(key)) is not None and b.due is not None and b.due <= now)
        classes.sort(key=lambda c: (c["route"], c["fromSitemap"], c["cadence"] or 0, c["carried"]))
        return {
            "held": len(where),
            "undated": undated,
            "now": {"due": due_sitemap + due_discovered, "dueSitemap": due_sitemap,
                    "dueDiscovered": due_discovered, "leased": in_flight},
            "coming": {**coming, "byHour": by_hour.tolist()},
            "lateness": {"edges": list(LATENESS_EDGES), "sitemap": late_sitemap.tolist(),
                         "discovered": late_discovered.tolist(),
                         "byRoute": {k: v.tolist() for k, v in late_by_route.items()}},
            "dueHistogram": {"binMs": HOUR_MS, "fromMs": now - _HIST_HOURS * HOUR_MS, "bins": hist.tolist(),
                             "before": before, "after": after},
            "classes": classes,
        }

    def _counts(self, held: tuple[_Class, ...], at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of class i due at or before ``at[i, j]``, and each class's rows: one search over the
        joint snapshot (rebuilt when a class or its snapshot changed, or the instants left its
        window), or a search per class when no window of int64 holds them all (junk cadences)."""
        nq = at.shape[1]
        if not held:
            return np.zeros((0, nq), np.int64), np.zeros(0, np.int64)
        qmin, qmax = float(at.min()), float(at.max())
        joint = self._joint
        if joint is None or not joint.holds(held, qmin, qmax):
            joint = self._joint = None
            if math.isfinite(qmin) and math.isfinite(qmax):
                lo = math.floor(qmin) - JOINT_MARGIN
                span = 1 << max(1, math.ceil(qmax) + JOINT_MARGIN + 2 - lo).bit_length()
                if len(held) * span < 1 << 62 and abs(lo) < 1 << 62:
                    joint = self._joint = _Joint(held, lo, span)
        if joint is not None:
            return joint.upto(at)
        counts = [cls.counts() for cls in held]
        return np.stack([c.upto(row) for c, row in zip(counts, at)]), np.array([c.total for c in counts], np.int64)
