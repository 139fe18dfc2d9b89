"""Schedule rows and rules: encoding, score, backoff ladder, changefreq (docs/queue.md#schedule-rows,
#failure-lane, #cadence, #ranking)."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.config.render import FailureRetry, Page
from prerender_ray.queue.schedule import (
    ScheduleRow,
    UnreadableRow,
    backoff_wait,
    cadence_of,
    changefreq_interval,
    counted_strikes,
    decode_many,
    encode_many,
    is_due,
    score,
)
from prerender_ray.timeutil import DAY_MS, HOUR_MS, MINUTE_MS

KEY = "https://shop.test/p/1|desktop"
NOW = 1_780_000_000_000

ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(st.one_of(st.none(), ints64), st.booleans(), st.one_of(st.none(), ints64))
def test_a_row_survives_encode_and_decode(due: int | None, sitemap: bool, interval: int | None) -> None:
    row = ScheduleRow(KEY, due, sitemap, interval)
    assert ScheduleRow.decode(KEY, row.encode()) == row
    assert ScheduleRow.decode(KEY.encode(), row.encode()) == row


def test_absent_and_zero_are_different_rows() -> None:
    absent = ScheduleRow(KEY, None, False, None)
    zero = ScheduleRow(KEY, 0, False, 0)
    assert absent.encode() != zero.encode()
    assert ScheduleRow.decode(KEY, absent.encode()).next_render_time is None
    assert ScheduleRow.decode(KEY, zero.encode()).next_render_time == 0
    assert ScheduleRow.decode(KEY, zero.encode()).effective_interval == 0


def test_every_field_of_a_row_is_mandatory() -> None:
    with pytest.raises(TypeError):
        ScheduleRow(KEY, NOW, True)  # type: ignore[call-arg]


@pytest.mark.parametrize("row", [
    ScheduleRow(KEY, NOW, 1, None),  # type: ignore[arg-type]
    ScheduleRow(KEY, float(NOW), True, None),  # type: ignore[arg-type]
    ScheduleRow(KEY, True, True, None),  # type: ignore[arg-type]
    ScheduleRow(KEY, NOW, True, "6h"),  # type: ignore[arg-type]
])
def test_encode_refuses_values_of_the_wrong_type(row: ScheduleRow) -> None:
    with pytest.raises(TypeError):
        row.encode()


def test_encode_refuses_values_beyond_64_bits() -> None:
    with pytest.raises(ValueError):
        ScheduleRow(KEY, 2**63, True, None).encode()


GOOD = ScheduleRow(KEY, NOW, True, DAY_MS).encode()


@pytest.mark.parametrize("key,data", [
    (KEY, b""),
    (KEY, GOOD[:-1]),
    (KEY, GOOD + b"\x00"),
    (KEY, b"\x02" + GOOD[1:]),  # unknown version
    (KEY, GOOD[:1] + b"\x08" + GOOD[2:]),  # unknown flag
    (KEY, struct.pack("<BBqq", 1, 0, NOW, 0)),  # absent due carrying a value
    (KEY, struct.pack("<BBqq", 1, 2, NOW, 5)),  # absent interval carrying a value
    (KEY, None),
    (b"\xff\xfe|desktop", GOOD),  # key not UTF-8
    ("", GOOD),
    (b"", GOOD),
])
def test_decode_raises_unreadable_row_on_junk(key: str | bytes, data: bytes) -> None:
    with pytest.raises(UnreadableRow):
        ScheduleRow.decode(key, data)  # type: ignore[arg-type]


def test_decode_many_skips_and_reports_unreadable_rows() -> None:
    rows = [ScheduleRow(f"https://shop.test/{i}|desktop", NOW + i, i % 2 == 0, None if i % 3 else HOUR_MS)
            for i in range(5)]
    pairs: list[tuple[str | bytes, bytes]] = [(r.cache_key.encode(), r.encode()) for r in rows]
    pairs.insert(2, (b"https://shop.test/bad|desktop", b"junk"))
    pairs.append(("https://shop.test/bad2|desktop", b"\x01\x08" + bytes(16)))
    bad: list[UnreadableRow] = []
    assert [tuple(r) for r in rows] == list(decode_many(pairs, bad.append))
    assert len(bad) == 2 and "bad|desktop" in str(bad[0])
    assert list(decode_many([(b"k", b"junk")])) == []  # no callback: skipped silently


def test_due_is_inclusive_and_absent_is_never_due() -> None:
    assert is_due(NOW, NOW)
    assert not is_due(NOW + 1, NOW)
    assert is_due(0, NOW) and is_due(1, NOW)  # a real 0 or 1 is "due since the epoch"
    assert not is_due(None, NOW)
    assert not is_due(math.nan, NOW)


def test_junk_carried_cadences_fall_back() -> None:
    for junk in (0, -1, None, math.nan, "nonsense"):
        assert cadence_of(junk, DAY_MS) == DAY_MS
    assert cadence_of(6 * HOUR_MS, DAY_MS) == 6 * HOUR_MS
    assert cadence_of("3600000", DAY_MS) == HOUR_MS


def test_score_matches_the_reference_examples() -> None:
    assert score(NOW - 2 * HOUR_MS, NOW, HOUR_MS, False, 2) == 2.0
    assert score(NOW - 3 * HOUR_MS, NOW, 48 * HOUR_MS, False, 2) == 0.0625
    assert score(NOW - HOUR_MS, NOW, HOUR_MS, True, 2) == 2.0
    assert score(NOW - 3 * HOUR_MS, NOW, HOUR_MS, False, 2) == 3.0


@pytest.mark.parametrize("cadence", [MINUTE_MS, HOUR_MS, 6 * HOUR_MS, DAY_MS, 30 * DAY_MS])
def test_late_by_one_cadence_scores_one_for_any_cadence(cadence: int) -> None:
    assert score(NOW - cadence, NOW, cadence, False, 2) == 1.0


def test_due_now_or_in_the_future_scores_zero_never_negative() -> None:
    assert score(NOW, NOW, HOUR_MS, True, 2) == 0.0
    assert score(NOW + DAY_MS, NOW, HOUR_MS, True, 2) == 0.0


def test_absent_due_or_now_scores_zero() -> None:
    assert score(None, NOW, HOUR_MS, True, 2) == 0.0
    assert score(math.nan, NOW, HOUR_MS, True, 2) == 0.0
    assert score(NOW - HOUR_MS, None, HOUR_MS, True, 2) == 0.0


def test_a_cadence_that_is_not_positive_leaves_raw_lateness_in_ms() -> None:
    assert score(NOW - 5_000, NOW, 0, False, 2) == 5_000.0
    assert score(NOW - 5_000, NOW, -HOUR_MS, True, 2) == 10_000.0
    assert score(NOW - 5_000, NOW, None, False, 2) == 5_000.0


def test_a_numeric_string_interval_still_divides() -> None:
    assert score(NOW - 2 * HOUR_MS, NOW, "3600000", False, 2) == 2.0


def test_counted_strikes_coerces_before_the_finite_check() -> None:
    assert counted_strikes("3") == 3
    assert counted_strikes(2.0) == 2
    assert counted_strikes(10**20) == 10**20
    for junk in (None, 0, -1, math.nan, math.inf, "x", True):
        assert counted_strikes(junk) == 0


DEFAULTS = FailureRetry()


@pytest.mark.parametrize("interval,sitemap,strikes,hours", [
    # 24 h sitemap: strikes 1-2 are the fast lane; 3 -> 24 h; 4 -> 48; 5 -> 96; 6+ -> 168 (cap)
    (24, True, 3, 24), (24, True, 4, 48), (24, True, 5, 96), (24, True, 6, 168), (24, True, 9, 168),
    # 24 h discovered: 3 -> 24 h; 4 -> 192 capped at 168
    (24, False, 3, 24), (24, False, 4, 168),
    # 6 h discovered: 3 -> 6 h; 4 -> 48; 5 -> 96; 6 -> 168
    (6, False, 3, 6), (6, False, 4, 48), (6, False, 5, 96), (6, False, 6, 168),
])
def test_backoff_follows_the_worked_examples(interval: int, sitemap: bool, strikes: int, hours: int) -> None:
    assert backoff_wait(interval * HOUR_MS, strikes, sitemap, DEFAULTS) == hours * HOUR_MS


def test_backoff_never_goes_below_the_cadence() -> None:
    cfg = FailureRetry(max_backoff=DAY_MS)
    for strikes in range(1, 10):
        assert backoff_wait(48 * HOUR_MS, strikes, False, cfg) == 48 * HOUR_MS


def test_backoff_with_no_fast_retries_has_no_negative_exponent() -> None:
    cfg = FailureRetry(fast_retries=0)
    assert backoff_wait(DAY_MS, 1, True, cfg) == DAY_MS
    assert backoff_wait(DAY_MS, 2, True, cfg) == 2 * DAY_MS
    assert backoff_wait(DAY_MS, 0, True, cfg) == DAY_MS


def test_a_backoff_factor_of_one_is_flat() -> None:
    cfg = FailureRetry(backoff_factor=1)
    assert {backoff_wait(DAY_MS, s, True, cfg) for s in range(3, 20)} == {DAY_MS}
    assert backoff_wait(DAY_MS, 5, False, cfg) == 4 * DAY_MS  # the penalty still applies


def test_the_first_escalation_is_one_interval_for_everyone() -> None:
    for sitemap in (True, False):
        assert backoff_wait(6 * HOUR_MS, DEFAULTS.fast_retries + 1, sitemap, DEFAULTS) == 6 * HOUR_MS


def test_absurd_strike_counts_do_not_overflow() -> None:
    assert backoff_wait(DAY_MS, 10**6, False, DEFAULTS) == 7 * DAY_MS
    assert backoff_wait(DAY_MS, 5_000, True, FailureRetry(backoff_factor=1.5)) == 7 * DAY_MS


@given(
    interval=st.integers(min_value=MINUTE_MS, max_value=30 * DAY_MS),
    factor=st.floats(min_value=1, max_value=5),
    sitemap=st.booleans(),
    fast=st.integers(min_value=0, max_value=4),
)
def test_backoff_waits_are_minute_aligned_capped_and_monotone(
    interval: int, factor: float, sitemap: bool, fast: int
) -> None:
    cfg = FailureRetry(fast_retries=fast, backoff_factor=factor)
    waits = [backoff_wait(interval, s, sitemap, cfg) for s in range(15)]
    for wait in waits:
        assert isinstance(wait, int)
        assert wait >= interval
        if wait > interval:
            assert wait % MINUTE_MS == 0 and wait <= cfg.max_backoff
    assert waits == sorted(waits)


@pytest.mark.parametrize("changefreq,expected", [
    ("always", 6 * HOUR_MS), ("hourly", 6 * HOUR_MS), ("daily", DAY_MS), ("weekly", 7 * DAY_MS),
    ("monthly", 30 * DAY_MS), ("yearly", 365 * DAY_MS), ("never", 365 * DAY_MS),
    ("Daily", DAY_MS), (" WEEKLY ", 7 * DAY_MS), (None, DAY_MS), ("sometimes", DAY_MS), ("", DAY_MS),
])
def test_changefreq_maps_to_a_cadence_floored_at_min_ttl(changefreq: str | None, expected: int) -> None:
    assert changefreq_interval(changefreq, Page()) == expected


def test_changefreq_defaults_follow_page_ttl_and_its_floor() -> None:
    assert changefreq_interval(None, Page(ttl=2 * HOUR_MS)) == 6 * HOUR_MS
    assert changefreq_interval("hourly", Page(min_ttl=HOUR_MS)) == HOUR_MS
    assert changefreq_interval("unknown", Page(ttl=3 * DAY_MS)) == 3 * DAY_MS


@given(st.lists(st.tuples(st.text(min_size=1, max_size=8), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
                          st.booleans(), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)))))
def test_encode_many_is_encode_row_by_row(rows: list[tuple]) -> None:
    assert encode_many(rows) == [(r[0].encode(), ScheduleRow(*r).encode()) for r in rows]


@pytest.mark.parametrize("row", [("k", 1.5, False, None), ("k", 1, 1, 2), ("k", 2**63, True, 1), ("k", 1, True, "7")])
def test_encode_many_refuses_what_encode_refuses(row: tuple) -> None:
    with pytest.raises((TypeError, ValueError)):
        ScheduleRow(*row).encode()
    with pytest.raises((TypeError, ValueError)):
        encode_many([row])
