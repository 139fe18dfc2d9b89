"""Membership changes without Ray: rows move to their new owner with their due times and leases
(docs/architecture.md#membership-change)."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.actors.keeper import keeper as keeper_module
from prerender_ray.identity.nodes import Ownership
from tests.actors.keeper.test_claims import put_due

THREE = ("node-a", "node-b", "node-c")


async def lagging_a(keepers):
    """node-a alone with 60 due targets, node-b and node-c started with all three as members: node-a's
    view lags theirs."""
    a = keepers("node-a")
    await a.load()
    urls = await put_due(a, *(f"/p{i}" for i in range(60)))
    b, c = keepers("node-b", members=THREE), keepers("node-c", members=THREE)
    await b.load()
    await c.load()
    return a, b, c, urls


async def stale_b(keepers):
    """node-b, still starting, applied a late {a, b} after the controller moved to {a, b, c}, and
    adopted rows of node-c's slice under it: node-b, node-c and those rows."""
    a, b, c, urls = await lagging_a(keepers)
    await b.handoff.set_membership(["node-a", "node-b"])  # the late push
    await a.handoff.set_membership(["node-a", "node-b"])
    await asyncio.wait_for(a.handoff.task, 10)
    owners = Ownership(THREE)
    keys = [key for u in urls for key in a.conf.rules.keys_of(u)]
    strays = [k for k in keys if b.rows.row(k) is not None and owners.owner(a.conf.rules.url_of(k)) != "node-b"]
    assert strays  # the case under test occurs
    return b, c, strays


async def test_a_joining_node_gets_its_rows_with_their_due_times_and_their_leases(keepers) -> None:
    a = keepers("node-a")
    await a.load()
    paths = [f"/p{i}" for i in range(40)]
    urls = await put_due(a, *paths)
    a.claims.publish()
    in_flight = {j["id"] for j in await a.claims.claim(200)}
    dues = {key: a.rows.row(key).next_render_time for u in urls for key in a.conf.rules.keys_of(u)}
    b = keepers("node-b", members=("node-a", "node-b"))
    await b.load()
    answer = await a.handoff.set_membership(["node-a", "node-b"])
    owners = Ownership(["node-a", "node-b"])
    moving = {key for key in dues if owners.owner(a.conf.rules.url_of(key)) == "node-b"}
    assert moving and answer["releasing"] == len(moving)
    assert not any(key in a.rows.ranking for key in moving)  # a stops granting them at once
    await asyncio.wait_for(a.handoff.task, 10)
    assert {key: b.rows.row(key).next_render_time for key in moving} == {key: dues[key] for key in moving}
    assert a.rows.unowned() == {}  # deleted here once b acknowledged them
    for key in moving & in_flight:  # still leased, now on b: never granted twice across the move
        assert (await b.leases.lease_of(key))["leaseExpiresAt"] is not None
    b.claims.publish()
    assert not {j["id"] for j in await b.claims.claim(200)} & in_flight


async def test_rows_handed_over_by_a_node_whose_view_lagged_go_on_to_their_owner(keepers) -> None:
    """Two nodes come back at once: node-a still sees {a, b} and hands node-b the rows b owns there,
    but b already sees {a, b, c}, so some of what it adopts is c's. b passes those on to c by
    itself; nothing else would ever move them (no further membership change comes)."""
    a, b, c, urls = await lagging_a(keepers)
    await a.handoff.set_membership(["node-a", "node-b"])
    await asyncio.wait_for(a.handoff.task, 10)
    owners = Ownership(THREE)
    keys = [key for u in urls for key in a.conf.rules.keys_of(u)]
    passed_on = [k for k in keys if owners.owner(a.conf.rules.url_of(k)) == "node-c"
                 and Ownership(["node-a", "node-b"]).owner(a.conf.rules.url_of(k)) == "node-b"]
    assert passed_on  # the case under test occurs
    assert b.handoff.task is not None
    await asyncio.wait_for(b.handoff.task, 10)
    assert [k for k in passed_on if c.rows.row(k) is None] == []
    assert b.rows.unowned() == {}
    await a.handoff.set_membership(list(THREE))
    await asyncio.wait_for(a.handoff.task, 10)
    for k in keys:
        owner = {"node-a": a, "node-b": b, "node-c": c}[owners.owner(a.conf.rules.url_of(k))]
        assert owner.rows.row(k) is not None
        assert [n.node for n in (a, b, c) if n is not owner and n.rows.row(k) is not None] == []


async def test_two_departures_in_a_row_rebuild_both_slices_on_the_survivor(keepers) -> None:
    """node-b and node-c die one right after the other: node-a sees {a, c}, then {a}, before its
    first rebuild pass starts. Each pass must judge "was owned by the departed" against the
    membership that node left, not the latest one, or part of node-b's slice is never rebuilt."""
    a, b, c = (keepers(n, members=THREE) for n in THREE)
    for k in (a, b, c):
        await k.load()
    urls = await put_due(a, *(f"/p{i}" for i in range(60)))
    keys = [key for u in urls for key in a.conf.rules.keys_of(u)]
    assert 0 < len([k for k in keys if a.rows.row(k) is not None]) < len(keys)
    await a.handoff.set_membership(["node-a", "node-c"])
    await a.handoff.set_membership(["node-a"])
    await asyncio.wait_for(asyncio.gather(*a.repair._rebuilds), 20)
    assert [k for k in keys if a.rows.row(k) is None] == []


async def test_a_rebuild_whose_scan_predates_a_join_hands_the_joiners_rows_on(keepers) -> None:
    """node-b sees node-c leave and starts rebuilding c's slice; node-c comes back while the pass is
    between its scan and its writes. The rows it collected for c's URLs are c's again: b must
    neither hold nor grant them, and they reach c (no later membership change comes to move them)."""
    a, b, c = (keepers(n, members=THREE) for n in THREE)
    for k in (a, b, c):
        await k.load()
    urls = await put_due(a, *(f"/p{i}" for i in range(60)))
    keys = [key for u in urls for key in a.conf.rules.keys_of(u)]
    scanned, resume = asyncio.Event(), asyncio.Event()
    pageless_first = b.repair._pageless_first

    async def held_after_the_scan(collected):
        scanned.set()
        await resume.wait()
        return await pageless_first(collected)

    b.repair._pageless_first = held_after_the_scan
    await b.handoff.set_membership(["node-a", "node-b"])
    await asyncio.wait_for(scanned.wait(), 10)
    await b.handoff.set_membership(list(THREE))
    resume.set()
    await asyncio.wait_for(asyncio.gather(*b.repair._rebuilds), 20)
    owners = Ownership(THREE)
    assert b.repair.last["restored"] > 0  # the pass wrote rows of c's slice
    assert [k for k in keys if b.rows.row(k) is not None and owners.owner(a.conf.rules.url_of(k)) != "node-b"] == []
    if b.handoff.task is not None:
        await asyncio.wait_for(b.handoff.task, 10)
    assert b.rows.unowned() == {}
    for k in keys:
        owner = {"node-a": a, "node-b": b, "node-c": c}[owners.owner(a.conf.rules.url_of(k))]
        assert owner.rows.row(k) is not None


async def test_a_keeper_that_applied_a_stale_push_comes_back_to_the_controllers_membership(keepers) -> None:
    """Pushes are not ordered: node-b, still starting, applies a late {a, b} after the controller
    moved to {a, b, c}, and adopts rows of node-c's slice under it. Its check against the
    controller applies {a, b, c}: those rows leave its ranking and reach node-c."""
    b, c, strays = await stale_b(keepers)

    async def controller() -> list[str]:
        return list(THREE)

    b.handoff.members = controller
    assert (await b.handoff.check_membership())["changed"] is True
    await asyncio.wait_for(b.handoff.task, 10)
    assert [k for k in strays if b.rows.row(k) is not None] == []
    assert [k for k in strays if c.rows.row(k) is None] == []
    assert await b.handoff.check_membership() == {"changed": False}


async def test_the_membership_read_at_start_releases_rows_adopted_under_an_older_one(keepers) -> None:
    """A restarting keeper waits for its store before it reads the controller's membership, and rows
    can be adopted meanwhile under the membership it was placed with. The start-up read must release
    what it no longer owns like any other change: it once replaced the ownership only, the rows stayed
    in the ranking, and every later check found the membership right (CI: node-b kept 48 of node-c's
    rows for 4 minutes in test_cluster)."""
    b, c, strays = await stale_b(keepers)

    async def controller() -> list[str]:
        return list(THREE)

    b.handoff.members = controller
    await b.handoff.fetch_membership()
    assert [k for k in strays if b.rows.row(k) is not None] == []  # not granted here any more
    await asyncio.wait_for(b.handoff.task, 10)
    assert [k for k in strays if c.rows.row(k) is None] == []


async def test_the_membership_check_goes_on_after_a_stray_cancel_and_a_check_that_hangs(keepers, monkeypatch) -> None:
    """A restarted node's keeper kept a stale {a, b} for minutes while the controller said {a, b, c}
    and its 5 s check said nothing: a check that never returns (a lookup that hangs) or ends in a
    CancelledError that is not the loop's own would stop the checking for good. Neither does now."""
    monkeypatch.setattr(keeper_module, "MEMBERSHIP_CHECK_S", 0.01)
    monkeypatch.setattr(keeper_module, "MEMBERSHIP_CHECK_DEADLINE_S", 0.2)
    b = keepers("node-b", members=("node-a", "node-b"))
    await b.load()
    steps = iter(["cancelled", "hangs"])

    async def controller() -> list[str]:
        step = next(steps, "answers")
        if step == "cancelled":
            raise asyncio.CancelledError()
        if step == "hangs":
            await asyncio.sleep(3600)
        return list(THREE)

    b.handoff.members = controller
    checker = asyncio.get_running_loop().create_task(b._membership_checker())
    try:
        for _ in range(200):
            if b.ownership.names == THREE:
                break
            await asyncio.sleep(0.02)
        assert b.ownership.names == THREE and not checker.done()
        assert b.state()["members"] == list(THREE) and b.state()["membershipCheckedAt"] is not None
    finally:
        checker.cancel()
    with pytest.raises(asyncio.CancelledError):  # its own cancel still ends it
        await checker


async def test_a_membership_applied_while_the_handle_lookup_hangs_still_moves_the_rows(keepers) -> None:
    """Seen under load: node-b applied the controller's {a, b, c} (a push), then waited for good on
    the lookup of the peers' handles before releasing node-c's rows; every later check found the
    membership right and did nothing, so it kept node-c's rows for minutes. The rows are released
    and handed off before the lookup is awaited; the lookup is bounded (``LOOKUP_DEADLINE_S``)."""
    b, c, strays = await stale_b(keepers)

    peers, renew = b.handoff.peers, b.handoff.peers.renew

    async def hangs(nodes: list[str]) -> None:
        await asyncio.sleep(3600)

    peers.renew = hangs  # type: ignore[method-assign]
    try:
        with pytest.raises(asyncio.TimeoutError):  # what the push's caller sees: no answer in time
            await asyncio.wait_for(b.handoff.set_membership(list(THREE)), 0.5)
    finally:
        peers.renew = renew  # type: ignore[method-assign]
    assert b.handoff.task is not None
    await asyncio.wait_for(b.handoff.task, 10)
    assert [k for k in strays if b.rows.row(k) is not None] == []
    assert [k for k in strays if c.rows.row(k) is None] == []
