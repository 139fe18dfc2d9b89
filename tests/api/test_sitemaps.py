"""Sitemap ingestion end to end: real HTTP, the real walker, keeper and store of one node without Ray
(``tests.localnode``), sitemaps served by a local test server (hostile ones included). docs/sitemaps.md.
A walker killed and restarted by Ray: ``test_sitemaps_restart.py``."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import quote

import httpx
import pytest

from prerender_ray.queue.targets import paced_due
from prerender_ray.sitemaps.refresh import next_daily_refresh
from prerender_ray.storage.registry import encode_json, sitemap_run_key
from prerender_ray.timeutil import DAY_MS, HOUR_MS, minute, next_slot, now_ms
from tests.localnode import LocalNode
from tests.sitemap_server import BILLION_LAUGHS, HTML, XXE, SitemapSite, gzip_bomb, index, urlset
from tests.support import (
    post_result,
    progress,
    put_target,
    schedule,
    sitemap_row,
    take,
    target,
    wait_for,
    walk,
)

HOST = "sitemaps.test"  # resolves nowhere: every fetch is pinned to 127.0.0.1 by origin.staging.ip


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.close()


@pytest.fixture(scope="module")
def canary():
    """Another sitemap server, on a port `domains` does not allow: it must never be asked."""
    s = SitemapSite()
    yield s
    s.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(tmp_path_factory.mktemp("sitemaps") / "data", {
        "domains": ["shop.test", f"{HOST}:{site.port}"],
        "origin": {"staging": {"ip": "127.0.0.1"}},
        "sitemap": {"fetchTimeoutMs": 5000, "maxBytes": 1024 * 1024, "node": "node-a",
                    "refreshTime": "03:30", "timezone": "UTC"},
    })
    yield d
    d.stop()


def u(site: SitemapSite, path: str) -> str:
    return site.url(path, host=HOST)


def start(base: str, url: str, **body: object) -> dict:
    r = httpx.post(f"{base}/sitemaps", json={"url": url, **body}, timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["background"] is True
    assert doc["firstRenders"]["when"] == "now"  # render.firstRender's default, and with revalidate
    return doc["sitemaps"][0]


def finished(base: str, root: str, timeout: float = 60) -> dict:
    return wait_for(lambda: (p := progress(base, root)) and p["state"] != "running" and p, timeout=timeout,
                    what=f"the walk of {root} to finish")


def codes(result: dict) -> dict[str, str]:
    return {f["url"]: f["error"].rsplit("(", 1)[-1].rstrip(")") for f in result["failed"]}


# ------------------------------------------------------------------------------------ hostile index


def test_an_index_with_broken_and_hostile_children_is_walked_and_every_problem_reported(node, site) -> None:
    p = lambda path: u(site, path)  # noqa: E731
    site.put("/h/good.xml", urlset("https://shop.test/h/a", ("https://shop.test/h/b", "weekly"),
                                   (None, "daily"), "https://evil.test/h/x",
                                   ("https://shop.test/h/c", "fortnightly"), "https://shop.test/search/h",
                                   "not-a-url"))
    site.gzipped("/h/zipped.xml.gz", urlset("https://shop.test/h/z1", "https://shop.test/h/z2"))
    site.delayed("/h/hang.xml", urlset("https://shop.test/h/late"), 6)
    site.put("/h/html.xml", HTML, ctype="text/html")
    site.put("/h/laughs.xml", BILLION_LAUGHS)
    site.put("/h/xxe.xml", XXE)
    site.put("/h/bomb.xml.gz", gzip_bomb(64), ctype="application/x-gzip")
    site.endless("/h/endless.xml")
    site.put("/h/real.xml", urlset("https://shop.test/h/d"))
    site.redirect("/h/moved.xml", "/h/real.xml")
    root = p("/h/index.xml")
    children = [p(f"/h/{x}") for x in ("good.xml", "zipped.xml.gz", "missing.xml", "hang.xml", "html.xml",
                                       "laughs.xml", "xxe.xml", "bomb.xml.gz", "endless.xml", "moved.xml")]
    site.put("/h/index.xml", index(*children[:5], root, children[0], *children[5:], "ftp://files.test/s.xml"))
    t0 = now_ms()

    [result] = walk(node.url, root)

    assert result["state"] == "completed" and result["url"] == root
    assert result["sitemapsDiscovered"] == result["sitemapsProcessed"] == 11
    assert result["repeatedChildren"] == 2  # the index itself, and good.xml listed twice
    assert result["created"] == 6 and result["updated"] == result["duplicates"] == result["removed"] == 0
    assert result["invalid"] == 4 and result["unknownChangefreq"] == 1
    assert result["filtered"] == {"passthrough": 1, "unclassified": 0}
    assert {s["loc"] for s in result["invalidSample"]} == {None, "https://evil.test/h/x", "not-a-url",
                                                            "ftp://files.test/s.xml"}
    assert codes(result) == {p("/h/missing.xml"): "HTTP_404", p("/h/hang.xml"): "SITEMAP_TIMEOUT",
                             p("/h/html.xml"): "SITEMAP_NOT_SITEMAP", p("/h/laughs.xml"): "SITEMAP_DOCTYPE",
                             p("/h/xxe.xml"): "SITEMAP_DOCTYPE", p("/h/bomb.xml.gz"): "SITEMAP_TOO_LARGE",
                             p("/h/endless.xml"): "SITEMAP_TOO_LARGE"}
    # The crawler said who it is and carried the token header; the host was kept while pinned.
    assert site.headers["/h/good.xml"]["user-agent"] == "HarperSitemapCrawler/1.0"
    assert site.headers["/h/good.xml"]["host"] == f"{HOST}:{site.port}"
    # Targets carry their document and cadence; every device has a row, due at once (firstRender: now).
    assert target(node.url, "https://shop.test/h/b")["renderInterval"] == 7 * DAY_MS
    for url in (f"https://shop.test/h/{x}" for x in ("a", "c", "z1", "d")):
        t = target(node.url, url)
        assert t["renderInterval"] == DAY_MS and t["sitemapUrl"] in children
        for device in ("desktop", "mobile"):
            row = schedule(node.url, f"{url}|{device}")
            assert row["fromSitemap"] is True
            assert minute(t0) <= row["nextRenderTime"] <= now_ms()
    assert target(node.url, "https://shop.test/h/late") is None
    assert target(node.url, "https://evil.test/h/x") is None
    # Rows: every document that parsed, with its parent; entries page from the chunk rows.
    good = sitemap_row(node.url, children[0])
    assert good["sitemap"]["parentUrl"] == root and good["sitemap"]["entryCount"] == 7
    assert [e["loc"] for e in good["entries"]][:2] == ["https://shop.test/h/a", "https://shop.test/h/b"]
    assert sitemap_row(node.url, root)["sitemap"]["isIndex"] is True
    assert sitemap_row(node.url, p("/h/missing.xml")) is None
    roots = [s["url"] for s in httpx.get(f"{node.url}/sitemaps").json()["sitemaps"]]
    assert root in roots and children[0] not in roots


def test_a_root_outside_domains_is_refused_at_once_and_never_fetched(node, site, canary) -> None:
    for url, origin in [(site.url("/c/root.xml"), f"127.0.0.1:{site.port}"),
                        (f"http://{HOST}:{canary.port}/c/root.xml", f"{HOST}:{canary.port}")]:
        for background in (True, False):
            r = httpx.post(f"{node.url}/sitemaps", json={"url": url, "background": background}, timeout=30)
            assert r.status_code == 400 and r.json()["reason"] == "host-not-allowed", r.text
            assert r.headers["x-content-type-options"] == "nosniff"  # it names the URL (api/errors.py)
            assert f"{origin} is not allowed by domains; add '{origin}'" in r.json()["error"]
            assert progress(node.url, url) is None
    assert "/c/root.xml" not in site.hits and canary.hits == {}


def test_children_and_redirects_outside_domains_are_recorded_failures_and_never_fetched(node, site,
                                                                                        canary) -> None:
    off_port = f"http://{HOST}:{canary.port}/c/child.xml"  # pinned to 127.0.0.1: the canary
    by_ip = site.url("/c/by-ip.xml")  # the allowed server under a name domains does not list
    lure = u(site, "/c/lure.xml")
    site.redirect("/c/lure.xml", f"http://{HOST}:{canary.port}/c/lured.xml")
    site.put("/c/ok.xml", urlset("https://shop.test/c/ok"))
    for path in ("/c/child.xml", "/c/lured.xml", "/c/by-ip.xml"):
        (canary if path != "/c/by-ip.xml" else site).put(path, urlset("https://shop.test/c/bad"))
    root = u(site, "/c/index.xml")
    site.put("/c/index.xml", index(off_port, by_ip, lure, u(site, "/c/ok.xml")))

    [result] = walk(node.url, root)

    assert result["state"] == "completed" and result["created"] == 1
    assert codes(result) == {off_port: "SITEMAP_HOST_NOT_ALLOWED", by_ip: "SITEMAP_HOST_NOT_ALLOWED",
                             lure: "SITEMAP_HOST_NOT_ALLOWED"}
    errors = {f["url"]: f["error"] for f in result["failed"]}
    assert f"{HOST}:{canary.port} is not allowed by domains" in errors[off_port]
    assert f"127.0.0.1:{site.port} is not allowed by domains" in errors[by_ip]
    assert f"redirected to http://{HOST}:{canary.port}/c/lured.xml" in errors[lure]
    assert canary.hits == {} and "/c/by-ip.xml" not in site.hits and site.hits["/c/lure.xml"] == 1
    assert target(node.url, "https://shop.test/c/bad") is None


# ------------------------------------------------------------------------------------ decisions


def test_create_duplicate_reattach_unlink_defer_and_convergence(node, site) -> None:
    a, b, root = u(site, "/d/a.xml"), u(site, "/d/b.xml"), u(site, "/d/index.xml")
    site.put("/d/index.xml", index(a, b))
    site.put("/d/a.xml", urlset("https://shop.test/d/1", "https://shop.test/d/2", "https://shop.test/d/3"))
    site.put("/d/b.xml", urlset("https://shop.test/d/2", "https://shop.test/d/4"))

    [first] = walk(node.url, root)
    assert (first["created"], first["duplicates"], first["updated"]) == (4, 1, 0)
    assert target(node.url, "https://shop.test/d/2")["sitemapUrl"] == a  # the first claimer wins

    [second] = walk(node.url, root)  # nothing changed: zero writes
    assert (second["created"], second["updated"], second["skipped"], second["duplicates"]) == (0, 0, 4, 1)

    # A discovered target listed later is reattached: attribution patched, render clock kept.
    put_target(node.url, "https://shop.test/d/5")
    before = schedule(node.url, "https://shop.test/d/5|desktop")["nextRenderTime"]
    # A target of A whose URL no longer routes to prerender is deferred, never unlinked.
    node.ask("keeper", "put_targets", [{"url": "https://shop.test/search/d", "sitemapUrl": a}])
    site.put("/d/a.xml", urlset("https://shop.test/d/1", "https://shop.test/d/2",
                                ("https://shop.test/d/5", "monthly")))
    site.put("/d/b.xml", urlset())  # an empty urlset keeps its targets attributed

    [third] = walk(node.url, root)
    assert (third["updated"], third["removed"], third["deferred"], third["created"]) == (1, 1, 1, 0)
    assert third["removedSample"] == ["https://shop.test/d/3"]
    t5 = target(node.url, "https://shop.test/d/5")
    assert t5["sitemapUrl"] == a and t5["renderInterval"] == 30 * DAY_MS
    assert schedule(node.url, "https://shop.test/d/5|desktop")["nextRenderTime"] == before
    t3 = target(node.url, "https://shop.test/d/3")  # unlinked, still rendering as a discovered page
    assert t3["sitemapUrl"] is None and schedule(node.url, "https://shop.test/d/3|desktop") is not None
    assert target(node.url, "https://shop.test/search/d")["sitemapUrl"] == a
    assert target(node.url, "https://shop.test/d/4")["sitemapUrl"] == b

    # Another root listing an attributed URL reattaches it (roots are separate walks, as in the reference).
    other = u(site, "/d/other.xml")
    site.put("/d/other.xml", urlset("https://shop.test/d/1"))
    [fourth] = walk(node.url, other)
    assert fourth["updated"] == 1 and target(node.url, "https://shop.test/d/1")["sitemapUrl"] == other

    # revalidate: every listed URL is put again, due this minute.
    t0 = now_ms()
    [fifth] = walk(node.url, other, revalidate=True)
    assert fifth["created"] == 1
    due = schedule(node.url, "https://shop.test/d/1|mobile")["nextRenderTime"]
    assert minute(t0) <= due <= minute(now_ms())


# ------------------------------------------------------------------ new pages first, and lastmod


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def test_new_pages_are_due_at_once_then_on_their_slot_and_a_newer_lastmod_makes_one_due_paced(node, site) -> None:
    # a URL whose slot is more than two hours off, so the paced hour cannot lose to it
    now = now_ms()
    a = next(url for i in range(100) if next_slot(url := f"https://shop.test/lm/a{i}", DAY_MS, now) > now + 2 * HOUR_MS)
    b, junk, ahead = "https://shop.test/lm/b", "https://shop.test/lm/junk", "https://shop.test/lm/ahead"
    listed = [(a, None, "2024-01-01"), (b, None, "2024-01-01T10:00:00+02:00"), (junk, None, "last tuesday"),
              (ahead, None, "2999-01-01")]
    site.put("/lm/s.xml", urlset(*listed))
    root = u(site, "/lm/s.xml")

    [first] = walk(node.url, root)
    assert first["created"] == 4 and first["lastmodDue"] == 0
    assert (first["lastmodInvalid"], first["lastmodFuture"]) == (1, 1)  # ignored, counted
    keys = [f"{url}|desktop" for url in (a, b)]
    assert all(schedule(node.url, k)["nextRenderTime"] <= now_ms() for k in keys)  # due at once, not spread
    jobs = take(node.url, keys)
    before = now_ms()
    for k in keys:
        assert post_result(jobs[k]).status_code == 204
    after = now_ms()
    for url, k in zip((a, b), keys):  # the render after the first: on the URL's slot, not a day after it
        assert schedule(node.url, k)["nextRenderTime"] in {next_slot(url, DAY_MS, before), next_slot(url, DAY_MS, after)}
    slot_b = schedule(node.url, keys[1])["nextRenderTime"]

    changed = now_ms() + 1  # after the page was cached, before the refresh
    site.put("/lm/s.xml", urlset((a, None, iso(changed)), *listed[1:]))
    t1 = now_ms()
    [second] = walk(node.url, root)
    t2 = now_ms()
    assert second["skipped"] == 4 and second["lastmodDue"] == 1  # a's rendered device; b unchanged
    due = schedule(node.url, keys[0])["nextRenderTime"]
    assert paced_due(keys[0], t1, HOUR_MS) <= due <= paced_due(keys[0], t2, HOUR_MS) < now_ms() + HOUR_MS
    assert schedule(node.url, f"{a}|mobile")["nextRenderTime"] <= now_ms()  # never rendered: still due
    assert schedule(node.url, keys[1])["nextRenderTime"] == slot_b
    [third] = walk(node.url, root)  # nothing newer than the last walk: nothing read, nothing due
    assert third["lastmodDue"] == 0 and third["lastmodFuture"] == 1


# ------------------------------------------------------------------------------ background runs


def test_a_background_walk_shows_its_progress_and_refuses_a_second_walk(node, site) -> None:
    kids = [u(site, f"/bg/{i}.xml") for i in range(4)]
    for i in range(4):
        site.delayed(f"/bg/{i}.xml", urlset(f"https://shop.test/bg/{i}"), 0.8)
    root = u(site, "/bg/index.xml")
    site.put("/bg/index.xml", index(*kids))

    handle = start(node.url, root)
    path = f"/sitemap_refresh?root={quote(root, safe='')}"
    assert handle == {"url": root, "started": True, "progress": path}
    again = start(node.url, root)
    assert again["started"] is False and "already running" in again["reason"]
    seen = []

    def done() -> bool:
        row = httpx.get(f"{node.url}{handle['progress']}").json()
        seen.append(row)
        return row["state"] == "completed"

    wait_for(done, timeout=60, interval=0.1, what="the background walk")
    running = [r for r in seen if r["state"] == "running"]
    assert any(r["sitemapsProcessed"] < r["sitemapsDiscovered"] for r in running)
    assert len({r["updatedAt"] for r in running}) >= 2  # bumped after each document
    last = seen[-1]
    assert last["sitemapsProcessed"] == last["sitemapsDiscovered"] == 5 and last["created"] == 4
    assert last["node"] == "node-a" and last["finishedAt"] >= last["startedAt"]


def test_a_running_claim_is_refused_until_its_progress_is_stale(node, site) -> None:
    root = u(site, "/claim.xml")
    site.put("/claim.xml", urlset("https://shop.test/claim/1"))

    def fake(updated_at: object) -> None:
        row = {"state": "running", "node": "node-x", "runId": "elsewhere", "updatedAt": updated_at}
        node.ask("store", "apply", [(sitemap_run_key(root), encode_json(row))])

    fake(now_ms())
    refused = start(node.url, root)
    assert refused["started"] is False and "node-x is already running" in refused["reason"]
    assert httpx.post(f"{node.url}/sitemaps", json={"url": root, "background": False}).status_code == 409
    fake(now_ms() - 11 * 60_000)  # older than sitemap.staleRunMs (10 min): taken over
    assert start(node.url, root)["started"] is True
    row = finished(node.url, root)
    assert row["state"] == "completed" and row["node"] == "node-a" and "from node-x" in row["takenOverFrom"]
    fake("not a time")  # unreadable progress: taken over too
    assert start(node.url, root)["started"] is True
    finished(node.url, root)


# ---------------------------------------------------------------------------- refresh-all, delete


def test_refresh_all_walks_the_roots_only(node, site) -> None:
    site.hurry()  # refresh-all walks every root of this module, twice: not their deliberate delays
    site.put("/all/index.xml", index(u(site, "/all/child.xml")))
    site.put("/all/child.xml", urlset("https://shop.test/all/1"))
    walk(node.url, u(site, "/all/index.xml"))
    roots = {s["url"] for s in httpx.get(f"{node.url}/sitemaps").json()["sitemaps"]}
    assert u(site, "/all/index.xml") in roots and u(site, "/all/child.xml") not in roots

    results = walk(node.url)
    assert {r["url"] for r in results} == roots
    assert progress(node.url, u(site, "/all/child.xml")) is None  # children have no run of their own

    r = httpx.post(f"{node.url}/sitemaps", json={}, timeout=30)
    assert r.status_code == 200 and {s["url"] for s in r.json()["sitemaps"]} == roots
    assert all(s["started"] for s in r.json()["sitemaps"])
    job = wait_for(lambda: (p := progress(node.url, "all")) and p["state"] == "completed" and p, timeout=120)
    assert set(job["roots"]) == roots and job["done"] == len(roots)


def test_delete_cascades_to_descendants_targets_schedule_rows_and_pages(node, site) -> None:
    root, kid, loop = u(site, "/del/index.xml"), u(site, "/del/kid.xml"), u(site, "/del/loop.xml")
    site.put("/del/index.xml", index(kid, loop))
    site.put("/del/kid.xml", urlset("https://shop.test/del/1", "https://shop.test/del/2"))
    site.put("/del/loop.xml", index(root, u(site, "/del/deep.xml")))  # a cycle back to the root
    site.put("/del/deep.xml", urlset("https://shop.test/del/3"))
    [result] = walk(node.url, root)
    assert result["created"] == 3 and result["repeatedChildren"] == 1
    key = "https://shop.test/del/1|desktop"
    node.ask("store", "apply", [], [(key.encode(), b"a page")])

    r = httpx.delete(f"{node.url}/sitemaps", params={"url": root}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["targets"] == 3
    assert set(r.json()["sitemaps"]) == {root, kid, loop, u(site, "/del/deep.xml")}
    for n in (1, 2, 3):
        assert target(node.url, f"https://shop.test/del/{n}") is None
        assert schedule(node.url, f"https://shop.test/del/{n}|mobile") is None
    assert node.ask("store", "get_pages", [key]) == [None]
    assert all(sitemap_row(node.url, s) is None for s in (root, kid, loop))
    assert progress(node.url, root)["state"] == "completed"  # refresh rows are kept
    assert httpx.delete(f"{node.url}/sitemaps", params={"url": root}).status_code == 404


def test_delete_keeps_the_pages_another_sitemap_still_lists(node, site) -> None:
    """The same file under a second root name, then that root deleted: the first root still lists
    every page, so they stay (re-attributed to it), and only what no remaining sitemap lists goes."""
    first, second = u(site, "/twice/a.xml"), u(site, "/twice/b.xml")
    pages = [f"https://shop.test/twice/{n}" for n in range(5)]
    site.put("/twice/a.xml", urlset(*pages))
    site.put("/twice/b.xml", urlset(*pages, "https://shop.test/twice/only-b"))
    walk(node.url, first)
    walk(node.url, second)  # reattaches the five to the second root
    assert target(node.url, pages[0])["sitemapUrl"] == second

    r = httpx.delete(f"{node.url}/sitemaps", params={"url": second}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["targets"] == 1 and r.json()["reattributed"] == 5
    for page in pages:
        assert target(node.url, page)["sitemapUrl"] == first
        assert schedule(node.url, f"{page}|desktop") is not None
    assert target(node.url, "https://shop.test/twice/only-b") is None
    [again] = walk(node.url, first)  # the first root's walk finds its pages where it left them
    assert again["skipped"] == 5 and again["created"] == 0


# --------------------------------------------------------------------------------- odds and ends


@pytest.mark.parametrize(("body", "message"), [
    ({"url": "ftp://files.test/s.xml"}, "only http and https"),
    ({"url": "/relative.xml"}, "Not a valid absolute http(s) URL"),
    ({"url": ""}, "url is required"),
    ({"url": "https://shop.test/s.xml", "background": "yes"}, "background must be true or false"),
    ({"url": "https://shop.test/s.xml", "revalidate": 1}, "revalidate must be true or false"),
])
def test_bad_input_is_a_400_that_starts_nothing(node, body, message) -> None:
    r = httpx.post(f"{node.url}/sitemaps", json=body)
    assert r.status_code == 400 and message in r.json()["error"], r.text


def test_bad_reads_are_clear(node) -> None:
    assert httpx.post(f"{node.url}/sitemaps", content=b"{nope").status_code == 400
    assert httpx.get(f"{node.url}/sitemap_refresh", params={"root": "nope"}).status_code == 400
    none = {"root": "https://none.test/s.xml"}
    assert httpx.get(f"{node.url}/sitemap_refresh", params=none).status_code == 404
    assert httpx.get(f"{node.url}/sitemaps", params={"url": "https://none.test/s.xml"}).status_code == 404


def test_the_daily_refresh_is_armed_on_the_configured_node(node) -> None:
    status = node.ask("sitemapper", "status")
    assert status["nextDailyRefresh"] == next_daily_refresh("03:30", "UTC", now_ms())
    assert node.refresh()["nodes"][0]["sitemapWalker"]["live"] is True
