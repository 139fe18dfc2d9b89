"""Diagnostics for one URL on a real node: diagnose makes the key's next job ask for a report, the
worker's report and summary are kept per key (render history, last reports) and shown by the admin
API; reference-fleet results and results with a bad diagnostics field are accepted as before."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from tests.localnode import LocalNode
from tests.support import post_result, put_target, take, wait_for

WIRE = {"id", "url", "deviceType", "expiresAt", "callbackOrigin", "isFromSitemap"}
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(300)).decode()
LATER = int(time.time() * 1000) + 6 * 3_600_000


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("diag") / "data")
    yield d
    d.stop()


def admin(base: str, method: str, route: str, **kw: object) -> httpx.Response:
    return httpx.request(method, f"{base}/prerender_admin/{route}", timeout=30, **kw)  # type: ignore[arg-type]


def diagnose(base: str, url: str) -> str:
    r = admin(base, "POST", "diagnose", json={"url": url, "deviceType": "desktop"})
    assert r.status_code == 200, r.text
    assert r.json()["diagnosticsUntil"] > time.time() * 1000
    return r.json()["cacheKey"]


def held(base: str, key: str, entries: int | None = None) -> dict:
    """The key's history and reports; with ``entries``, once that many entries are there (the owner
    may be another node of the shared cluster: the records reach this one by replication)."""
    def read() -> dict | None:
        r = admin(base, "GET", "diagnostics", params={"cacheKey": key})
        assert r.status_code == 200, r.text
        doc = r.json()
        return doc if entries is None or len(doc["renderHistory"]) == entries else None

    return wait_for(read, timeout=15, what=f"{entries} history entries of {key}")


def stored(base: str, key: str) -> dict | None:
    r = admin(base, "GET", "pages", params={"prefix": key})
    return next((p for p in r.json()["pages"] if p["cacheKey"] == key), None)


REPORT = {
    "console": [{"level": "error", "text": "TypeError: cannot read 'x'", "at": 310},
                {"level": "warning", "text": "slow script", "at": 90}],
    "exceptions": [{"message": "Error: boom", "at": 320}],
    "failedRequests": [{"url": "https://api.shop.example/cart", "error": "net::ERR_CONNECTION_REFUSED", "type": "fetch"}],
    "blockedRequests": [{"url": "https://www.google-analytics.com/analytics.js"}],
    "timeline": [{"at": 0, "event": "navigate", "detail": ""}, {"at": 700, "event": "settled", "detail": "1 fetch pending"}],
    "chars": 4321,
    "truncated": {},
    "screenshot": {"type": "image/jpeg", "width": 400, "height": 300, "data": JPEG},
}
SUMMARY = {"errors": 2, "blocked": 1, "failed": 1, "chars": 4321, "scrollSteps": 0}


def test_a_diagnosed_key_asks_once_and_its_report_is_kept_and_shown(node) -> None:
    url, other = "https://shop.example/diag/a", "https://shop.example/diag/plain"
    put_target(node.url, url, nextRenderTime=LATER)
    [plain, *_] = put_target(node.url, other, nextRenderTime=1)["cacheKeys"]
    key = diagnose(node.url, url)
    jobs = take(node.url, [key, plain], headers={"x-worker-id": "w-1"})
    assert jobs[key]["renderOptions"] == {"diagnostics": True}
    assert set(jobs[key]) == WIRE | {"renderOptions"}
    assert all(set(job) == WIRE for k, job in jobs.items() if k != key)  # nothing asked: as today

    assert post_result(jobs[key], worker="w-1", diagnostics=REPORT, renderSummary=SUMMARY).status_code == 204
    got = held(node.url, key, 1)
    [entry] = got["renderHistory"]
    assert {k: entry[k] for k in ("renderMs", "outcome", "statusCode", "worker")} == {
        "renderMs": 800, "outcome": "rendered", "statusCode": 200, "worker": "w-1"}
    assert {k: entry[k] for k in SUMMARY} == SUMMARY
    [report] = got["reports"]
    assert report["screenshot"] == REPORT["screenshot"]
    assert report["console"] == REPORT["console"] and report["exceptions"] == REPORT["exceptions"]
    assert report["failedRequests"] == REPORT["failedRequests"] and report["chars"] == 4321

    x = admin(node.url, "POST", "explain", json={"url": url, "deviceType": "desktop"}).json()
    assert [e["at"] for e in x["renderHistory"]] == [entry["at"]]
    [summary] = x["diagnostics"]
    assert summary["screenshot"] == {"type": "image/jpeg", "width": 400, "height": 300, "bytes": len(JPEG) * 3 // 4}
    assert summary["exceptions"] == REPORT["exceptions"]

    # the flag went with its result: the next render of the key asks for nothing
    assert admin(node.url, "POST", "revalidate", json={"url": url, "deviceType": "desktop"}).status_code == 200
    again = take(node.url, [key])[key]
    assert set(again) == WIRE
    assert post_result(again).status_code == 204
    got = held(node.url, key, 2)
    assert len(got["reports"]) == 1
    assert "errors" not in got["renderHistory"][0]

    # the reference fleet's format: accepted as ever, and it still leaves a history entry
    assert post_result(jobs[plain], worker="w-1").status_code == 204
    [ref] = held(node.url, plain, 1)["renderHistory"]
    assert set(ref) == {"at", "renderMs", "outcome", "verdict", "statusCode", "worker"}
    assert ref["outcome"] == "rendered" and ref["verdict"] == "rendered/rendered"
    assert held(node.url, plain)["reports"] == []

    # a deleted target takes its keys' history along
    assert httpx.delete(f"{node.url}/render_targets", params={"url": url}, timeout=30).status_code == 200
    assert held(node.url, key, 0)["reports"] == []


@pytest.mark.parametrize("bad", [
    "not an object",
    # past every bound of a report (console 200, the screenshot's 512 KiB of base64), within the 2 MiB
    # of metadata the ingress parses at all (past that the result is a 413: tests/api/test_render_queue.py)
    {"console": [{"level": "error", "text": "x" * 100}] * 5_000, "exceptions": "boom",
     "screenshot": {"type": "image/jpeg", "width": 10, "height": 10,
                    "data": base64.b64encode(b"\xff\xd8\xff" + bytes(700 * 1024)).decode()}},
    {"screenshot": {"type": "image/jpeg", "width": 10, "height": 10, "data": base64.b64encode(b"GIF89a").decode()},
     "timeline": [[[[[[[[[["deep"]]]]]]]]]]},
], ids=["string", "huge", "not-jpeg"])
def test_a_bad_diagnostics_field_never_costs_the_page(node, bad) -> None:
    url = f"https://shop.example/diag/bad-{time.monotonic_ns()}"
    put_target(node.url, url, nextRenderTime=LATER)
    key = diagnose(node.url, url)
    job = take(node.url, [key])[key]
    r = post_result(job, html=b"<html><body>still stored</body></html>", diagnostics=bad,
                    renderSummary={"errors": "many", "blocked": -1})
    assert r.status_code == 204, r.text
    got = held(node.url, key, 1)
    assert stored(node.url, key) is not None
    [entry] = got["renderHistory"]
    assert entry["outcome"] == "rendered" and "errors" not in entry and "blocked" not in entry
    for report in got["reports"]:
        assert report["screenshot"] is None
        assert len(report["console"]) <= 200 and report["exceptions"] == []
    assert len(got["reports"]) == (0 if isinstance(bad, str) else 1)


def test_diagnose_refuses_what_would_never_render(node) -> None:
    assert admin(node.url, "POST", "diagnose", json={"url": "not a url"}).status_code == 400
    assert admin(node.url, "POST", "diagnose", json={"url": "https://shop.example/x", "deviceType": "fridge"}).status_code == 400
    assert admin(node.url, "POST", "diagnose", json={"url": "https://shop.example/x", "more": 1}).status_code == 400
    assert admin(node.url, "GET", "diagnostics", params={"cacheKey": ""}).status_code == 400
