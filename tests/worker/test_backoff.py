"""HostHealth and the backoff arithmetic of the reference fleet (docs/fleet-protocol.md#host-health)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from prerender_ray.worker.backoff import (
    HostHealth,
    Timing,
    circuit_delay,
    idle_delay,
    parse_retry_after,
    result_retry_delay,
)

T = Timing()
NOW = 1_800_000_000_000.0


def test_idle_backoff_is_15_s_plus_or_minus_25_percent() -> None:
    rng = random.Random(1)
    delays = [idle_delay(T, rng) for _ in range(2000)]
    assert 11_250 <= min(delays) < 11_600 and 18_400 < max(delays) <= 18_750


@pytest.mark.parametrize(
    "failures, low, high",
    [
        (1, 500, 1000),
        (2, 1000, 2000),
        (3, 2000, 4000),
        (5, 8000, 16000),
        (6, 15000, 30000),
        (20, 15000, 30000),
    ],
)
def test_the_circuit_grows_exponentially_with_equal_jitter_up_to_30_s(
    failures: int, low: int, high: int
) -> None:
    rng = random.Random(failures)
    for _ in range(200):
        assert low <= circuit_delay(T, failures, rng) <= high


@pytest.mark.parametrize(
    "attempt, low, high", [(1, 500, 1000), (2, 1000, 2000), (3, 2000, 4000), (4, 2500, 5000)]
)
def test_result_retries_sleep_half_to_one_second_then_double_capped_at_5_s(
    attempt: int, low: int, high: int
) -> None:
    rng = random.Random(attempt)
    for _ in range(200):
        assert low <= result_retry_delay(T, attempt, rng) <= high


def test_retry_after_takes_seconds_or_an_http_date_and_ignores_zero_past_and_junk() -> None:
    assert parse_retry_after("2", NOW) == 2000
    assert parse_retry_after(" 1.5 ", NOW) == 1500
    future = datetime.fromtimestamp(NOW / 1000 + 30, UTC)
    assert abs(parse_retry_after(format_datetime(future, usegmt=True), NOW) - 30_000) < 1000
    past = datetime.fromtimestamp(NOW / 1000 - 30, UTC)
    for junk in (None, "", "0", "-3", "soon", "nan", "inf", format_datetime(past, usegmt=True)):
        assert parse_retry_after(junk, NOW) is None, junk


def test_a_new_host_is_eligible_at_once_and_no_host_means_a_60_s_sleep() -> None:
    h = HostHealth(rng=random.Random(0))
    assert h.wait_ms(NOW) == 60_000 and h.pick(NOW) is None
    h.add("http://a:9926")
    assert h.pick(NOW) == "http://a:9926" and h.wait_ms(NOW) == 0


def test_an_empty_claim_idles_the_host_and_jobs_poll_again_at_once() -> None:
    h = HostHealth(rng=random.Random(0))
    h.add("a")
    h.on_empty("a", NOW)
    assert h.pick(NOW) is None
    assert 11_250 <= h.wait_ms(NOW) <= 18_750
    h.on_jobs("a", NOW)
    assert h.pick(NOW) == "a"


def test_the_circuit_escalates_once_per_open_window_and_only_extends() -> None:
    h = HostHealth(rng=random.Random(0))
    until = h.open_circuit("a", NOW)
    assert h.state("a").failures == 1 and NOW + 500 <= until <= NOW + 1000
    again = h.open_circuit("a", NOW + 10)  # a parallel failure in the same window: no escalation
    assert h.state("a").failures == 1 and again >= until
    later = h.open_circuit("a", until + 1)  # the window closed: the next failure escalates
    assert h.state("a").failures == 2 and until + 1 + 1000 <= later <= until + 1 + 2000
    h.on_jobs("a", later + 1)
    assert h.state("a").failures == 0 and h.pick(later + 1) == "a"


def test_retry_after_sets_the_circuit_floored_at_1_s_and_capped_at_120_s() -> None:
    h = HostHealth(rng=random.Random(0))
    assert h.open_circuit("a", NOW, 2000) == NOW + 2000
    assert h.open_circuit("b", NOW, 100) == NOW + 1000
    assert h.open_circuit("c", NOW, 3_600_000) == NOW + 120_000


def test_a_delivered_result_closes_the_circuit_and_says_when_that_wakes_the_loop() -> None:
    h = HostHealth(rng=random.Random(0))
    h.open_circuit("a", NOW)
    assert h.on_result_ok("a", NOW + 1) is True
    assert h.pick(NOW + 1) == "a"
    assert h.on_result_ok("a", NOW + 2) is False  # it was eligible already


def test_queue_status_queued_wakes_paused_waits_30_s_and_anything_else_idles() -> None:
    h = HostHealth(rng=random.Random(0))
    h.on_empty("a", NOW)
    assert h.on_status("a", "queued", NOW, NOW) is True and h.pick(NOW) == "a"
    assert h.on_status("a", "paused", NOW + 1, NOW) is False
    assert h.state("a").next_poll_at == NOW + 30_000
    h.on_status("a", "unready", NOW + 2, NOW)
    assert 11_250 <= h.wait_ms(NOW) <= 18_750
    # an older message is ignored; an equal one applies
    assert h.on_status("a", "queued", NOW + 1, NOW) is False and h.pick(NOW) is None
    assert h.on_status("a", "queued", NOW + 2, NOW) is True


def test_queued_never_shortens_an_open_circuit() -> None:
    h = HostHealth(rng=random.Random(0))
    until = h.open_circuit("a", NOW, 5000)
    assert h.on_status("a", "queued", NOW, NOW) is False
    assert h.pick(NOW) is None and h.wait_ms(NOW) == until - NOW
