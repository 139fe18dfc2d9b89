"""A joiner's catch-up of its share, one sender per record (``actors/store/catchup.py``,
``storage/placement.share_sender``), without Ray: real stores on RocksDB in temp dirs, reached through
a dict of live stores. Each peer's ``since`` is the real one, tallied."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prerender_ray.actors.store.catchup import HOLDING_MAX
from prerender_ray.identity.nodes import Ownership
from prerender_ray.storage.keys import FRESHNESS, HPTR, TARGET
from prerender_ray.storage.placement import NEVER
from prerender_ray.storage.replication import Clock, Version, unwrap, wrap
from tests.actors.store.test_rebalance import URLS, R, holders, stop, where, wire, write
from tests.actors.store.test_replication import Node, _until

THREE = ["node-a", "node-b", "node-c"]
FOUR = [*THREE, "node-d"]


class Tallied(Node):
    """A store whose answers to a pull are counted: (holder, db, key) -> times sent; and the records
    peers push to it: ("pushed", itself, key)."""

    def __init__(self, *args: Any, sent: Counter, **kw: Any):
        super().__init__(*args, **kw)
        self.sent = sent

    async def since(self, name: str, hlc: int, after: bytes | None, limit: int = 500, holder: str | None = None,
                    *args: Any, **kw: Any) -> dict:
        page = await super().since(name, hlc, after, limit, holder, *args, **kw)
        self.sent.update((holder, self.node, key) for _, key, _ in page["records"])
        return page

    async def apply_remote(self, records: list[list], epoch: int | None = None,
                           membership: dict | None = None) -> int:
        if epoch is not None:  # a peer's (its own pull applies with none)
            self.sent.update(("pushed", self.node, key) for _, key, _ in records)
        return await super().apply_remote(records, epoch, membership)


async def seeded(tmp_path: Path, net: dict[str, Node], sent: Counter) -> dict[str, Node]:
    """Three tallied stores, every URL written by its owner (as the keeper does), and placed."""
    nodes: dict[str, Node] = {}
    for n in THREE:
        nodes[n] = net[n] = Tallied(n, tmp_path, [p for p in THREE if p != n], net, replicas=R, sent=sent)
    for u in URLS:
        write(nodes[Ownership(THREE).owner(u)], [u])
    await _until(lambda: all(v == holders(THREE, u) for u in URLS for v in where(nodes, u).values()),
                 "the three-node placement")
    # Each store's own catch-up at start ended too: one still pulling when a node joins sends it
    # records again, rightly, and the test would count them (it failed so under load).
    await asyncio.wait_for(asyncio.gather(*(n.catch_up.synced.wait() for n in nodes.values())), 30)
    sent.clear()  # the peers' own catch-ups at start
    return nodes


def share(name: str) -> set[bytes]:
    """The per-URL records ``name`` holds among four: target, page and freshness record of each URL."""
    out = set()
    for u in URLS:
        if name in holders(FOUR, u):
            out |= {TARGET + u.encode(), f"{u}|desktop".encode(), FRESHNESS + f"{u}|desktop".encode()}
    return out


def held(node: Node, keys: set[bytes]) -> set[bytes]:
    return {k for k in keys if (node.registry if k.startswith(TARGET) else node.pages).get(k) is not None}


async def test_a_joiner_is_sent_each_record_of_its_share_once_when_every_peer_answers(tmp_path) -> None:
    """Every record of node-d's share is held by two of the three peers: each is sent by one of them,
    once, in the first pass; the second pass sends nothing (nothing reached a peer meanwhile). Before,
    both holders sent it, and the second pass went back 10 minutes: four times each."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    nodes = await seeded(tmp_path, net, sent)
    d = nodes["node-d"] = net["node-d"] = Node("node-d", tmp_path, THREE, net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()
    mine = share("node-d")
    assert mine and held(d, mine) == mine
    to_d = Counter()
    for (holder, _, key), n in sent.items():
        if holder == "node-d":
            to_d[key] += n
    assert set(to_d) == mine  # nothing else
    assert [k for k, n in to_d.items() if n > 1] == []  # and each once
    by_peer = Counter(peer for holder, peer, _ in sent if holder == "node-d")
    assert set(by_peer) == set(THREE)  # the share spread over the peers, not one doing all of it
    assert d.catch_up.sync_report["sources"] == THREE and d.catch_up.sync_report["retrying"] == []
    stop(nodes)


async def test_a_joiner_gets_all_of_its_share_when_the_designated_sender_of_some_records_is_down(tmp_path) -> None:
    """node-a does not answer node-d's catch-up: the records it would have sent come from their
    other holder (each once still), and node-a is asked again later for what it holds."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    nodes = await seeded(tmp_path, net, sent)
    a = net.pop("node-a")  # unreachable
    d = nodes["node-d"] = net["node-d"] = Node("node-d", tmp_path, THREE, net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()
    mine = share("node-d")
    assert held(d, mine) == mine  # every record of the share has a holder that answered
    first_by_a = [u for u in URLS if "node-d" in holders(FOUR, u)
                  and Ownership(THREE).holders(u, R)[0] == "node-a"]
    assert first_by_a  # records node-a was the designated sender of, among them
    to_d = Counter(key for holder, _, key in sent.elements() if holder == "node-d")
    assert set(to_d) == mine and max(to_d.values()) == 1
    assert d.catch_up.sync_report["sources"] == ["node-b", "node-c"] and d.catch_up.sync_report["retrying"] == ["node-a"]
    net["node-a"] = a
    stop(nodes)


async def test_a_joiner_s_share_reaches_it_once_though_the_peers_walk_too(tmp_path) -> None:
    """node-d pulls its share; then the peers learn the four-node membership and walk. The holder
    node-d displaces, and the first holder that keeps a record written within ``JOINER_MARGIN_MS``
    (all of them here), ask node-d which versions it holds (once its catch-up is done) and send it
    none it pulled; the displaced one asks the holder that keeps each record too, and drops its copy
    once both said they hold it. Before, each record of node-d's share reached it three times (its
    pull and two pushes) and its other holder got it again: 1.5 million pushes in a 1M-target join."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    nodes = await seeded(tmp_path, net, sent)
    d = nodes["node-d"] = net["node-d"] = Tallied("node-d", tmp_path, THREE, net, replicas=R, epoch=2, sent=sent)
    await d.catch_up.synced.wait()
    for name in THREE:
        await nodes[name].set_membership(wire(FOUR, 2))
    await _until(lambda: all(v == holders(FOUR, u) for u in URLS for v in where(nodes, u).values()),
                 "every record on exactly its holders among four", timeout=20)
    mine = share("node-d")
    to_d = Counter(key for holder, _, key in sent.elements() if holder == "node-d")
    assert set(to_d) == mine and max(to_d.values()) == 1  # pulled, once each
    assert [key for tag, _, key in sent.elements() if tag == "pushed"] == []  # and pushed to nobody again
    assert sum(nodes[n].rebalancing.rebalance_report.get("held", 0) for n in THREE) >= len(mine)  # asked instead
    stop(nodes)


async def test_a_peer_sends_its_own_writes_that_have_not_reached_the_designated_sender(tmp_path) -> None:
    """node-b writes records whose designated sender for node-d is node-a, and cannot reach node-a
    (a link down): node-a does not have them when node-d pulls, so node-b sends them itself."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    nodes = await seeded(tmp_path, net, sent)
    b = nodes["node-b"]
    b.net = {n: s for n, s in net.items() if n != "node-a"}  # node-b's view of the network: no node-a
    late = [u for u in (f"https://x.com/late/{i}" for i in range(200))
            if Ownership(THREE).holders(u, R) == ("node-a", "node-b") and "node-d" in holders(FOUR, u)]
    assert late
    b.records.commit_local("registry", [(TARGET + u.encode(), b"{}") for u in late])
    assert all(nodes["node-a"].target(u) is None for u in late)
    d = nodes["node-d"] = net["node-d"] = b.net["node-d"] = Node("node-d", tmp_path, THREE, net, replicas=R, epoch=2)
    await d.catch_up.synced.wait()
    assert [u for u in late if d.target(u) is None] == []
    assert {key for holder, peer, key in sent if holder == "node-d" and peer == "node-b"} >= {
        TARGET + u.encode() for u in late}
    stop(nodes)


async def test_a_second_pass_sends_what_reached_the_peer_since_the_first_and_nothing_else(tmp_path) -> None:
    """The peer's answer carries a mark; asked again with it, it sends what it accepted since (however
    old its version: it may sit behind the first pass's scan), nothing when nothing came, and from
    the given version when the mark is not its own (it restarted)."""
    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, [], net, replicas=R)
    write(a, URLS)
    await a.catch_up.synced.wait()
    first = await a.since("registry", 0, None, 10_000)
    assert len(first["records"]) == len(URLS) and first["synced"] is True
    mark = first["arrivals"]
    assert (await a.since("registry", 0, None, 10_000, arrived=mark))["records"] == []
    old = Clock("node-b", lambda: 1_000).now()  # versioned before anything node-a holds
    assert a.records.commit_remote("registry", [(TARGET + b"https://x.com/old", wrap(old, b"{}"))]) == 1
    again = await a.since("registry", 0, None, 10_000, arrived=mark)
    assert [key for _, key, _ in again["records"]][0] == TARGET + b"https://x.com/old"
    for foreign in (["elsewhere", 0, mark[2]], [*mark[:2], mark[2] + 10**6], [*mark[:2], "0"]):
        assert a.catch_up.arrivals.lowest_since(foreign) is None
        assert len((await a.since("registry", 0, None, 10_000, arrived=foreign))["records"]) == len(URLS) + 1
    assert a.catch_up.arrivals.lowest_since(a.catch_up.arrivals.mark()) == NEVER
    a.crash()


def test_a_mark_older_than_the_spans_kept_is_not_trusted(monkeypatch) -> None:
    """Arrivals keep a bounded number of spans between marks: a mark from before the oldest kept one
    cannot say what arrived since, so the peer falls back to the margin (None)."""
    from prerender_ray.actors.store import pulls

    monkeypatch.setattr(pulls, "ARRIVALS_KEPT", 2)
    seen = pulls.Arrivals(0.0)
    old = seen.mark()
    for low in (50, 40, 30):
        seen.accepted(low)
        seen.accepted(low + 1)  # the same span: no mark in between
        recent = seen.mark()
    assert seen.lowest_since(old) is None
    assert seen.lowest_since(recent) == NEVER
    seen.accepted(70)
    seen.accepted(60)
    assert seen.lowest_since(recent) == 60


async def test_holding_answers_by_version_and_refuses_a_malformed_or_oversized_question(tmp_path) -> None:
    """A walk's ask: held at that version or one that wins over it (a tie of clocks goes by writer,
    as a write does); not held, or older: no. Bad input is a ValueError, before anything is read."""
    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, [], net, replicas=R)
    write(a, URLS[:1])
    await a.catch_up.synced.wait()
    for name, key in (("registry", TARGET + URLS[0].encode()), ("pages", f"{URLS[0]}|desktop".encode())):
        db = a.registry if name == "registry" else a.pages
        v = unwrap(db.get(key))[0]
        asked = [[key, v.hlc, v.node], [key, v.hlc - 1, "node-z"], [key, v.hlc + 1, "node-a"],
                 [key, v.hlc, "node-z"], [key, v.hlc, "node-0"], [b"absent", 1, "node-a"]]
        assert await a.holding(name, asked) == [True, True, False, False, True, False]
    for bad in ([[b"k", "1", "n"]], [[b"k", 1]], [["k", 1, "n"]], [[b"k", 1, "n"]] * (HOLDING_MAX + 1)):
        with pytest.raises(ValueError):
            await a.holding("registry", bad)
    with pytest.raises(ValueError):
        await a.holding("leases", [])
    a.crash()


# ----------------------------------------------------- every node holds everything (R >= nodes)


async def full(tmp_path: Path, net: dict[str, Node], sent: Counter, b_reaches: dict[str, Node]) -> tuple[Node, Node]:
    """node-c, alone at first, holds every URL; node-b joined it over ``b_reaches`` (its view of the
    network): an empty one cuts it off, so its catch-up had no answer and it owes node-c a pull."""
    c = net["node-c"] = Tallied("node-c", tmp_path, [], net, sent=sent)
    write(c, URLS)
    await c.catch_up.synced.wait()
    b = net["node-b"] = Tallied("node-b", tmp_path, ["node-c"], b_reaches, epoch=2, sent=sent)
    await b.catch_up.synced.wait()
    sent.clear()
    return b, c


def urls_held(node: Node) -> list[str]:
    return [u for u in URLS if node.target(u) is not None and node.page(f"{u}|desktop") is not None]


async def test_a_full_copy_is_not_taken_from_a_peer_that_had_not_caught_up_itself(tmp_path) -> None:
    """Every node holds everything: node-d pulls from the first peer that answers, node-b, which was
    cut off through its own catch-up and holds nothing; node-b says so in its answer, so node-d pulls
    node-c too. Before, node-d took node-b's answer for everything and counted its pull from node-c
    paid: what only node-c held never reached it (node-c pushes a joiner nothing it held before)."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    b, c = await full(tmp_path, net, sent, {})
    assert b.catch_up.sync_report["state"] == "no-peer-answered" and urls_held(b) == []
    d = net["node-d"] = Node("node-d", tmp_path, ["node-b", "node-c"], net, epoch=3)
    await d.catch_up.synced.wait()
    assert urls_held(d) == URLS
    assert (await b.since("registry", 0, None))["synced"] is False
    assert d.catch_up.sync_report["sources"] == ["node-b", "node-c"] and d.catch_up.owed.load() == {}
    stop({"b": b, "c": c, "d": d})


async def test_a_full_copy_owed_by_a_peer_that_did_not_answer_is_pulled_once_it_answers(tmp_path) -> None:
    """As above, and node-c does not answer node-d's catch-up at first: node-d keeps owing it the
    pull (its answer from node-b does not pay it) and pulls once node-c answers."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    b, c = await full(tmp_path, net, sent, {})
    d_reaches = {"node-b": b}
    d = Node("node-d", tmp_path, ["node-b", "node-c"], d_reaches, epoch=3)
    await d.catch_up.synced.wait()
    assert urls_held(d) == [] and list(d.catch_up.owed.load()) == ["node-c"]
    assert d.catch_up.sync_report["retrying"] == ["node-c"]
    assert (await d.since("registry", 0, None))["synced"] is False  # nobody takes it for caught up either
    d_reaches["node-c"] = c
    await _until(lambda: not d.catch_up.owed.load(), "the pull owed to node-c", timeout=20)
    assert urls_held(d) == URLS and d.catch_up.sync_report["retrying"] == []
    stop({"b": b, "c": c, "d": d})


async def test_a_peer_s_debt_to_a_node_outside_the_membership_passes_to_the_node_that_pulls_from_it(
        tmp_path) -> None:
    """node-b owes node-c a pull (cut off through its catch-up) when node-c leaves; node-d joins and
    pulls everything from node-b, which lacks all node-c held but, owing no member, says it has
    caught up. node-c back, node-b pays its debt, and node-d pulls from node-c too: node-b's answer
    passed the debt on. Before, node-d owed nobody and nothing sent it what only node-c held (a
    holder under the smaller membership already, no walk pushes it to node-d: simulation seed 2074
    with ``replicas=3``)."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    b_reaches: dict[str, Node] = {}
    b, c = await full(tmp_path, net, sent, b_reaches)
    await b.set_membership(wire(["node-b"], 3))  # node-c leaves
    d = net["node-d"] = b_reaches["node-d"] = Node("node-d", tmp_path, ["node-b"], net, epoch=4)
    await d.catch_up.synced.wait()
    assert urls_held(d) == [] and d.catch_up.sync_report["sources"] == ["node-b"]
    assert d.catch_up.owed.load() == {"node-c": 0}
    b_reaches["node-c"] = c
    for node in (b, c, d):
        await node.set_membership(wire(["node-b", "node-c", "node-d"], 5))
    await _until(lambda: urls_held(b) == URLS and urls_held(d) == URLS, "node-c's records on node-b and node-d",
                 timeout=20)
    await _until(lambda: not d.catch_up.owed.load(), "node-d's debt to node-c paid")
    stop({"b": b, "c": c, "d": d})


async def test_a_store_that_owes_a_member_a_pull_has_not_caught_up_when_it_holds_a_share(tmp_path) -> None:
    """``replicas=3``: node-b joined node-c cut off (it owes node-c a pull) and node-c was dropped, so
    node-b's catch-up has no peer left to retry. Back in a membership of four, node-b still owes
    node-c, now a member, and says it has not caught up: node-d's catch-up takes from node-c the
    records of its share node-b was to send (node-b lacks them). Before, a store holding a share
    went by the peers its catch-up left to retry (none): node-d took node-b's answer for those
    records and never got them, node-b got them later from its own pull, and no walk pushed them
    to node-d (simulation seed 9073 with 5 nodes and ``replicas=3``)."""
    net: dict[str, Node] = {}
    c = net["node-c"] = Node("node-c", tmp_path, [], net, replicas=3)
    write(c, URLS)
    await c.catch_up.synced.wait()
    b_reaches: dict[str, Node] = {}
    b = net["node-b"] = Node("node-b", tmp_path, ["node-c"], b_reaches, replicas=3, epoch=2)
    await c.set_membership(wire(["node-b", "node-c"], 2))  # every node holds everything
    await b.catch_up.synced.wait()
    await b.set_membership(wire(["node-b"], 3))  # node-c dropped
    await _until(lambda: b.catch_up.sync_report["retrying"] == [], "node-b's retries to end with node-c gone")
    assert b.catch_up.owed.load() == {"node-c": 0} and urls_held(b) == []
    four = ["node-b", "node-c", "node-d", "node-e"]  # node-e down
    d = net["node-d"] = b_reaches["node-d"] = Node("node-d", tmp_path, ["node-b", "node-c", "node-e"], net,
                                                   replicas=3, epoch=5)
    await d.catch_up.synced.wait()
    held = {u: Ownership(four).holders(u, 3) for u in URLS}
    # node-b would send these (it ranks before node-c among their holders) and node-c keeps them
    assert [u for u, h in held.items() if "node-e" not in h and h.index("node-b") < h.index("node-c")]
    mine = [u for u, h in held.items() if "node-d" in h]
    assert [u for u in mine if d.target(u) is None or d.page(f"{u}|desktop") is None] == []
    assert (await b.since("registry", 0, None))["synced"] is False  # on the four's membership, owing node-c
    b_reaches["node-c"] = c
    await _until(lambda: not b.catch_up.owed.load(), "node-b's pull from node-c", timeout=20)
    stop({"b": b, "c": c, "d": d})


async def test_a_full_copy_is_taken_from_one_peer_when_it_had_caught_up(tmp_path) -> None:
    """The usual join: node-b caught up from node-c, so node-d's pull from node-b pays what it owes
    node-c too, and node-c sends it nothing (a pull from every peer would copy everything N times)."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    b, c = await full(tmp_path, net, sent, net)
    assert urls_held(b) == URLS and (await b.since("registry", 0, None))["synced"] is True
    sent.clear()
    d = net["node-d"] = Node("node-d", tmp_path, ["node-b", "node-c"], net, epoch=3)
    await d.catch_up.synced.wait()
    assert urls_held(d) == URLS and d.catch_up.owed.load() == {}
    by_peer = Counter(peer for holder, peer, _ in sent.elements() if holder != "pushed")
    assert set(by_peer) == {"node-b"} and d.catch_up.sync_report["from"] == "node-b"
    stop({"b": b, "c": c, "d": d})


async def test_a_full_copy_from_a_caught_up_peer_brings_the_writes_that_have_not_reached_it_yet(tmp_path) -> None:
    """Every node holds everything: node-c writes while cut off from node-b (the records wait in its
    outbox for node-b), and node-d joins and pulls from node-b, caught up itself. node-c ships only to
    the members it knew when it wrote, so it sends node-d its own writes node-b lacks, and only those.
    Before, node-b's pull paid node-c's debt too and those records never reached node-d (simulation
    seeds 2009 and 2026 with ``replicas=5``; tests/sim ``full_copy_while_a_write_is_on_its_way``)."""
    net: dict[str, Node] = {}
    sent: Counter = Counter()
    b, c = await full(tmp_path, net, sent, net)
    c.stores.net = {}  # node-c reaches nobody from here on (node-d reaches it)
    await c.set_membership(wire(["node-b", "node-c"], 2))
    new = [f"https://x.com/new/{i}" for i in range(5)]
    write(c, new)
    assert c.shipping.unshipped_from("node-b") != NEVER
    d = net["node-d"] = Node("node-d", tmp_path, ["node-b", "node-c"], net, epoch=3)
    await d.catch_up.synced.wait()
    assert all(d.target(u) is not None and d.page(f"{u}|desktop") is not None for u in new)
    assert urls_held(d) == URLS and d.catch_up.owed.load() == {}
    from_c = {key for _, peer, key in sent.elements() if peer == "node-c"}
    assert from_c == {k for u in new for k in (TARGET + u.encode(), f"{u}|desktop".encode(),
                                               FRESHNESS + f"{u}|desktop".encode())}
    with pytest.raises(ValueError, match="unshipped_to"):
        await c.since("registry", 0, None, unshipped_to=["node-b"])  # type: ignore[arg-type]
    stop({"b": b, "c": c, "d": d})


async def test_a_writer_sends_its_writes_held_up_for_longer_than_the_margin_too(tmp_path, monkeypatch) -> None:
    """As above, node-d back from a restart: it pulls from the margin before the newest record it
    holds (none here), newer than node-c's writes that wait for node-b. node-c sends them all the
    same: what has not reached node-b is not in what node-d held either. Before, node-c sent only its
    writes from the margin on (simulation seed 2005 with ``replicas=5``, once the above was fixed)."""
    from prerender_ray.actors.store import catchup

    monkeypatch.setattr(catchup, "CATCH_UP_MARGIN_MS", 0)
    net: dict[str, Node] = {}
    b, c = await full(tmp_path, net, Counter(), net)
    d = net["node-d"] = Node("node-d", tmp_path, ["node-b", "node-c"], net, epoch=3, skew_ms=60_000)
    await d.catch_up.synced.wait()
    c.stores.net = {}  # node-c reaches nobody from here on
    await c.set_membership(wire(["node-b", "node-c", "node-d"], 3))
    new = [f"https://x.com/new/{i}" for i in range(5)]
    write(c, new)
    write(d, ["https://x.com/later"])  # a minute ahead (its clock): newer than node-c's writes
    d.crash()
    d = net["node-d"] = Node("node-d", tmp_path, ["node-b", "node-c"], net, epoch=3)
    await d.catch_up.synced.wait()
    assert d.catch_up.sync_report["since"] > unwrap(c.registry.get(TARGET + new[-1].encode()))[0].hlc
    assert all(d.target(u) is not None and d.page(f"{u}|desktop") is not None for u in new)
    stop({"b": b, "c": c, "d": d})


async def test_a_tie_of_clocks_is_answered_from_the_page_pointer_as_from_the_page(tmp_path) -> None:
    """A page's pointer names its writer: a tie of clocks (``holding``, a duplicate pushed again) is
    decided without reading the 30 KB page, with the answers the page gives. A pointer an older
    version wrote (the hlc alone, or without the writer) leaves the page to read, and answers the same."""
    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, [], net)
    write(a, URLS[:2])
    await a.catch_up.synced.wait()
    theirs = f"{URLS[1]}|desktop".encode()  # a peer's version of it, accepted over ours
    v1 = unwrap(a.pages.get(theirs))[0]
    assert a.records.commit_remote("pages", [(theirs, wrap(Version(v1.hlc + 1, "node-m"), b"<html>m"))]) == 1
    ours = f"{URLS[0]}|desktop".encode()
    cases = []
    for key in (ours, theirs):
        v = unwrap(a.pages.get(key))[0]
        cases += [[key, v.hlc, v.node], [key, v.hlc, "node-z"], [key, v.hlc, "node-0"], [key, v.hlc - 1, "node-z"],
                  [key, v.hlc + 1, "node-0"]]
    answers = [True, False, True, True, False] * 2
    assert await a.holding("pages", cases) == answers
    body = {k: a.pages.get(k) for k in (ours, theirs)}
    a.pages.write([(ours, None), (theirs, None)])  # the bodies gone, the pointers left: never read
    assert await a.holding("pages", cases) == answers
    a.pages.write(list(body.items()))
    pointers = {k: a.pages.get(HPTR + k) for k in (ours, theirs)}
    for older in (9, 8):  # without the writer, then the hlc alone
        a.pages.write([(HPTR + k, p[:older]) for k, p in pointers.items()])
        assert await a.holding("pages", cases) == answers
        # a duplicate is not applied again, a tie is won by the greater writer: as the page says
        again = [(k, a.pages.get(k)) for k in (ours, theirs)]
        assert a.records.commit_remote("pages", again) == 0
    a.pages.write([(HPTR + k, p) for k, p in pointers.items()])
    assert a.records.commit_remote("pages", [(k, a.pages.get(k)) for k in (ours, theirs)]) == 0
    v = unwrap(a.pages.get(ours))[0]
    assert a.records.commit_remote("pages", [(ours, wrap(Version(v.hlc, "node-0"), b"x"))]) == 0
    assert a.records.commit_remote("pages", [(ours, wrap(Version(v.hlc, "node-z"), b"z"))]) == 1
    assert a.page(ours.decode()) == b"z" and a.pages.get(HPTR + ours)[9:] == b"node-z"
    a.crash()
