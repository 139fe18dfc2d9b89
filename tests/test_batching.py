"""Group commit: concurrent callers share one call, answers in order, failures reach the whole batch."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.batching import GroupCommit


class Recorder:
    def __init__(self, fail_on: int | None = None, wrong_count: bool = False) -> None:
        self.calls: list[list[int]] = []
        self.gate = asyncio.Event()
        self.fail_on = fail_on
        self.wrong_count = wrong_count

    async def flush(self, items: list[int]) -> list[int]:
        self.calls.append(list(items))
        await self.gate.wait()
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"boom {self.fail_on}")
        if self.wrong_count:
            return items[:-1]
        return [i * 10 for i in items]


async def test_callers_queued_behind_a_call_in_flight_share_the_next_call() -> None:
    rec = Recorder()
    gc = GroupCommit(rec.flush)
    first = asyncio.ensure_future(gc.submit(1))
    await asyncio.sleep(0)  # the first call is now in flight, waiting on the gate
    rest = [asyncio.ensure_future(gc.submit(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    rec.gate.set()
    assert await first == 10
    assert [await f for f in rest] == [20, 30, 40]
    assert rec.calls == [[1], [2, 3, 4]]
    assert gc.batches == 2 and len(gc) == 0


async def test_a_failing_call_fails_its_own_batch_only() -> None:
    rec = Recorder(fail_on=2)
    gc = GroupCommit(rec.flush)
    a = asyncio.ensure_future(gc.submit(1))
    await asyncio.sleep(0)
    b, c = asyncio.ensure_future(gc.submit(2)), asyncio.ensure_future(gc.submit(3))
    await asyncio.sleep(0)
    rec.gate.set()
    assert await a == 10
    for f in (b, c):
        with pytest.raises(ValueError, match="boom 2"):
            await f
    rec.fail_on = None
    assert await gc.submit(5) == 50  # a later batch is tried afresh


async def test_a_caller_that_gave_up_while_queued_is_left_out_of_the_call() -> None:
    rec = Recorder()
    gc = GroupCommit(rec.flush)
    a = asyncio.ensure_future(gc.submit(1))
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(gc.submit(2))
    kept = asyncio.ensure_future(gc.submit(3))
    await asyncio.sleep(0)
    gone.cancel()
    rec.gate.set()
    assert await a == 10 and await kept == 30
    assert rec.calls == [[1], [3]]


async def test_a_wrong_number_of_answers_is_an_error_not_a_misdelivery() -> None:
    rec = Recorder(wrong_count=True)
    rec.gate.set()
    gc = GroupCommit(rec.flush)
    with pytest.raises(RuntimeError, match="1 answers for 2 items"):
        await asyncio.gather(gc.submit(1), gc.submit(2))


async def test_max_batch_splits_a_long_queue() -> None:
    rec = Recorder()
    rec.gate.set()
    gc = GroupCommit(rec.flush, max_batch=2)
    assert await asyncio.gather(*(gc.submit(i) for i in range(5))) == [0, 10, 20, 30, 40]
    assert rec.calls == [[0, 1], [2, 3], [4]]


async def test_a_deadline_on_a_caller_does_not_hang_the_others() -> None:
    rec = Recorder()
    gc = GroupCommit(rec.flush)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(gc.submit(1), 0.01)
    rec.gate.set()
    assert await asyncio.wait_for(gc.submit(2), 1) == 20


# ------------------------------------------------------------------------------------- linger


async def test_after_a_shared_call_the_next_waits_its_linger_for_more_callers() -> None:
    rec = Recorder()
    rec.gate.set()
    gc = GroupCommit(rec.flush, linger_s=0.5)
    assert await asyncio.gather(gc.submit(1), gc.submit(2)) == [10, 20]  # after an idle spell: at once
    three = asyncio.ensure_future(gc.submit(3))
    await asyncio.sleep(0)  # the drain is lingering now: without the linger, [3] would be in flight
    assert rec.calls == [[1, 2]]
    four = asyncio.ensure_future(gc.submit(4))
    assert [await three, await four] == [30, 40]
    assert rec.calls == [[1, 2], [3, 4]]


async def test_a_lone_caller_after_a_lone_call_does_not_linger() -> None:
    rec = Recorder()
    rec.gate.set()
    gc = GroupCommit(rec.flush, linger_s=30)
    assert await asyncio.wait_for(gc.submit(1), 5) == 10
    assert await asyncio.wait_for(gc.submit(2), 5) == 20  # the last call carried one: no one to wait for
    assert rec.calls == [[1], [2]]


async def test_a_full_batch_does_not_linger() -> None:
    rec = Recorder()
    rec.gate.set()
    gc = GroupCommit(rec.flush, max_batch=2, linger_s=30)
    assert await asyncio.wait_for(asyncio.gather(gc.submit(1), gc.submit(2)), 5) == [10, 20]
    assert await asyncio.wait_for(asyncio.gather(gc.submit(3), gc.submit(4)), 5) == [30, 40]
    assert rec.calls == [[1, 2], [3, 4]]
