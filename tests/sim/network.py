"""The simulated network: every call between two simulated processes goes through it.

``SimHandle`` stands where a Ray actor handle stands (the typed clients take either): its
``handle.method.remote(*args)`` sends the call as a message, runs the method on the receiver when
the message arrives and sends the answer back as another message. Each message may be delayed (a
per-link distribution, so messages overtake each other), dropped (the caller's deadline fires; a
dropped answer means the method ran and the caller does not know), duplicated (the method runs
twice) or cut by a partition. Arguments and answers are copied, as Ray copies them. A call to a
node that is down fails after a delay, as Ray's ActorUnavailableError does.

Every choice is drawn from the network's seeded RNG, in the order the loop runs: a seed is a history.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CONTROLLER = "ctl"
CLIENT = "client"  # the fleet and API users: they reach every node's front door, whatever the partition


class NodeDown(RuntimeError):
    """The receiving process is not running (killed, not restarted yet)."""


@dataclass
class Faults:
    """What the network does to a message between two different nodes (a node's own processes talk
    without loss: one host). Delays in seconds."""

    drop: float = 0.0
    duplicate: float = 0.0
    min_delay: float = 0.0005
    max_delay: float = 0.005
    slow: float = 0.0  # the chance of a long delay (an overloaded peer): deadlines fire
    slow_max: float = 40.0

    @classmethod
    def none(cls) -> Faults:
        return cls()

    @classmethod
    def rough(cls) -> Faults:
        return cls(drop=0.03, duplicate=0.03, slow=0.02)


class Network:
    def __init__(self, rng: random.Random, faults: Faults | None = None):
        self.rng = rng
        self.faults = faults or Faults()
        self.groups: list[set[str]] | None = None  # a partition: nodes talk only inside their group
        self.services: dict[tuple[str, str], Any] = {}  # (node, kind) -> the running object
        self.dead: set[str] = set()  # nodes whose processes are down: they send nothing
        self.context_of: Callable[[str], contextvars.Context] = lambda node: contextvars.copy_context()
        self.trace: list[tuple] = []
        self.stats = {"sent": 0, "dropped": 0, "duplicated": 0, "cut": 0, "down": 0}

    # ------------------------------------------------------------------------------ topology

    def serve(self, node: str, kind: str, obj: Any) -> None:
        self.services[(node, kind)] = obj

    def down(self, node: str) -> None:
        self.dead.add(node)
        for key in [k for k in self.services if k[0] == node]:
            del self.services[key]
        self.trace.append(("down", node))

    def up(self, node: str) -> None:
        self.dead.discard(node)
        self.trace.append(("up", node))

    def partition(self, *groups: set[str]) -> None:
        """Nodes (and the controller, ``CONTROLLER``) reach only those of their own group; one not
        named is alone."""
        self.groups = [set(g) for g in groups]
        self.trace.append(("partition", tuple(sorted(tuple(sorted(g)) for g in self.groups))))

    def heal(self) -> None:
        self.groups = None
        self.trace.append(("heal",))

    def connected(self, a: str, b: str) -> bool:
        if a == b or self.groups is None or CLIENT in (a, b):
            return True
        return any(a in g and b in g for g in self.groups)

    def handle(self, src: str, dst: str, kind: str) -> SimHandle:
        return SimHandle(self, src, dst, kind)

    # ------------------------------------------------------------------------------ messages

    def _delay(self, src: str, dst: str) -> float:
        f = self.faults
        if src == dst:
            return self.rng.uniform(0, f.min_delay)
        if f.slow and self.rng.random() < f.slow:
            return self.rng.uniform(f.max_delay, f.slow_max)
        return self.rng.uniform(f.min_delay, f.max_delay)

    def _lost(self, src: str, dst: str) -> bool:
        """Cut by a partition now, or dropped."""
        if not self.connected(src, dst):
            self.stats["cut"] += 1
            return True
        if src != dst and self.faults.drop and self.rng.random() < self.faults.drop:
            self.stats["dropped"] += 1
            return True
        return False

    def send(self, src: str, dst: str, kind: str, method: str, args: tuple, kwargs: dict) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()
        self.stats["sent"] += 1
        if src in self.dead:  # a killed process's last breath goes nowhere
            return answer
        payload = _copied((args, kwargs))
        copies = 1
        if src != dst and self.faults.duplicate and self.rng.random() < self.faults.duplicate:
            copies = 2
            self.stats["duplicated"] += 1
        self.trace.append(("send", round(loop.time(), 6), src, dst, kind, method, copies))
        for _ in range(copies):
            if self._lost(src, dst):
                continue
            loop.call_later(self._delay(src, dst), self._arrive, src, dst, kind, method, payload, answer)
        return answer

    def _arrive(self, src: str, dst: str, kind: str, method: str, payload: tuple, answer: asyncio.Future) -> None:
        loop = asyncio.get_running_loop()
        if not self.connected(src, dst):  # partitioned while in flight
            self.stats["cut"] += 1
            return
        obj = self.services.get((dst, kind))
        if obj is None:
            self.stats["down"] += 1
            loop.call_later(self._delay(dst, src), _settle, answer, NodeDown(f"{kind} on {dst} is not running"), True)
            return
        args, kwargs = _copied(payload)  # each delivery its own copy (a duplicate is a second message)
        self.trace.append(("run", round(loop.time(), 6), src, dst, kind, method))
        # the call runs as the receiver's task: a kill of the receiver cancels it
        task = loop.create_task(_invoke(getattr(obj, method), args, kwargs), context=self.context_of(dst))
        task.add_done_callback(lambda t: self._reply(dst, src, t, answer))

    def _reply(self, src: str, dst: str, task: asyncio.Task, answer: asyncio.Future) -> None:
        if task.cancelled():
            return  # the receiver was killed mid-call: no answer ever comes
        error = task.exception()
        value: Any = _copied_error(error) if error is not None else _copied(task.result())
        if self._lost(src, dst):
            return
        asyncio.get_running_loop().call_later(self._delay(src, dst), _settle, answer, value, error is not None)


async def _invoke(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    got = fn(*args, **kwargs)
    if inspect.isawaitable(got):
        got = await got
    return got


def _settle(answer: asyncio.Future, value: Any, failed: bool) -> None:
    if answer.done():  # the caller gave up (its deadline), or a duplicate answered first
        return
    (answer.set_exception if failed else answer.set_result)(value)


def _copied(value: Any) -> Any:
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))  # noqa: S301 (our own bytes)


def _copied_error(error: BaseException) -> BaseException:
    try:
        return _copied(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}"[:500])


class SimHandle:
    """A handle to ``kind`` on ``dst`` as seen from ``src``; resolved at each delivery, so it reaches
    the process running there then (a restarted one too), as a Ray handle of a restartable actor does."""

    def __init__(self, net: Network, src: str, dst: str, kind: str):
        self._net, self._src, self._dst, self._kind = net, src, dst, kind

    def __getattr__(self, name: str) -> _SimMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _SimMethod(self, name)


class _SimMethod:
    def __init__(self, handle: SimHandle, name: str):
        self._h, self._name = handle, name

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future:
        h = self._h
        return h._net.send(h._src, h._dst, h._kind, self._name, args, kwargs)
