"""Render targets over HTTP (api/targets.py), on a real node: the paced revalidation of a prefix or
the whole site, and the refusals of bad input."""

from __future__ import annotations

import httpx
import pytest

from prerender_ray.timeutil import minute, now_ms
from tests.localnode import LocalNode
from tests.support import put_target, schedule

SITE = "https://shop.test"
LATER = 2**50


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("targets") / "data", {})
    yield d
    d.stop()


def revalidate(node, **body) -> httpx.Response:
    return httpx.post(f"{node.url}/render_targets", json={"action": "revalidate", **body}, timeout=60)


def test_a_prefix_is_made_due_over_the_window_it_is_given(node) -> None:
    for i in range(30):
        put_target(node.url, f"{SITE}/docs/{i}", nextRenderTime=LATER)
    put_target(node.url, f"{SITE}/other", nextRenderTime=LATER)
    before = now_ms()
    r = revalidate(node, prefix=f"{SITE.upper()}/docs/", within="2h")  # scheme and host in any case
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["targets"] == 30 and doc["revalidating"] == 60 and doc["within"] == 7_200_000
    assert doc["prefix"] == f"{SITE}/docs/" and set(doc["nodes"]) == {"node-a"}
    dues = [schedule(node.url, f"{SITE}/docs/{i}|desktop")["nextRenderTime"] for i in range(30)]
    assert all(minute(before) <= d < before + 7_200_000 for d in dues) and len(set(dues)) > 10
    assert schedule(node.url, f"{SITE}/other|desktop")["nextRenderTime"] == LATER


@pytest.mark.parametrize("body, message", [
    ({}, "exactly one of"),
    ({"urls": [f"{SITE}/a"], "prefix": f"{SITE}/"}, "exactly one of"),
    ({"prefix": "/docs/"}, "absolute http(s) URL prefix"),
    ({"prefix": "ftp://shop.test/"}, "absolute http(s) URL prefix"),
    ({"prefix": f"{SITE}/", "within": "soon"}, "within: not a duration"),
    ({"prefix": f"{SITE}/", "within": -5}, "within must be between"),
    ({"all": True, "within": "8d"}, "within must be between"),
    ({"all": "yes"}, "all must be true"),
    ({"urls": [f"{SITE}/a"], "within": "1h"}, "urls are due now"),
])
def test_bad_input_is_a_400_that_schedules_nothing(node, body, message) -> None:
    put_target(node.url, f"{SITE}/untouched", nextRenderTime=LATER)
    r = revalidate(node, **body)
    assert r.status_code == 400 and message in r.text, r.text
    assert schedule(node.url, f"{SITE}/untouched|desktop")["nextRenderTime"] == LATER


@pytest.fixture(scope="module")
def walled(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("walled") / "data", {"domains": ["shop.test"]})
    yield d
    d.stop()


@pytest.mark.parametrize("url, entry", [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),  # a cloud metadata service
    ("https://shop.test:8443/a", "shop.test:8443"),  # the port too, as the ingress checks it
    ("https://evil.test\\@shop.test/a", "evil.test"),  # the host a browser reads
])
def test_a_target_outside_the_domains_is_a_400_naming_the_entry_and_changes_nothing(walled, url, entry) -> None:
    r = httpx.put(f"{walled.url}/render_targets", json={"url": url, "nextRenderTime": 1}, timeout=30)
    assert r.status_code == 400 and r.json()["reason"] == "host-not-allowed", r.text
    assert f"add '{entry}'" in r.json()["error"]
    canonical = r.json()["url"]
    r = revalidate(walled, urls=[f"{SITE}/fine", url])
    assert r.status_code == 400 and f"add '{entry}'" in r.json()["error"], r.text
    assert httpx.get(f"{walled.url}/render_targets", params={"url": canonical}).status_code == 404
    assert schedule(walled.url, f"{canonical}|desktop") is None
    assert schedule(walled.url, f"{SITE}/fine|desktop") is None  # the whole request was refused
    assert put_target(walled.url, f"{SITE}/fine")["url"] == f"{SITE}/fine"  # a host in domains is taken
    assert httpx.delete(f"{walled.url}/render_targets", params={"url": f"{SITE}/fine"}).status_code == 200
