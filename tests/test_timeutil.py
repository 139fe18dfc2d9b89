"""Time base, numeric reads and the reference's fnv1a32 (docs/queue.md#time-base,
docs/queue.md#first-render)."""

from __future__ import annotations

import math
import time

import pytest

from prerender_ray.timeutil import (
    DAY_MS,
    MINUTE_MS,
    finite,
    fnv1a32,
    initial_render_time,
    minute,
    now_ms,
    positive,
)

NOW = 1_780_000_012_345  # deliberately not minute-aligned
VECTOR_KEY = "https://x.test/a|desktop"


def test_fnv1a32_reproduces_the_reference_vectors() -> None:
    # change detector: these pin the corpus' jitter; do not update the expectations
    assert fnv1a32("") == 2166136261
    assert fnv1a32("a") == 3826002220
    assert fnv1a32("https://x.test/a") == 1755872036


def test_fnv1a32_folds_utf16_code_units_like_javascript() -> None:
    # values computed with JavaScript's charCodeAt loop; astral characters are surrogate pairs
    assert fnv1a32("é😀") == 1154239905
    assert fnv1a32("https://ü.test/a|desktop") == 1346205900
    assert fnv1a32("\ud800x") == 2137190693  # a lone surrogate is one code unit, as in JS


def test_fnv1a32_hashes_none_as_the_empty_string() -> None:
    assert fnv1a32(None) == fnv1a32("") == 2166136261


def test_minute_floors_to_the_minute() -> None:
    assert minute(90_000) == 60_000
    assert minute(60_000) == 60_000
    assert minute(59_999) == 0
    assert minute(-1) == -60_000
    assert minute(90_000.5) == 60_000


def test_now_ms_is_integer_epoch_milliseconds() -> None:
    value = now_ms()
    assert isinstance(value, int)
    assert abs(value - time.time() * 1000) < 60_000


def test_finite_distinguishes_absent_from_zero() -> None:
    assert finite(None) is None
    assert finite(0) == 0
    assert finite(1) == 1
    assert finite("12") == 12 and isinstance(finite("12"), int)
    assert finite("1.5") == 1.5
    assert finite(3.0) == 3 and isinstance(finite(3.0), int)
    assert finite(10**20) == 10**20  # BigInt-like values stay exact
    for junk in (math.nan, math.inf, -math.inf, "abc", "", True, False, object(), [1]):
        assert finite(junk) is None


def test_positive_drops_zero_and_negatives() -> None:
    assert positive(0) is None
    assert positive(-5) is None
    assert positive("7") == 7
    assert positive(math.nan) is None


def test_initial_render_time_scales_the_hash_onto_the_cadence() -> None:
    # xxh64("https://x.test/a") x 1 day >> 64 = 76 544 293 ms (1275 min); a change detector
    assert initial_render_time(VECTOR_KEY, DAY_MS, 0, default_interval=DAY_MS) == 1275 * MINUTE_MS


def test_initial_render_times_are_flat_even_over_a_year() -> None:
    # the reference's fnv mod cadence only reaches 49.7 days into a 365-day cadence
    year = 365 * DAY_MS
    tenths = [0] * 10
    for i in range(5000):
        t = initial_render_time(f"https://shop.test/p/{i}|desktop", year, 0, default_interval=DAY_MS)
        tenths[t * 10 // year] += 1
    assert min(tenths) > 400 and max(tenths) < 600


def test_initial_render_time_floors_now_plus_offset_not_the_minute_of_now() -> None:
    # offset 27 872 036: from now = 59 999 the sum crosses a minute that minute(now) + offset would not
    assert initial_render_time(VECTOR_KEY, DAY_MS, 59_999, default_interval=DAY_MS) == 76_560_000


def test_initial_render_time_is_minute_aligned_within_the_interval_and_stable() -> None:
    for i in range(200):
        key = f"https://shop.test/p/{i}|desktop"
        t = initial_render_time(key, DAY_MS, NOW, default_interval=DAY_MS)
        assert t % MINUTE_MS == 0
        assert NOW - MINUTE_MS < t < NOW + DAY_MS
        assert t == initial_render_time(key, DAY_MS, NOW, default_interval=DAY_MS)


def test_initial_render_time_spreads_distinct_urls() -> None:
    slots = {initial_render_time(f"https://shop.test/p/{i}|desktop", DAY_MS, NOW, default_interval=DAY_MS)
             for i in range(200)}
    assert len(slots) > 100


def test_device_variants_of_one_url_share_the_initial_slot() -> None:
    url = "https://shop.test/catalog?page=2"
    slots = {initial_render_time(f"{url}|{device}", DAY_MS, NOW, default_interval=DAY_MS)
             for device in ("desktop", "mobile", "tablet")}
    assert len(slots) == 1
    later = initial_render_time(f"{url}|tablet", DAY_MS, NOW + 59_000, default_interval=DAY_MS)
    assert abs(later - slots.pop()) <= MINUTE_MS  # a clock tick between calls moves it one minute at most


def test_keys_without_the_delimiter_are_seeded_by_the_whole_string() -> None:
    slots = {initial_render_time(f"not-a-key-{i}", DAY_MS, NOW, default_interval=DAY_MS) for i in range(50)}
    assert len(slots) > 25
    assert initial_render_time("https://x.test/a", DAY_MS, 0, default_interval=DAY_MS) == 1275 * MINUTE_MS


def test_initial_render_time_honours_a_custom_delimiter() -> None:
    a = initial_render_time("https://x.test/a#desktop", DAY_MS, 0, default_interval=DAY_MS, delimiter="#")
    assert a == 1275 * MINUTE_MS


@pytest.mark.parametrize("interval", [0, -1, None, math.nan, "junk", math.inf])
def test_a_junk_interval_falls_back_to_the_default_for_jitter(interval: object) -> None:
    key = "https://x.test/a|desktop"
    expected = initial_render_time(key, 6 * 3_600_000, NOW, default_interval=DAY_MS)
    assert initial_render_time(key, interval, NOW, default_interval=6 * 3_600_000) == expected


def test_next_slot_is_the_seeds_fixed_phase_strictly_after_this_minute() -> None:
    from prerender_ray.timeutil import next_slot

    span = DAY_MS
    for i in range(200):
        seed = f"https://shop.test/p/{i}"
        slot = next_slot(seed, span, NOW)
        assert slot % MINUTE_MS == 0 and minute(NOW) < slot <= minute(NOW) + MINUTE_MS + span
        assert next_slot(seed, span, slot - MINUTE_MS) == slot  # the minute before it: still ahead
        assert next_slot(seed, span, slot) == slot + span  # at it: the next period's
        assert next_slot(seed, span, NOW + 3 * span) == slot + 3 * span  # one phase on the epoch
