"""``render.onMiss`` on a real node: a bot's miss of a page never cached makes it due at once and
waits for the render; concurrent misses share one render; without a fleet the origin answers after
the wait."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest

from tests.localnode import LocalNode
from tests.support import claim, post_result

DEBUG = {"x-harper-prerender-debug": "1"}
HTML = b"<!doctype html><html><body><p>rendered on the first visit</p></body></html>"


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(tmp_path_factory.mktemp("onmiss") / "data", {
        "domains": [f"127.0.0.1:{site.port}"],
        "render": {"onMiss": {"enabled": True, "waitMs": 6000}},
        "renderNow": {"pollIntervalMs": 50},
    })
    yield d
    d.stop()


def bot(node, url: str) -> httpx.Response:
    return httpx.get(f"{node.url}/p/{url}", headers=DEBUG, timeout=30)


def test_concurrent_first_visits_share_one_render_and_get_the_rendered_page(node, site) -> None:
    url = f"http://127.0.0.1:{site.port}/first/visit"
    key = f"{url}|desktop"
    granted: list[dict] = []
    stop = threading.Event()

    def fleet() -> None:  # renders what it is granted, as the fleet does
        while not stop.is_set():
            for job in claim(node.url, 20):
                granted.append(job)
                assert post_result(job, html=HTML, encoding="identity", headers={"content-type": "text/html"}).status_code == 204
            time.sleep(0.1)

    worker = threading.Thread(target=fleet, daemon=True)
    worker.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: bot(node, url), range(4)))
    finally:
        stop.set()
        worker.join(10)
    waited = [r for r in answers if r.headers.get("x-harper-render-now") == "on-miss"]
    for r in answers:
        assert r.status_code == 200 and r.content == HTML, (r.status_code, r.headers)
        # A bot whose request lands after the render's 204 is served that render as a hit (the page
        # log serves a write at once): the same page, no second render.
        source = "rendered" if r in waited else "cache"
        assert r.headers["x-harper-source"] == source, r.headers
    assert waited  # the first visit, at least, waited for the render
    assert [j["id"] for j in granted].count(key) == 1  # one render for the four bots
    assert site.hits["/first/visit"] == 0  # the origin was never asked for the shell


def test_without_a_render_in_time_the_origin_answers_after_the_wait(node, site) -> None:
    url = f"http://127.0.0.1:{site.port}/nobody/renders"
    t0 = time.monotonic()
    r = bot(node, url)  # no fleet claims: the wait runs out
    assert time.monotonic() - t0 >= 5.5
    assert r.status_code == 404  # the origin's answer for a path it does not know, relayed
    assert r.headers["x-harper-source"] == "origin" and "x-harper-render-now" not in r.headers
    assert site.hits["/nobody/renders"] == 1
