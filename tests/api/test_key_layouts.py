"""A device-first cache key with a delimiter that occurs in every URL (``:``), end to end: claims,
results, reschedules and suppression all find the right URL (one key parser, cachekeys.KeyFormat)."""

from __future__ import annotations

import time

import httpx
import pytest

from prerender_ray.timeutil import DAY_MS, HOUR_MS, MINUTE_MS, minute
from tests.support import deploy_on, post_result, put_target, schedule, take


@pytest.fixture(scope="module")
def node(ray_cluster, tmp_path_factory):
    d = deploy_on(ray_cluster, tmp_path_factory.mktemp("layout") / "data", {
        "cacheKey": {"attributes": ["deviceType", "url"], "delimiter": ":"},
        "ingress": {"routes": [{"match": "prefix", "path": "/hourly/", "renderInterval": 6 * HOUR_MS}]},
    })
    yield d
    d.stop()


def test_a_device_first_key_with_a_colon_delimiter_works_end_to_end(node) -> None:
    hourly, daily, gone = ("https://shop.example/hourly/a:b", "https://shop.example/plain/x",
                           "https://shop.example/gone")
    keys = {u: put_target(node.url, u, nextRenderTime=1)["cacheKeys"] for u in (hourly, daily, gone)}
    assert keys[hourly] == [f"desktop:{hourly}", f"mobile:{hourly}"]
    jobs = take(node.url, [k for ks in keys.values() for k in ks], headers={"x-worker-id": "w1"})
    job = jobs[keys[hourly][0]]
    assert (job["url"], job["deviceType"]) == (hourly, "desktop")
    before = time.time() * 1000
    for url in (hourly, daily):
        for key in keys[url]:
            assert post_result(jobs[key], worker="w1").status_code == 204
    for url, cadence in ((hourly, 6 * HOUR_MS), (daily, DAY_MS)):
        for key in keys[url]:
            row = schedule(node.url, key)
            assert row["leased"] is False and row["effectiveInterval"] == cadence
            assert row["nextRenderTime"] in (minute(before) + cadence, minute(before) + MINUTE_MS + cadence)
    r = httpx.get(f"{node.url}/prerender_admin/page-content", params={"cacheKey": keys[hourly][1]})
    assert r.status_code == 200 and "rendered" in r.text
    r = post_result(jobs[keys[gone][0]], worker="w1", outcome="non-indexable", reason="http-error", status=404,
                    html=None, isIndexable=False)
    assert r.status_code == 204
    target = httpx.get(f"{node.url}/render_targets", params={"url": gone}).json()
    assert target["state"] == "suppressed" and target["strikes"] == 1
    for key in keys[gone]:  # every device of the URL rechecks in 14 days
        assert schedule(node.url, key)["nextRenderTime"] - time.time() * 1000 > 13 * DAY_MS
