"""A NodeStore's close ends every background task it started before its files close: a walk, a push
on, a pull owed, a shipper or a catch-up still running would write to a closed RocksDB (a walk's drop,
its placement kept on disk). A plain NodeStore over RocksDB in a temp dir, without Ray; its one peer
is a stub that answers a walk's questions when the test lets it."""

from __future__ import annotations

import asyncio

from prerender_ray import logs
from prerender_ray.actors.store.actor import NodeStore, StoreClient
from prerender_ray.actors.store.replication import SHIP_DEADLINE_S
from prerender_ray.identity.membership import Membership
from prerender_ray.rpc import Local
from prerender_ray.storage.registry import Target, target_key
from tests.actors.store.test_replication import _until
from tests.support import Recorded, node_config

URLS = [f"https://x.com/{i}" for i in range(40)]


class Joiner:
    """node-b, just joined: caught up, holding nothing; asked what it holds, it answers once let."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.asked = 0
        self.applied: list[list] = []

    async def wait_synced(self, timeout: float) -> dict:
        return {"state": "synced"}

    async def holding(self, name: str, items: list[list], epoch: int | None = None,
                      membership: dict | None = None) -> list[bool]:
        self.asked += 1
        await self.gate.wait()
        return [False] * len(items)

    async def apply_remote(self, records: list[list], epoch: int | None = None, membership: dict | None = None) -> int:
        self.applied += records
        return len(records)


class Peers:
    def __init__(self, joiner: Joiner):
        self.joiner = joiner

    async def get(self, peer: str) -> StoreClient:
        return StoreClient(Local(self.joiner), SHIP_DEADLINE_S)

    async def renew(self, names: list[str]) -> None:
        pass


async def test_a_store_closed_mid_walk_ends_the_walk_and_writes_nothing_after(tmp_path) -> None:
    """Before, the walk's task was the store's only one not in its tasks: a close left it running, and
    once the peer answered it dropped the records pushed, from a closed RocksDB (DbClosedError)."""
    joiner = Joiner()
    log = Recorded(logs.get("store"))
    data = tmp_path / "data"
    store = NodeStore(node_config(data, {"cluster": {"replicas": 1}}), "node-a", str(data),
                      Membership.of(1, ["node-a"]).to_wire(), stores=Peers(joiner), log=log)
    await store.catch_up.synced.wait()
    await store.apply([(target_key(u), Target(url=u).encode()) for u in URLS])
    await store.set_membership(Membership.of(2, ["node-a", "node-b"]).to_wire())  # half of them are node-b's now
    await _until(lambda: joiner.asked > 0, "the walk to ask node-b what it holds")
    walk = store.rebalancing.rebalance_task
    assert walk is not None and not walk.done()

    await store.close()
    assert walk.done()  # cancelled and awaited: it can write nothing from here on
    joiner.gate.set()  # node-b answers now: a walk still running would push, then drop
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert joiner.applied == []
    assert [line for line in log.lines if line[0] in ("error", "exception")] == []
    assert store.rebalancing.rebalance_report["state"] == "superseded"

