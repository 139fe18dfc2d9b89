"""A deterministic asyncio event loop on virtual time, for the simulated cluster.

``loop.time()`` is virtual: it starts at 0 and moves only when nothing is ready to run, straight to the
next timer (no real sleeping, so an hour of simulated retries and lease expiries costs milliseconds).
Callbacks run in the order asyncio schedules them, which is a function of what ran before: with a
seeded RNG for every choice the simulation makes, one seed gives one history. Work sent to an
executor (``asyncio.to_thread``) runs inline, since a thread would make the order depend on the OS.

A run has a step budget and a horizon of virtual time: a livelock (callbacks that keep each other
ready) or a loop of timers that never settles fails with the seed rather than hanging the suite.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_STEPS = 2_000_000
DEFAULT_HORIZON_S = 7 * 24 * 3600.0


class SimStuck(RuntimeError):
    """The simulation cannot go on: no callback ready and no timer left (a deadlock), the step budget
    spent (a livelock) or the virtual horizon passed."""


class _VirtualSelector(selectors.SelectSelector):
    """Keeps asyncio's registrations (its self-pipe), never asks the OS: waiting ``timeout`` seconds
    is moving the virtual clock by that much."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualLoop | None = None

    def select(self, timeout: float | None = None) -> list:
        assert self.loop is not None
        if timeout is None:
            raise SimStuck(f"deadlock at t={self.loop.time():.3f}s: nothing ready and no timer set")
        if timeout > 0:
            self.loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, *, steps: int = DEFAULT_STEPS, horizon_s: float = DEFAULT_HORIZON_S):
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        self.steps = 0
        self.max_steps = steps
        self.horizon_s = horizon_s
        self.set_exception_handler(self._unhandled)
        self.unhandled: list[dict] = []  # "exception never retrieved" and the like: kept for the report

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        if self._now > self.horizon_s:
            raise SimStuck(f"virtual horizon of {self.horizon_s:g}s passed")

    def _run_once(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise SimStuck(f"step budget of {self.max_steps} spent at t={self._now:.3f}s (a livelock?)")
        super()._run_once()  # type: ignore[misc]

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as e:  # noqa: BLE001 (handed to the awaiting caller, as an executor does)
            fut.set_exception(e)
        return fut

    def _unhandled(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        self.unhandled.append({k: repr(v)[:300] for k, v in context.items()})


def run(main: Coroutine[Any, Any, T], *, steps: int = DEFAULT_STEPS, horizon_s: float = DEFAULT_HORIZON_S) -> T:
    """Run ``main`` to its end on a fresh virtual loop; then cancel what it left running and close the
    loop (the loop is never made the thread's current one: the suite's own loop is left alone)."""
    loop = VirtualLoop(steps=steps, horizon_s=horizon_s)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
        finally:
            loop.close()


STUBBORN: list[str] = []  # tasks that outlived their cancel at a teardown (for the report)


def _cancel_all(loop: VirtualLoop) -> None:
    """Cancel what is left, on a budget of its own; never masks the run's own outcome."""
    loop.max_steps = loop.steps + 100_000
    try:
        for _ in range(10):
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            if not tasks:
                return
            for t in tasks:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    except SimStuck:
        STUBBORN.extend(repr(t.get_coro())[:200] for t in asyncio.all_tasks(loop) if not t.done())
