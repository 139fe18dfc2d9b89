"""LocalCluster: the real parts of several nodes in this process, on one event loop, without Ray.

Each node is a ``LocalNode`` (its actor shells, its own data dir, name and port, its app on uvicorn on
127.0.0.1), but every node's parts run on the cluster's one loop, in one thread. A stand-in for the
controller holds the membership (every node, one epoch) and answers each part's reads of it; every
look-up of another node's actor (``NodeContext``'s, the keeper's peers, the store's replication
peers, the walker's keepers and stores) finds that node's part through an ``rpc.Local`` handle, which
copies arguments and answers as Ray does. What only Ray shows (a real process killed, placement,
``up``/``down``) stays on the shared cluster (``tests.support.deploy_on``).

The surface mirrors ``tests.support.Deployment`` (``url``, ``urls``, ``data_dir``, ``config``,
``status``, ``refresh()``, ``stop()``); ``cluster["node-b"]`` is one node (``ask``, ``asgi``, ``run``).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import gc
import threading
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prerender_ray.identity.membership import Membership
from prerender_ray.rpc import Local
from tests.localnode import (
    CALL_DEADLINE_S,
    START_DEADLINE_S,
    STOP_DEADLINE_S,
    LocalNode,
    _cancel_the_rest,
    _quiet,
    _within,
    fresh_metrics,
)
from tests.support import node_config

T = TypeVar("T")


class StandInController:
    """The controller's part in a LocalCluster: the one membership every part reads."""

    def __init__(self, membership: Membership):
        self.membership = membership

    async def fetch(self, timeout: float | None = None) -> Membership:
        """``controller_membership``: what a part's start-up read and periodic check get."""
        return self.membership


class ClusterNode(LocalNode):
    """One node of a ``LocalCluster``: placed, stopped and its loop run by the cluster."""

    def __init__(self, cluster: LocalCluster, data_dir: Path, config: dict, name: str):
        super().__init__(data_dir, config, name)
        self.cluster = cluster
        self.loop = cluster.loop
        self.thread = cluster.thread
        self.parts: dict[str, Any] = {}
        self.handles: dict[str, Local] = {}
        self.ingress: list[Any] = []
        self._stopped = False

    def _wire(self) -> dict:
        return self.cluster.controller.membership.to_wire()

    async def _membership(self, timeout: float | None = None) -> Membership:
        return await self.cluster.controller.fetch(timeout)

    async def _lookup(self, kind: str, node: str) -> Any:
        return await self.cluster.lookup(kind, node)

    def _peers(self, kind: str) -> Any:
        """As the shells' defaults (``Handles`` with the keeper's and the store's clients), with the
        cluster's look-up in place of Ray's named actors."""
        from prerender_ray.actors.common import Handles
        from prerender_ray.actors.keeper.client import KeeperClient
        from prerender_ray.actors.store.actor import StoreClient
        from prerender_ray.actors.store.replication import SHIP_DEADLINE_S

        wrap: Any = KeeperClient if kind == "keeper" else (lambda handle: StoreClient(handle, SHIP_DEADLINE_S))
        return Handles(kind, wrap=wrap, lookup=self.cluster.lookup)

    def restart(self, timeout: float = START_DEADLINE_S) -> None:
        raise NotImplementedError("a LocalCluster's nodes start and stop with the cluster")

    def stop(self, *, drain: bool = True) -> dict:
        raise NotImplementedError("stop the LocalCluster")


class LocalCluster:
    """Start with ``LocalCluster.start(root, config, names=("node-a", "node-b"))``: node ``name``'s
    data dir is ``root / name``; ``stop()`` closes every part, the servers and the thread."""

    def __init__(self, root: Path, config: dict, names: Sequence[str]):
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"distinct node names, at least one: {names!r}")
        self.data_dir = Path(root)
        self.config = config  # as the actors get it; each node's differs only in its data dir
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="localnode-cluster", daemon=True)
        self.nodes: dict[str, ClusterNode] = {}
        for name in names:
            cfg = copy.deepcopy(config)
            cfg["server"]["data_dir"] = str(self.data_dir / name)
            self.nodes[name] = ClusterNode(self, self.data_dir / name, cfg, name)
        self.controller = StandInController(
            Membership.from_wire({"epoch": 1, "nodes": [dataclasses.asdict(n.info) for n in self.nodes.values()]}))
        self.status: dict = {}
        self._stopped = False

    @classmethod
    def start(cls, root: Path, config: dict | None = None, *, names: Sequence[str] = ("node-a", "node-b"),
              replicas: int = 1, timeout: float = START_DEADLINE_S) -> LocalCluster:
        """``config`` (camelCase or snake_case) as ``deploy_on`` takes it; one session secret for all."""
        cluster = cls(root, node_config(root, config, replicas=replicas), tuple(names))
        fresh_metrics()
        cluster._gc_threshold = gc.get_threshold()  # the shells tune the process's GC for their own process
        cluster.thread.start()
        try:
            for node in cluster.nodes.values():
                cluster.run(node._place(), timeout)
            for node in cluster.nodes.values():
                node._wait_ready(timeout)
            cluster.refresh()
        except BaseException:
            cluster.stop(drain=False)
            raise
        return cluster

    async def lookup(self, kind: str, node: str) -> Any:
        """``NodeContext``'s look-up for every node: ``(kind, node)``, ingress replicas as
        ``("ingress", "node:index")``; a node or part not placed is ``ActorNotPlaced``, as Ray's."""
        from prerender_ray.actors.common import ActorNotPlaced

        name, _, index = node.partition(":") if kind == "ingress" else (node, "", "")
        member = self.nodes.get(name)
        if member is not None:
            if kind == "ingress" and index.isdigit() and int(index) < len(member.ingress):
                return Local(member.ingress[int(index)])
            if kind != "ingress" and kind in member.handles:
                return member.handles[kind]
        raise ActorNotPlaced(f"no {kind} on {node}")

    def __getitem__(self, name: str) -> ClusterNode:
        return self.nodes[name]

    # ------------------------------------------------------------------------- the Deployment surface

    @property
    def urls(self) -> dict[str, str]:
        return {name: node.url for name, node in self.nodes.items()}

    @property
    def url(self) -> str:
        return next(iter(self.nodes.values())).url

    def refresh(self) -> dict:
        """The controller's status document (``Controller.status``): every node's."""
        async def every() -> list[dict]:
            return [await node._node_status() for node in self.nodes.values()]

        nodes = self.run(every(), CALL_DEADLINE_S)
        self.status = {"nodes": nodes, "membership": list(self.nodes), "epoch": self.controller.membership.epoch,
                       "healthy": all(n["healthy"] for n in nodes)}
        return self.status

    def stop(self, *, drain: bool = True) -> dict:
        """What ``down`` does, on every node: drain, then close the parts in the controller's order
        (every node's ingress first, so no request reaches a closed part); then the loop and its
        thread. Safe to call twice."""
        if self._stopped:
            return {"stopped": []}
        self._stopped = True
        report: dict = {"stopped": list(self.nodes)}
        if self.thread.is_alive():
            placed = [n for n in self.nodes.values() if "keeper" in n.parts]
            if drain and placed:
                try:
                    async def every() -> list[dict]:
                        return list(await asyncio.gather(*(n._drain() for n in placed)))

                    drained = self.run(every(), max(n._drain_budget() for n in placed))
                    report["drain"] = {"nodes": drained, "periodMs": self.config["fleet"]["drain_period"]}
                except Exception as e:
                    report["drain"] = {"error": repr(e)}
            try:
                self.run(self._close(), STOP_DEADLINE_S * 2)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(STOP_DEADLINE_S)
        if not self.thread.is_alive():
            self.loop.close()
        gc.unfreeze()  # what the shells did to the process's GC (see ``LocalNode.stop``)
        gc.set_threshold(*getattr(self, "_gc_threshold", gc.get_threshold()))
        gc.collect()
        return report

    async def _close(self) -> None:
        for node in self.nodes.values():
            for replica in node.ingress:
                await _quiet(replica.stop(), 15)
            node.ingress = []
        for node in self.nodes.values():
            await node._close_parts()
        await _cancel_the_rest()

    # ------------------------------------------------------------------------------ test helpers

    def run(self, coro: Awaitable[T], timeout: float = CALL_DEADLINE_S) -> T:
        """Run ``coro`` on the cluster's loop and wait for its answer (at most ``timeout``)."""
        return asyncio.run_coroutine_threadsafe(_within(coro, timeout), self.loop).result(timeout + 5)

    async def arun(self, coro: Awaitable[T], timeout: float = CALL_DEADLINE_S) -> T:
        """``run`` from another event loop (an async test's): that loop goes on while ``coro`` runs."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_within(coro, timeout), self.loop))
