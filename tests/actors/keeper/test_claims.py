"""Claims without Ray: the published ready set dealt out as exclusive grants (docs/queue.md#leases)."""

from __future__ import annotations

import json

from prerender_ray.timeutil import minute, now_ms
from tests.actors.keeper.conftest import SITE, close, config


async def put_due(keeper, *paths: str, due: int = 1) -> list[str]:
    urls = [SITE + p for p in paths]
    await keeper.targets.put_targets([{"url": u, "nextRenderTime": due} for u in urls])
    return urls


async def test_a_claim_grants_each_due_key_once_with_what_the_fleet_needs(keepers) -> None:
    k = keepers()
    await k.load()
    urls = await put_due(k, "/a", "/b", "/c")
    k.claims.publish()
    jobs = await k.claims.claim(100)
    keys = {key for u in urls for key in k.conf.rules.keys_of(u)}
    assert {j["id"] for j in jobs} == keys and len(jobs) == len(keys)
    job = jobs[0]
    assert job["url"] == k.conf.rules.url_of(job["id"]) and job["deviceType"] == k.conf.rules.device_of(job["id"])
    assert job["callbackOrigin"] == "http://127.0.0.1:9926" and job["isFromSitemap"] is False
    assert job["expiresAt"] > 0
    for key in keys:
        assert (await k.leases.lease_of(key))["leaseExpiresAt"] == next(j for j in jobs if j["id"] == key)["expiresAt"]
    k.claims.publish()
    assert await k.claims.claim(100) == []  # every key is leased: nothing is granted twice
    assert k.status.current == "empty"


async def test_claim_json_deals_one_ranked_pass_out_in_request_order(keepers) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/a", "/b")
    k.claims.publish()
    first, second = (json.loads(b) for b in await k.claims.claim_json([1, 2], ["w1", "w2"]))
    assert len(first) == 1 and len(second) == 2
    assert not {j["id"] for j in first} & {j["id"] for j in second}


async def test_rows_not_due_yet_are_not_granted(keepers) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/later", due=2**50)
    k.claims.publish()
    assert await k.claims.claim(10) == []


async def test_a_paused_node_grants_nothing_until_resumed(keepers) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/a")
    answer = await k.status.set_pause("node-a", True, "test", "admin")
    assert answer["local"] == {"status": "paused", "paused": True, "source": "node"}
    k.claims.publish()
    assert await k.claims.claim(10) == []
    await k.status.set_pause("node-a", None, "test", "admin")  # inherit: no cluster row, so not paused
    k.claims.publish()
    assert len(await k.claims.claim(10)) == 2


async def test_a_restarted_keeper_never_regrants_a_key_in_flight(keepers, tmp_path) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/a")
    k.claims.publish()
    granted = await k.claims.claim(1)
    assert len(granted) == 1
    await close(k)
    again = keepers()  # the same directories: the rows and the leases come back from RocksDB
    await again.load()
    assert len(again.rows) == 2
    again.claims.publish()
    jobs = await again.claims.claim(10)
    assert [j["id"] for j in jobs] != [] and granted[0]["id"] not in {j["id"] for j in jobs}


async def test_a_paced_revalidation_makes_a_prefix_due_over_its_window_and_nothing_else(keepers) -> None:
    k = keepers()
    await k.load()
    later = 2**50
    blog = await put_due(k, *(f"/blog/{i}" for i in range(60)), due=later)
    shop = await put_due(k, *(f"/shop/{i}" for i in range(20)), due=later)
    now = now_ms()
    answer = await k.targets.revalidate_prefix(SITE + "/blog/", 2 * 3_600_000)
    assert answer == {"node": "node-a", "targets": 60, "revalidating": 120}
    dues = [k.rows.row(key).next_render_time for u in blog for key in k.conf.rules.keys_of(u)]
    assert all(minute(now) <= d < now + 2 * 3_600_000 for d in dues)
    assert len({d // 600_000 for d in dues}) >= 8  # spread over the two hours, not one herd minute
    assert all(k.rows.row(key).next_render_time == later for u in shop for key in k.conf.rules.keys_of(u))
    again = await k.targets.revalidate_prefix(SITE + "/blog/", 2 * 3_600_000)
    assert again["revalidating"] == 0  # due within the window already: nothing delayed, nothing rewritten
    sooner = 40 + sum(1 for d in dues if d > minute(now_ms()))  # /shop/, and what of /blog/ is not due yet
    assert (await k.targets.revalidate_prefix("", 0))["revalidating"] == sooner  # the whole site, now


async def test_jobs_carry_render_options_only_for_routes_that_change_them(keepers) -> None:
    cfg = config(ingress={"routes": [
        {"match": "prefix", "path": "/feed/", "scroll": {"mode": "bottom", "maxSteps": 40}},
        {"match": "prefix", "path": "/chat/", "block": {"hosts": ["Widget.Chat.example."]}},
    ]})
    k = keepers(cfg=cfg)
    await k.load()
    await put_due(k, "/feed/1", "/chat/1", "/plain")
    k.claims.publish()
    jobs = {(j["url"].split("/", 3)[3], j["deviceType"]): j for j in await k.claims.claim(100)}
    feed, chat, plain = jobs[("feed/1", "desktop")], jobs[("chat/1", "desktop")], jobs[("plain", "desktop")]
    assert feed["renderOptions"] == {"scroll": {"mode": "bottom", "maxSteps": 40, "budgetMs": 3000}}
    assert chat["renderOptions"] == {"block": {"hosts": ["widget.chat.example"], "defaults": True}}
    assert set(plain) == {"id", "url", "deviceType", "expiresAt", "callbackOrigin", "isFromSitemap"}  # as ever


async def test_the_fleet_neither_lifts_nor_overrides_an_admins_node_intent(keepers) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/a")
    await k.status.set_pause("node-a", True, "ops", "admin")
    answer = await k.status.set_pause("node-a", None, "renderer", "fleet")
    assert "admin API" in answer["refused"] and "local" not in answer
    again = await k.status.set_pause("node-a", True, "renderer", "fleet")  # already so: nothing written
    assert again["local"]["paused"] is True and "refused" not in again
    k.claims.publish()
    assert await k.claims.claim(10) == []  # still the admin's pause
    await k.status.set_pause("node-a", None, "ops", "admin")
    await k.status.set_pause("node-a", True, "renderer", "fleet")  # the fleet's own pause, its own to lift
    assert (await k.status.set_pause("node-a", None, "renderer", "fleet"))["local"]["paused"] is False
    await k.status.set_pause("node-a", False, "ops", "admin")  # an explicit run: no fleet pause over it
    assert "set to run" in (await k.status.set_pause("node-a", True, "renderer", "fleet"))["refused"]
    k.claims.publish()
    assert len(await k.claims.claim(10)) == 2
