"""The render fleet's protocol through real HTTP, a node's real parts and real RocksDB, without Ray
(``tests.localnode``; docs/fleet-protocol.md)."""

from __future__ import annotations

import concurrent.futures
import functools
import gzip
import json
import time

import brotli
import httpx
import pytest
from fastapi import HTTPException

from prerender_ray.api.render_queue import MAX_GZIP_MEMBERS, check_encoding
from prerender_ray.queue.metadata import MAX_METADATA_BYTES
from prerender_ray.storage.pages import Page
from prerender_ray.timeutil import MINUTE_MS, minute, next_slot, now_ms
from tests.localnode import LocalNode
from tests.support import (
    brotli_bomb,
    claim,
    claim_until,
    ingress_peak_rss_mb,
    metric_value,
    post_result,
    put_target,
    result_body,
    schedule,
    take,
    wait_for,
)

DAY = 86_400_000


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("rq") / "data", {
        "ingress": {"routes": [{"match": "prefix", "path": "/hourly/", "renderInterval": 6 * 3600_000}]},
        "server": {"maxBodyBytes": 5 * 512 * 1024},  # room for metadata past its own 2 MiB cap
    })
    yield d
    d.stop()


def stored_page(base: str, key: str) -> dict | None:
    """The stored page's metadata (lastCached, statusCode ...), None when there is none."""
    r = httpx.get(f"{base}/prerender_admin/pages", params={"prefix": key}, timeout=10)
    assert r.status_code == 200, r.text
    return next((p for p in r.json()["pages"] if p["cacheKey"] == key), None)


def due_now(base: str, url: str, **kw: object) -> list[str]:
    return put_target(base, url, nextRenderTime=1, **kw)["cacheKeys"]


def test_a_claim_is_a_bare_array_of_jobs_with_the_wire_fields(node) -> None:
    keys = due_now(node.url, "https://shop.example/wire/")
    jobs = take(node.url, keys, timeout=15)
    job = jobs[keys[0]]
    assert set(job) == {"id", "url", "deviceType", "expiresAt", "callbackOrigin", "isFromSitemap"}
    assert job["url"] == "https://shop.example/wire" and job["deviceType"] == "desktop"
    assert job["callbackOrigin"] == node.url
    assert job["isFromSitemap"] is False
    # expiresAt = grant time + jobLeaseTime, unfloored, and far more than the fleet's 30 s skip
    assert abs(job["expiresAt"] - (time.time() * 1000 + 600_000)) < 30_000
    for key in keys:
        assert post_result(jobs[key]).status_code == 204


def test_a_leased_key_is_never_granted_again_while_its_lease_lives(node) -> None:
    keys = due_now(node.url, "https://shop.example/once")
    jobs = take(node.url, keys, timeout=15)
    time.sleep(1.2)  # a fresh publish: the leased keys must stay out of it
    again = claim(node.url, 25) + claim(node.url, 25)
    assert not {j["id"] for j in again} & set(keys)
    for key in keys:
        assert post_result(jobs[key]).status_code == 204


def test_a_rendered_result_stores_the_page_and_reschedules_at_the_route_cadence(node) -> None:
    url, cadence = "https://shop.example/hourly/p1", 6 * 3600_000
    keys = due_now(node.url, url)
    jobs = take(node.url, keys, timeout=15)
    before = time.time() * 1000
    r = post_result(jobs[keys[0]], html=b"<html>ok</html>")
    assert r.status_code == 204 and r.content == b""
    row = schedule(node.url, keys[0])
    # the page's first render: the next lands on the URL's slot within the route's 6 h
    assert row["nextRenderTime"] in {next_slot(url, cadence, int(before)), next_slot(url, cadence, now_ms())}
    assert row["effectiveInterval"] == cadence and row["leased"] is False
    assert post_result(jobs[keys[1]]).status_code == 204
    due_now(node.url, url)
    jobs = take(node.url, keys[:1], timeout=15)
    before = time.time() * 1000
    assert post_result(jobs[keys[0]], html=b"<html>ok</html>").status_code == 204
    # a page stored before: completion-relative, minute(now) + the route's 6 h, not the stored or default
    row = schedule(node.url, keys[0])
    assert row["nextRenderTime"] in (minute(before) + cadence, minute(before) + MINUTE_MS + cadence)


def test_claim_limits_are_clamped_and_junk_is_a_400(node) -> None:
    for n in range(30):
        due_now(node.url, f"https://shop.example/bulk/{n}")
    assert len(claim_until(node.url, 1, limit=0)) >= 1  # 0 -> 1
    time.sleep(1.1)
    assert len(claim(node.url, 100)) <= 25  # clamped to queue.maxClaimLimit
    bad = httpx.post(f"{node.url}/render_queue/claim", json={"limit": "abc"})
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
    assert httpx.post(f"{node.url}/render_queue/claim", content=b"{not json").status_code == 400
    assert httpx.post(f"{node.url}/render_queue/claim", content=b"").status_code == 200  # default 20


@pytest.mark.parametrize("size, body, expected", [
    (None, b'{"id":"x"}', "x-metadata-size must be a positive integer"),
    ("0", b'{"id":"x"}', "x-metadata-size must be a positive integer"),
    ("-3", b'{"id":"x"}', "x-metadata-size must be a positive integer"),
    ("ten", b'{"id":"x"}', "x-metadata-size must be a positive integer"),
    ("999", b'{"id":"x"}', "x-metadata-size must be a positive integer"),
    ("5", b'{"id":"x"}', "metadata is not valid JSON"),
    ("2", b'[]', "metadata must be a JSON object"),
    ("2", b'{}', "metadata.id"),
])
def test_malformed_results_are_400_with_a_json_error(node, size, body, expected) -> None:
    headers = {} if size is None else {"x-metadata-size": size}
    r = httpx.post(f"{node.url}/render_queue/job_result", content=body, headers=headers)
    assert r.status_code == 400
    assert expected in r.json()["error"]


def test_a_result_for_an_id_never_granted_is_refused_and_changes_nothing(node) -> None:
    keys = due_now(node.url, "https://shop.example/never-granted")
    job = {"id": keys[0], "url": "https://shop.example/never-granted", "callbackOrigin": node.url}
    r = post_result(job)
    assert r.status_code == 409 and "no lease" in r.json()["error"]
    assert schedule(node.url, keys[0])["nextRenderTime"] == 1  # untouched


def test_unknown_outcomes_wrong_encodings_and_huge_bodies_are_refused(node) -> None:
    keys = due_now(node.url, "https://shop.example/bad-results")
    jobs = take(node.url, keys, timeout=15)
    job = jobs[keys[0]]
    r = post_result(job, outcome="exploded")
    assert r.status_code == 400 and "unknown outcome" in r.json()["error"]
    body, headers = result_body(job)
    meta_len = int(headers["x-metadata-size"])
    lie = body[:meta_len] + b"<html>not gzip</html>"
    r = httpx.post(f"{node.url}/render_queue/job_result", content=lie, headers=headers)
    assert r.status_code == 400 and "not gzip-encoded" in r.json()["error"]
    huge = post_result(job, html=b"x" * (3 * 1024 * 1024), encoding="identity")
    assert huge.status_code == 413
    # none of that moved the row or released the lease
    row = schedule(node.url, keys[0])
    assert row["nextRenderTime"] == 1 and row["leased"] is True
    for key in keys:
        assert post_result(jobs[key]).status_code == 204


@pytest.mark.parametrize("field, values", [("statusCode", [99999, -1, 1e300, "200", True]),
                                           ("renderTime", [-5, 1e300])])
def test_out_of_range_result_numbers_are_400_naming_the_field_and_change_nothing(node, field, values) -> None:
    keys = due_now(node.url, f"https://shop.example/out-of-range/{field}")
    jobs = take(node.url, keys, timeout=15)
    for value in values:
        r = post_result(jobs[keys[0]], **({"status": value} if field == "statusCode" else {field: value}))
        assert r.status_code == 400, (value, r.text)
        assert field in r.json()["error"]
    row = schedule(node.url, keys[0])  # no page, no reschedule, the lease still held
    assert row["nextRenderTime"] == 1 and row["leased"] is True
    assert stored_page(node.url, keys[0]) is None
    for key in keys:
        assert post_result(jobs[key]).status_code == 204


def test_content_with_a_status_that_carries_none_is_400_and_changes_nothing(node) -> None:
    keys = due_now(node.url, "https://shop.example/no-content-status")
    jobs = take(node.url, keys, timeout=15)
    for status in (100, 204, 304):
        r = post_result(jobs[keys[0]], status=status)
        assert r.status_code == 400, (status, r.text)
        assert f"statusCode {status} carries no content" in r.json()["error"]
    row = schedule(node.url, keys[0])  # no page, no reschedule, the lease still held
    assert row["nextRenderTime"] == 1 and row["leased"] is True
    assert stored_page(node.url, keys[0]) is None
    for key in keys:
        assert post_result(jobs[key]).status_code == 204


def test_an_error_result_holds_the_lease_and_leaves_the_row_overdue(node) -> None:
    keys = due_now(node.url, "https://shop.example/crashes")
    jobs = take(node.url, keys, timeout=15)
    r = post_result(jobs[keys[0]], outcome="error", status=None, html=None,
                    error={"name": "TimeoutError", "message": "settle", "phase": "navigation"})
    assert r.status_code == 204
    row = schedule(node.url, keys[0])
    assert row["nextRenderTime"] == 1 and row["leased"] is True  # fast lane: retried at lease expiry
    time.sleep(1.2)
    assert keys[0] not in {j["id"] for j in claim(node.url, 25)}
    assert post_result(jobs[keys[1]]).status_code == 204


def test_a_noindex_verdict_suppresses_the_target_for_every_device(node) -> None:
    url = "https://shop.example/noindex"
    keys = due_now(node.url, url)
    jobs = take(node.url, keys, timeout=15)
    assert post_result(jobs[keys[0]]).status_code == 204  # a page exists first
    r = post_result(jobs[keys[1]], outcome="non-indexable", reason="noindex", html=None, isIndexable=False)
    assert r.status_code == 204
    target = httpx.get(f"{node.url}/render_targets", params={"url": url}).json()
    assert target["state"] == "suppressed" and target["suppressedReason"] == "noindex" and target["strikes"] == 1
    now = time.time() * 1000
    for key in keys:  # every device rechecks in 7 days, filed at its cadence
        row = schedule(node.url, key)
        assert 7 * DAY - 2 * MINUTE_MS < row["nextRenderTime"] - now <= 7 * DAY
        assert row["effectiveInterval"] == DAY


def test_a_permanent_redirect_retires_the_source_and_adopts_the_destination(node) -> None:
    src, dst = "https://shop.example/old-page", "https://shop.example/new-page"
    keys = due_now(node.url, src)
    jobs = take(node.url, keys, timeout=15)
    r = post_result(jobs[keys[0]], outcome="redirected", status=301, html=None, reason="redirect",
                    redirectedTo=dst + "?utm_source=x")
    assert r.status_code == 204
    assert httpx.get(f"{node.url}/render_targets", params={"url": src}).status_code == 404
    assert schedule(node.url, keys[0]) is None and schedule(node.url, keys[1]) is None
    assert httpx.get(f"{node.url}/render_targets", params={"url": dst}).status_code == 200
    adopted = schedule(node.url, f"{dst}|desktop")
    assert adopted["nextRenderTime"] <= time.time() * 1000  # due now


def test_concurrent_claimers_never_get_the_same_key_twice(node) -> None:
    urls = [f"https://shop.example/race/{i}" for i in range(60)]
    for u in urls:
        due_now(node.url, u)
    time.sleep(1.2)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda _: claim(node.url, 20), range(16)))
    ids = [j["id"] for batch in batches for j in batch]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 60  # 120 keys were due; 16 x 20 could take them all


def test_concurrent_claims_with_different_limits_each_get_at_most_their_own(node) -> None:
    # Concurrent claims on a replica share one keeper call, which deals the jobs out per request.
    urls = [f"https://shop.example/deal/{i}" for i in range(40)]
    for u in urls:
        due_now(node.url, u)
    time.sleep(1.2)
    limits = [1, 2, 3, 5, 8, 13, 1, 2]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda n: claim(node.url, n), limits))
    assert all(len(b) <= n for b, n in zip(batches, limits))
    ids = [j["id"] for b in batches for j in b]
    assert len(ids) == len(set(ids)) and len(ids) == sum(limits)  # 80 due: every claim is filled


def test_pause_and_resume_are_node_scoped_and_a_paused_node_answers_an_empty_array(node) -> None:
    due_now(node.url, "https://shop.example/paused")
    r = httpx.post(f"{node.url}/render_queue/pause")
    assert r.status_code == 200 and r.json()["local"]["status"] == "paused"
    time.sleep(1.2)
    assert claim(node.url, 25) == []
    status = {s["node"]: s for s in httpx.get(f"{node.url}/queue_status").json()}
    assert status["node-a"]["status"] == "paused"
    assert httpx.get(f"{node.url}/queue_control").json()[0]["paused"] is True
    r = httpx.post(f"{node.url}/render_queue/resume")
    assert r.json()["inherited"] is True and r.json()["local"]["status"] != "paused"
    assert claim_until(node.url, 1)


def test_queue_state_counts_are_exact_and_the_schedule_leaf_answers(node) -> None:
    doc = httpx.get(f"{node.url}/prerender_admin/queue-state")
    assert doc.status_code == 200
    body = doc.json()
    assert body["trust"]["live"] is True and body["trust"]["exact"] is True
    assert body["now"]["due"] == body["now"]["dueSitemap"] + body["now"]["dueDiscovered"]
    assert set(body["coming"]) >= {"next15m", "next60m", "next24h", "byHour"}
    assert body["flow"]["granted"]["lastHour"] > 0
    bad = httpx.post(f"{node.url}/prerender_admin/schedule", json={"cacheKey": ""})
    assert bad.status_code == 400


def test_targets_reject_bad_urls_and_non_prerender_paths(node) -> None:
    for url in ("not a url", "/relative", "ftp://x.example/a", ""):
        r = httpx.put(f"{node.url}/render_targets", json={"url": url})
        assert r.status_code == 400, url
    r = httpx.put(f"{node.url}/render_targets", json={"url": "https://shop.example/search/q"})
    assert r.status_code == 400 and "not in a prerender route" in r.json()["error"]
    r = httpx.put(f"{node.url}/render_targets", json={"url": "https://shop.example/x", "renderInterval": -5})
    assert r.status_code == 400
    assert httpx.get(f"{node.url}/render_targets", params={"url": "https://shop.example/none"}).status_code == 404


def test_revalidate_makes_every_device_due_now(node) -> None:
    url = "https://shop.example/reval"
    keys = put_target(node.url, url, nextRenderTime=int(time.time() * 1000) + DAY)["cacheKeys"]
    r = httpx.post(f"{node.url}/render_targets", json={"action": "revalidate", "urls": [url]})
    assert r.status_code == 200 and r.json() == {"revalidating": 2, "examined": 1}
    for key in keys:
        row = schedule(node.url, key)
        assert row["nextRenderTime"] <= time.time() * 1000 and row["effectiveInterval"] is None
    take(node.url, keys, timeout=15)


def test_gzip_bodies_are_stored_as_posted(node) -> None:
    keys = due_now(node.url, "https://shop.example/stored")
    jobs = take(node.url, keys, timeout=15)
    html = b"<html><body>" + b"x" * 5000 + b"</body></html>"
    assert post_result(jobs[keys[0]], html=html).status_code == 204
    [raw] = node.ask("store", "get_pages", [keys[0]])
    page = Page.decode(raw)
    assert gzip.decompress(page.content) == html
    assert page.headers["content-encoding"] == "gzip" and page.headers["x-harper-rendered"] == "1"
    assert page.is_indexable is None and page.status_code == 200
    assert json.loads(json.dumps(page.headers))["content-type"].startswith("text/html")
    assert post_result(jobs[keys[1]]).status_code == 204


# ---------------------------------------------------------------------------------- hostile bodies


def _post_coded(job: dict, content: bytes, encoding: str) -> httpx.Response:
    """A result whose body is ``content`` as given, labelled ``encoding``."""
    body, headers = result_body(job, html=None)
    meta = json.loads(body)
    meta["headers"]["content-encoding"] = encoding
    raw = json.dumps(meta).encode()
    return httpx.post(f"{job['callbackOrigin']}/render_queue/job_result", content=raw + content,
                      headers={**headers, "x-metadata-size": str(len(raw))}, timeout=30)


def _stored(node: LocalNode, key: str) -> bytes | None:
    [raw] = node.ask("store", "get_pages", [key])
    return raw


def _refused_unchanged(node: LocalNode, key: str) -> None:
    """A refused result wrote no page, and ``key``'s lease is still held with its row as it was."""
    assert _stored(node, key) is None
    row = schedule(node.url, key)
    assert row["nextRenderTime"] == 1 and row["leased"] is True


@functools.cache
def _gib_bomb() -> bytes:
    return brotli_bomb(1024)  # 1 GiB of zeros in 1.6 KB: the old check decoded all of it


def test_a_brotli_bomb_is_413_changes_nothing_and_is_never_decoded_whole(node) -> None:
    keys = due_now(node.url, "https://shop.example/bomb")
    jobs = take(node.url, keys, timeout=15)
    bomb = _gib_bomb()
    assert len(bomb) < 4096
    before = ingress_peak_rss_mb(node, reset=True)  # the replica runs in this process
    r = _post_coded(jobs[keys[0]], bomb, "br")
    grown = ingress_peak_rss_mb(node) - before
    assert r.status_code == 413, r.text
    assert "decodes to more than 20971520 bytes" in r.json()["error"] and "maxHtmlBytes" in r.json()["error"]
    # The bound: decoding stops one piece past the 20 MB cap and drops pieces as it goes, so the
    # replica's peak RSS grows by less than 100 MB (decoding it whole would take 1 GiB).
    assert grown < 100, f"peak RSS grew by {grown:.0f} MB"
    _refused_unchanged(node, keys[0])
    for key in keys:
        assert post_result(jobs[key]).status_code == 204


def test_metadata_past_its_cap_is_413_and_changes_nothing(node) -> None:
    keys = due_now(node.url, "https://shop.example/fat-metadata")
    jobs = take(node.url, keys, timeout=15)
    r = post_result(jobs[keys[0]], padding="p" * MAX_METADATA_BYTES)
    assert r.status_code == 413 and r.json()["error"] == f"the metadata is larger than {MAX_METADATA_BYTES} bytes"
    _refused_unchanged(node, keys[0])
    for key in keys:
        assert post_result(jobs[key]).status_code == 204


def test_a_page_of_many_gzip_members_is_400_checked_in_bounded_time(node) -> None:
    """2 MB of empty gzip members is 100,000 of them: each cost the check Python steps on the loop
    that serves bots (10 MB took 0.79 s). A few members pass; more are refused at the first extra."""
    keys = due_now(node.url, "https://shop.example/members")
    jobs = take(node.url, keys, timeout=15)
    empty = gzip.compress(b"")
    r = _post_coded(jobs[keys[0]], empty * 100_000, "gzip")
    assert r.status_code == 400 and f"more than {MAX_GZIP_MEMBERS} gzip members" in r.json()["error"], r.text
    _refused_unchanged(node, keys[0])
    few = b"".join(gzip.compress(b"<p>%d</p>" % i) for i in range(MAX_GZIP_MEMBERS))
    assert _post_coded(jobs[keys[0]], few, "gzip").status_code == 204
    for key in keys[1:]:
        assert post_result(jobs[key]).status_code == 204


def test_the_encoding_check_of_ten_mb_of_gzip_members_is_bounded() -> None:
    empty = gzip.compress(b"")
    body = empty * (10_000_000 // len(empty))
    started = time.perf_counter()
    with pytest.raises(HTTPException, match="400"):
        check_encoding("gzip", body, 20 * 1024 * 1024)
    assert time.perf_counter() - started < 0.1  # 0.79 s when every member was read


def test_a_lone_surrogate_in_the_metadata_is_400_and_changes_nothing(node) -> None:
    """Stored, a lone surrogate failed every answer that encoded it: the target's reason made
    GET /render_targets a 500 for good, a header value made every retry a 503 until the lease ran out."""
    url = "https://shop.example/surrogates"
    keys = due_now(node.url, url)
    jobs = take(node.url, keys, timeout=15)
    job = jobs[keys[0]]
    spoiled = [dict(outcome="non-indexable", reason="noindex\ud800", html=None, isIndexable=False),
               dict(headers={"content-type": "text/html", "content-encoding": "gzip", "link": "<x\udfff>"})]
    for kw in spoiled:  # json.dumps writes a lone surrogate as its escape, as a crafted body would
        r = post_result(job, **kw)
        assert r.status_code == 400 and "lone surrogate" in r.json()["error"], r.text
    target = httpx.get(f"{node.url}/render_targets", params={"url": url})
    assert target.status_code == 200 and target.json()["state"] != "suppressed"
    _refused_unchanged(node, keys[0])
    # a valid pair is one character: an escaped emoji is text, kept and answered
    r = post_result(job, outcome="non-indexable", reason="noindex \U0001F600", html=None, isIndexable=False)
    assert r.status_code == 204, r.text
    target = httpx.get(f"{node.url}/render_targets", params={"url": url})
    assert target.status_code == 200 and target.json()["suppressedReason"] == "noindex \U0001F600"
    assert post_result(jobs[keys[1]]).status_code == 204


def test_a_corrupt_gzip_or_truncated_brotli_result_is_400_and_changes_nothing(node) -> None:
    keys = due_now(node.url, "https://shop.example/corrupt")
    jobs = take(node.url, keys, timeout=15)
    job = jobs[keys[0]]
    html = b"<html><body>" + b"".join(b"<p>%d</p>" % i for i in range(5000)) + b"</body></html>"
    gz = bytearray(gzip.compress(html))
    gz[len(gz) // 2:len(gz) // 2 + 16] = bytes(16)  # the header and first blocks are intact
    r = _post_coded(job, bytes(gz), "gzip")
    assert r.status_code == 400 and "not gzip-encoded" in r.json()["error"], r.text
    br = brotli.compress(html)
    r = _post_coded(job, br[:-8], "br")
    assert r.status_code == 400 and "not br-encoded: truncated" in r.json()["error"], r.text
    r = _post_coded(job, gzip.compress(html) + b"<script>", "gzip")
    assert r.status_code == 400 and "after the end" in r.json()["error"], r.text
    _refused_unchanged(node, keys[0])
    assert _post_coded(job, br, "br").status_code == 204  # the whole stream is accepted
    assert brotli.decompress(Page.decode(_stored(node, keys[0])).content) == html
    for key in keys[1:]:
        assert post_result(jobs[key]).status_code == 204


# ------------------------------------------------------------------ results bound to their grant


def test_a_result_posted_four_times_is_applied_once(node) -> None:
    keys = due_now(node.url, "https://shop.example/replayed")
    jobs = take(node.url, keys, timeout=15)
    duplicates = functools.partial(metric_value, node.url, "prerender_results_ignored_total", reason="duplicate")
    ignored = duplicates()  # one registry per process: other modules' nodes counted too
    assert post_result(jobs[keys[0]], html=b"<html>first</html>").status_code == 204
    first = stored_page(node.url, keys[0])
    for _ in range(3):  # a replay (or a retry after a lost 204) is acknowledged, never applied
        time.sleep(0.02)
        assert post_result(jobs[keys[0]], html=b"<html>replayed</html>").status_code == 204
    assert stored_page(node.url, keys[0])["lastCached"] == first["lastCached"]
    body = httpx.get(f"{node.url}/prerender_admin/page-content", params={"cacheKey": keys[0]}).text
    assert "first" in body
    # one lease's non-indexable verdict posted four times is one strike, not a deletion (max 4)
    for _ in range(4):
        r = post_result(jobs[keys[1]], outcome="non-indexable", reason="noindex", html=None,
                        isIndexable=False)
        assert r.status_code == 204
    target = httpx.get(f"{node.url}/render_targets", params={"url": "https://shop.example/replayed"})
    assert target.status_code == 200 and target.json()["strikes"] == 1
    wait_for(lambda: duplicates() > ignored, what="the ignored-results metric")


def test_two_devices_reporting_404_in_one_cycle_are_one_strike(node) -> None:
    url = "https://shop.example/gone-twice"
    keys = due_now(node.url, url)
    jobs = take(node.url, keys, timeout=15)
    for key in keys:  # gone: two strikes delete; both devices were claimed in this cycle
        r = post_result(jobs[key], outcome="non-indexable", reason="http-error", status=404, html=None,
                        isIndexable=False)
        assert r.status_code == 204
    target = httpx.get(f"{node.url}/render_targets", params={"url": url})
    assert target.status_code == 200 and target.json()["strikes"] == 1
    assert target.json()["suppressedReason"] == "http-gone"


def test_a_late_result_of_a_previous_holder_never_touches_the_new_lease(node) -> None:
    url = "https://shop.example/regranted"
    keys = due_now(node.url, url)
    a = take(node.url, keys, timeout=15, headers={"x-worker-id": "worker-a"})
    key = keys[0]
    for k in keys:
        assert post_result(a[k], worker="worker-a", html=b"<html>from a</html>").status_code == 204
    due_now(node.url, url)  # due again: after its release grace the key goes to worker B
    b = take(node.url, [key], timeout=20, headers={"x-worker-id": "worker-b"})
    assert schedule(node.url, key)["leased"] is True
    page = stored_page(node.url, key)
    late = post_result(a[key], worker="worker-a", html=b"<html>late from a</html>")
    assert late.status_code == 204  # acknowledged, so the fleet does not circuit-break
    row = schedule(node.url, key)
    assert row["leased"] is True and row["nextRenderTime"] == 1  # B's lease and the row untouched
    assert stored_page(node.url, key)["lastCached"] == page["lastCached"]
    time.sleep(1.2)  # a fresh publish: B's lease still keeps the key out of it
    assert key not in {j["id"] for j in claim(node.url, 25) + claim(node.url, 25)}
    assert post_result(b[key], worker="worker-b", html=b"<html>from b</html>").status_code == 204
    row = schedule(node.url, key)
    assert row["leased"] is False and row["nextRenderTime"] > 1
    body = httpx.get(f"{node.url}/prerender_admin/page-content", params={"cacheKey": key}).text
    assert "from b" in body
    if keys[1] in b:
        assert post_result(b[keys[1]], worker="worker-b").status_code == 204


def test_a_client_side_redirect_result_never_overwrites_the_destinations_page(node) -> None:
    """One lease is one key: a rendered result whose landed URL is another page of ours stores nothing
    there (the stored page stays as bots get it); the destination is made due, for its own grant."""
    src, dst = "https://shop.example/lure", "https://shop.example/victim"
    dst_keys = due_now(node.url, dst)
    jobs = take(node.url, dst_keys, timeout=15)
    for k in dst_keys:
        assert post_result(jobs[k], html=b"<html>the real page</html>").status_code == 204
    before = _stored(node, dst_keys[0])
    assert before is not None
    keys = due_now(node.url, src)
    jobs = take(node.url, keys, timeout=15)
    r = post_result(jobs[keys[0]], html=b"<html>attacker text</html>", redirectedTo=dst, isIndexable=True)
    assert r.status_code == 204
    assert _stored(node, dst_keys[0]) == before  # byte for byte
    assert "the real page" in httpx.get(f"{node.url}/prerender_admin/page-content",
                                        params={"cacheKey": dst_keys[0]}).text
    row = schedule(node.url, dst_keys[0])
    assert row["nextRenderTime"] <= time.time() * 1000 and row["leased"] is False  # due, for its own grant
    assert httpx.get(f"{node.url}/render_targets", params={"url": src}).status_code == 404  # retired
