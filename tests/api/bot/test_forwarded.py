"""The bot path in forwarded mode (behind a CDN, docs/serving.md#forwarded-mode): the host comes
from x-forwarded-host (injection-guarded), the scheme from x-forwarded-proto, routes decide what is
a bot request; anything else falls through to the routers."""

from __future__ import annotations

import httpx
import pytest

from tests.api.origin_site import JS_PAGE
from tests.localnode import LocalNode
from tests.support import claim, post_result, put_target, wait_for

DEBUG = {"x-harper-prerender-debug": "1"}


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(tmp_path_factory.mktemp("fwd") / "data", {
        "domains": [f"127.0.0.1:{site.port}"],
        "ingress": {"mode": "forwarded", "routes": [
            {"match": "prefix", "path": "/page/", "queryParams": ["ref"]},
            {"match": "prefix", "path": "/echo/", "mode": "passthrough"},
        ]},
        "origin": {"readTimeoutMs": 2000},
        "renderNow": {"enabled": True, "token": "rn", "timeoutMs": 1500, "pollIntervalMs": 100, "fallback": "error"},
    })
    yield d
    d.stop()


def fwd(node, site, path: str, *, proto: str = "http", **headers: str) -> httpx.Response:
    h = {"x-forwarded-host": f"127.0.0.1:{site.port}", "x-forwarded-proto": proto, **DEBUG, **headers}
    return httpx.get(f"{node.url}{path}", headers=h, timeout=30)


def test_a_routed_page_is_fetched_from_the_forwarded_host_then_served_from_cache(node, site) -> None:
    r = fwd(node, site, "/page/one?ref=a&utm=x")
    assert r.status_code == 200 and r.content == JS_PAGE
    assert r.headers["x-harper-url"] == f"http://127.0.0.1:{site.port}/page/one?ref=a"  # route allowlist
    assert r.headers["x-harper-route"] == "prefix /page/ [ref] prerender (ingress.routes)"
    assert site.last("/page/one").target == "/page/one?ref=a"
    url = f"http://127.0.0.1:{site.port}/page/one?ref=a"
    wait_for(lambda: httpx.get(f"{node.url}/render_targets", params={"url": url}).status_code == 200,
             what="discovery of the routed page")
    key = f"{url}|desktop"
    put_target(node.url, url, nextRenderTime=1)
    jobs: dict[str, dict] = {}

    def granted() -> bool:
        jobs.update({j["id"]: j for j in claim(node.url, 25)})
        return key in jobs

    wait_for(granted, what="the routed page's job")
    assert post_result(jobs[key], html=b"<html>cached</html>").status_code == 204
    wait_for(lambda: fwd(node, site, "/page/one?ref=a").headers.get("x-harper-cache") == "hit")
    assert fwd(node, site, "/page/one?utm=z&ref=a").content == b"<html>cached</html>"  # the same key


def test_a_passthrough_route_is_proxied_and_tallied_as_unrouted(node, site) -> None:
    r = fwd(node, site, "/echo/pass?anything=kept", **{"x-device-type": "tablet"})
    assert r.status_code == 200 and r.headers["x-harper-route-class"] == "passthrough"
    assert r.json()["target"] == "/echo/pass?anything=kept" and r.headers["x-harper-device-type"] == "tablet"

    def tallied() -> bool:
        text = httpx.get(f"{node.url}/metrics", timeout=10).text
        return 'prerender_unrouted_total{bucket="/echo/*",route_class="passthrough"}' in text

    wait_for(tallied, what="the unrouted tally")


@pytest.mark.parametrize("headers", [
    {"x-forwarded-host": "evil.com/inject"},
    {"x-forwarded-host": "user@127.0.0.1"},
    {"x-forwarded-host": "[::1]"},
    {"x-forwarded-host": "not-allowed.example"},  # outside domains
    {"x-forwarded-host": "127.0.0.1:9"},  # the allowed host on a port domains does not allow
    {"x-forwarded-host": "127.0.0.1"},  # ... or on its default port
    {"x-forwarded-proto": "ftp"},
    {"x-forwarded-host": ""},
])
def test_bad_forwarded_headers_fall_through_to_the_routers(node, site, headers) -> None:
    r = fwd(node, site, "/page/injected", **headers)
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}


def test_an_unrouted_path_is_not_a_bot_request_in_header_mode(node, site) -> None:
    r = fwd(node, site, "/elsewhere/x")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    assert httpx.get(f"{node.url}/healthz", timeout=10).status_code == 200  # own endpoints still route


def test_the_peer_endpoint_is_hidden_when_peer_rescue_is_off(node) -> None:
    r = httpx.get(f"{node.url}/prerender_peer/page", params={"key": "x"},
                  headers={"x-harper-peer-token": "anything"}, timeout=10)
    assert r.status_code == 404


def test_render_now_with_the_error_fallback_answers_504_after_its_timeout(node, site) -> None:
    r = fwd(node, site, "/page/never-rendered", **{"x-harper-render-now": "rn"})
    assert r.status_code == 504 and r.headers["x-harper-render-now"] == "timeout"
    assert r.json()["error"] and r.headers["x-harper-cache"] == "miss"
    head = httpx.head(f"{node.url}/page/never-rendered", headers={
        "x-forwarded-host": f"127.0.0.1:{site.port}", "x-forwarded-proto": "http", "x-harper-render-now": "rn"},
        timeout=30)
    assert head.status_code == 200 and "x-harper-render-now" not in head.headers  # GET only (docs/serving.md#render-now)
