"""What the bot path reports: metric writes batched per replica, and warnings at most once a minute
per reason (bots repeat themselves).

A multiprocess-mode prometheus increment is a locked mmap write, which costs more than the rest of a
cache hit, so counts and observations are summed here and written once a second.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from typing import Any

from prerender_ray import logs, metrics

log = logs.get("bot")
METRICS_FLUSH_S = 1.0


class Counters:
    def __init__(self) -> None:
        self._children: dict[tuple, Any] = {}
        self._pending: dict[tuple, int] = {}
        self._observed: dict[tuple, list[float]] = {}
        self._warned = logs.Sometimes()  # per reason
        self._flush_task: asyncio.Task | None = None
        # where ``flush`` writes (counts, observations): prometheus; a test's tally instead (the
        # class is compiled, so its methods cannot be patched)
        self.sink: Callable[[dict[tuple, int], dict[tuple, list[float]]], None] = self.to_prometheus

    def start(self) -> None:
        self._flush_task = asyncio.get_running_loop().create_task(self._flusher())

    def close(self) -> None:
        if self._flush_task is not None:
            self._flush_task.cancel()
        self.flush()

    def count(self, metric: Any, *labels: str) -> None:
        """Add one to a counter, batched: written to prometheus by the next ``flush``."""
        key = (metric, labels)
        self._pending[key] = self._pending.get(key, 0) + 1

    def observe(self, metric: Any, value: float, *labels: str) -> None:
        """A histogram observation, batched like ``count``."""
        key = (metric, labels)
        found = self._observed.get(key)
        if found is None:
            self._observed[key] = [value]
        else:
            found.append(value)

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        observed, self._observed = self._observed, {}
        self.sink(pending, observed)

    def to_prometheus(self, pending: dict[tuple, int], observed: dict[tuple, list[float]]) -> None:
        for (metric, labels), n in pending.items():
            self.child(metric, *labels).inc(n)
        for (metric, labels), values in observed.items():
            _observe_many(self.child(metric, *labels), values)

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(METRICS_FLUSH_S)
            try:
                self.flush()
            except Exception as e:
                metrics.loop_errors.labels("bot-metrics").inc()
                log.error("metrics flush failed", error=repr(e))

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, memoized: the hot path increments several per request."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def warn_sometimes(self, reason: str, message: str, **kw: Any) -> None:
        """``message`` at most once a minute per ``reason`` (``logs.Sometimes``), with how many like it
        were held back since (``held``)."""
        held = self._warned.let(reason)
        if held is not None:
            log.warning(message, reason=reason, **({"held": held} if held else {}), **kw)


def _observe_many(child: Any, values: list[float]) -> None:
    """Many observations into one histogram child as one write per bucket touched. Uses the
    child's buckets as prometheus_client lays them out (``observe`` does the same per value);
    falls back to ``observe`` if that layout ever changes."""
    bounds, buckets, total = (getattr(child, n, None) for n in ("_upper_bounds", "_buckets", "_sum"))
    if not (bounds and buckets and total is not None and len(bounds) == len(buckets)):
        for v in values:
            child.observe(v)
        return
    counts = [0] * len(bounds)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1  # the first bucket with v <= bound, as observe
    total.inc(sum(values))
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
