"""A stopping node's drain, on a virtual clock (docs/queue.md#stopping-a-node)."""

from __future__ import annotations

import pytest

from prerender_ray.queue.drain import POLL_MS, Drain, run

T0 = 1_780_000_000_000


class Clock:
    """Virtual time: ``sleep`` moves it, and the lease table's count follows a script."""

    def __init__(self, counts: dict[int, int | None | Exception], default: int | None = 0):
        self.now = T0
        self.counts = counts  # ms since T0 -> awaited results from then on
        self.default = default
        self.looks: list[int] = []

    def clock(self) -> int:
        return self.now

    async def sleep(self, s: float) -> None:
        assert s >= 0
        self.now += round(s * 1000)

    async def awaiting(self) -> int | None:
        self.looks.append(self.now - T0)
        at = max((t for t in self.counts if t <= self.now - T0), default=None)
        value = self.default if at is None else self.counts[at]
        if isinstance(value, Exception):
            raise value
        return value


async def drain(period_ms: int, c: Clock) -> dict:
    return await run(Drain(period_ms, c.now), c.awaiting, clock=c.clock, sleep=c.sleep)


async def test_a_node_with_nothing_outstanding_stops_at_once() -> None:
    c = Clock({}, default=0)
    assert await drain(30_000, c) == {"ended": "drained", "waitedMs": 0, "awaitingResults": 0}
    assert c.looks == [0]


async def test_the_drain_ends_when_the_last_granted_result_arrives() -> None:
    c = Clock({0: 3, 1_000: 1, 2_500: 0})
    report = await drain(30_000, c)
    assert report == {"ended": "drained", "waitedMs": 2_600, "awaitingResults": 0}  # the next poll after it
    assert all(b - a == POLL_MS for a, b in zip(c.looks, c.looks[1:]))


async def test_results_that_never_come_end_the_drain_at_its_period_not_later() -> None:
    c = Clock({}, default=2)
    report = await drain(30_050, c)
    assert report == {"ended": "deadline", "waitedMs": 30_050, "awaitingResults": 2}
    assert c.looks[-1] == 30_050  # the last poll is shortened to land on the deadline


async def test_an_unanswering_lease_table_never_ends_the_drain_early() -> None:
    c = Clock({0: RuntimeError("lease table gone"), 5_000: None}, default=0)
    report = await drain(10_000, c)
    assert report == {"ended": "deadline", "waitedMs": 10_000, "awaitingResults": None}


async def test_a_zero_period_looks_once_and_stops() -> None:
    c = Clock({}, default=4)
    assert await drain(0, c) == {"ended": "deadline", "waitedMs": 0, "awaitingResults": 4}
    assert c.looks == [0]


def test_an_ended_drain_stays_ended_and_a_negative_period_is_refused() -> None:
    d = Drain(1_000, T0)
    assert d.check(T0 + 5, 2) is None and d.wait_ms(T0 + 5) == POLL_MS
    assert d.wait_ms(T0 + 900) == 100
    assert d.check(T0 + 1_000, 2) == "deadline"
    assert d.check(T0 + 1_001, 0) == "deadline" and d.report()["waitedMs"] == 1_000
    with pytest.raises(ValueError):
        Drain(-1, T0)
