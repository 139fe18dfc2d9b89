"""Tasks (prerender_ray/tasks.py): a close cancels and awaits every task, those a cancelled one starts
meanwhile too, and names those that do not end by its deadline."""

from __future__ import annotations

import asyncio

from prerender_ray.tasks import Tasks


async def test_a_close_ends_the_tasks_a_cancelled_one_starts_and_names_those_that_do_not_end() -> None:
    tasks = Tasks()
    ran: list[str] = []

    async def later() -> None:
        ran.append("later")

    async def walk() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            tasks.spawn(later())  # as a push on that gives up starts a walk

    stop = False

    async def stubborn() -> None:
        while not stop:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                pass

    first = tasks.spawn(walk())
    await asyncio.sleep(0)
    assert await tasks.close(1.0) == [] and first.cancelled() and len(tasks) == 0
    assert ran == []  # started once the close began: never ran

    tasks = Tasks()
    left = tasks.spawn(stubborn())
    await asyncio.sleep(0)
    assert await tasks.close(0.1) == [left]
    stop = True
    left.cancel()
    await asyncio.gather(left, return_exceptions=True)
