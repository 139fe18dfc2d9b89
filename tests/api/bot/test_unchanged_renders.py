"""An identical render changes nothing but freshness, end to end
(docs/serving.md#validators-and-unchanged-renders): results posted through the fleet API of a real
node, the page served to a bot by its ingress, the store's write counters read from its /metrics."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.localnode import LocalNode
from tests.support import post_result, put_target, take, wait_for

DEBUG = {"x-harper-prerender-debug": "1"}


def html(nonce: str, text: str = "the same page") -> bytes:
    return (f'<!doctype html><html><head><script nonce="{nonce}">boot()</script></head>'
            f"<body><h1>{text}</h1>{'<p>content</p>' * 200}</body></html>").encode()


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(tmp_path_factory.mktemp("unchanged") / "data", {
        "domains": [f"127.0.0.1:{site.port}"],
        "page": {"swrTtl": 0},  # an expired page is not served at all: its freshness is what serves it
    })
    yield d
    d.stop()


def writes(node) -> dict[str, float]:
    text = httpx.get(f"{node.url}/metrics", timeout=10).text
    out = {"page": 0.0, "freshness": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name == "prerender_page_writes":
            for s in family.samples:
                if s.name.endswith("_total") and s.labels["kind"] in out:  # not the history records
                    out[s.labels["kind"]] += s.value
    return out


def bot(node, url: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{node.url}/p/{url}", headers={**DEBUG, **headers}, timeout=30)


def render(node, url: str, body: bytes) -> None:
    """Due now, claimed, one result per device (after the previous release's grace)."""
    keys = put_target(node.url, url, nextRenderTime=1)["cacheKeys"]
    jobs = take(node.url, keys, timeout=30)
    for key in keys:
        assert post_result(jobs[key], html=body).status_code == 204


def test_two_identical_renders_write_the_page_once_and_keep_serving_it_with_its_validators(node, site) -> None:
    url = f"{site.base}/page/same"
    start = writes(node)
    render(node, url, html("n0nce-one"))
    first = wait_for(lambda: (r := bot(node, url)).headers.get("x-harper-cache") == "hit" and r,
                     what="the first render served")
    devices = 2  # desktop and mobile: one page each
    after_first = writes(node)
    assert after_first["page"] - start["page"] == devices and after_first["freshness"] == start["freshness"]
    etag, modified = first.headers["etag"], first.headers["last-modified"]

    # Past its expiry (a revalidate moves it to now, by a freshness write): not served any more
    r = httpx.post(f"{node.url}/render_targets", json={"action": "revalidate", "urls": [url]}, timeout=15)
    assert r.status_code == 200
    wait_for(lambda: bot(node, url).headers.get("x-harper-cache") == "stale", what="the page to expire")
    revalidated = writes(node)
    assert revalidated["page"] == after_first["page"]

    # The same page again, with another nonce: freshness only, and the page is served again as stored
    render(node, url, html("n0nce-two"))
    again = wait_for(lambda: (r := bot(node, url)).headers.get("x-harper-cache") == "hit" and r,
                     what="the identical render served")
    second = writes(node)
    assert second["page"] == after_first["page"]  # not rewritten, not re-replicated
    assert second["freshness"] - revalidated["freshness"] == devices
    assert again.headers["etag"] == etag and again.headers["last-modified"] == modified
    assert again.content == html("n0nce-one")  # the stored bytes, their own nonce with them
    assert again.headers["x-harper-cache-timestamp"] > first.headers["x-harper-cache-timestamp"]
    assert bot(node, url, **{"if-none-match": etag}).status_code == 304

    # A changed page: a full write with new validators, and a crawler's old ETag gets the new page
    render(node, url, html("n0nce-three", "a new page"))
    changed = wait_for(lambda: (r := bot(node, url)).headers.get("etag") not in (None, etag) and r,
                       what="the changed render served")
    third = writes(node)
    assert third["page"] - second["page"] == devices and third["freshness"] == second["freshness"]
    assert changed.headers["last-modified"] != modified
    fresh = bot(node, url, **{"if-none-match": etag})
    assert fresh.status_code == 200 and fresh.content == html("n0nce-three", "a new page")
