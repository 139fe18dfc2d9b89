"""The membership value and the one place a process holds it (prerender_ray/identity/membership.py)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.identity.membership import (
    NOBODY,
    Confirmations,
    Membership,
    MembershipView,
    StaleEpoch,
    next_epoch,
)
from prerender_ray.identity.nodes import NodeInfo, Ownership

A = NodeInfo("node-a", "127.0.0.1", 8001)
B = NodeInfo("node-b", "127.0.0.1", 8002)
C = NodeInfo("node-c", "127.0.0.1", 8003)


def test_a_membership_is_sorted_and_its_ownership_is_that_of_its_names() -> None:
    m = Membership(7, (C, A, B))
    assert m.names == ("node-a", "node-b", "node-c") and m.nodes == (A, B, C)
    url = "https://shop.test/p/1"
    assert m.owner(url) == Ownership(["node-a", "node-b", "node-c"]).owner(url)


def test_a_node_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        Membership(1, (A, NodeInfo("node-a", "10.0.0.1", 1)))


def test_the_wire_form_round_trips_and_refuses_what_is_malformed() -> None:
    m = Membership(12, (A, B))
    assert Membership.from_wire(m.to_wire()) == m
    for bad in ({}, {"epoch": -1, "nodes": [A.__dict__]}, {"epoch": True, "nodes": [A.__dict__]},
                {"epoch": 1, "nodes": []}, {"epoch": 1, "nodes": "node-a"}, {"epoch": 1, "nodes": [1]},
                {"epoch": 1, "nodes": [{"name": "../etc", "host": "h", "port": 1}]},
                {"epoch": 1, "nodes": [{"host": "h", "port": 1}]}, [], "x"):
        with pytest.raises(ValueError):
            Membership.from_wire(bad)  # type: ignore[arg-type]


def test_a_view_moves_only_forward_and_tells_its_listeners_before_offer_returns() -> None:
    view = MembershipView.alone(A)
    assert view.epoch == NOBODY and view.current.names == ("node-a",)
    seen: list[tuple[int, int]] = []
    view.listen(lambda before, after: seen.append((before.epoch, after.epoch)))
    assert view.offer(Membership(5, (A, B)))
    assert not view.offer(Membership(4, (A, B, C)))  # a late push of an older list
    assert not view.offer(Membership(5, (A, C)))  # the same epoch never replaces
    assert view.current.names == ("node-a", "node-b") and seen == [(NOBODY, 5)]
    assert view.offer(Membership(9, (A,)))
    assert seen == [(NOBODY, 5), (5, 9)]


def test_a_call_under_an_older_epoch_is_refused_with_both_epochs() -> None:
    view = MembershipView(Membership(8, (A, B)))
    view.check(8)
    view.check(9)  # a newer caller is the receiver's cue to refresh, not a refusal
    with pytest.raises(StaleEpoch) as e:
        view.check(7, "adopt")
    assert (e.value.caller, e.value.receiver) == (7, 8) and "adopt" in str(e.value)
    again = pickle.loads(pickle.dumps(e.value))  # crosses processes intact
    assert (again.caller, again.receiver) == (7, 8)


@given(st.lists(st.integers(min_value=0, max_value=10**6), max_size=40))
def test_whatever_order_offers_arrive_in_the_view_ends_on_the_highest(epochs: list[int]) -> None:
    view = MembershipView.alone(A)
    for e in epochs:
        view.offer(Membership(e, (A, B) if e % 2 else (A,)))
    assert view.epoch == max(epochs, default=NOBODY)


def test_a_controller_placed_again_starts_above_the_epochs_it_forgot() -> None:
    assert next_epoch(5, 1_000) == 1_000
    assert next_epoch(2_000, 1_000) == 2_001


def test_a_node_ray_lost_stays_a_member_until_its_trust_ran_out_and_is_not_confirmed_meanwhile() -> None:
    c = Confirmations(now_ms=1_000, trust_ms=20_000)
    # a controller that just started: one placed before it, cut off from Ray, may have answered b until
    # a trust after this one's start
    assert c.held(["a", "b"], ["a"], 1_000) == ["b"]
    assert c.confirm("a", 5_000) and not c.confirm("b", 5_000)  # b is leaving: its checks are not answered
    assert c.held(["a", "b"], ["a"], 40_999) == ["b"] and c.held(["a", "b"], ["a"], 41_000) == []
    c = Confirmations(now_ms=0, trust_ms=20_000)
    c.held(["a", "b"], ["a", "b"], 30_000)  # Ray's list, read now
    assert c.confirm("b", 30_000)
    assert c.held(["a", "b"], ["a"], 49_999) == ["b"] and c.leaves_at("b") == 50_000
    assert c.held(["a", "b"], ["a", "b"], 50_000) == [] and c.confirm("b", 50_000)  # listed again: answered
    assert c.held(["a"], ["a"], 60_000) == [] and c.confirm("b", 60_000)  # gone from the membership: answered


def test_a_controller_that_cannot_read_rays_node_list_confirms_nobody_after_a_trust() -> None:
    """Cut off from Ray's head with a minority, it cannot see Ray declare them dead while Ray places
    another controller on the head's side: the minority's trust must run out as if cut off from it."""
    c = Confirmations(now_ms=1_000, trust_ms=10_000)
    assert c.confirm("a", 10_999)  # a controller that starts lists Ray within its first pass
    assert not c.confirm("a", 11_000) and not c.listed_lately(11_000)
    c.held(["a"], ["a"], 12_000)
    assert c.confirm("a", 21_999) and not c.confirm("a", 22_000)
    c.held(["a"], ["a"], 5_000)  # a late answer to an older read moves nothing back
    assert c.listed_at == 12_000
    c.held(["a"], ["a"], 30_000)  # listing again: confirmed again
    assert c.confirm("a", 30_000)
