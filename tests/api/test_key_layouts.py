"""A device-first cache key with a delimiter that occurs in every URL (``:``), end to end on two
nodes (a ``LocalCluster``, over real HTTP): claims, results, reschedules, suppression and rows routed
to another node's keeper all find the right URL (one key parser, cachekeys.KeyFormat)."""

from __future__ import annotations

import time

import httpx
import pytest

from prerender_ray.identity.nodes import Ownership
from prerender_ray.timeutil import DAY_MS, HOUR_MS, next_slot, now_ms
from tests.localcluster import LocalCluster
from tests.support import claim, post_result, put_target, schedule, wait_for

OWNERS = Ownership(["node-a", "node-b"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = LocalCluster.start(tmp_path_factory.mktemp("layout") / "data", {
        "cacheKey": {"attributes": ["deviceType", "url"], "delimiter": ":"},
        "ingress": {"routes": [{"match": "prefix", "path": "/hourly/", "renderInterval": 6 * HOUR_MS}]},
        "render": {"reconcile": {"startDelay": "1h"}},
    }, names=("node-a", "node-b"))
    yield d
    d.stop()


def take_everywhere(d, keys: list[str]) -> dict[str, dict]:
    """Claim from every node until each of ``keys`` was granted (a node grants the keys it owns)."""
    got: dict[str, dict] = {}

    def step() -> bool:
        for base in d.urls.values():
            got.update({j["id"]: j for j in claim(base, 25, headers={"x-worker-id": "w1"})})
        return all(k in got for k in keys)

    wait_for(step, timeout=20, interval=0.3, what=f"grants of {keys}")
    return got


def test_a_device_first_key_with_a_colon_delimiter_works_end_to_end(cluster) -> None:
    d = cluster
    hourly, daily, gone = ("https://shop.example/hourly/a:b", "https://shop.example/plain/x",
                           "https://shop.example/gone")
    keys = {u: put_target(d.url, u, nextRenderTime=1)["cacheKeys"] for u in (hourly, daily, gone)}
    assert keys[hourly] == [f"desktop:{hourly}", f"mobile:{hourly}"]
    jobs = take_everywhere(d, [k for ks in keys.values() for k in ks])
    job = jobs[keys[hourly][0]]
    assert (job["url"], job["deviceType"]) == (hourly, "desktop")
    assert job["callbackOrigin"] == d.urls[OWNERS.owner(hourly)]
    before = time.time() * 1000
    for url in (hourly, daily):
        for key in keys[url]:
            assert post_result(jobs[key], worker="w1").status_code == 204
    for url, cadence in ((hourly, 6 * HOUR_MS), (daily, DAY_MS)):
        for key in keys[url]:
            row = schedule(d.url, key)
            assert row["leased"] is False and row["effectiveInterval"] == cadence
            # a first render: the next lands on the URL's slot within its cadence (render.firstRender)
            assert row["nextRenderTime"] in {next_slot(url, cadence, int(before)), next_slot(url, cadence, now_ms())}
    r = post_result(jobs[keys[gone][0]], worker="w1", outcome="non-indexable", reason="http-error",
                    status=404, html=None, isIndexable=False)
    assert r.status_code == 204
    target = httpx.get(f"{d.url}/render_targets", params={"url": gone}).json()
    assert target["state"] == "suppressed" and target["strikes"] == 1
    for key in keys[gone]:  # every device of the URL rechecks in 14 days
        assert schedule(d.url, key)["nextRenderTime"] - time.time() * 1000 > 13 * DAY_MS


def test_a_client_side_redirect_makes_the_destination_due_on_its_owner(cluster) -> None:
    """The destination's row (made due, for its own grant) belongs to the destination URL's node: it
    is routed by that URL, not by the text before the first delimiter (``desktop``, which named a node
    by chance)."""
    d = cluster
    src, dst = next((s, t) for i in range(100)
                    for s, t in [(f"https://shop.example/src/{i}", f"https://shop.example/dst/{i}")]
                    if OWNERS.owner(s) == OWNERS.owner("desktop") != OWNERS.owner(t))
    put_target(d.url, dst, nextRenderTime=int(time.time() * 1000) + 30 * DAY_MS)
    key = put_target(d.url, src, nextRenderTime=1)["cacheKeys"][0]
    jobs = take_everywhere(d, [key])
    r = post_result(jobs[key], worker="w1", redirectedTo=dst)  # rendered, landed on another URL
    assert r.status_code == 204, r.text
    row = schedule(d.urls[OWNERS.owner(dst)], f"desktop:{dst}")
    assert row["nextRenderTime"] <= time.time() * 1000  # due now (it was 30 days out)
    assert httpx.get(f"{d.url}/render_targets", params={"url": src}).status_code == 404  # retired
