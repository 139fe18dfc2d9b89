"""A stopping keeper drains, without Ray (docs/queue.md#stopping-a-node): paused first and for good,
results for what it granted still applied, the wait bounded, and a lease it could not wait for kept
across the restart."""

from __future__ import annotations

import asyncio

from prerender_ray.storage.keys import QUEUE_STATUS
from prerender_ray.storage.registry import decode_json
from tests.actors.keeper.conftest import close
from tests.actors.keeper.test_claims import put_due
from tests.actors.keeper.test_results import HTML, rendered


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_stop_says_paused_grants_nothing_more_and_waits_for_the_results_of_what_it_granted(keepers) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/a", "/b")
    k.claims.publish()
    early = asyncio.create_task(k.claims.claim(1))  # on its way to the lease table as the stop begins
    await asyncio.sleep(0)
    stop = asyncio.create_task(k.drain(60_000))
    [job] = await asyncio.wait_for(early, 10)
    await until(lambda: k.status.draining)
    assert k.status.current == "paused" and k.state()["draining"] is True
    row = decode_json(k.store.registry[QUEUE_STATUS + b"node-a"])  # type: ignore[attr-defined]
    assert row["status"] == "paused"  # what GET /queue_status reads, written before the wait
    k.claims.publish()
    assert await k.claims.claim(10) == []  # three due keys left, none granted
    await k.status.set_pause("node-a", False, "an admin", "admin")  # neither a resume nor the status sync lifts it
    await k.status.sync()
    assert k.status.current == "paused" and await k.claims.claim(10) == []
    await asyncio.sleep(0.5)  # two looks at the lease table: the granted job is still out
    assert not stop.done()
    answer = await k.results.process(rendered(job["id"], job["url"]), HTML)
    assert answer["outcome"] == "rendered"  # a result for a granted lease is applied while draining
    report = await asyncio.wait_for(stop, 10)
    assert report == {"node": "node-a", "ended": "drained", "waitedMs": report["waitedMs"], "awaitingResults": 0}


async def test_a_result_the_drain_could_not_wait_for_is_accepted_after_the_restart(keepers) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/slow")
    k.claims.publish()
    jobs = await k.claims.claim(10)
    assert len(jobs) == 2
    report = await asyncio.wait_for(k.drain(300), 10)
    assert report["ended"] == "deadline" and report["awaitingResults"] == 2
    assert (await k.drain(300))["ended"] == "deadline"  # again: nothing new, bounded again
    await close(k)
    again = keepers()  # the same directories: the leases come back from RocksDB
    await again.load()
    assert again.status.current != "paused" and not again.status.draining  # a start says its real status
    again.claims.publish()
    assert await again.claims.claim(10) == []  # nothing re-granted early
    for job in jobs:
        assert (await again.results.process(rendered(job["id"], job["url"]), HTML))["outcome"] == "rendered"
