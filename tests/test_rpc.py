"""``rpc.call``: the deadline every actor call carries, and what a timeout says."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.rpc import DeadlineExceeded, call


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
