"""Per-URL records on R nodes without Ray (``actors/store/rebalance.py``, docs/architecture.md#membership-change): writes ship
to their URL's holders only, cluster-wide rows everywhere; a joining node pulls its share; a change of
membership pushes what new holders lack and drops, after their ack, what a node no longer holds."""

from __future__ import annotations

import asyncio

from prerender_ray.actors.store import rebalance
from prerender_ray.identity.membership import NOBODY, Membership
from prerender_ray.identity.nodes import Ownership
from prerender_ray.storage.keys import FRESHNESS, SITEMAP, TARGET, VIDX
from prerender_ray.storage.replication import payload_of
from tests.actors.store.test_replication import Node, _until

R = 2
URLS = [f"https://x.com/{i}" for i in range(60)]


def wire(names: list[str], epoch: int) -> dict:
    """The controller's push of ``names`` at ``epoch`` (every store starts at epoch 1)."""
    return Membership.of(epoch, names).to_wire()


def holders(names: list[str], url: str) -> set[str]:
    return set(Ownership(names).holders(url, R))


def start(tmp_path, names: list[str], net: dict[str, Node]) -> dict[str, Node]:
    nodes = {}
    for n in names:
        nodes[n] = net[n] = Node(n, tmp_path, [p for p in names if p != n], net, replicas=R)
    return nodes


def write(node: Node, urls: list[str]) -> None:
    node.records.commit_local("registry", [(TARGET + u.encode(), f'{{"u":"{u}"}}'.encode()) for u in urls])
    node.records.commit_local("pages", [(f"{u}|desktop".encode(), b"<html>" + u.encode()) for u in urls]
                      + [(FRESHNESS + f"{u}|desktop".encode(), b"touch") for u in urls])


def where(nodes: dict[str, Node], url: str) -> dict[str, set[str]]:
    """Which nodes hold the target, the page and the freshness record of ``url``."""
    key = f"{url}|desktop".encode()
    return {"target": {n for n, s in nodes.items() if s.target(url) is not None},
            "page": {n for n, s in nodes.items() if payload_of(s.pages.get(key)) is not None},
            "touch": {n for n, s in nodes.items() if payload_of(s.pages.get(FRESHNESS + key)) is not None}}


def placed(nodes: dict[str, Node], names: list[str]) -> list[str]:
    """URLs not held by exactly their holders under ``names`` (every kind of record)."""
    return [u for u in URLS if any(v != holders(names, u) for v in where(nodes, u).values())]


async def seeded(tmp_path, names: list[str], net: dict[str, Node]) -> dict[str, Node]:
    """``names`` started, every URL written by its owner (as the keeper does), and placed."""
    nodes = start(tmp_path, names, net)
    for u in URLS:
        write(nodes[Ownership(names).owner(u)], [u])
    await _until(lambda: not placed(nodes, names), f"the {len(names)}-node placement")
    # Each store's own catch-up at start ended too: one still pulling when the membership changes
    # sends records again, rightly, which the tests would count (they failed so under load).
    await asyncio.wait_for(asyncio.gather(*(n.catch_up.synced.wait() for n in nodes.values())), 30)
    return nodes


async def joined(tmp_path, name: str, peers: list[str], nodes: dict[str, Node], net: dict[str, Node]) -> Node:
    """``name`` started with ``peers``, reachable, and done with its catch-up."""
    node = nodes[name] = net[name] = Node(name, tmp_path, peers, net, replicas=R, epoch=2)
    await node.catch_up.synced.wait()
    return node


def no_walk_pushes_to_joiners(monkeypatch) -> None:
    """A walk pushes a joiner no record, however recent (``JOINER_MARGIN_MS`` puts the cut-off in the
    far future): what is tested is what covers the rest (its pull, the push on)."""
    monkeypatch.setattr(rebalance, "JOINER_MARGIN_MS", -10**14)


def stop(nodes) -> None:
    for node in list(nodes.values()):
        node.crash()


async def test_writes_ship_to_their_urls_holders_only_and_cluster_rows_everywhere(tmp_path) -> None:
    names = ["node-a", "node-b", "node-c"]
    net: dict[str, Node] = {}
    nodes = start(tmp_path, names, net)
    for u in URLS:  # each URL is written by its owner, as the keeper does
        write(nodes[Ownership(names).owner(u)], [u])
    nodes["node-a"].records.commit_local("registry", [(SITEMAP + b"https://x.com/sitemap.xml", b"{}")])
    await _until(lambda: not placed(nodes, names), "every record on exactly its two holders")
    assert all(s.registry.get(SITEMAP + b"https://x.com/sitemap.xml") is not None for s in nodes.values())
    assert {n: s.records.live["registry"] for n, s in nodes.items()} == {
        n: sum(n in holders(names, u) for u in URLS) for n in names}
    stop(nodes)


async def test_a_joining_node_pulls_its_share_and_the_others_drop_what_it_took_over(tmp_path) -> None:
    three, four = ["node-a", "node-b", "node-c"], ["node-a", "node-b", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    d = await joined(tmp_path, "node-d", three, nodes, net)
    mine = [u for u in URLS if "node-d" in holders(four, u)]
    assert mine and all(d.target(u) is not None for u in mine)  # its share, pulled
    assert [u for u in URLS if u not in mine and d.target(u) is not None] == []  # and nothing else
    assert d.catch_up.sync_report["sources"] == three
    for name in three:
        await nodes[name].set_membership(wire(four, 2))
    await _until(lambda: not placed(nodes, four), "every record on exactly its holders among four", timeout=20)
    for s in nodes.values():  # a dropped record leaves no bookkeeping behind
        assert s.rebalancing.rebalance_report["state"] in ("idle", "done")
        indexed = {k[len(VIDX) + 8:] for k, _ in s.registry.items(VIDX) if k[len(VIDX) + 8:].startswith(TARGET)}
        assert indexed == {k for k, _ in s.registry.items(TARGET)}
    stop(nodes)


async def test_a_record_shipped_to_a_node_after_its_walk_passed_is_pushed_on_to_its_holders(tmp_path, monkeypatch) -> None:
    """node-c writes records held by node-c and node-d; node-b joins and takes node-d's place for them.
    Shipped to node-d only after node-d's walk (node-c had not yet learnt of node-b, and node-b's pull
    came before them): node-d keeps none of them, node-b gets them all."""
    monkeypatch.setattr(rebalance, "PUSH_ON_AFTER_S", 0.1)
    no_walk_pushes_to_joiners(monkeypatch)
    three, four = ["node-a", "node-c", "node-d"], ["node-a", "node-b", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    await joined(tmp_path, "node-b", three, nodes, net)
    late = [u for u in (f"https://x.com/late/{i}" for i in range(200))
            if holders(three, u) == {"node-c", "node-d"} and holders(four, u) == {"node-b", "node-c"}]
    assert late
    d = net.pop("node-d")  # node-c's shipping to node-d stalls
    write(nodes["node-c"], late)
    for name in three:
        await nodes[name].set_membership(wire(four, 2))
    await _until(lambda: d.rebalancing.rebalance_report["state"] == "done", "node-d's walk")
    net["node-d"] = d
    await _until(lambda: all(v == {"node-b", "node-c"} for u in late for v in where(nodes, u).values()),
                 "the late records on exactly their holders")
    stop(nodes)


async def test_a_node_whose_membership_was_stale_for_a_moment_keeps_what_it_holds(tmp_path, monkeypatch) -> None:
    """node-b is still on the membership that lists node-e (gone from the cluster since, its store
    still up) and receives records it holds, though not in that view; its membership is right again
    before a stray is pushed on: it keeps them all (pushed on at once, they would have gone to node-e)."""
    monkeypatch.setattr(rebalance, "PUSH_ON_AFTER_S", 0.5)
    four, five = ["node-a", "node-b", "node-c", "node-d"], ["node-a", "node-b", "node-c", "node-d", "node-e"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, four, net)
    e = Node("node-e", tmp_path, [n for n in five if n != "node-e"], net, replicas=R, epoch=2)
    net["node-e"] = e
    await e.catch_up.synced.wait()
    fresh = [u for u in (f"https://x.com/fresh/{i}" for i in range(300))
             if "node-b" in holders(four, u) and "node-b" not in holders(five, u)]
    assert fresh
    await nodes["node-b"].set_membership(wire(five, 2))
    for name in four:  # the others are on the four-node membership of after node-e left
        if name != "node-b":
            await nodes[name].set_membership(wire(four, 3))
    for u in fresh:
        write(nodes[Ownership(four).owner(u)] if Ownership(four).owner(u) != "node-b" else nodes["node-a"], [u])
    await _until(lambda: all(nodes["node-b"].target(u) is not None for u in fresh), "the records on node-b")
    await nodes["node-b"].set_membership(wire(four, 3))
    await asyncio.sleep(1.5)
    assert [u for u in fresh if nodes["node-b"].target(u) is None] == []
    e.crash()
    stop(nodes)


async def test_a_lost_node_s_urls_get_their_new_holder_from_a_survivor(tmp_path) -> None:
    four = ["node-a", "node-b", "node-c", "node-d"]
    three = ["node-a", "node-b", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, four, net)
    nodes.pop("node-c").crash()
    lost = [u for u in URLS if "node-c" in holders(four, u)]
    assert lost
    for s in nodes.values():
        await s.set_membership(wire(three, 2))
    await _until(lambda: not placed(nodes, three), "two copies of every URL again", timeout=20)
    assert sum(s.rebalancing.rebalance_report["pushed"] for s in nodes.values()) >= 2 * len(lost)  # target, page, touch
    stop(nodes)


async def test_a_record_is_dropped_only_after_every_holder_has_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(rebalance, "RETRY_AFTER_S", 0.2)
    monkeypatch.setattr(rebalance, "PUSH_TRIES", 1)
    three, four = ["node-a", "node-b", "node-c"], ["node-a", "node-b", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    d = Node("node-d", tmp_path, three, net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()
    # node-d is up, but not in the network: unreachable from the others
    for name in three:
        await nodes[name].set_membership(wire(four, 2))
    moving = [u for u in URLS if "node-d" in holders(four, u)]
    await asyncio.sleep(0.5)
    for u in moving:  # the node it moves away from keeps it: node-d never acknowledged
        assert where(nodes, u)["target"] == holders(three, u), u
    assert any(s.rebalancing.rebalance_report["state"] != "done" for s in nodes.values())
    net["node-d"] = nodes["node-d"] = d
    await _until(lambda: not placed(nodes, four), "the drop once node-d answers", timeout=20)
    stop(nodes)


async def test_a_store_that_died_mid_walk_resumes_it_when_it_starts_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(rebalance, "PUSH_TRIES", 1)
    three, four = ["node-a", "node-b", "node-c"], ["node-a", "node-b", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    d = Node("node-d", tmp_path, three, net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()  # node-d is up but unreachable: every walk stays owed
    for name in three:
        await nodes[name].set_membership(wire(four, 2))
    await asyncio.sleep(0.3)
    for name in three:  # every store dies mid-walk, and starts again already on the four-node membership
        nodes.pop(name).crash()
    net["node-d"] = nodes["node-d"] = d
    for name in three:
        nodes[name] = net[name] = Node(name, tmp_path, [n for n in four if n != name], net, replicas=R, epoch=2)
    await _until(lambda: not placed(nodes, four), "the resumed walks to finish", timeout=20)
    stop(nodes)


async def test_a_filtered_since_pages_through_every_record_of_a_holder(tmp_path, monkeypatch) -> None:
    """A scan bounded per call (``SCAN_BUDGET``) goes on where it stopped: no record is skipped."""
    from prerender_ray.actors.store import catchup

    monkeypatch.setattr(catchup, "SCAN_BUDGET", 3)
    four = ["node-a", "node-b", "node-c", "node-d"]
    net: dict[str, Node] = {}
    a = Node("node-a", tmp_path, [], net, replicas=R)
    write(a, URLS)
    got: set[bytes] = set()
    after = None
    while True:
        page = await a.since("registry", 0, after, holder="node-d", members=four)
        got.update(key for _, key, _ in page["records"])
        after = page["next"]
        if after is None:
            break
    want = {TARGET + u.encode() for u in URLS if "node-d" in holders(four, u)}
    assert want and got == want
    a.crash()


async def test_a_joiner_whose_catch_up_failed_from_a_peer_pulls_its_share_from_it_later(tmp_path, monkeypatch) -> None:
    """node-b leaves as node-d joins: a URL held by node-b and node-c moves to node-c and node-d. node-c
    keeps it and pushes it to no joiner (a joiner pulls its share), node-b is gone: node-d must pull it
    from node-c, which did not answer during node-d's catch-up. Found by the simulation (seed 3)."""
    no_walk_pushes_to_joiners(monkeypatch)
    three, after = ["node-a", "node-b", "node-c"], ["node-a", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    nodes.pop("node-b").crash()
    only_c = [u for u in URLS if holders(three, u) == {"node-b", "node-c"} and holders(after, u) == {"node-c", "node-d"}]
    assert only_c
    c = net.pop("node-c")  # unreachable during node-d's catch-up
    d = nodes["node-d"] = net["node-d"] = Node("node-d", tmp_path, ["node-a", "node-c"], net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()
    assert d.catch_up.sync_report["sources"] == ["node-a"] and d.catch_up.sync_report["retrying"] == ["node-c"]
    assert [u for u in only_c if d.target(u) is not None] == []
    net["node-c"] = c
    for name in ("node-a", "node-c"):
        await nodes[name].set_membership(wire(after, 2))
    await _until(lambda: not placed(nodes, after), "every record on exactly its holders", timeout=20)
    stop(nodes)


async def test_a_store_back_under_another_membership_drops_what_it_no_longer_holds_and_pulls_its_new_share(
        tmp_path, monkeypatch) -> None:
    """node-c is down while node-d joins and node-c is removed; node-c comes back later, as node-b
    leaves: it starts on a membership it was never part of the change to, with what it held under
    the old one. Its walk from the membership its records were placed under sends away and drops
    what it no longer holds; its catch-up pulls all of its new share, old records too (the others
    count it a joiner and push it nothing, and node-b, which held some of it, is gone). Found by the
    simulation (seed 1, with the stray check on)."""
    from prerender_ray.actors.store import catchup

    monkeypatch.setattr(catchup, "CATCH_UP_MARGIN_MS", 0)  # a restart pulls only what is newer than it holds
    three, with_d, last = ["node-a", "node-b", "node-c"], ["node-a", "node-b", "node-d"], ["node-a", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    nodes.pop("node-c").crash()
    d = nodes["node-d"] = net["node-d"] = Node("node-d", tmp_path, ["node-a", "node-b"], net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()
    for name in ("node-a", "node-b"):
        await nodes[name].set_membership(wire(with_d, 2))
    await _until(lambda: not placed(nodes, with_d), "the placement without node-c", timeout=20)
    kept = [u for u in URLS if "node-c" in holders(three, u) and "node-c" not in holders(last, u)]
    gained = [u for u in URLS if "node-c" not in holders(three, u) and "node-b" in holders(with_d, u)
              and "node-c" in holders(last, u)]
    assert kept and gained
    nodes.pop("node-b").crash()
    for name in ("node-a", "node-d"):
        await nodes[name].set_membership(wire(last, 3))
    nodes["node-c"] = net["node-c"] = Node("node-c", tmp_path, ["node-a", "node-d"], net, replicas=R, epoch=3)
    await _until(lambda: not placed(nodes, last), "every record on exactly its holders", timeout=20)
    stop(nodes)


async def test_a_walk_cut_short_by_a_new_epoch_of_the_same_nodes_is_walked_again(tmp_path, monkeypatch) -> None:
    """node-d joins, unreachable at first; while the others walk, the controller gives the same four
    nodes a new epoch. The walk under the old one stops at its next step (it drops nothing under a
    membership that is gone) and must be walked again under the new one: before, nothing did, and the
    records moving to node-d stayed where they were for good. Found by the simulation (seed 5)."""
    monkeypatch.setattr(rebalance, "RETRY_AFTER_S", 0.2)
    monkeypatch.setattr(rebalance, "PUSH_TRIES", 1)
    three, four = ["node-a", "node-b", "node-c"], ["node-a", "node-b", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    d = nodes["node-d"] = Node("node-d", tmp_path, three, net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()
    for name in three:
        await nodes[name].set_membership(wire(four, 2))
    for name in three:  # the same nodes, a new epoch, while the walks wait on node-d
        await nodes[name].set_membership(wire(four, 3))
    await asyncio.sleep(1.0)
    net["node-d"] = d
    await _until(lambda: not placed(nodes, four), "every record on exactly its holders", timeout=20)
    stop(nodes)


async def test_records_written_under_a_stale_view_reach_a_holder_that_joined_meanwhile(tmp_path) -> None:
    """node-c misses node-d's join (its catch-up pulled from node-c before these writes) and writes
    records it holds with node-b; node-b dies and leaves, and node-c learns the membership of then,
    where node-d holds them with node-c. node-d is no joiner of that change for node-c's walk, yet it
    never pulls them: the walk pushes it what was written since the membership it walks from. Before,
    it pushed a joiner nothing, the records waiting for node-b went with it, and node-d never had
    them. Found by the simulation (seed 6)."""
    three, four, last = ["node-a", "node-b", "node-c"], ["node-a", "node-b", "node-c", "node-d"], ["node-a", "node-c", "node-d"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    await joined(tmp_path, "node-d", three, nodes, net)
    for name in ("node-a", "node-b"):
        await nodes[name].set_membership(wire(four, 2))
    late = [u for u in (f"https://x.com/late/{i}" for i in range(300))
            if holders(three, u) == {"node-b", "node-c"} and holders(last, u) == {"node-c", "node-d"}]
    assert late
    nodes.pop("node-b").crash()
    write(nodes["node-c"], late)  # for node-b, under node-c's view of epoch 1
    for name in ("node-a", "node-c", "node-d"):
        await nodes[name].set_membership(wire(last, 3))
    await _until(lambda: all(v == {"node-c", "node-d"} for u in late for v in where(nodes, u).values()),
                 "the late records on exactly their holders")
    stop(nodes)


async def test_a_record_written_here_after_the_walk_passed_it_goes_to_its_holders_and_leaves(
        tmp_path, monkeypatch) -> None:
    """node-b and node-c died together and come back together; node-a, alone meanwhile, learns the
    three-node membership and walks. Then a write its keeper still routed under the one-node view
    (the keeper learns the change on its own, later) lands here: records node-a no longer holds, after
    its walk passed them. They reach their holders and leave node-a; before, they shipped to the
    holders and stayed here for good. Found by the simulation (seed 2059, two nodes lost and back)."""
    monkeypatch.setattr(rebalance, "PUSH_ON_AFTER_S", 0.1)
    three = ["node-a", "node-b", "node-c"]
    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, [], net, replicas=R)
    write(a, URLS)  # alone: it holds everything
    nodes = {"node-a": a}
    for name in ("node-b", "node-c"):
        nodes[name] = net[name] = Node(name, tmp_path, [n for n in three if n != name], net, replicas=R, epoch=2)
    await a.set_membership(wire(three, 2))
    await _until(lambda: a.rebalancing.rebalance_report["state"] == "done", "node-a's walk")
    late = [u for u in (f"https://x.com/late/{i}" for i in range(100)) if holders(three, u) == {"node-b", "node-c"}]
    assert late
    write(a, late)
    await _until(lambda: all(v == {"node-b", "node-c"} for u in late for v in where(nodes, u).values()),
                 "the late records on exactly their holders", timeout=5)
    await _until(lambda: not placed(nodes, three), "every record on exactly its holders")
    stop(nodes)


async def test_a_stray_whose_push_on_died_with_its_store_is_pushed_on_when_it_starts_again(tmp_path) -> None:
    """node-a writes records it does not hold (its keeper routed them under an older membership) and
    dies before their push on (it waits ``PUSH_ON_AFTER_S``, in memory). It starts again on the same
    membership: the placement it kept on disk says a walk is owed, and the walk sends them on and
    drops them. Before, nothing looked at them again. Found by the simulation (seed 2060)."""
    three = ["node-a", "node-b", "node-c"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    late = [u for u in (f"https://x.com/late/{i}" for i in range(100)) if holders(three, u) == {"node-b", "node-c"}]
    assert late
    write(nodes["node-a"], late)
    await _until(lambda: all(v >= {"node-b", "node-c"} for u in late for v in where(nodes, u).values()),
                 "the late records shipped to their holders")
    nodes.pop("node-a").crash()
    nodes["node-a"] = net["node-a"] = Node("node-a", tmp_path, ["node-b", "node-c"], net, replicas=R)
    await _until(lambda: all(v == {"node-b", "node-c"} for u in late for v in where(nodes, u).values()),
                 "the late records on exactly their holders", timeout=5)
    assert not placed(nodes, three)
    stop(nodes)


async def test_strays_whose_push_on_gave_up_leave_once_their_holder_answers_with_no_change_of_nodes(
    tmp_path, monkeypatch
) -> None:
    """node-a takes records node-b and node-c hold while node-c is down, still a member: their push on
    gives up. The controller's next change is a new epoch of the same nodes, which starts no walk; a
    walk of the membership of then, retried until node-c answers, sends them on and drops them. Before,
    they waited for a walk nothing started and stayed on node-a for good. Found by the simulation
    (seed 1030: a peer's outbox shipped them after node-a's walk, a holder down meanwhile)."""
    monkeypatch.setattr(rebalance, "PUSH_ON_AFTER_S", 0.1)
    monkeypatch.setattr(rebalance, "PUSH_ON_TRIES", 1)
    monkeypatch.setattr(rebalance, "PUSH_TRIES", 1)
    monkeypatch.setattr(rebalance, "RETRY_AFTER_S", 0.2)
    three = ["node-a", "node-b", "node-c"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    late = [
        u
        for u in (f"https://x.com/late/{i}" for i in range(100))
        if holders(three, u) == {"node-b", "node-c"}
    ]
    assert late
    c = net.pop("node-c")  # down a while, still a member
    write(nodes["node-a"], late)
    await asyncio.sleep(1.0)  # the push on tried once (after 0.1 s) and gave up
    assert all(nodes["node-a"].target(u) is not None for u in late)
    for node in nodes.values():
        await node.set_membership(wire(three, 2))
    net["node-c"] = c
    await _until(
        lambda: all(v == {"node-b", "node-c"} for u in late for v in where(nodes, u).values()),
        "the strays on exactly their holders",
        timeout=10,
    )
    assert not placed(nodes, three)
    stop(nodes)


async def test_records_written_while_the_store_knew_no_membership_go_to_their_holders(tmp_path) -> None:
    """node-c starts again cut off from the controller (it knows no membership: alone) and its keeper
    takes writes of URLs node-a and node-b hold. When node-c learns the membership, the same one its
    records were placed under before it died, it walks them: before, it found nothing owed and kept
    them for good. Found by the simulation (seed 2102)."""
    three = ["node-a", "node-b", "node-c"]
    net: dict[str, Node] = {}
    nodes = await seeded(tmp_path, three, net)
    nodes.pop("node-c").crash()
    c = nodes["node-c"] = net["node-c"] = Node("node-c", tmp_path, [], net, replicas=R, epoch=NOBODY)
    await c.catch_up.synced.wait()
    late = [u for u in (f"https://x.com/late/{i}" for i in range(100)) if holders(three, u) == {"node-a", "node-b"}]
    assert late
    write(c, late)
    await c.set_membership(wire(three, 2))
    await _until(lambda: all(v == {"node-a", "node-b"} for u in late for v in where(nodes, u).values()),
                 "the records written alone on exactly their holders", timeout=5)
    assert not placed(nodes, three)
    stop(nodes)


async def test_a_joiner_cut_off_through_its_catch_up_pulls_from_that_peer_once_it_is_back(tmp_path) -> None:
    """node-d joins node-a's two-node cluster while cut off from it: its catch-up fails, and node-a
    counts its records placed under both (it pushes a joiner nothing). node-d dies, and starts again
    under node-c and itself (node-a dropped meanwhile): its pull from node-c succeeds. When node-a is
    back, its walk from the membership it placed its records under takes node-d for a holder that has
    them. node-d still owes node-a the pull: the debt is kept on disk until node-a answers. Before,
    it lived in a retry task that died with the process (or gave up when node-a left), and what only
    node-a held never reached node-d. Found by the simulation (seeds 5000 and 6057)."""
    two, last = ["node-a", "node-d"], ["node-a", "node-c", "node-d"]
    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, [], net, replicas=R)
    write(a, URLS)  # alone: it holds everything
    a_net = net.pop("node-a")  # cut off from node-d
    d = Node("node-d", tmp_path, ["node-a"], net, replicas=R, epoch=2)
    await a.set_membership(wire(two, 2))
    await d.catch_up.synced.wait()
    assert d.catch_up.sync_report["state"] == "no-peer-answered"
    d.crash()
    c = net["node-c"] = Node("node-c", tmp_path, ["node-d"], net, replicas=R, epoch=3)
    d = net["node-d"] = Node("node-d", tmp_path, ["node-c"], net, replicas=R, epoch=3)
    await d.catch_up.synced.wait()
    assert d.catch_up.sync_report["from"] == "node-c" and d.target(URLS[0]) is None
    net["node-a"] = a_net
    nodes = {"node-a": a, "node-c": c, "node-d": d}
    for node in nodes.values():
        await node.set_membership(wire(last, 4))
    await _until(lambda: not placed(nodes, last), "every record on exactly its holders", timeout=20)
    stop(nodes)
