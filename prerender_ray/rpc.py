"""Calls between a node's processes: the deadline every call carries, and the typed interface of each
actor that plain code depends on.

The actors' clients (``actors/leasetable.py``, ``actors/store/actor.py``, ``actors/keeper/client.py``)
implement these interfaces over Ray handles; the keeper's parts are written against the interfaces,
so their tests run them against in-process implementations without Ray. No Ray import here: an
ObjectRef is awaitable, which is all ``call`` needs.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
from collections.abc import Awaitable, Sequence
from typing import Protocol, TypeVar

from prerender_ray.storage.pages import PageMeta

T = TypeVar("T")
Op = Sequence[bytes | None]  # (key, payload) as a tuple or a list; payload None = delete


class DeadlineExceeded(TimeoutError):
    """An actor call that did not answer within its deadline."""


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for``, except that a caller cancelled meanwhile is cancelled, whatever ``aw``
    ended with: on 3.11 ``wait_for`` hands it the result (or ``aw``'s error) when ``aw`` ends in the
    turn of the cancel, the cancel is spent, and the task goes on (a store's walk, cancelled by its
    close, wrote to its closed RocksDB; a loop never ends). Only cancels requested while it waits
    count: a task already cancelled and cleaning up is not cancelled again."""
    task = asyncio.current_task()
    cancels = task.cancelling() if task is not None else 0
    try:
        got = await asyncio.wait_for(aw, timeout)
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        if task is not None and task.cancelling() > cancels:
            raise asyncio.CancelledError() from e
        raise
    if task is not None and task.cancelling() > cancels:
        raise asyncio.CancelledError()
    return got


async def call(ref: Awaitable[T], timeout: float) -> T:
    """Await an actor call (an ObjectRef, or any awaitable) with a deadline; the caller decides what a
    timeout means. A caller cancelled meanwhile is cancelled, whatever the call ended with (``wait_for``)."""
    try:
        return await wait_for(ref, timeout)
    except DeadlineExceeded:
        raise
    except asyncio.TimeoutError as e:
        if type(e) is not asyncio.TimeoutError:  # the call's own timeout (Ray's GetTimeoutError is one), not ours
            raise DeadlineExceeded(f"{type(e).__name__} before the {timeout:g}s deadline: {str(e)[:200]}") from e
        raise DeadlineExceeded(f"no answer within {timeout:g}s") from None


class StoreApi(Protocol):
    """The node's replicated stores (the NodeStore actor): registry rows and pages."""

    async def apply(self, registry: Sequence[Op], pages: Sequence[Op] | None = None,
                    history: Sequence[list] | None = None) -> int: ...

    async def apply_absent(self, registry: Sequence[Op], deleted_within_ms: int = 0) -> list[bytes | None]: ...

    async def apply_if(self, registry: Sequence[Op], expected: list[bytes | None]) -> list[bool]: ...

    async def get(self, keys: list[bytes]) -> list[bytes | None]: ...

    async def get_targets(self, urls: list[str]) -> list[bytes | None]: ...

    async def get_pages(self, keys: list[str]) -> list[bytes | None]: ...

    async def has_pages(self, keys: list[str]) -> list[bool]: ...

    async def page_metas(self, keys: list[str]) -> list[PageMeta | None]: ...

    async def targets_and_metas(self, urls: list[str], keys: list[str]) -> tuple[list, list]: ...

    async def page_times(self, keys: list[str]) -> list[int | None]: ...

    async def render_history(self, key: str, screenshots: bool = False) -> dict: ...

    async def scan(self, prefix: bytes, start: bytes | None = None,
                   limit: int = 1000) -> list[tuple[bytes, bytes]]: ...

    async def wait_synced(self, timeout: float) -> dict: ...


class LeaseApi(Protocol):
    """The node's lease table (the LeaseTable actor): exclusive grants and their results."""

    async def grant_many(self, items: list[list]) -> list[list]: ...

    async def begin_results(self, items: list[list]) -> list[list]: ...

    async def finish_results(self, items: list[list]) -> list[bool]: ...

    async def abandon_results(self, items: list[list]) -> None: ...

    async def reopen_answering(self) -> int: ...

    async def blocked(self) -> list[tuple[str, int]]: ...

    async def lease_of(self, key: str) -> dict | None: ...

    async def export_keys(self, keys: list[str]) -> list[tuple[str, list]]: ...

    async def adopt(self, leases: list[tuple[str, list]]) -> int: ...

    async def forget(self, keys: list[str]) -> None: ...

    async def status(self) -> dict: ...


class KeeperApi(Protocol):
    """What one node's keeper asks of another's: the owner of a key decides about it. Calls that
    move or write owned data carry the caller's membership epoch; a receiver on a newer one raises
    ``identity.membership.StaleEpoch``."""

    async def process_result(self, meta: dict, content: bytes | None, forwarded: bool = False,
                             worker: str | None = None, epoch: int | None = None) -> dict: ...

    async def apply_rows(self, rows: list, deletes: list[str], epoch: int | None = None) -> None: ...

    async def put_targets(self, items: list[dict], forwarded: bool = False, absent_only: bool = False,
                          deleted_within_ms: int = 0, epoch: int | None = None) -> dict: ...

    async def suppress(self, url: str, reason: str | None, status: int | None) -> dict: ...

    async def discover_target(self, url: str, deleted_within_ms: int, forwarded: bool = False,
                              epoch: int | None = None) -> dict: ...

    async def adopt(self, rows: list, leases: list, epoch: int, fences: list | None = None) -> int: ...

    async def handoff_done(self, sender: str, epoch: int, fence: list | None = None) -> list | None: ...


class Peers(Protocol):
    """Other nodes' keepers by node name (a handle cache that forgets on membership change)."""

    async def of(self, node: str) -> KeeperApi: ...

    async def renew(self, nodes: list[str]) -> None: ...



class Local:
    """An in-process handle: ``handle.method.remote(*args)`` runs ``obj.method`` on the caller's event
    loop and returns an awaitable, as a Ray actor handle does. The typed clients take it in place of
    a Ray handle, so the same clients and the same actor shells run in the ``LocalNode`` test harness
    and the simulated cluster without Ray. Arguments and answers are copied (a pickle round trip), as
    Ray copies them, so a caller can never share mutable state with the object it calls."""

    def __init__(self, obj: object, *, copy: bool = True):
        self._obj = obj
        self._copy = copy

    @property
    def target(self) -> object:
        return self._obj

    def __getattr__(self, name: str) -> _LocalMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _LocalMethod(self._obj, name, self._copy)


class _LocalMethod:
    def __init__(self, obj: object, name: str, copy: bool):
        self._fn = getattr(obj, name)
        self._copy = copy

    def remote(self, *args: object, **kwargs: object) -> Awaitable[object]:
        if self._copy:
            args, kwargs = _copied((args, kwargs))
        return asyncio.ensure_future(self._run(args, kwargs))

    async def _run(self, args: tuple, kwargs: dict) -> object:
        got = self._fn(*args, **kwargs)
        if inspect.isawaitable(got):
            got = await got
        return _copied(got) if self._copy else got


def _copied(value: T) -> T:
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))  # noqa: S301 (our own bytes)
