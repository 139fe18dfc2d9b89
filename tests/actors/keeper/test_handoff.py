"""Membership changes without Ray: rows move to their new owner with their due times and leases
(docs/architecture.md#membership-change)."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.actors.keeper import claims as claims_module
from prerender_ray.actors.keeper import keeper as keeper_module
from prerender_ray.identity.membership import MEMBERSHIP_TRUST_MS, Confirmations, Membership, StaleEpoch
from prerender_ray.identity.nodes import Ownership
from prerender_ray.timeutil import Clock
from tests.actors.keeper.conftest import SITE
from tests.actors.keeper.test_claims import put_due
from tests.actors.keeper.test_results import HTML, claimed, rendered

THREE = ("node-a", "node-b", "node-c")
AB = ("node-a", "node-b")


def at(epoch: int, *names: str) -> Membership:
    return Membership.of(epoch, names)


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
    """node-b applied {a, b} (epoch 2) and missed the push of {a, b, c} (epoch 3) that followed, and
    adopted rows of node-c's slice under it: node-b, node-c and those rows."""
    a, b, c, urls = await lagging_a(keepers)
    await b.handoff.set_membership(at(2, *AB))
    await a.handoff.set_membership(at(2, *AB))
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
    answer = await a.handoff.set_membership(at(1, *AB))
    owners = Ownership(["node-a", "node-b"])
    moving = {key for key in dues if owners.owner(a.conf.rules.url_of(key)) == "node-b"}
    assert moving and answer["releasing"] == len(moving)
    assert not any(key in a.rows.ranking for key in moving)  # a stops granting them at once
    await asyncio.wait_for(a.handoff.task, 10)
    assert {key: b.rows.row(key).next_render_time for key in moving} == {key: dues[key] for key in moving}
    assert a.rows.unowned(a.view.current) == {}  # deleted here once b acknowledged them
    for key in moving & in_flight:  # still leased, now on b: never granted twice across the move
        assert (await b.leases.lease_of(key))["leaseExpiresAt"] is not None
    b.claims.publish()
    assert not {j["id"] for j in await b.claims.claim(200)} & in_flight


async def test_rows_handed_over_by_a_node_whose_view_lagged_go_on_to_their_owner(keepers) -> None:
    """node-a applies {a, b} at epoch 2 and hands node-b the rows b owns there, while b (epoch 1,
    {a, b, c}) has not heard of it: b adopts (a newer caller is not refused) and some of what it
    adopts is c's under its view. b passes those on to c by itself; nothing else would move them."""
    a, b, c, urls = await lagging_a(keepers)
    await a.handoff.set_membership(at(2, *AB))
    await asyncio.wait_for(a.handoff.task, 10)
    owners = Ownership(THREE)
    keys = [key for u in urls for key in a.conf.rules.keys_of(u)]
    passed_on = [k for k in keys if owners.owner(a.conf.rules.url_of(k)) == "node-c"
                 and Ownership(["node-a", "node-b"]).owner(a.conf.rules.url_of(k)) == "node-b"]
    assert passed_on  # the case under test occurs
    assert b.handoff.task is not None
    await asyncio.wait_for(b.handoff.task, 10)
    assert [k for k in passed_on if c.rows.row(k) is None] == []
    assert b.rows.unowned(b.view.current) == {}
    await a.handoff.set_membership(at(3, *THREE))
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
    await a.handoff.set_membership(at(2, "node-a", "node-c"))
    await a.handoff.set_membership(at(3, "node-a"))
    await asyncio.wait_for(asyncio.gather(*a.repair._rebuilds), 20)
    assert [k for k in keys if a.rows.row(k) is None] == []


async def test_a_rebuild_whose_scan_predates_a_join_hands_the_joiners_rows_on(keepers) -> None:
    """node-b sees node-c leave and starts rebuilding c's slice; node-c comes back while the pass is
    between its scan and its writes. The rows it collected for c's URLs are c's again: the pass sees
    the epoch moved before it writes and reads again under the new membership (where b owns none of
    c's slice), so it writes none of them; b neither holds nor grants them, and c has them."""
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
    await b.handoff.set_membership(at(2, *AB))
    await asyncio.wait_for(scanned.wait(), 10)
    b.repair._pageless_first = pageless_first
    await b.handoff.set_membership(at(3, *THREE))
    resume.set()
    await asyncio.wait_for(asyncio.gather(*b.repair._rebuilds), 20)
    owners = Ownership(THREE)
    assert b.repair.last["restored"] == 0  # decided under epoch 2, redone under 3: nothing of c's
    assert [k for k in keys if b.rows.row(k) is not None and owners.owner(a.conf.rules.url_of(k)) != "node-b"] == []
    if b.handoff.task is not None:
        await asyncio.wait_for(b.handoff.task, 10)
    assert b.rows.unowned(b.view.current) == {}
    for k in keys:
        owner = {"node-a": a, "node-b": b, "node-c": c}[owners.owner(a.conf.rules.url_of(k))]
        assert owner.rows.row(k) is not None


async def test_a_keeper_that_missed_a_push_comes_back_to_the_controllers_membership(keepers) -> None:
    """Pushes can be lost: node-b holds {a, b} (epoch 2) after the controller moved to {a, b, c}
    (epoch 3), and adopted rows of node-c's slice under it. Its check against the controller
    applies epoch 3: those rows leave its ranking and reach node-c."""
    b, c, strays = await stale_b(keepers)

    async def controller() -> Membership:
        return at(3, *THREE)

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

    async def controller() -> Membership:
        return at(3, *THREE)

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

    async def controller() -> Membership:
        step = next(steps, "answers")
        if step == "cancelled":
            raise asyncio.CancelledError()
        if step == "hangs":
            await asyncio.sleep(3600)
        return at(2, *THREE)

    b.handoff.members = controller
    checker = asyncio.get_running_loop().create_task(b._membership_checker())
    try:
        for _ in range(200):
            if b.view.current.names == THREE:
                break
            await asyncio.sleep(0.02)
        assert b.view.current.names == THREE and not checker.done()
        assert b.state()["members"] == list(THREE) and b.state()["membershipCheckedAt"] is not None
    finally:
        checker.cancel()
    with pytest.raises(asyncio.CancelledError):  # its own cancel still ends it
        await checker


async def test_a_cancel_that_wait_for_swallows_still_ends_the_membership_check(keepers, monkeypatch) -> None:
    """Python 3.11's ``wait_for`` returns the inner call's result when the cancel of its caller lands
    as that call ends, and no later await raises it again: the checker never ended (a test of
    the close path hung 180 s under load). It ends at the next turn now (``end_if_cancelled``)."""
    monkeypatch.setattr(keeper_module, "MEMBERSHIP_CHECK_S", 0.01)
    b = keepers("node-b", members=AB)
    await b.load()
    checker: asyncio.Task | None = None
    calls = 0

    async def controller() -> Membership:
        nonlocal calls
        calls += 1
        if calls == 1:  # the check's own task (wait_for's inner): cancel the checker as it ends
            asyncio.current_task().add_done_callback(lambda _: checker.cancel())
        return at(2, *AB)

    b.handoff.members = controller
    checker = asyncio.get_running_loop().create_task(b._membership_checker())
    done, _ = await asyncio.wait({checker}, timeout=5)
    assert checker in done and checker.cancelled() and calls == 1


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
            await asyncio.wait_for(b.handoff.set_membership(at(3, *THREE)), 0.5)
    finally:
        peers.renew = renew  # type: ignore[method-assign]
    assert b.handoff.task is not None
    await asyncio.wait_for(b.handoff.task, 10)
    assert [k for k in strays if b.rows.row(k) is not None] == []
    assert [k for k in strays if c.rows.row(k) is None] == []


async def test_a_late_push_of_an_older_epoch_changes_nothing(keepers) -> None:
    """Pushes are not ordered: {a, b} at epoch 2 arriving after {a, b, c} at epoch 3 is ignored (it
    once replaced the newer list, and the node held another node's rows for minutes)."""
    b = keepers("node-b", members=THREE)
    keepers("node-a", members=THREE), keepers("node-c", members=THREE)
    await b.load()
    await b.handoff.set_membership(at(3, *THREE))
    await put_due(b, *(f"/p{i}" for i in range(30)))
    held = {h.key for h in b.rows.ranking.rows()}
    assert held  # b owns some of them
    assert await b.handoff.set_membership(at(2, *AB)) == {"changed": False, "epoch": 3}
    assert b.view.current.names == THREE and {h.key for h in b.rows.ranking.rows()} == held


async def test_rows_sent_under_an_older_epoch_are_refused_and_the_sender_routes_them_again(keepers) -> None:
    """node-a hands rows over under epoch 2 ({a, b}) while node-b is at epoch 3 ({a, b, c}): b
    refuses before it writes anything (``StaleEpoch``, both epochs), a reads the controller's epoch
    3 and hands each row to its owner under it, so none lands where it must move again."""
    a, b, c, urls = await lagging_a(keepers)
    for k in (b, c):
        await k.handoff.set_membership(at(3, *THREE))
    keys = [key for u in urls for key in a.conf.rules.keys_of(u)]
    with pytest.raises(StaleEpoch) as refused:
        await b.handoff.adopt([a.rows.row(keys[0])], [], 2)
    assert (refused.value.caller, refused.value.receiver) == (2, 3) and b.rows.row(keys[0]) is None

    async def controller() -> Membership:
        return at(3, *THREE)

    a.handoff.members = controller
    await a.handoff.set_membership(at(2, *AB))
    await asyncio.wait_for(a.handoff.task, 10)
    assert a.view.epoch == 3 and a.handoff.report["staleRefusals"] >= 1
    owners = Ownership(THREE)
    for k in keys:
        owner = {"node-a": a, "node-b": b, "node-c": c}[owners.owner(a.conf.rules.url_of(k))]
        assert owner.rows.row(k) is not None
        assert [n.node for n in (a, b, c) if n is not owner and n.rows.row(k) is not None] == []
    assert b.handoff.report["adopted"] == len([k for k in keys if owners.owner(a.conf.rules.url_of(k)) == "node-b"])


def same_fences(k) -> None:
    """A publish's fence test (decided once for all keys) says what ``is_fenced`` says key by key."""
    now = k.rows.clock.now_ms()
    keys = [h.key for h in k.rows.ranking.rows()]
    fenced = k.rows.fence_test(now)
    assert keys and [fenced(key) for key in keys] == [k.rows.is_fenced(key, now) for key in keys]
    only = k.rows.fence_only(now)  # a publish ranks only these when not None: none it leaves out may pass
    assert only is None or {key for key in keys if not k.rows.is_fenced(key, now)} <= only


async def fences_holding_back(k, leased: set[str]) -> dict:
    """``k`` holds every row of ``leased``, grants none of them, and its fences as an operator sees them."""
    assert {key for key in leased if k.rows.row(key) is not None} == leased
    same_fences(k)
    k.claims.publish()
    assert [j for j in await k.claims.claim(10) if j["id"] in leased] == []  # the old holder's lease may run
    return (await k.queue_state())[1]["fences"]


async def settled(*ks) -> None:
    """Each keeper's hand-off pass has run (and told the others it is done)."""
    for k in ks:
        if k.handoff.task is not None:
            await asyncio.wait_for(k.handoff.task, 10)


async def test_a_new_cluster_grants_at_once(keepers) -> None:
    """Every keeper of a first deployment starts fenced (it cannot know who held what); each tells
    the others its hand-off is done once loaded, so work is granted at once, not a lease later."""
    a, b = keepers("node-a", members=AB), keepers("node-b", members=AB)
    for k in (a, b):
        await k.load()
    await settled(a, b)
    urls = await put_due(a, *(f"/p{i}" for i in range(20)))
    granted = set()
    for k in (a, b):
        k.claims.publish()
        granted |= {j["id"] for j in await k.claims.claim(100)}
    assert granted == {key for u in urls for key in a.conf.rules.keys_of(u)}


async def test_a_keeper_that_starts_among_others_waits_on_every_key_until_the_others_said_done(keepers) -> None:
    """node-c is placed among node-a and node-b, which have said nothing yet: none of its keys is
    granted (the publish decides the fence once for all keys, and must say what each key's check says)."""
    keepers("node-a", members=THREE), keepers("node-b", members=THREE)  # placed, not loaded: silent
    c = keepers("node-c", members=THREE)
    await c.load()
    owners = Ownership(list(THREE))
    await put_due(c, *(p for p in (f"/p{i}" for i in range(60)) if owners.owner(SITE + p) == "node-c"))
    same_fences(c)
    c.claims.publish()
    assert c.claims.ready == [] and await c.claims.claim(100) == []


@pytest.mark.parametrize("long_walk", [20_000, -1])
async def test_a_keeper_placed_among_others_grants_once_every_other_member_said_done(
        keepers, monkeypatch, long_walk: int) -> None:
    """node-c is placed among node-a and node-b; a publish finds every key held back. Once node-a
    said its hand-off is done, still none passes, not even the keys a owns among the others: b,
    silent, may have owned any key under a membership c never saw (simulation seed 20054). Once b
    said done too, every key does; so do publishes that decide the fence once per publish
    (``Rows.fence_only``, taken after a walk skipped more than ``LONG_WALK`` keys: -1, at once)."""
    monkeypatch.setattr(claims_module, "LONG_WALK", long_walk)
    a, b = keepers("node-a", members=THREE), keepers("node-b", members=THREE)  # placed, silent
    c = keepers("node-c", members=THREE)
    await c.load()
    owners = Ownership(list(THREE))
    urls = await put_due(c, *(p for p in (f"/p{i}" for i in range(120)) if owners.owner(SITE + p) == "node-c"))
    keys = {key for u in urls for key in c.conf.rules.keys_of(u)}
    c.claims.publish()
    assert c.claims.ready == []
    await a.load()
    await settled(a)  # a told c it is done
    same_fences(c)
    c.claims.publish()
    assert c.claims.ready == [] and await c.claims.claim(100) == []
    await b.load()
    await settled(b)  # b told c it is done
    same_fences(c)
    now = c.rows.clock.now_ms()
    assert {key for key in keys if not c.rows.is_fenced(key, now)} == keys
    c.claims.publish()
    assert set(c.claims.ready) == keys
    assert {j["id"] for j in await c.claims.claim(300)} == keys


async def test_a_key_whose_owner_was_down_when_it_moved_is_not_granted_while_that_owner_may_hold_its_lease(keepers) -> None:
    """node-a granted a key, then went down; node-c joined and now owns the key. A put brings the key
    to c, but a's lease may still run: c grants it only once a is back and its hand-off is done (the
    row then comes with its lease, which keeps it from a second grant until it ends). Seen in the
    simulation before the fence: c granted it at once, two workers rendered one key."""
    a, b = keepers("node-a", members=AB), keepers("node-b", members=AB)
    for k in (a, b):
        await k.load()
    await settled(a, b)
    after = Ownership(list(THREE))
    path = next(p for p in (f"/p{i}" for i in range(200))
                if after.owner(SITE + p) == "node-c" and Ownership(list(AB)).owner(SITE + p) == "node-a")
    [url] = await put_due(a, path)
    a.claims.publish()
    leased = {j["id"] for j in await a.claims.claim(10)}
    assert leased == set(a.conf.rules.keys_of(url))
    c = keepers("node-c", members=())  # placed under epoch 2 below; a is down and hears nothing
    await c.handoff.set_membership(at(2, *THREE))  # a keeper placed among others: fenced (``Rows.fence``)
    await c.load()
    await b.handoff.set_membership(at(2, *THREE))
    await settled(b, c)
    await b.targets.put_targets([{"url": url, "nextRenderTime": 1}])  # routed to its owner, c
    fences = await fences_holding_back(c, leased)  # a's lease may run
    assert fences["everyKeyUntil"] is not None and fences["waitingOn"] == ["node-a"]  # what an operator sees
    await a.handoff.set_membership(at(2, *THREE))  # a is back: its rows and leases go to c
    await settled(a, c)
    same_fences(c)
    c.claims.publish()
    assert [j for j in await c.claims.claim(10) if j["id"] in leased] == []  # now its lease blocks them
    fences = (await c.queue_state())[1]["fences"]
    assert fences["keys"] == 0 and fences["waitingOn"] == []
    for k in leased:
        assert (await c.leases.lease_of(k))["leaseExpiresAt"] is not None


async def test_a_keeper_that_starts_among_others_waits_on_every_other_member_not_only_the_keys_owner_among_them(
        keepers) -> None:
    """Simulation seed 20054 (5 nodes, replicas=3): node-b granted a key under {a, b} and went down;
    node-c and node-d came back together into {a, b, c, d}, each fenced on every key (neither can
    know who owned what). The key is d's now, and its owner among d's others {a, b, c} is c, not b;
    c's own fence said done names b, but the key's owner among c's others {a, b, d} is d itself.
    Before, d waited only on that chain, found it clear once a and c said done, and granted the key
    under b's lease (in the simulation c left instead, which cleared it the same way)."""
    four = (*THREE, "node-d")
    path = next(p for p in (f"/p{i}" for i in range(400))
                if Ownership(list(AB)).owner(SITE + p) == "node-b" and Ownership(list(THREE)).owner(SITE + p) == "node-c"
                and Ownership(list(four)).owner(SITE + p) == "node-d")
    a, b = keepers("node-a", members=AB), keepers("node-b", members=AB)
    for k in (a, b):
        await k.load()
    await settled(a, b)
    [url] = await put_due(a, path)  # routed to its owner, b
    b.claims.publish()
    leased = {j["id"] for j in await b.claims.claim(10)}
    assert leased == set(b.conf.rules.keys_of(url))
    c, d = keepers("node-c"), keepers("node-d")  # placed under epoch 2 below; b is down and hears nothing
    for k in (c, d):
        await k.handoff.set_membership(at(2, *four))  # placed among others: fenced on every key
        await k.load()
    await a.handoff.set_membership(at(2, *four))
    await settled(a, c, d)
    assert "node-b" in d.rows.done["node-c"].waiting  # c said done with its fence: b is not clear
    await a.targets.put_targets([{"url": url, "nextRenderTime": 1}])  # routed to its owner, d
    fences = await fences_holding_back(d, leased)  # b's lease may run
    assert fences["everyKeyUntil"] is not None and fences["waitingOn"] == ["node-b"]


class Manual(Clock):
    """A clock the test moves (epoch ms)."""

    def __init__(self, at: int):
        self.at = at

    def now_ms(self) -> int:
        return self.at

    def time(self) -> float:
        return self.at / 1000


async def test_a_node_cut_off_from_the_controller_stops_granting_before_it_leaves_the_membership(keepers) -> None:
    """The controller's side of a partition is the smaller one: Ray stops listing node-b, which still
    runs, cut off. Once b leaves the membership, node-a grants b's keys at once (a departed node's
    leases are taken as gone with it), so b must not grant from then on: b grants only while the
    controller confirmed it lately, and the controller keeps b a member until that trust has run out
    (``Confirmations``). Without either half, b and a both grant b's keys after b left."""
    clock = Manual(1_700_000_000_000)
    confirmations = Confirmations(clock.at)
    controller = {"m": at(2, *AB), "reach": {"node-a", "node-b"}}

    def fetch(node: str):
        async def members() -> Membership:
            if node not in controller["reach"] or not confirmations.confirm(node, clock.at):
                raise ConnectionError("no answer")
            return controller["m"]
        return members

    a, b = (keepers(n, members=AB, clock=clock, fetch=fetch(n)) for n in AB)
    for k in (a, b):
        await k.load()
    await settled(a, b)
    paths = [p for p in (f"/p{i}" for i in range(100)) if Ownership(list(AB)).owner(SITE + p) == "node-b"]
    urls = await put_due(b, *paths)
    b_keys = {key for u in urls for key in b.conf.rules.keys_of(u)}
    controller["reach"] = {"node-a"}  # b is cut off from here on, and Ray soon stops listing it
    left_at = None
    grants: list[tuple[str, str, int]] = []
    for _ in range(12):
        clock.at += 5_000
        for k in (a, b):
            await k.handoff.check_membership()
        if left_at is None and "node-b" not in confirmations.held(AB, ["node-a"], clock.at):
            controller["m"] = at(3, "node-a")
            await a.handoff.set_membership(controller["m"])
            await settled(a)
            await a.targets.put_targets([{"url": u, "nextRenderTime": 1} for u in urls])  # its rows now
            left_at = clock.at
        if left_at is not None:
            for k in (b, a):
                k.claims.publish()
                grants += [(k.node, j["id"], clock.at) for j in await k.claims.claim(500) if j["id"] in b_keys]
    assert left_at is not None and left_at >= 1_700_000_000_000 + MEMBERSHIP_TRUST_MS
    assert {key for node, key, _ in grants if node == "node-a"} == b_keys  # a took them over at once
    assert [g for g in grants if g[0] == "node-b"] == []  # b stopped granting before it left
    assert b.state()["membershipConfirmedAt"] <= left_at - MEMBERSHIP_TRUST_MS


async def test_a_grant_handed_over_is_answered_by_one_node_only_though_the_hand_off_was_not_acknowledged(
        keepers) -> None:
    """Simulation seed 1106: node-a handed a key in flight to node-b, which adopted it with its open
    grant, but b's answer was lost (b was lost too), so a kept the key and its lease. The render's
    result came to a, now the owner again, and was applied; b came back owning the key and applied the
    fleet's retry of it a second time. From the hand-over on, only the adopter answers the grant."""
    a = keepers("node-a")
    await a.load()
    b = keepers("node-b", members=AB)
    await b.load()
    path = next(p for p in (f"/p{i}" for i in range(200)) if Ownership(list(AB)).owner(SITE + p) == "node-b")
    job = await claimed(a, path, "w1")
    adopted = asyncio.Event()
    real_adopt = b.adopt

    async def adopt_unanswered(*args, **kw):
        await real_adopt(*args, **kw)
        adopted.set()
        raise ConnectionError("node-b's answer was lost")

    b.adopt = adopt_unanswered
    await a.handoff.set_membership(at(2, *AB))
    await asyncio.wait_for(adopted.wait(), 10)
    for k in (a, b):  # both hold the key's lease now
        assert (await k.leases.lease_of(job["id"]))["leaseExpiresAt"] is not None
    await a.handoff.set_membership(at(3, "node-a"))  # b is lost: the key is a's again
    meta = rendered(job["id"], job["url"])
    answers = [await asyncio.gather(a.results.process(meta, HTML, worker="w1"), return_exceptions=True)]
    await b.handoff.set_membership(at(4, "node-b"))  # a leaves, b is back: the key is b's
    answers.append(await asyncio.gather(b.results.process(meta, HTML, worker="w1"), return_exceptions=True))
    applied = [x for [x] in answers if isinstance(x, dict) and "outcome" in x]
    assert len(applied) == 1, answers
    assert len((await b.store.render_history(job["id"]))["renderHistory"]) == 1
