"""LocalNode: one node's real parts wired in this process, without Ray.

The actor shells themselves (``QueueKeeper``, ``LeaseTable``, ``NodeStore``, ``SitemapWalker``,
``IngressReplica``), their RocksDB stores under a temp dir, and the ingress app served by uvicorn on
127.0.0.1 (real HTTP), all on one event loop in a background thread. They call each other through
``rpc.Local`` handles, which copy arguments and answers as Ray does; the controller's part (the
membership) is answered by the node itself: a single-node cluster (several nodes on one loop:
``tests.localcluster``). What only Ray shows (process restarts, placement, per-process memory,
``up``/``down``) stays on the shared cluster (``tests.support.deploy_on``); every other API test runs
here, in a fraction of the time.

The surface mirrors ``tests.support.Deployment`` (``url``, ``urls``, ``data_dir``, ``config``,
``status``, ``refresh()``, ``stop()``), so a module moves by swapping its fixture.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from prerender_ray.identity.membership import Membership
from prerender_ray.rpc import Local
from tests.support import free_port, node_config

T = TypeVar("T")

START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0
CALL_DEADLINE_S = 30.0
DRAIN_SLACK_S = 15.0  # as the controller allows a drain beyond its period


def fresh_metrics() -> None:
    """Forget every labelled series of this process's registry: a node placed on Ray starts with fresh
    processes, so a series it exposes is one its own work made, never an earlier node's. (Unlabelled
    ones keep their values: compare those with an earlier reading, ``support.metric_value``.)"""
    from prometheus_client import REGISTRY

    for collector in list(REGISTRY._collector_to_names):  # no public listing of the collectors
        if getattr(collector, "_labelnames", None):
            collector.clear()


class OnlyNode:
    """The keeper's ``rpc.Peers`` in a single-node cluster: there is no other node to ask."""

    def __init__(self, name: str):
        self.name = name

    async def of(self, node: str) -> Any:
        from prerender_ray.actors.common import ActorNotPlaced

        raise ActorNotPlaced(f"no keeper on {node}: {self.name} is the only node")

    async def renew(self, nodes: list[str]) -> None:
        return None


class LocalNode:
    """Start with ``LocalNode.start(data_dir, config)``; ``stop()`` closes every part, the server and
    the thread, so many nodes can run one after another in one pytest process."""

    def __init__(self, data_dir: Path, config: dict, name: str = "node-a", port: int | None = None):
        from prerender_ray.identity.nodes import NodeInfo

        self.data_dir = Path(data_dir)
        self.config = config
        self.name = name
        self.info = NodeInfo(name, "127.0.0.1", port or free_port())
        self.status: dict = {}

    # --------------------------------------------------------------------------------- start

    @classmethod
    def start(cls, data_dir: Path, config: dict | None = None, *, replicas: int = 1, name: str = "node-a",
              port: int | None = None, timeout: float = START_DEADLINE_S) -> LocalNode:
        node = cls(data_dir, node_config(data_dir, config, replicas=replicas), name, port)
        fresh_metrics()
        node._boot(timeout)
        return node

    def restart(self, timeout: float = START_DEADLINE_S) -> None:
        """After ``stop()``: the node again, on the same data dir, config and port (a node's restart;
        the processes' memory is gone, what RocksDB holds is read back)."""
        if not self._stopped:
            raise RuntimeError("stop the node first")
        self._boot(timeout)

    def _boot(self, timeout: float) -> None:
        self._gc_threshold = gc.get_threshold()  # the shells tune the process's GC for their own process
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"localnode-{self.name}", daemon=True)
        self.parts: dict[str, Any] = {}  # kind -> the plain shell object
        self.handles: dict[str, Local] = {}  # kind -> its in-process handle
        self.ingress: list[Any] = []
        self._stopped = False
        self.thread.start()
        try:
            self.run(self._place(), timeout)
            self._wait_ready(timeout)
        except BaseException:
            self.stop(drain=False)
            raise

    async def _membership(self, timeout: float | None = None) -> Membership:
        """What the controller would answer (``controller_membership``): this node alone, for good."""
        return Membership.from_wire(self._wire())

    def _wire(self) -> dict:
        return {"epoch": 1, "nodes": [dataclasses.asdict(self.info)]}

    async def _lookup(self, kind: str, node: str) -> Any:
        """``NodeContext.actor``: this node's own actors; any other node is not placed."""
        from prerender_ray.actors.common import ActorNotPlaced

        if node == self.name and kind in self.handles:
            return self.handles[kind]
        if kind == "ingress" and node.startswith(f"{self.name}:"):  # "node:index"
            index = node.rpartition(":")[2]
            if index.isdigit() and int(index) < len(self.ingress):
                return Local(self.ingress[int(index)])
        raise ActorNotPlaced(f"no {kind} on {node}")

    async def _place(self) -> None:
        """The controller's ``_place``, in its order, with in-process handles."""
        from prerender_ray.actors.ingress import IngressReplica
        from prerender_ray.actors.keeper.actor import QueueKeeper
        from prerender_ray.actors.leasetable import LeaseTable
        from prerender_ray.actors.store.actor import NodeStore
        from prerender_ray.actors.walker.actor import SitemapWalker

        cfg, name, data_dir, node = self.config, self.name, str(self.data_dir), dataclasses.asdict(self.info)
        self._add("store", NodeStore(cfg, name, data_dir, self._wire(), self._membership, stores=self._peers("store")))
        self._add("leases", LeaseTable(cfg, name, data_dir))
        self._add("keeper", QueueKeeper(cfg, node, data_dir, self.handles["leases"], self.handles["store"],
                                        self._wire(), peers=self._peers("keeper"), fetch_membership=self._membership))
        self._add("sitemapper", SitemapWalker(cfg, node, data_dir, self.handles["store"], self.handles["keeper"],
                                              fetch_membership=self._membership, lookup=self._lookup))
        for i in range(int(cfg["server"]["replicas"])):
            replica = IngressReplica(cfg, node, i, data_dir, self.handles["keeper"], self.handles["leases"],
                                     self.handles["store"], membership=self._membership, lookup=self._lookup)
            if replica.error:
                raise RuntimeError(f"{name}: {replica.error}")
            self.ingress.append(replica)

    def _peers(self, kind: str) -> Any:
        """Other nodes' keepers or stores (``rpc.Peers``, the store's ``stores``): none here."""
        return OnlyNode(self.name)

    def _add(self, kind: str, part: Any) -> None:
        self.parts[kind] = part
        self.handles[kind] = Local(part)

    def _wait_ready(self, timeout: float) -> None:
        """As ``deploy.wait_ready``: every part live, every replica up, and /readyz answers 200."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            self.refresh()
            node = self.status["nodes"][0]
            last = node
            if node["healthy"]:
                try:
                    r = httpx.get(f"{self.url}/readyz", timeout=2.0)
                    if r.status_code == 200:
                        return
                    last = r.text
                except httpx.HTTPError as e:
                    last = repr(e)
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready within {timeout:g}s (last: {last!r})")

    # ------------------------------------------------------------------------- the Deployment surface

    @property
    def urls(self) -> dict[str, str]:
        return {self.name: self.info.url}

    @property
    def url(self) -> str:
        return self.info.url

    def refresh(self) -> dict:
        """The controller's status document for this one node (``Controller.status``)."""
        self.status = self.run(self._status(), CALL_DEADLINE_S)
        return self.status

    async def _status(self) -> dict:
        node = await self._node_status()
        return {"nodes": [node], "membership": [self.name], "epoch": "local", "healthy": node["healthy"]}

    async def _node_status(self) -> dict:
        async def ask(part: Any) -> dict:
            try:
                return await asyncio.wait_for(part.status(), 2.0)
            except Exception as e:
                return {"live": False, "reason": f"unavailable: {type(e).__name__}"}

        keeper, leases, store, walker = [await ask(self.parts[k]) for k in ("keeper", "leases", "store", "sitemapper")]
        from prerender_ray.actors.controller import node_status

        replicas = [await ask(r) for r in self.ingress]
        return node_status(self.info, keeper, leases, store, walker, replicas)

    def stop(self, *, drain: bool = True) -> dict:
        """What ``down`` does: drain (``fleet.drainPeriod``, 0 unless asked), then ingress, walker,
        keeper, lease table and store are closed in the controller's order; then every task left on
        the loop, the loop and its thread. Safe to call twice."""
        if self._stopped:
            return {"stopped": []}
        self._stopped = True
        report: dict = {"stopped": [self.name]}
        if self.thread.is_alive():
            try:
                drained = self.run(self._drain(), self._drain_budget()) if drain and "keeper" in self.parts else None
                if drained is not None:
                    report["drain"] = {"nodes": [drained], "periodMs": self.config["fleet"]["drain_period"]}
            except Exception as e:
                report["drain"] = {"error": repr(e)}
            try:
                self.run(self._close(), STOP_DEADLINE_S)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(STOP_DEADLINE_S)
        if not self.thread.is_alive():
            self.loop.close()
        # What the shells did to the process's GC (``bulk_gc``, the keeper's ``gc.freeze`` after its
        # load) is undone: under Ray their process ends, here the next module's tests run on.
        gc.unfreeze()
        gc.set_threshold(*self._gc_threshold)
        gc.collect()
        return report

    def _drain_budget(self) -> float:
        return self.config["fleet"]["drain_period"] / 1000 + DRAIN_SLACK_S

    async def _drain(self) -> dict:
        return await self.parts["keeper"].drain(self.config["fleet"]["drain_period"])

    async def _close(self) -> None:
        await self._close_parts()
        await _cancel_the_rest()

    async def _close_parts(self) -> None:
        for replica in self.ingress:
            await _quiet(replica.stop(), 15)
        for kind in ("sitemapper", "keeper", "leases", "store"):
            if kind in self.parts:
                await _quiet(self.parts[kind].close(), 10)

    # ------------------------------------------------------------------------------ test helpers

    def run(self, coro: Awaitable[T], timeout: float = CALL_DEADLINE_S) -> T:
        """Run ``coro`` on the node's loop and wait for its answer (at most ``timeout``)."""
        return asyncio.run_coroutine_threadsafe(_within(coro, timeout), self.loop).result(timeout + 5)

    def ask(self, kind: str, method: str, *args: Any, timeout: float = CALL_DEADLINE_S, **kwargs: Any) -> Any:
        """``ray.get(lookup(kind, node).method.remote(*args), timeout)``, in process: through the
        node's own handle, so arguments and answers are copied as Ray copies them."""
        handle = self.handles[kind]

        async def go() -> Any:
            return await getattr(handle, method).remote(*args, **kwargs)

        return self.run(go(), timeout)

    def asgi(self, use: Callable[[httpx.AsyncClient], Awaitable[T]], timeout: float = CALL_DEADLINE_S,
             replica: int = 0) -> T:
        """``use(client)`` with an httpx client over ``httpx.ASGITransport`` to a replica's app, run on
        the node's loop (the app and its parts live there): a request without a socket."""
        app = self.ingress[replica].app

        async def go() -> T:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=self.url) as client:
                return await use(client)

        return self.run(go(), timeout)


async def _cancel_the_rest(timeout: float = 10.0) -> None:
    """What the shells leave running on the loop (a process exit ends them under Ray).

    A task still running is cancelled again: Python 3.11's ``wait_for`` drops a cancel that lands as
    its inner await completes (gh-86296), so one cancel does not always end a loop that uses it."""
    me = asyncio.current_task()
    left = {t for t in asyncio.all_tasks() if t is not me}
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for t in left:
            t.cancel()
        _, left = await asyncio.wait(left, timeout=0.5)
    if left:
        names = sorted(f"{t.get_name()}: {t.get_coro()!r}" for t in left)
        raise TimeoutError(f"{len(left)} task(s) did not end within {timeout:g}s of their cancel: {names}")


async def _within(coro: Awaitable[T], timeout: float) -> T:
    async with asyncio.timeout(timeout):  # in this task (``wait_for`` would run ``coro`` in another)
        return await coro


async def _quiet(coro: Awaitable[Any], timeout: float) -> None:
    try:
        await asyncio.wait_for(coro, timeout)
    except Exception:  # a part that fails to close must not keep the others open
        pass
