"""The store's replication without Ray: ``NodeStore``'s replication parts over real RocksDB in temp dirs,
with peers reached through a stub network (a dict of live stores; a missing one is unreachable)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from prerender_ray import logs
from prerender_ray.actors.store.actor import NodeStore, StoreClient
from prerender_ray.actors.store.records import no_index
from prerender_ray.actors.store.replication import SHIP_DEADLINE_S
from prerender_ray.identity.membership import NOBODY, Membership
from prerender_ray.rpc import Local
from prerender_ray.storage.keys import QUEUE_CONTROL, SHIPPED, TARGET
from prerender_ray.storage.replication import Clock, payload_of
from prerender_ray.storage.rocks import PAGES, REGISTRY, Store, store_path
from prerender_ray.tasks import Tasks
from prerender_ray.timeutil import SYSTEM_CLOCK


class Net:
    """The peers' stores by name, over ``net`` (a missing one is unreachable)."""

    def __init__(self, net: dict[str, Any]):
        self.net = net

    async def get(self, peer: str) -> StoreClient:
        node = self.net.get(peer)
        if node is None:
            raise ConnectionError(f"{peer} is unreachable")
        return StoreClient(Local(node), SHIP_DEADLINE_S)

    async def renew(self, names: list[str]) -> None:
        pass


class Node(NodeStore):
    """A NodeStore's replication parts on their own: its stores (no page log, no sitemap index), its
    clock, and the network."""

    def __init__(self, name: str, data_dir: Path, peers: list[str], net: dict[str, Node], replicas: int = 64,
                 epoch: int = 1, fetch: Any = None, skew_ms: int = 0):
        self.log = logs.get("store")
        self.node = name
        self.clock = Clock(name, lambda: int(time.time() * 1000) + skew_ms)  # skew_ms: its wall clock's error
        self.pages = Store(store_path(data_dir, name, PAGES))
        self.registry = Store(store_path(data_dir, name, REGISTRY))
        self._tasks = Tasks()
        self.net = net
        self.records = self._records(SYSTEM_CLOCK, no_index)
        self._compose(Membership.of(epoch, [name, *peers]), replicas, lambda key: key.split("|")[0],
                      fetch=fetch, wall=SYSTEM_CLOCK, stores=Net(net))

    def page(self, key: str) -> bytes | None:
        return payload_of(self.pages.get(key.encode()))

    def crash(self) -> None:
        """The process dies: its tasks and its outbox with it; what it wrote stays on disk."""
        self._tasks.cancel()
        self.shipping.close()
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
    await a.catch_up.synced.wait()
    await b.catch_up.synced.wait()  # its catch-up is over: only a push brings it anything now
    a.records.commit_local("registry", [(TARGET + b"https://x.com/1", b'{"url": 1}')])
    await asyncio.sleep(0.2)  # its shipper tried, and backs off
    assert len(a.shipping.outbox["node-b"]) == 1
    a.crash()  # the outbox is gone
    net["node-b"] = b
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    await _until(lambda: b.target("https://x.com/1") == b'{"url": 1}', "the write to reach node-b")
    await _until(lambda: not a.shipping.resync_from, "the re-push to finish")
    b.crash()
    a.crash()


async def test_the_shipped_mark_follows_what_reached_the_peer_so_a_restart_re_pushes_nothing_old(tmp_path) -> None:
    net: dict[str, Node] = {}
    b = Node("node-b", tmp_path, ["node-a"], net)
    net["node-b"] = b
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    await a.catch_up.synced.wait()
    a.records.commit_local("registry", [(TARGET + f"https://x.com/{i}".encode(), b"{}") for i in range(3)])
    await _until(lambda: b.target("https://x.com/2") == b"{}", "the writes to reach node-b")
    await _until(lambda: a.shipping.shipped.get("node-b", 0) > a.records.newest_hlc(), "the mark to pass the newest write")
    mark = a.shipping.shipped["node-b"]
    a.crash()
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    assert a.shipping.shipped["node-b"] == mark and "node-b" not in a.shipping.resync_from  # nothing owed
    assert a.registry.get(SHIPPED + b"node-b") is not None
    b.crash()
    a.crash()


async def test_a_store_without_a_mark_re_pushes_its_recent_writes_at_start(tmp_path) -> None:
    """A data dir from a release that kept no shipped mark: the catch-up margin decides."""
    net: dict[str, Node] = {}
    b = Node("node-b", tmp_path, ["node-a"], net)
    a = Node("node-a", tmp_path, ["node-b"], net)
    await a.catch_up.synced.wait()
    await b.catch_up.synced.wait()
    a.records.commit_local("registry", [(TARGET + b"https://x.com/old", b"{}")])
    a.crash()
    net["node-b"] = b
    a = Node("node-a", tmp_path, ["node-b"], net)
    net["node-a"] = a
    await _until(lambda: b.target("https://x.com/old") == b"{}", "the write to reach node-b")
    b.crash()
    a.crash()


async def test_a_peer_back_from_a_leave_is_sent_what_it_missed_while_cut_off(tmp_path, monkeypatch) -> None:
    """node-a writes while node-b is cut off from it; node-b writes on, leaves (node-a's outbox for it
    goes) and comes back. Its pull starts a margin before the newest record it holds, and that one is
    newer than node-a's write: node-a sends it what it missed, from the mark of what reached it.
    Before, nothing did. Found by the simulation (seed 1031: a partition, then a leave)."""
    from prerender_ray.actors.store import catchup

    monkeypatch.setattr(catchup, "CATCH_UP_MARGIN_MS", 0)
    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, ["node-b"], net)
    b = net["node-b"] = Node("node-b", tmp_path, ["node-a"], net)
    await a.catch_up.synced.wait()
    await b.catch_up.synced.wait()
    a.records.commit_local("registry", [(TARGET + b"https://x.com/before", b"{}")])
    await _until(lambda: a.registry.get(SHIPPED + b"node-b") is not None, "a first write to reach node-b")
    net.pop("node-b")  # cut off from node-a
    a.records.commit_local("registry", [(TARGET + b"https://x.com/missed", b"{}")])
    await asyncio.sleep(0.05)
    b.records.commit_local("registry", [(TARGET + b"https://x.com/own", b"{}")])  # newer than what it missed
    await a.set_membership(Membership.of(2, ["node-a"]).to_wire())  # node-b left
    b.crash()
    b = net["node-b"] = Node("node-b", tmp_path, ["node-a"], net, epoch=3)
    await a.set_membership(Membership.of(3, ["node-a", "node-b"]).to_wire())
    await _until(lambda: b.target("https://x.com/missed") == b"{}", "what node-b missed to reach it", timeout=5)
    a.crash()
    b.crash()


async def test_a_store_that_starts_alone_re_pushes_what_its_last_outbox_held_at_its_first_membership(
        tmp_path) -> None:
    """node-a writes while node-b is unreachable (no mark for it on disk: nothing ever reached it), dies,
    and starts again knowing no membership (the controller did not list it yet): it has no peers to
    re-push to at start. At its first membership it does what it does at start: node-b gets the write.
    Before, it never did (node-b's own catch-up was long over). Found by the simulation (seed 4161)."""
    net: dict[str, Node] = {}
    b = Node("node-b", tmp_path, ["node-a"], net)  # up all along, unreachable from node-a for now
    a = net["node-a"] = Node("node-a", tmp_path, ["node-b"], net)
    await a.catch_up.synced.wait()
    await b.catch_up.synced.wait()
    a.records.commit_local("registry", [(TARGET + b"https://x.com/1", b'{"url": 1}')])
    await asyncio.sleep(0.2)  # its shipper tried, and backs off
    assert len(a.shipping.outbox["node-b"]) == 1 and a.registry.get(SHIPPED + b"node-b") is None
    a.crash()  # the outbox is gone
    net["node-b"] = b
    a = net["node-a"] = Node("node-a", tmp_path, [], net, epoch=NOBODY)
    await a.catch_up.synced.wait()
    await a.set_membership(Membership.of(2, ["node-a", "node-b"]).to_wire())
    await _until(lambda: b.target("https://x.com/1") == b'{"url": 1}', "the write to reach node-b", timeout=5)
    a.crash()
    b.crash()


class Stalled:
    """A peer's store that takes calls and answers none of them until ``answer`` is set (a process
    stopped with SIGSTOP, a link that hangs)."""

    def __init__(self, node: Node):
        self.node, self.answer = node, asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.node, name)

        async def hangs(*args: Any, **kw: Any) -> Any:
            await self.answer.wait()
            return await real(*args, **kw)

        return hangs


async def test_a_stalled_peer_delays_no_other_peer_and_gets_every_write_once_it_answers(tmp_path) -> None:
    net: dict[str, Any] = {}
    a = net["node-a"] = Node("node-a", tmp_path, ["node-b", "node-c"], net)
    b = net["node-b"] = Node("node-b", tmp_path, ["node-a", "node-c"], net)
    c = Node("node-c", tmp_path, ["node-a", "node-b"], net)
    for n in (a, b, c):
        await n.catch_up.synced.wait()
    net["node-c"] = stalled = Stalled(c)
    urls = [f"https://x.com/stall/{i}" for i in range(20)]
    for url in urls:  # one write at a time: the first call to node-c hangs, the rest queue behind it
        a.records.commit_local("registry", [(TARGET + url.encode(), b"{}")])
        await asyncio.sleep(0)
    await _until(lambda: all(b.target(u) == b"{}" for u in urls), "every write on node-b while node-c hangs")
    assert [u for u in urls if c.target(u) is not None] == [] and a.shipping.outbox["node-c"]
    stalled.answer.set()
    await _until(lambda: all(c.target(u) == b"{}" for u in urls), "every write on node-c once it answers")
    await _until(lambda: not a.shipping.outbox["node-c"], "node-a's backlog for node-c drained")
    for n in (a, b, c):
        n.crash()


async def test_a_later_write_wins_over_a_peer_whose_clock_runs_5_s_ahead(tmp_path) -> None:
    """A cluster pause written on node-a, whose clock is 5 s fast, then a resume written on node-b
    after it saw the pause: with wall-clock versions the pause would win for 5 s; the hybrid clock
    (a received version moves the receiver's clock past it) makes the later write win on both."""
    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, ["node-b"], net, skew_ms=5_000)
    b = net["node-b"] = Node("node-b", tmp_path, ["node-a"], net)
    await a.catch_up.synced.wait()
    await b.catch_up.synced.wait()
    key = QUEUE_CONTROL + b"all"
    a.records.commit_local("registry", [(key, b"paused")])
    await _until(lambda: payload_of(b.registry.get(key)) == b"paused", "the pause on node-b")
    b.records.commit_local("registry", [(key, b"running")])
    await _until(lambda: payload_of(a.registry.get(key)) == b"running", "the later resume on node-a")
    assert payload_of(b.registry.get(key)) == b"running"
    a.crash()
    b.crash()
