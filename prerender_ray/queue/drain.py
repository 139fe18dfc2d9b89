"""A stopping node's drain: when it may exit.

A stop first says ``paused`` (claims get ``[]``), then waits for the results of the leases the node
granted: the fleet posts a result only to the node that granted the job, and gives up after a few
seconds of retries (docs/fleet-protocol.md#result-retries), so a node that exits with renders in
flight loses their results and the keys wait out their whole lease. The wait is bounded by the drain
period and ends early once no granted lease awaits a result. Time is passed in (epoch ms), so tests
move it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal

from prerender_ray.timeutil import now_ms

Ended = Literal["drained", "deadline"]
POLL_MS = 200


class Drain:
    def __init__(self, period_ms: int, now: int):
        if period_ms < 0:
            raise ValueError("the drain period cannot be negative")
        self.started = now
        self.deadline = now + period_ms
        self.awaiting: int | None = None  # the last count seen (None: the lease table did not answer)
        self.ended: Ended | None = None
        self.ended_at: int | None = None

    def check(self, now: int, awaiting: int | None) -> Ended | None:
        """After one look at the lease table: ``drained`` when nothing awaits a result, ``deadline``
        when the period is over (with results still awaited, or unknown), else None (keep waiting).
        An unknown count never ends the drain early: only the deadline does."""
        if self.ended is not None:
            return self.ended
        self.awaiting = awaiting
        if awaiting is not None and awaiting <= 0:
            self.ended = "drained"
        elif now >= self.deadline:
            self.ended = "deadline"
        if self.ended is not None:
            self.ended_at = now
        return self.ended

    def wait_ms(self, now: int, poll_ms: int = POLL_MS) -> int:
        """How long to sleep before the next look: a poll, never past the deadline."""
        return max(0, min(poll_ms, self.deadline - now))

    def report(self) -> dict:
        return {"ended": self.ended, "waitedMs": None if self.ended_at is None else self.ended_at - self.started,
                "awaitingResults": self.awaiting}


async def run(drain: Drain, awaiting: Callable[[], Awaitable[int | None]], *,
              clock: Callable[[], int] = now_ms, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
              poll_ms: int = POLL_MS) -> dict:
    """Look at the count of awaited results until ``drain`` ends. ``awaiting`` carries its own
    deadline (a typed client call); one that fails counts as unknown."""
    while True:
        try:
            count = await awaiting()
        except Exception:
            count = None
        now = clock()
        if drain.check(now, count) is not None:
            return drain.report()
        await sleep(drain.wait_ms(now, poll_ms) / 1000)
