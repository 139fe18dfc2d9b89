"""Membership changes without Ray: rows move to their new owner with their due times and leases
(docs/architecture.md#membership-change)."""

from __future__ import annotations

import asyncio

from prerender_ray.identity.nodes import Ownership
from tests.actors.keeper.test_claims import put_due


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
