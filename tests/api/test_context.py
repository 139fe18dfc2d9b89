"""NodeContext's typed seams without Ray: the clients over in-process handles (``rpc.Local``), a call
under another deadline (``within``), the per-node accessors routed by ownership, and the admin
fan-out by client method."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.api.admin.common import fan_out
from prerender_ray.api.context import HoldersUnavailable, NodeContext
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo, Ownership
from prerender_ray.rpc import DeadlineExceeded, Local


class Keeper:
    """A keeper's answers, by node; ``hang`` never answers."""

    def __init__(self, node: str, hang: bool = False):
        self.node, self.hang = node, hang

    async def queue_state(self) -> tuple[int, dict]:
        if self.hang:
            await asyncio.Event().wait()
        return 200, {"node": self.node}

    async def reconcile_status(self) -> dict:
        return {"node": self.node}


class Store:
    """A store's answers, by node; ``hang``: reads answer only once ``gate`` opens."""

    def __init__(self, node: str, hang: bool = False):
        self.node, self.hang = node, hang
        self.gate = asyncio.Event()
        self.reads = 0

    async def get(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.node.encode() + b":" + k for k in keys]

    async def get_targets(self, urls: list[str]) -> list[bytes | None]:
        self.reads += 1
        if self.hang:
            await self.gate.wait()
        return [self.node.encode() + b":" + u.encode() for u in urls]

    async def counts(self) -> dict:
        await self.gate.wait()
        return {"targets": 1, "pages": 2}


def node_ctx(names: list[str], placed: dict[tuple[str, str], object], replicas: int = 3,
             store: Store | None = None) -> NodeContext:
    """Node ``n1`` of a cluster of ``names``: another node's actor is ``placed[(kind, node)]``, else
    not placed (a ValueError, as ``ray.get_actor`` raises; a callable placed is called first)."""

    async def lookup(kind: str, node: str) -> Local:
        if (kind, node) not in placed:
            raise ValueError(f"Failed to look up actor with name '{kind}:{node}'")
        found = placed[kind, node]
        return Local(found() if callable(found) else found)

    ownership = Ownership()
    ownership.update(names)
    cfg = Config.model_validate({"cluster": {"replicas": replicas}})
    return NodeContext(cfg=cfg, node=NodeInfo("n1", "127.0.0.1", 1), data_dir="/nonexistent",
                       keeper=Local(Keeper("n1")), store=Local(store or Store("n1")), ownership=ownership,
                       peers={n: NodeInfo(n, "127.0.0.1", 1) for n in names}, lookup=lookup)


async def test_the_node_clients_are_typed_and_reach_the_node_actors() -> None:
    ctx = node_ctx(["n1"], {})
    assert isinstance(ctx.keeper, KeeperClient) and isinstance(ctx.store, StoreClient)
    assert await ctx.store.get([b"a"]) == [b"n1:a"]
    assert await ctx.keeper.queue_state() == (200, {"node": "n1"})


async def test_within_bounds_one_call_and_leaves_the_client_as_it_was() -> None:
    ctx = node_ctx(["n1"], {})
    quick = ctx.store.within(0.05)
    assert quick.deadline_s == 0.05 and ctx.store.deadline_s > 1
    with pytest.raises(DeadlineExceeded):
        await quick.counts()  # the store never opens its gate
    keeper = ctx.keeper.within(0.05)
    assert keeper.deadline_s == keeper.long_deadline_s == 0.05  # every deadline the client has
    assert ctx.keeper.long_deadline_s > 1


async def test_another_nodes_actors_are_found_by_ownership() -> None:
    names = ["n1", "n2", "n3"]
    ctx = node_ctx(names, {("keeper", "n2"): Keeper("n2"), ("keeper", "n3"): Keeper("n3"),
                           ("store", "n2"): Store("n2"), ("store", "n3"): Store("n3")}, replicas=1)
    owners = set()
    for i in range(40):
        url = f"https://x.example/{i}"
        owner = ctx.owner_of(url)
        owners.add(owner)
        keeper = await ctx.keeper_of(url)
        assert (await keeper.queue_state())[1] == {"node": owner}
        assert await (await ctx.store_at(owner)).get([b"k"]) == [owner.encode() + b":k"]
        assert (keeper is ctx.keeper) == (owner == "n1")
    assert owners == set(names)
    with pytest.raises(ValueError):
        await ctx.walker_at("n2")  # not placed


async def test_fan_out_asks_a_client_method_of_every_node_and_names_those_that_did_not_answer() -> None:
    ctx = node_ctx(["n1", "n2", "n3", "n4"], {("keeper", "n2"): Keeper("n2"), ("keeper", "n4"): Keeper("n4", hang=True)})
    found = await fan_out(ctx, ctx.keeper_at, KeeperClient.queue_state, timeout=0.2)
    assert found["n1"] == (True, (200, {"node": "n1"}))
    assert found["n2"] == (True, (200, {"node": "n2"}))
    assert found["n3"] == (False, "no actor placed on n3 to answer")
    assert found["n4"] == (False, "no answer within 200 ms")
    repairs = await fan_out(ctx, ctx.keeper_at, KeeperClient.reconcile_status, timeout=0.2)
    assert repairs["n2"] == (True, {"node": "n2"})


def test_no_route_writes_remote_or_finds_a_service_by_key() -> None:
    """The api/ tree calls actors only through the typed clients, and NodeContext has no string-keyed
    services."""
    from pathlib import Path

    import prerender_ray.api as api

    root = Path(api.__file__).parent
    offenders = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
                 if ".remote(" in p.read_text() or "extras" in p.read_text()]
    assert offenders == []


def test_a_node_the_membership_no_longer_lists_holds_nothing_and_reads_from_the_holders() -> None:
    """node-b left the membership while it still runs (cut off, then told by the controller's check):
    with R = 2 and two members left, every member holds every URL, but node-b holds none. It once
    took itself for a holder and answered 404 for targets it never had (the namespace soak)."""
    cfg = Config.model_validate({"domains": ["shop.test"], "cluster": {"replicas": 2}})
    b = NodeContext(cfg, NodeInfo("node-b", "127.0.0.1", 9002), "/tmp", ownership=Ownership(["node-a", "node-c"]))
    url = "https://shop.test/p/1"
    assert not b.holds(url) and set(b.read_order(url)) == {"node-a", "node-c"}
    a = NodeContext(cfg, NodeInfo("node-a", "127.0.0.1", 9001), "/tmp", ownership=Ownership(["node-a", "node-c"]))
    assert a.holds(url) and a.read_order(url) == ("node-a", "node-c")


# ------------------------------------------------------------------ reads from a URL's holders

NAMES = ["n1", "n2", "n3"]
R2 = Ownership(NAMES)


def url_held(by_n1: bool) -> tuple[str, tuple[str, ...]]:
    """A URL that ``n1`` holds (or not) with R = 2, and its holders, the owner first."""
    url = next(u for u in (f"https://x.example/{i}" for i in range(1000))
               if ("n1" in R2.holders(u, 2)) == by_n1)
    return url, R2.holders(url, 2)


def targets(url: str):
    return lambda store: store.get_targets([url])


async def test_a_read_goes_on_to_the_next_holder_when_the_first_hangs_or_is_gone() -> None:
    url, (first, second) = url_held(False)
    for placed_first in (Store(first, hang=True), None):  # cut off, then gone
        placed = {("store", second): Store(second)}
        if placed_first is not None:
            placed["store", first] = placed_first
        ctx = node_ctx(NAMES, placed, replicas=2)
        assert await ctx.read_from_holders(url, targets(url), 30) == [f"{second}:{url}".encode()]


async def test_a_slow_holder_is_still_heard_after_the_next_was_asked() -> None:
    """The first holder answers only after the second failed: its answer is the read's."""
    url, (first, second) = url_held(False)
    slow = Store(first, hang=True)

    def gone() -> Store:
        slow.gate.set()
        raise ValueError(f"Failed to look up actor with name 'store:{second}'")

    ctx = node_ctx(NAMES, {("store", first): slow, ("store", second): gone}, replicas=2)
    assert await ctx.read_from_holders(url, targets(url), 30) == [f"{first}:{url}".encode()]


async def test_a_node_that_holds_the_url_reads_its_own_store() -> None:
    url, holders = url_held(True)
    others = {("store", n): Store(n) for n in holders if n != "n1"}
    ctx = node_ctx(NAMES, others, replicas=2)
    assert ctx.read_order(url)[0] == "n1"
    assert await ctx.read_from_holders(url, targets(url), 30) == [f"n1:{url}".encode()]
    assert all(s.reads == 0 for s in others.values())


async def test_no_holder_answering_is_holders_unavailable_naming_each() -> None:
    url, (first, second) = url_held(False)
    ctx = node_ctx(NAMES, {("store", "n1"): Store("n1")}, replicas=2)  # n1 holds no copy: never asked
    with pytest.raises(HoldersUnavailable) as gone:
        await ctx.read_from_holders(url, targets(url), 30)
    assert gone.value.url == url and gone.value.failed == {first: "ValueError", second: "ValueError"}
    ctx = node_ctx(NAMES, {("store", first): Store(first, hang=True), ("store", second): Store(second, hang=True)},
                   replicas=2)
    with pytest.raises(HoldersUnavailable) as hung:
        await ctx.read_from_holders(url, targets(url), 0.5)
    assert hung.value.failed == {first: "no answer within 0.5s", second: "no answer within 0.5s"}
