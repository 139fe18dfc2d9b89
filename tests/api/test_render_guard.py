"""A bad render never replaces a good page, on a real node: results posted through the fleet API."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.localnode import LocalNode
from tests.support import post_result, put_target, schedule, take, wait_for

URL = "https://guard.example/product/1"
GOOD = (b"<!doctype html><html><head><title>Product 1</title></head><body><main><h1>Product 1</h1>"
        + b"".join(b"<p>Paragraph %d of the description, <a href='/product/%d'>related</a>.</p>" % (i, i)
                   for i in range(60)) + b"</main></body></html>")
SHELL = b"<!doctype html><html><head><script src='/app.js'></script></head><body><div id='app'></div></body></html>"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("guard") / "data", {"domains": ["guard.example"]})
    yield d
    d.stop()


def sample(node, name: str, **labels: str) -> float | None:
    """A sample of the node's /metrics with these labels (in any order), None when absent."""
    for line in httpx.get(f"{node.url}/metrics", timeout=10).text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.startswith(name + "{") and all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def render(node, key: str, html: bytes) -> None:
    job = take(node.url, [key], timeout=30)[key]
    assert post_result(job, html=html).status_code == 204


def test_a_shell_render_keeps_the_good_page_for_bots_and_shows_in_the_explainer(node) -> None:
    [key, *_] = put_target(node.url, URL, nextRenderTime=1)["cacheKeys"]
    render(node, key, GOOD)
    r = httpx.post(f"{node.url}/prerender_admin/revalidate", json={"url": URL}, timeout=30)
    assert r.status_code == 200, r.text
    render(node, key, SHELL)  # re-granted once the release grace is over

    for _ in range(8):  # over several catch-ups of the ingress's page store (every 250 ms)
        bot = httpx.get(f"{node.url}/p/{URL}", timeout=30)
        assert bot.status_code == 200 and bot.content == GOOD
        assert "x-prerender-measure" not in bot.headers
        time.sleep(0.25)
    row = schedule(node.url, key)
    assert row is not None and row["leased"] is True  # the failure lane's fast retry holds the lease
    wait_for(lambda: sample(node, "prerender_render_guard_total", route="prerender", why="empty-shell",
                            action="refused") == 1, what="the refused-render count")
    assert sample(node, "prerender_render_outcomes_total", outcome="bad-render", detail="fast") == 1

    x = httpx.post(f"{node.url}/prerender_admin/explain", json={"url": URL}, timeout=30).json()
    refused, page = x["rows"]["refusedRender"], x["rows"]["prerenderedPage"]
    assert refused["why"] == "empty-shell" and refused["cacheKey"] == key and refused["count"] == 1
    assert refused["otherDevice"] is False
    assert refused["new"] == {"textChars": 0, "links": 0, "bytes": len(SHELL)}
    assert refused["stored"]["bytes"] == len(GOOD) and refused["stored"]["links"] == 60
    assert refused["stored"]["textChars"] > 1000
    assert page["measure"] == refused["stored"] and page["suspect"] is None
