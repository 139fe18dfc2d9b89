"""Per-minute counters over the last hour: the queue-state document's ``flow`` section."""

from __future__ import annotations

from collections import defaultdict

MINUTES = 60


class Flow:
    def __init__(self, names: tuple[str, ...]):
        self.names = names
        self._minutes: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(self.names, 0))

    def add(self, name: str, n: int, now_ms: int) -> None:
        m = now_ms // 60_000
        self._minutes[m][name] += n
        if len(self._minutes) > MINUTES + 5:
            for old in [k for k in self._minutes if k <= m - MINUTES]:
                del self._minutes[old]

    def report(self, now_ms: int) -> dict:
        """Each name's counts per minute, oldest first, for the last hour (the current minute last)."""
        m = now_ms // 60_000
        span = range(m - MINUTES + 1, m + 1)
        out: dict = {"minutes": MINUTES, "fromMs": span[0] * 60_000}
        for name in self.names:
            series = [self._minutes[k][name] if k in self._minutes else 0 for k in span]
            out[name] = {"perMinute": series, "lastHour": sum(series)}
        return out
