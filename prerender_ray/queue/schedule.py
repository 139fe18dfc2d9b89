"""Schedule rows and the rules that place them in time: score, backoff ladder, changefreq cadence.

A schedule row is one cache key's place in the queue. Its RocksDB key is the cache key (UTF-8);
its value is the fixed 18-byte record below, so a load decodes it with one ``struct`` call. Absent
is not zero anywhere: a row may have no due time (never due) and no carried cadence (resolved from
config when it is ranked), and both differ from an explicit 0.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from prerender_ray.config.render import FailureRetry, Page
from prerender_ray.timeutil import DAY_MS, HOUR_MS, MINUTE_MS, finite, positive

# version, flags, next_render_time, effective_interval (little-endian, no padding)
_RECORD = struct.Struct("<BBqq")
_VERSION = 1
_SITEMAP, _HAS_DUE, _HAS_INTERVAL = 1, 2, 4
_KNOWN_FLAGS = _SITEMAP | _HAS_DUE | _HAS_INTERVAL
# flags -> (from_sitemap, has due, has interval); unknown flags are a KeyError, i.e. junk
_FLAG_BITS = {f: (bool(f & _SITEMAP), bool(f & _HAS_DUE), bool(f & _HAS_INTERVAL)) for f in range(8)}
_INT64 = (-(2**63), 2**63 - 1)


class UnreadableRow(ValueError):
    """A stored schedule value that cannot be decoded; the keeper counts and skips it."""


class ScheduleRow(NamedTuple):
    """One cache key's schedule. Every field is mandatory: a write that forgets one fails."""

    cache_key: str
    next_render_time: int | None  # epoch ms; None = never due (not the epoch)
    from_sitemap: bool
    effective_interval: int | None  # the page's cadence in ms; None = resolve from config

    def encode(self) -> bytes:
        """The RocksDB value (the cache key is the RocksDB key)."""
        if type(self.from_sitemap) is not bool:
            raise TypeError(f"from_sitemap must be a bool, got {self.from_sitemap!r}")
        flags = _SITEMAP if self.from_sitemap else 0
        due = _int64_or_none("next_render_time", self.next_render_time)
        interval = _int64_or_none("effective_interval", self.effective_interval)
        if due is not None:
            flags |= _HAS_DUE
        if interval is not None:
            flags |= _HAS_INTERVAL
        return _RECORD.pack(_VERSION, flags, due or 0, interval or 0)

    @classmethod
    def decode(cls, cache_key: str | bytes, data: bytes) -> ScheduleRow:
        """Inverse of ``encode``; raises ``UnreadableRow`` on anything it did not write."""
        if isinstance(cache_key, (bytes, bytearray, memoryview)):
            raw = bytes(cache_key)
            try:
                cache_key = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UnreadableRow(f"cache key is not UTF-8: {raw[:80]!r}") from e
        if not isinstance(cache_key, str) or not cache_key:
            raise UnreadableRow(f"not a cache key: {cache_key!r}")
        try:
            version, flags, due, interval = _RECORD.unpack(data)
        except (struct.error, TypeError) as e:
            raise UnreadableRow(f"{cache_key}: not a {_RECORD.size}-byte record: {data!r:.80}") from e
        if version != _VERSION or flags & ~_KNOWN_FLAGS:
            raise UnreadableRow(f"{cache_key}: unknown record version {version} / flags {flags:#x}")
        if (not flags & _HAS_DUE and due) or (not flags & _HAS_INTERVAL and interval):
            raise UnreadableRow(f"{cache_key}: absent field carries a value")
        return cls(
            cache_key,
            due if flags & _HAS_DUE else None,
            bool(flags & _SITEMAP),
            interval if flags & _HAS_INTERVAL else None,
        )


def decode_many(
    pairs: Iterable[tuple[str | bytes, bytes]], on_unreadable: Callable[[UnreadableRow], None] | None = None
) -> Iterator[tuple[str, int | None, bool, int | None]]:
    """``ScheduleRow.decode`` over (key, value) pairs as a store walk yields them, at load speed.

    Yields plain tuples in ``ScheduleRow`` field order (building 250,000 NamedTuples costs a tenth
    of a load). Unreadable rows are skipped and handed to ``on_unreadable``, so the keeper can count
    and name them; one junk row never stops a load.
    """
    unpack, flag_bits, version_ok = _RECORD.unpack, _FLAG_BITS, _VERSION
    for key, data in pairs:
        text = ""
        try:
            version, flags, due, interval = unpack(data)
            sitemap, has_due, has_interval = flag_bits[flags]
            text = key if isinstance(key, str) else key.decode("utf-8")
            ok = version == version_ok and (has_due or not due) and (has_interval or not interval)
        except (struct.error, TypeError, KeyError, AttributeError, UnicodeDecodeError):
            ok = False
        if ok and text:
            yield text, due if has_due else None, sitemap, interval if has_interval else None
            continue
        try:  # the slow path names what is wrong
            ScheduleRow.decode(key, data)
        except UnreadableRow as e:
            if on_unreadable is not None:
                on_unreadable(e)


def encode_many(rows: Iterable[tuple[str, Any, Any, Any]]) -> list[tuple[bytes, bytes]]:
    """``(cache key, ScheduleRow.encode())`` for rows given as tuples in ``ScheduleRow`` order: a
    sitemap ingest writes two per URL. Plain ints and bools take one ``struct`` call; anything else
    goes through ``encode``'s checks (and raises as it does)."""
    pack, (lo, hi) = _RECORD.pack, _INT64
    both = _HAS_DUE | _HAS_INTERVAL
    out: list[tuple[bytes, bytes]] = []
    add = out.append
    last: tuple = (object(), None, None)  # the previous row's values, and their encoding in ``value``
    value = b""
    for key, due, sitemap, interval in rows:
        if due is last[0] and sitemap is last[1] and interval is last[2]:
            add((key.encode(), value))  # a device variant of the previous row, built from its values
            continue
        if type(due) is int and type(interval) is int and type(sitemap) is bool and lo <= due <= hi \
                and lo <= interval <= hi:
            value = pack(_VERSION, both | _SITEMAP if sitemap else both, due, interval)
        elif type(due) is int and interval is None and type(sitemap) is bool and lo <= due <= hi:
            value = pack(_VERSION, _HAS_DUE | _SITEMAP if sitemap else _HAS_DUE, due, 0)  # no carried cadence
        else:
            value = ScheduleRow(key, due, sitemap, interval).encode()
        last = (due, sitemap, interval)
        add((key.encode(), value))
    return out


def _int64_or_none(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int:
        raise TypeError(f"{name} must be an int or None, got {value!r}")
    if not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f"{name} {value} does not fit in 64 bits")
    return value


def is_due(next_render_time: Any, now: int) -> bool:
    """Due is inclusive (``<= now``): many keys share a minute, and an exclusive test strands one."""
    due = finite(next_render_time)
    return due is not None and due <= now


def cadence_of(effective_interval: Any, fallback: int) -> int | float:
    """The carried cadence when it is a finite number > 0; junk (0, -1, None, NaN, text) falls back."""
    return positive(effective_interval) or fallback


def score(due_at: Any, now: Any, cadence: Any, from_sitemap: bool, boost: float) -> float:
    """Rank of a due row (higher is served first): lateness over cadence, times the sitemap boost.

    Lateness, not age: a row filed with a non-cadence gap (recheck, backoff) enters at 0 when it
    comes due. A cadence that is not a number > 0 leaves the raw lateness in ms. Absent due or now
    scores 0. The boost is a multiplier, not a tier, so discovered rows cannot starve.
    """
    due, at = finite(due_at), finite(now)
    if due is None or at is None:
        return 0.0
    lateness = max(0, at - due)
    c = finite(cadence)
    ratio = lateness / c if c is not None and c > 0 else float(lateness)
    return ratio * boost if from_sitemap else ratio


def counted_strikes(value: Any) -> int:
    """A stored strike count: its numeric value if finite and > 0 (strings count), else 0."""
    n = positive(value)
    return int(n) if n is not None else 0


def backoff_wait(interval: float, strikes: int, from_sitemap: bool, failure_retry_cfg: FailureRetry) -> int:
    """Gap before a failing page's next slow retry, minute-aligned and never below its cadence.

    ``e`` counts escalations past the first slow retry; discovered pages pay the penalty from the
    second escalation on; ``maxBackoff`` caps the growth but never pulls the wait below the cadence
    (a failing page must not come due more often than a healthy one).
    """
    cfg = failure_retry_cfg
    e = max(0, strikes - cfg.fast_retries - 1)
    penalty = 1 if from_sitemap or e == 0 else cfg.non_sitemap_penalty
    try:
        grown = interval * cfg.backoff_factor**e * penalty
    except OverflowError:
        grown = math.inf
    capped = min(grown, cfg.max_backoff)
    return max(math.floor(interval + 0.5), math.floor(capped / MINUTE_MS) * MINUTE_MS)


# Sitemap changefreq -> stored renderInterval, before the page.minTtl floor.
CHANGEFREQ_MS: dict[str, int] = {
    "always": 0,
    "hourly": HOUR_MS,
    "daily": DAY_MS,
    "weekly": 7 * DAY_MS,
    "monthly": 30 * DAY_MS,
    "yearly": 365 * DAY_MS,
    "never": 365 * DAY_MS,
}


def changefreq_interval(changefreq: str | None, page: Page) -> int:
    """Cadence for a sitemap entry: its changefreq (case-insensitive), else ``page.ttl``, floored at
    ``page.minTtl`` (so ``always`` and ``hourly`` render every 6 h on defaults)."""
    ttl = CHANGEFREQ_MS.get(changefreq.strip().lower(), page.ttl) if isinstance(changefreq, str) else page.ttl
    return max(ttl, page.min_ttl)
