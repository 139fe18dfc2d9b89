"""The store's one membership (``Members.offer``): only a newer epoch replaces it, and records
that move between stores carry the sender's epoch: a receiver on a newer one refuses them
(``StaleEpoch``), the sender refreshes and sends again; a receiver on an older one refreshes first."""

from __future__ import annotations

from typing import Any

import pytest

from prerender_ray.identity.membership import Membership, StaleEpoch
from prerender_ray.storage.keys import TARGET
from prerender_ray.storage.replication import Clock, wrap
from tests.actors.store.test_replication import Node, _until

TWO = ["node-a", "node-b"]
THREE = ["node-a", "node-b", "node-c"]


class Said:
    """A logger that keeps what was said."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))

    warning = error = debug = info


def record(url: str, node: str = "node-b") -> list:
    return ["registry", TARGET + url.encode(), wrap(Clock(node).now(), b'{"u": 1}')]


async def test_only_a_newer_membership_replaces_the_one_held_and_a_malformed_one_changes_nothing(tmp_path) -> None:
    a = Node("node-a", tmp_path, ["node-b"], {}, epoch=5)
    assert await a.set_membership(Membership.of(4, THREE).to_wire()) == {"changed": False, "epoch": 5}
    assert await a.set_membership(Membership.of(5, THREE).to_wire()) == {"changed": False, "epoch": 5}
    for bad in ({"epoch": 9, "nodes": []}, {"epoch": -1, "nodes": [{"name": "node-a"}]}, {"nodes": THREE},
                {"epoch": 9, "nodes": [{"name": "../x"}]}, {"epoch": True, "nodes": [{"name": "node-a"}]}):
        with pytest.raises(ValueError):
            await a.set_membership(bad)
    assert a.members.view.epoch == 5 and a.members.peers == ["node-b"]
    assert await a.set_membership(Membership.of(6, THREE).to_wire()) == {"changed": True, "epoch": 6}
    assert sorted(a.members.peers) == ["node-b", "node-c"] and sorted(a.shipping.outbox) == ["node-b", "node-c"]
    a.crash()


async def test_records_sent_under_an_older_membership_are_refused_and_a_receiver_behind_refreshes_first(
        tmp_path) -> None:
    controller = [Membership.of(2, TWO)]

    async def fetch() -> Membership:
        return controller[0]

    net: dict[str, Node] = {}
    a = Node("node-a", tmp_path, ["node-b"], net, epoch=2, fetch=fetch)
    b = Node("node-b", tmp_path, ["node-a"], net, epoch=1)  # no controller to ask: stays behind
    with pytest.raises(StaleEpoch) as refused:
        await a.apply_remote([record("https://x.com/1")], 1)
    assert (refused.value.caller, refused.value.receiver) == (1, 2)
    assert a.target("https://x.com/1") is None  # nothing written
    controller[0] = Membership.of(3, TWO)
    assert await a.apply_remote([record("https://x.com/2")], 3) == 1  # a newer sender: refreshed, then applied
    assert a.members.view.epoch == 3
    b.crash()
    a.crash()


async def test_a_sender_refused_as_stale_refreshes_sends_again_and_says_so_once_per_peer_and_epoch(
        tmp_path) -> None:
    asked: list[int] = []

    async def fetch() -> Membership:  # the controller does not answer the first time
        asked.append(1)
        if len(asked) == 1:
            raise ConnectionError("the controller is away")
        return Membership.of(2, TWO)

    net: dict[str, Node] = {}
    a = net["node-a"] = Node("node-a", tmp_path, ["node-b"], net, epoch=2)
    b = Node("node-b", tmp_path, ["node-a"], net, epoch=1, fetch=fetch)  # it missed a push
    b.members.log = said = Said()
    net["node-b"] = b
    b.records.commit_local("registry", [(TARGET + b"https://x.com/1", b'{"u": 1}')])
    await _until(lambda: a.target("https://x.com/1") is not None, "the record, sent again under epoch 2")
    assert b.members.view.epoch == 2 and len(asked) >= 2
    assert [kw for event, kw in said.lines if "newer membership" in event] == [{"peer": "node-a", "ours": 1, "theirs": 2}]
    for e in (StaleEpoch(1, 2), StaleEpoch(2, 3), StaleEpoch(2, 3)):
        await b.members.refused("node-a", e)
    await b.members.refused("node-c", StaleEpoch(2, 3))
    assert [(kw["peer"], kw["theirs"]) for event, kw in said.lines if "newer membership" in event] == [
        ("node-a", 2), ("node-a", 3), ("node-c", 3)]
    a.crash()
    b.crash()


async def test_a_store_cut_off_from_the_controller_takes_a_newer_membership_a_call_carries_and_ships_to_the_joiner(
        tmp_path) -> None:
    """Before: a writer that could not reach the controller answered a joiner's pull under the
    joiner's epoch but stayed on its own, so its later writes went only to the members it knew."""

    async def away() -> Membership:
        raise ConnectionError("the controller is on the other side of a partition")

    net: dict[str, Node] = {}
    a = Node("node-a", tmp_path, ["node-b"], net, epoch=2, fetch=away)
    c = Node("node-c", tmp_path, ["node-a", "node-b"], net, epoch=3)
    net.update({"node-a": a, "node-c": c})
    three = Membership.of(3, THREE)
    for bad in (Membership.of(4, THREE).wire, {"epoch": 3, "nodes": []}):  # not of the call's epoch; malformed
        with pytest.raises(ValueError):
            await a.since("registry", 0, None, holder="node-c", epoch=3, membership=bad)
    assert a.members.view.epoch == 2
    await a.since("registry", 0, None, holder="node-c", epoch=3, membership=three.wire)  # the joiner's pull
    assert a.members.view.epoch == 3 and sorted(a.members.peers) == ["node-b", "node-c"]
    a.records.commit_local("registry", [(TARGET + b"https://x.com/later", b'{"url": 1}')])
    await _until(lambda: c.target("https://x.com/later") == b'{"url": 1}', "the later write to reach the joiner")
    c.crash()
    a.crash()
