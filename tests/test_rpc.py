"""``rpc.call``: the deadline every actor call carries, and what a timeout says; ``rpc.wait_for``: a
caller cancelled while it waits is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.rpc import DeadlineExceeded, call, wait_for


class CallTimedOut(TimeoutError):
    """As Ray's GetTimeoutError: a TimeoutError the awaited call raises itself."""


async def test_a_call_past_its_deadline_is_deadline_exceeded() -> None:
    with pytest.raises(DeadlineExceeded, match="no answer within 0.05s"):
        await call(asyncio.sleep(10), 0.05)


async def test_a_timeout_the_call_raises_itself_is_named_not_taken_for_the_deadline() -> None:
    """Seen once: a write answered 'no answer within 30s' 12 s after the node started serving."""

    async def fails() -> None:
        raise CallTimedOut("the actor's address did not resolve")

    with pytest.raises(DeadlineExceeded, match="CallTimedOut before the 30s deadline: the actor's address") as e:
        await call(fails(), 30)
    assert isinstance(e.value.__cause__, CallTimedOut)


async def test_a_nested_deadline_passes_through_unchanged() -> None:
    async def inner() -> None:
        await call(asyncio.sleep(10), 0.01)

    with pytest.raises(DeadlineExceeded, match="no answer within 0.01s"):
        await call(inner(), 30)


async def test_a_caller_cancelled_as_its_call_answers_is_cancelled() -> None:
    """``asyncio.wait_for`` (3.11) returned the answer then, and the task went on: a store's walk,
    cancelled by a close as its peer answered, dropped records from a closed RocksDB."""
    answer = asyncio.get_running_loop().create_future()
    went_on: list[str] = []

    async def caller() -> None:
        went_on.append(await call(answer, 5))

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)
    answer.set_result("held")
    task.cancel()  # in the same turn
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and went_on == []


async def test_a_caller_cancelled_as_its_call_fails_is_cancelled() -> None:
    """Its error, handed to it instead, was caught as the call's, and the task went on."""
    answer = asyncio.get_running_loop().create_future()
    went_on: list[str] = []

    async def caller() -> None:
        try:
            await call(answer, 5)
        except ConnectionError:
            went_on.append("retrying")

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)
    answer.set_exception(ConnectionError("unreachable"))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and went_on == []


async def test_a_loop_cancelled_as_its_wait_ends_is_cancelled() -> None:
    """``wait_for`` (any awaitable, not only actor calls): a loop waiting for a wake-up, cancelled by its
    owner's close in the turn the wake-up came, was handed it and waited again, never to end."""
    wake = asyncio.Event()
    turns: list[int] = []

    async def loop() -> None:
        while len(turns) < 3:
            try:
                await wait_for(wake.wait(), 5)
            except TimeoutError:
                pass
            wake.clear()
            turns.append(1)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)  # waiting: the event's waiter is wrapped in a task of its own
    wake.set()
    await asyncio.sleep(0)  # the wrapped wait() ends now; the loop wakes only in a later turn
    task.cancel()
    ended, _ = await asyncio.wait([task], timeout=1)
    if not ended:  # it waits again
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert ended and task.cancelled() and turns == []


async def test_wait_for_keeps_its_timeout_and_a_cleanup_after_a_cancel() -> None:
    """Its timeout is asyncio's own (not a DeadlineExceeded); a task cancelled before the wait (its
    cleanup in an ``except CancelledError``) gets the result: only a cancel during the wait counts."""
    with pytest.raises(TimeoutError) as e:
        await wait_for(asyncio.sleep(10), 0.01)
    assert type(e.value) is TimeoutError

    async def cleaning_up() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return await wait_for(asyncio.sleep(0, "closed"), 5)
        return "not cancelled"

    task = asyncio.create_task(cleaning_up())
    await asyncio.sleep(0)
    task.cancel()
    assert await task == "closed"
