"""When to claim from which host: the reference fleet's HostHealth (docs/fleet-protocol.md#host-health), as
plain functions and a small class over epoch milliseconds, so every rule is unit-tested without I/O.

Per host: ``next_poll_at`` (when work is expected), ``circuit_until`` (error backoff end), ``failures``
(consecutive failure rounds) and ``status_time`` (the last applied queue-status ``updatedTime``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

RETRY_AFTER_CAP_MS = 120_000
RESULT_RETRY_CAP_MS = 5_000


@dataclass(frozen=True)
class Timing:
    idle_ms: int = 15_000
    min_ms: int = 1_000
    max_ms: int = 30_000
    paused_ms: int = 30_000
    max_idle_ms: int = 60_000


def idle_delay(t: Timing, rng: random.Random) -> float:
    """Next poll after an empty claim (or an ``empty`` status): idle +-25 %."""
    return t.idle_ms * rng.uniform(0.75, 1.25)


def circuit_delay(t: Timing, failures: int, rng: random.Random) -> float:
    """Exponential with equal jitter: uniform in [exp/2, exp], exp = min(max, min * 2^(failures-1))."""
    exp = min(t.max_ms, t.min_ms * 2 ** max(0, failures - 1))
    return rng.uniform(exp / 2, exp)


def result_retry_delay(t: Timing, attempt: int, rng: random.Random) -> float:
    """Sleep before result retry ``attempt`` (1-based): equal jitter over min(5 s, min * 2^(n-1))."""
    exp = min(RESULT_RETRY_CAP_MS, t.min_ms * 2 ** max(0, attempt - 1))
    return rng.uniform(exp / 2, exp)


def parse_retry_after(value: str | None, now_ms: float) -> float | None:
    """Milliseconds to wait from a ``Retry-After`` header (delta seconds or an HTTP date); None when
    absent, unparseable, zero or in the past (the caller falls back to exponential backoff)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        delta = when.timestamp() * 1000 - now_ms
        return delta if delta > 0 else None
    if math.isnan(seconds) or seconds <= 0 or math.isinf(seconds):
        return None
    return seconds * 1000


def retry_after_delay(t: Timing, retry_after_ms: float) -> float:
    """A positive Retry-After, floored at ``min_ms`` and capped at 120 s."""
    return min(RETRY_AFTER_CAP_MS, max(t.min_ms, retry_after_ms))


@dataclass
class HostState:
    next_poll_at: float = 0.0
    circuit_until: float = 0.0
    failures: int = 0
    status_time: float | None = None
    status: str | None = None

    def available_at(self) -> float:
        return max(self.next_poll_at, self.circuit_until)


class HostHealth:
    """One per worker. Hosts are queue base URLs (``http://host:port``)."""

    def __init__(self, timing: Timing | None = None, rng: random.Random | None = None):
        self.t = timing or Timing()
        self.rng = rng or random.Random()
        self.hosts: dict[str, HostState] = {}

    def add(self, host: str) -> bool:
        """Make ``host`` known (immediately eligible); True when it was new."""
        if host in self.hosts:
            return False
        self.hosts[host] = HostState()
        return True

    def state(self, host: str) -> HostState:
        if host not in self.hosts:
            self.hosts[host] = HostState()
        return self.hosts[host]

    # ------------------------------------------------------------------------------- choosing

    def eligible(self, now: float) -> list[str]:
        return [h for h, s in self.hosts.items() if now >= s.available_at()]

    def pick(self, now: float) -> str | None:
        """A uniformly random eligible host, or None."""
        hosts = self.eligible(now)
        return self.rng.choice(hosts) if hosts else None

    def wait_ms(self, now: float) -> float:
        """How long until some host is eligible, at most ``max_idle_ms`` (also when none is known)."""
        if not self.hosts:
            return float(self.t.max_idle_ms)
        earliest = min(s.available_at() for s in self.hosts.values())
        return max(0.0, min(float(self.t.max_idle_ms), earliest - now))

    # ------------------------------------------------------------------------------- outcomes

    def on_jobs(self, host: str, now: float) -> None:
        """A claim returned jobs: healthy, poll again right away."""
        s = self.state(host)
        s.failures, s.circuit_until, s.next_poll_at = 0, 0.0, now

    def on_empty(self, host: str, now: float) -> None:
        """A claim returned ``[]``: healthy, poll again after the idle backoff."""
        s = self.state(host)
        s.failures, s.circuit_until = 0, 0.0
        s.next_poll_at = now + idle_delay(self.t, self.rng)

    def open_circuit(self, host: str, now: float, retry_after_ms: float | None = None) -> float:
        """A failure (claim unavailable/error, result failure). Escalates once per open window;
        the circuit only ever extends. Returns when the host is next eligible."""
        s = self.state(host)
        if s.circuit_until <= now:
            s.failures += 1
        if retry_after_ms is not None and retry_after_ms > 0:
            delay = retry_after_delay(self.t, retry_after_ms)
        else:
            delay = circuit_delay(self.t, s.failures, self.rng)
        s.circuit_until = max(s.circuit_until, now + delay)
        return s.available_at()

    def on_result_ok(self, host: str, now: float) -> bool:
        """A 204 for a result: closes the circuit. True when that made the host eligible (wake up)."""
        s = self.state(host)
        was = now >= s.available_at()
        s.failures, s.circuit_until = 0, 0.0
        return not was and now >= s.available_at()

    def on_status(self, host: str, status: str, updated: float | None, now: float) -> bool:
        """A queue-status observation for ``host``. Older than the last applied one: ignored.
        ``queued`` -> poll now (True: wake the claim loop, unless a circuit is open);
        ``paused`` -> in ``paused_ms``; anything else (``empty``, ``unready``) -> idle backoff."""
        s = self.state(host)
        if updated is not None and s.status_time is not None and updated < s.status_time:
            return False
        if updated is not None:
            s.status_time = updated
        s.status = status
        if status == "queued":
            s.next_poll_at = now
            return now >= s.circuit_until
        if status == "paused":
            s.next_poll_at = now + self.t.paused_ms
        else:
            s.next_poll_at = now + idle_delay(self.t, self.rng)
        return False
