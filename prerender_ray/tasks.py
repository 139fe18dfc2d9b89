"""The background tasks of one owner, kept in one place (the node store's, the keeper's). Pure asyncio.

Every task an owner's parts start (a store's walks, pushes on, pulls owed, shippers, catch-ups; a
keeper's loops, hand-off passes, repairs, status writes) is started through ``spawn``, so that
``close`` cancels each and awaits its end before the owner's files close: a task left out went on
after the close and wrote to a closed RocksDB (a walk, its drop and its placement kept on disk). A task
started once the close began never runs (a cancelled task's own handler may start another, a walk
after a push on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any

CLOSE_DEADLINE_S = 10.0  # a close waits this long for its tasks to end, then names those that did not


class Tasks:
    def __init__(self) -> None:
        self._live: set[asyncio.Task] = set()
        self.closing = False

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """``coro`` as a task of the owner's, forgotten when it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._live.add(task)
        task.add_done_callback(self._live.discard)
        if self.closing:
            task.cancel()  # before its first step: its body never runs
        return task

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[asyncio.Task]:
        return iter(list(self._live))

    def cancel(self) -> list[asyncio.Task]:
        """Every task cancelled, none awaited (a process that dies): those still running."""
        self.closing = True
        live = list(self._live)
        for task in live:
            task.cancel()
        return live

    async def close(self, deadline_s: float = CLOSE_DEADLINE_S) -> list[asyncio.Task]:
        """Every task cancelled and awaited, for at most ``deadline_s``, those a cancelled one started
        meanwhile too: the tasks that had not ended by then (none that honours a cancel)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        me = asyncio.current_task()
        while live := [t for t in self.cancel() if not t.done() and t is not me]:
            left = deadline - loop.time()
            if left <= 0:
                return live
            await asyncio.wait(live, timeout=left)
        return []
