"""Per-minute flow counters over the last hour (the queue-state document's ``flow`` section)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.queue.flow import MINUTES, Flow
from prerender_ray.timeutil import HOUR_MS, MINUTE_MS, minute

NAMES = ("added", "granted", "results")
NOW = 1_780_000_123_456
M = minute(NOW)


def test_an_empty_flow_reports_an_hour_of_zeros_for_every_name() -> None:
    doc = Flow(NAMES).report(NOW)
    assert doc["minutes"] == MINUTES == 60
    assert doc["fromMs"] == M - 59 * MINUTE_MS
    for name in NAMES:
        assert doc[name] == {"perMinute": [0] * 60, "lastHour": 0}
    assert set(doc) == {"minutes", "fromMs", *NAMES}


def test_counts_land_in_their_minute_with_the_current_minute_last() -> None:
    f = Flow(NAMES)
    f.add("granted", 3, NOW)
    f.add("granted", 2, M)  # the same minute, its first millisecond
    f.add("granted", 1, NOW - MINUTE_MS)
    f.add("results", 4, NOW - 59 * MINUTE_MS)
    doc = f.report(NOW)
    assert doc["granted"]["perMinute"][-1] == 5 and doc["granted"]["perMinute"][-2] == 1
    assert doc["granted"]["lastHour"] == 6
    assert doc["results"]["perMinute"][0] == 4 and doc["results"]["lastHour"] == 4
    assert doc["added"]["lastHour"] == 0


def test_a_minute_older_than_an_hour_drops_out_of_the_report() -> None:
    f = Flow(NAMES)
    f.add("added", 7, NOW - 60 * MINUTE_MS)
    f.add("added", 1, NOW)
    assert f.report(NOW)["added"]["lastHour"] == 1
    assert f.report(NOW - MINUTE_MS)["added"]["perMinute"][0] == 7  # still inside an hour then


def test_the_window_slides_with_the_reporting_time() -> None:
    f = Flow(NAMES)
    f.add("granted", 1, NOW)
    assert f.report(NOW + 30 * MINUTE_MS)["granted"]["perMinute"][29] == 1
    assert f.report(NOW + HOUR_MS)["granted"]["lastHour"] == 0


def test_counts_of_one_name_never_leak_into_another() -> None:
    f = Flow(NAMES)
    f.add("added", 10, NOW)
    doc = f.report(NOW)
    assert (
        doc["added"]["lastHour"] == 10 and doc["granted"]["lastHour"] == 0 and doc["results"]["lastHour"] == 0
    )


def test_reporting_creates_no_state() -> None:
    f = Flow(NAMES)
    for i in range(200):
        f.report(NOW + i * MINUTE_MS)
    assert f.report(NOW)["granted"]["lastHour"] == 0
    assert len(f._minutes) == 0


def test_memory_stays_bounded_over_a_long_run() -> None:
    f = Flow(NAMES)
    for i in range(24 * 60):  # a day, one add per minute
        f.add("results", 1, NOW + i * MINUTE_MS)
    assert len(f._minutes) <= MINUTES + 6
    end = NOW + (24 * 60 - 1) * MINUTE_MS
    assert f.report(end)["results"] == {"perMinute": [1] * 60, "lastHour": 60}


def test_a_burst_after_a_long_silence_still_counts_right() -> None:
    f = Flow(NAMES)
    f.add("granted", 1, NOW)
    later = NOW + 10 * HOUR_MS
    for i in range(70):
        f.add("granted", 2, later + i * MINUTE_MS)
    end = later + 69 * MINUTE_MS
    assert f.report(end)["granted"]["lastHour"] == 120


@given(st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 50), st.integers(0, 180)), max_size=80))
def test_the_last_hour_is_the_sum_of_the_adds_inside_it(adds: list) -> None:
    f = Flow(NAMES)
    end = M + 180 * MINUTE_MS
    for name, n, at_minute in sorted(adds, key=lambda a: a[2]):  # time moves forward
        f.add(name, n, M + at_minute * MINUTE_MS + 59_999)
    doc = f.report(end)
    for name in NAMES:
        expected = sum(n for nm, n, at in adds if nm == name and at > 120)
        assert doc[name]["lastHour"] == expected == sum(doc[name]["perMinute"])
        assert len(doc[name]["perMinute"]) == 60
