"""Time base and the reference's 32-bit hash: minute flooring, the clock, numeric reads, jitter.

Every due time is epoch ms floored to the minute. ``fnv1a32`` must match the reference bit for bit
(it seeds the initial render time, so changing it re-jitters the whole corpus); it folds UTF-16 code
units, as JavaScript's ``charCodeAt`` does, not UTF-8 bytes.
"""

from __future__ import annotations

import math
import time
from typing import Any

from fnv_hash_fast import fnv1a_32
from xxhash import xxh64_intdigest

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 16_777_619
_U32 = 0xFFFFFFFF


def minute(ms: float) -> int:
    """Floor epoch ms to the minute: ``minute(90_000) == 60_000``."""
    if type(ms) is int:
        return ms - ms % MINUTE_MS  # Python's % floors, so negatives floor too
    return math.floor(ms / MINUTE_MS) * MINUTE_MS


def now_ms() -> int:
    """Wall-clock epoch ms; inject it (``clock=now_ms``) so tests can move time."""
    return time.time_ns() // 1_000_000


class Clock:
    """The time a part reads, passed to its constructor: the system's by default. The simulated
    cluster (``tests/sim/``) passes a virtual one, so every decision a part makes on time follows the
    simulation's clock and a seed replays exactly. Durations measured only for reports may still
    use ``time.perf_counter``."""

    def now_ms(self) -> int:
        """Epoch ms."""
        return time.time_ns() // 1_000_000

    def time(self) -> float:
        """Epoch seconds."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds that never go back (intervals, deadlines)."""
        return time.monotonic()


SYSTEM_CLOCK = Clock()


def finite(value: Any) -> int | float | None:
    """The numeric value of ``value`` if it is a finite number, else None (absent is never 0).

    Numeric strings count (the reference coerces before its finite check); booleans do not.
    Integral values come back as ``int`` so millisecond arithmetic stays exact.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(f):
        return None
    return int(f) if f.is_integer() else f


def positive(value: Any) -> int | float | None:
    """``finite(value)`` if it is > 0, else None: the guard for every carried interval."""
    n = finite(value)
    return n if n is not None and n > 0 else None


def fnv1a32(text: str | None) -> int:
    """FNV-1a 32 over UTF-16 code units; ``None`` hashes as ``""``."""
    h = _FNV_OFFSET
    if not text:
        return h
    if text.isascii():  # one byte per code unit: the C implementation over bytes is the same hash
        return fnv1a_32(text.encode("ascii"))
    else:
        # surrogatepass keeps lone surrogates as the single code units JavaScript sees
        units = memoryview(text.encode("utf-16-le", "surrogatepass")).cast("H")
    for unit in units:
        h = ((h ^ unit) * _FNV_PRIME) & _U32
    return h


def initial_render_time(
    key: str, interval: Any, now: int, *, default_interval: int, delimiter: str = "|"
) -> int:
    """Jittered first due time: ``minute(now + offset)``, the offset spread evenly over ``[0, I)``.

    ``I`` is ``interval`` when it is a finite number > 0, else ``default_interval``. The seed is the
    text before the first delimiter (the URL, so every device variant of a URL lands on one slot),
    or the whole key when it has no delimiter (so non-keys do not collapse onto one minute).
    Deliberately unlike the reference (``fnv1a32(seed) mod I``), a 64-bit hash is scaled onto the
    cadence (``xxh64(seed) * I >> 64``): a 32-bit hash modulo the cadence covers at most 2^32 ms
    (49.7 days), so monthly and yearly pages would all start in their first weeks, and scaling
    FNV's weakly mixed high bits instead would be lumpy for URLs that differ only at the end.
    """
    span = int(positive(interval) or default_interval)
    cut = key.find(delimiter)
    return jittered_minute(key if cut < 0 else key[:cut], span, now)


def jittered_minute(seed: str, span: int, now: int) -> int:
    """``initial_render_time`` for a seed and a positive int span already settled (a bulk put calls it
    directly): ``minute(now + xxh64(seed) * span >> 64)``."""
    return minute(now + ((xxh64_intdigest(seed.encode("utf-8", "surrogatepass")) * span) >> 64))


def next_slot(seed: str, span: int, now: int) -> int:
    """The seed's next slot after ``now``'s minute: the first ``t >= minute(now) + 1 min`` with
    ``t = offset (mod span)`` on the epoch, ``offset`` as ``jittered_minute`` draws it. Fixed per URL
    and cadence whatever the time of the first render, so re-renders of a corpus stay flat over the
    cadence and the gap after the first render is at most ``span`` (plus a minute)."""
    offset = (xxh64_intdigest(seed.encode("utf-8", "surrogatepass")) * span) >> 64
    start = minute(now) + MINUTE_MS
    return minute(start + (offset - start) % span)
