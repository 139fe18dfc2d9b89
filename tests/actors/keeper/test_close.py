"""A keeper's close ends every background task of its parts before the rows' db closes: a repair, a
hand-off pass or a status write still running would write to the closed schedule RocksDB, or call
peers, after the close. Plain keepers without Ray (tests/actors/keeper/doubles.py); what a part waits
on is a stub held until the test lets it answer."""

from __future__ import annotations

import asyncio
from typing import Any

from prerender_ray.actors.keeper.keeper import Keeper
from prerender_ray.identity.membership import Membership
from tests.actors.keeper.test_claims import put_due
from tests.support import Recorded

THREE = ("node-a", "node-b", "node-c")


class Held:
    """The node store as one part sees it, its ``has_pages`` answered only once let (the rest as is)."""

    def __init__(self, store: Any):
        self.store = store
        self.gate = asyncio.Event()
        self.asked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def has_pages(self, keys: list[str]) -> list[bool]:
        self.asked += 1
        await self.gate.wait()
        return await self.store.has_pages(keys)


def recorded(keeper: Keeper) -> Recorded:
    log = Recorded(keeper.log)
    keeper.log = keeper.repair.log = keeper.handoff.log = keeper.status.log = log
    return log


async def test_a_keeper_closed_mid_rebuild_ends_the_rebuild_and_writes_nothing_after(keepers) -> None:
    """Before, a rebuild of a departed node's slice was a bare task the close never cancelled: once the
    store answered, it wrote the rows it restored to the closed schedule db (and logged the failure)."""
    a, b, c = (keepers(n, members=THREE) for n in THREE)
    for k in (a, b, c):
        await k.load()
    await put_due(a, *(f"/p{i}" for i in range(60)))
    held = Held(b.repair.store)
    b.repair.store = held
    log = recorded(b)
    writes: list[int] = []
    write = b.rows.write

    def counted(rows: Any, *args: Any, **kw: Any) -> None:
        writes.append(len(rows))
        write(rows, *args, **kw)

    b.rows.write = counted
    # node-c died: b rebuilds its share of node-c's rows
    await b.handoff.set_membership(Membership.of(2, ["node-a", "node-b"]))
    for _ in range(500):
        if held.asked:
            break
        await asyncio.sleep(0.01)
    [rebuild] = b.repair._rebuilds
    assert held.asked and not rebuild.done() and b.repair.running

    await b.close()
    assert rebuild.done() and not b.repair.running  # cancelled and awaited: it writes nothing from here on
    held.gate.set()  # the store answers now: a rebuild still running would write its rows
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert writes == []
    assert [line for line in log.lines if line[0] in ("error", "exception")] == []


class HeldPeer:
    """Another node's keeper whose ``adopt`` answers only once let (the rest as is)."""

    def __init__(self, keeper: Keeper):
        self.keeper = keeper
        self.gate = asyncio.Event()
        self.asked = 0
        self.adopted = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.keeper, name)

    async def adopt(self, rows: list, leases: list, epoch: int, fences: list | None = None) -> int:
        self.asked += 1
        await self.gate.wait()
        self.adopted += len(rows)
        return await self.keeper.adopt(rows, leases, epoch, fences)


async def test_a_keeper_closed_mid_hand_off_ends_the_pass_before_the_close_returns(keepers) -> None:
    """Before, the close cancelled the pass and closed the rows' db without waiting for it to end."""
    a = keepers("node-a")
    await a.load()
    await put_due(a, *(f"/p{i}" for i in range(40)))
    b = keepers("node-b", members=("node-a", "node-b"))
    await b.load()
    peer = HeldPeer(b)
    a.handoff.peers.keepers["node-b"] = peer
    log = recorded(a)
    await a.handoff.set_membership(Membership.of(1, ["node-a", "node-b"]))  # b joined: a hands b its share
    for _ in range(500):
        if peer.asked:
            break
        await asyncio.sleep(0.01)
    task = a.handoff.task
    assert peer.asked and task is not None and not task.done()

    await a.close()
    assert task.done()  # ended before the rows' db closed
    peer.gate.set()  # b answers now: a pass still running would hand its rows over, then delete them
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert peer.adopted == 0
    assert [line for line in log.lines if line[0] in ("error", "exception")] == []
