"""The store's replication without Ray: ``Replication`` over real RocksDB in temp dirs, with peers
reached through a stub network (a dict of live stores; a missing one is unreachable)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prerender_ray import logs
from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.actors.store.replication import SHIP_DEADLINE_S, Replication
from prerender_ray.identity.membership import Membership
from prerender_ray.rpc import Local
from prerender_ray.storage.keys import SHIPPED, TARGET
from prerender_ray.storage.replication import Clock, payload_of
from prerender_ray.storage.rocks import PAGES, REGISTRY, Store, store_path


class Node(Replication):
    """A NodeStore's replication part on its own: its stores, its clock, and the network."""

    def __init__(self, name: str, data_dir: Path, peers: list[str], net: dict[str, Node], replicas: int = 64,
                 epoch: int = 1, fetch: Any = None):
        self.log = logs.get("store")
        self.node = name
        self.clock = Clock(name)
        self.pages = Store(store_path(data_dir, name, PAGES))
        self.registry = Store(store_path(data_dir, name, REGISTRY))
        self._tasks: list = []
        self.net = net
        self.load_live_counts()
        self.init_replication(Membership.of(epoch, [name, *peers]), replicas, lambda key: key.split("|")[0],
                              fetch=fetch, stores=SimpleNamespace(renew=lambda names: asyncio.sleep(0)))  # the network is ``net``

    def _index_ops(self, out: list, key: bytes, old: bytes | None, new: bytes | None) -> None:
        """NodeStore's targets-by-sitemap index: none here."""

    async def _peer_store(self, peer: str) -> Any:
        node = self.net.get(peer)
        if node is None:
            raise ConnectionError(f"{peer} is unreachable")
        return StoreClient(Local(node), SHIP_DEADLINE_S)

    def page(self, key: str) -> bytes | None:
        return payload_of(self.pages.get(key.encode()))

    def crash(self) -> None:
        """The process dies: its tasks and its outbox with it; what it wrote stays on disk."""
        for task in [*self._tasks, *self.shippers.values()]:
            task.cancel()
        self.net.pop(self.node, None)
        self.pages.close()
        self.registry.close()

    def target(self, url: str) -> bytes | None:
        return payload_of(self.registry.get(TARGET + url.encode()))


async def _until(check, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_write_acknowledged_but_not_shipped_when_the_store_died_reaches_the_peer(tmp_path) -> None:
    net: dict[str, Node] = {}
    b = Node("node-b", tmp_path, ["node-a"], net)  # up all along, unreachable from node-a for now
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    await a.synced.wait()
    await b.synced.wait()  # its catch-up is over: only a push brings it anything now
    a.commit_local("registry", [(TARGET + b"https://x.com/1", b'{"url": 1}')])
    await asyncio.sleep(0.2)  # its shipper tried, and backs off
    assert len(a.outbox["node-b"]) == 1
    a.crash()  # the outbox is gone
    net["node-b"] = b
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    await _until(lambda: b.target("https://x.com/1") == b'{"url": 1}', "the write to reach node-b")
    await _until(lambda: not a.resync_from, "the re-push to finish")
    b.crash()
    a.crash()


async def test_the_shipped_mark_follows_what_reached_the_peer_so_a_restart_re_pushes_nothing_old(tmp_path) -> None:
    net: dict[str, Node] = {}
    b = Node("node-b", tmp_path, ["node-a"], net)
    net["node-b"] = b
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    await a.synced.wait()
    a.commit_local("registry", [(TARGET + f"https://x.com/{i}".encode(), b"{}") for i in range(3)])
    await _until(lambda: b.target("https://x.com/2") == b"{}", "the writes to reach node-b")
    await _until(lambda: a.shipped.get("node-b", 0) > a.newest_hlc(), "the mark to pass the newest write")
    mark = a.shipped["node-b"]
    a.crash()
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    assert a.shipped["node-b"] == mark and "node-b" not in a.resync_from  # nothing owed
    assert a.registry.get(SHIPPED + b"node-b") is not None
    b.crash()
    a.crash()


async def test_a_store_without_a_mark_re_pushes_its_recent_writes_at_start(tmp_path) -> None:
    """A data dir from a release that kept no shipped mark: the catch-up margin decides."""
    net: dict[str, Node] = {}
    b = Node("node-b", tmp_path, ["node-a"], net)
    a = Node("node-a", tmp_path, ["node-b"], net)
    await a.synced.wait()
    await b.synced.wait()
    a.commit_local("registry", [(TARGET + b"https://x.com/old", b"{}")])
    a.crash()
    net["node-b"] = b
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    await _until(lambda: b.target("https://x.com/old") == b"{}", "the write to reach node-b")
    b.crash()
    a.crash()
