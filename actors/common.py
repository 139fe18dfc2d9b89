"""What every actor module shares: names, placement options and calls with deadlines."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import time
import types
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from prerender_ray import logs, metrics
from prerender_ray.actors.controller_client import ControllerClient
from prerender_ray.identity.membership import Membership
from prerender_ray.identity.nodes import NAMESPACE, actor_name
from prerender_ray.rpc import DeadlineExceeded, call
from prerender_ray.storage.rocks import node_dir

__all__ = ["NAMESPACE", "actor_name", "placement", "call", "lookup", "untraced", "DeadlineExceeded"]


# Ray records every actor call as task events in the GCS (for its state API and dashboard, which we do
# not use): per call a little CPU in the caller and the actor, and GCS memory up to its cap of 100,000
# tasks. The 30-minute soak saw the head's GCS grow from 58 to 339 MB. Ray Serve turns them off for
# its replicas the same way.
TASK_EVENTS = False


def placement(node_id: str, name: str, *, data_dir: str, node: str, epoch: str,
              max_concurrency: int = 1000, restarts: int = -1) -> dict[str, Any]:
    """Options for a named, detached actor pinned to one node, with the node's metrics directory."""
    env = {
        metrics.ENV: str(node_dir(data_dir, node) / "metrics" / epoch),
        "PRERENDER_NODE": node,
        logs.LOG_DIR_ENV: str(node_dir(data_dir, node) / "logs"),
    }
    return dict(
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=restarts,
        max_concurrency=max_concurrency,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        runtime_env={"env_vars": env},
        enable_task_events=TASK_EVENTS,
    )


BULK_GC_THRESHOLD = (50_000, 20, 20)


def bulk_gc() -> None:
    """For an actor that handles thousands of rows per call (a sitemap walk allocates a few objects
    per URL): a young-generation collection every 50,000 allocations instead of 700 (measured 0.6 to
    0.8 us of GC per ingested URL in the walker at the default)."""
    gc.set_threshold(*BULK_GC_THRESHOLD)


def untraced(actor: object) -> None:
    """Ray wraps every method of an actor class for tracing, private helpers included, so a call
    from one method to another pays a wrapper, which adds up in per-row and per-key loops. With
    tracing off (we never turn it on), bind the plain functions on the instance for those inner
    calls; remote calls are unaffected (Ray dispatches them through the class)."""
    try:
        from ray.util.tracing.tracing_helper import _is_tracing_enabled
    except ImportError:  # a Ray without it: keep the wrappers
        return
    if _is_tracing_enabled():
        return
    for name, fn in inspect.getmembers(type(actor), inspect.isfunction):
        plain = getattr(fn, "__wrapped__", None)
        if getattr(fn, "__ray_tracing_wrapped__", False) and callable(plain) and not name.startswith("__"):
            setattr(actor, name, types.MethodType(plain, actor))


OVERRIDES_READ_S = 10.0


async def read_overrides(store: Any, apply: Any, log: Any) -> None:
    """Read the live config overrides row from the node's store (its ``StoreClient``, or its handle)
    and hand it to ``apply`` (a plain or an async function); a store that does not answer is logged,
    and the next read retries."""
    from prerender_ray.actors.store.actor import StoreClient
    from prerender_ray.storage.keys import OVERRIDES_KEY

    client = StoreClient(store.handle if isinstance(store, StoreClient) else store, OVERRIDES_READ_S)
    try:
        (raw,) = await client.get([OVERRIDES_KEY])
        applied = apply(raw)
        if inspect.isawaitable(applied):
            await applied
    except Exception as e:
        log.warning("config overrides not read", error=repr(e)[:300])


async def follow_overrides(store: Any, apply: Any, log: Any) -> None:
    """``read_overrides`` every ``OVERRIDES_POLL_S``, forever (the first read is the caller's)."""
    from prerender_ray.config.overrides import OVERRIDES_POLL_S

    while True:
        await asyncio.sleep(OVERRIDES_POLL_S)
        await read_overrides(store, apply, log)


class ActorNotPlaced(ValueError, RayError):
    """No actor of that name: not placed yet, killed and not placed again, or its node is gone. A
    ValueError, as ``ray.get_actor`` raises, and a RayError, so a route that needed it answers 503
    with Retry-After (``api/app.py``), never 500."""


def lookup(kind: str, node: str, index: int | None = None) -> Any:
    """A named actor's handle: a blocking GCS round trip, so never on an event loop (``Handles``).
    Outside Ray (a test harness, a tool) the actor is not placed: ``ray.get_actor`` would start Ray
    there, or join whichever instance it finds, from a request's thread, seconds later."""
    if not ray.is_initialized():
        raise ActorNotPlaced(f"Ray is not running in this process: no {actor_name(kind, node, index)}")
    try:
        return ray.get_actor(actor_name(kind, node, index), namespace=NAMESPACE)
    except ValueError as e:
        raise ActorNotPlaced(str(e)) from None


LOOKUP_DEADLINE_S = 10.0


async def lookup_async(kind: str, node: str, index: int | None = None) -> Any:
    """``lookup`` in a thread, under a deadline (a GCS round trip; under load it can take long)."""
    return await call(asyncio.to_thread(lookup, kind, node, index), LOOKUP_DEADLINE_S)


def survivable(e: BaseException) -> bool:
    """What a loop that must keep running logs and goes on after: any Exception, and a CancelledError
    that is not its own task's (one that came out of an awaited call); its own cancel still ends it,
    as a CancelledError even when a ``wait_for`` on the way turned it into another exception."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        if not isinstance(e, asyncio.CancelledError):
            raise asyncio.CancelledError() from e
        return False
    return isinstance(e, (Exception, asyncio.CancelledError))


def end_if_cancelled() -> None:
    """For a loop that must keep running, at the top of each turn: Python 3.11's ``wait_for`` can
    swallow a cancel that lands as its inner call ends (it returns the result), and no later await
    raises it again, so the loop would never end (seen once under load)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


class Sometimes:
    """True at most once per ``every`` seconds: a warning a loop would otherwise repeat."""

    def __init__(self, every: float = 60.0):
        self.every = every
        self._at = -every

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._at < self.every:
            return False
        self._at = now
        return True


_controller: list[ControllerClient] = []  # the controller's client, looked up once per process


async def controller_membership(timeout: float = 10.0, node: str | None = None) -> Membership:
    """The controller's current membership: the truth every push carries. The whole ask is under
    ``timeout``, the handle lookup (a thread: a GCS round trip) included; the handle is kept, so a
    check every few seconds needs no thread, and forgotten on a failure (a controller placed again
    has a new one). ``node``: a keeper's own check (``ControllerClient.membership``)."""
    async def ask() -> Membership:
        if not _controller:
            found = await asyncio.to_thread(ControllerClient.find)
            if found is None:
                raise ActorNotPlaced("the controller is not placed")
            _controller.append(found)
        m = await _controller[0].membership(node)
        if m is None:
            raise ActorNotPlaced("the controller has not seen a node yet")
        return m

    try:
        return await call(ask(), timeout)
    except BaseException:
        _controller.clear()
        raise


MEMBERSHIP_CHECK_S = 5.0  # how often an actor asks the controller for its membership
MEMBERSHIP_CHECK_DEADLINE_S = 30.0  # a check that hangs (a lookup, the apply) would never check again


async def follow_membership(held_epoch: Callable[[], int], offer: Callable[[Membership], Awaitable[Any]],
                            log: Any, every: float = MEMBERSHIP_CHECK_S,
                            fetch: Callable[[], Awaitable[Membership]] | None = None) -> None:
    """Every ``every`` seconds, ask the controller for its membership and ``offer`` it when its epoch
    is newer than the one held: pushes can be lost (seen in CI: a restarted node kept a two-node view
    for minutes), and the check is what converges every process on the controller's epoch.
    ``fetch``: what answers for the controller (``controller_membership``, Ray's, unless told)."""
    unasked = Sometimes()
    while True:
        await asyncio.sleep(every)
        end_if_cancelled()
        try:
            m = await (fetch or controller_membership)()
        except BaseException as e:  # the controller is away: the pushes and the next check will do
            if not survivable(e):
                raise
            if unasked.due():
                log.warning("the controller's membership could not be read", error=repr(e)[:200])
            continue
        try:
            if m.epoch > held_epoch():
                log.warning("a newer membership from the controller's check; applying it", held=held_epoch(),
                            epoch=m.epoch, nodes=list(m.names))
                await call(offer(m), MEMBERSHIP_CHECK_DEADLINE_S)
        except BaseException as e:
            if not survivable(e):
                raise
            metrics.loop_errors.labels("membership-check").inc()
            log.error("membership check failed", error=repr(e))


HANDLE_TTL_S = 10.0


class Handles:
    """Named actors of other nodes by node name, the one handle cache: a lookup runs off the event
    loop, a handle is trusted for ``HANDLE_TTL_S`` at most, and every membership push renews the
    members' handles and forgets the others (a node that came back has new actors under the same
    names). ``wrap`` turns a handle into its typed client; ``lookup`` (kind, node) -> handle replaces
    Ray's named actors (the LocalNode and LocalCluster test harnesses)."""

    def __init__(self, kind: str, own: tuple[str, Any] | None = None, wrap: Any = None,
                 lookup: Callable[[str, str], Awaitable[Any]] | None = None):
        self.kind = kind
        self.own = own  # this node's own actor (or client), never looked up
        self.wrap = wrap or (lambda handle: handle)
        self._lookup = lookup or lookup_async
        self._cache: dict[str, tuple[float, Any]] = {}

    async def get(self, node: str) -> Any:
        if self.own is not None and node == self.own[0]:
            return self.own[1]
        hit = self._cache.get(node)
        now = time.monotonic()
        if hit is None or now - hit[0] > HANDLE_TTL_S:
            hit = self._cache[node] = (now, self.wrap(await self._lookup(self.kind, node)))
        return hit[1]

    async def of(self, node: str) -> Any:  # rpc.Peers
        return await self.get(node)

    async def renew(self, nodes: list[str]) -> None:
        """Look the members' handles up in a thread; the others are forgotten (one that is not
        placed yet is looked up when first used)."""
        fresh: dict[str, tuple[float, Any]] = {}
        for node in nodes:
            if self.own is not None and node == self.own[0]:
                continue
            try:
                fresh[node] = (time.monotonic(), self.wrap(await self._lookup(self.kind, node)))
            except (ValueError, DeadlineExceeded):
                pass
        self._cache = fresh


def process_env_node() -> str:
    return os.environ.get("PRERENDER_NODE", "")
