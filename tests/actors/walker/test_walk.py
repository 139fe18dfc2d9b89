"""The walk's document pipeline (actors/walker/walk.py) on a node's real parts (``tests.localnode``):
the document cap, and consecutive urlsets whose rows are written while the next one reconciles."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from prerender_ray.sitemaps.rules import SAMPLE_TEXT
from prerender_ray.storage.registry import decode_json, encode_json, sitemap_run_key
from prerender_ray.timeutil import now_ms
from tests.localnode import LocalNode
from tests.sitemap_server import SitemapSite, index, urlset
from tests.support import progress, schedule, sitemap_row, target, wait_for, walk

CAP = 4  # sitemap.maxDocuments of this deployment: the index and three children


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    d = LocalNode.start(tmp_path_factory.mktemp("walk") / "data", {
        "domains": ["shop.test", f"127.0.0.1:{site.port}"],
        "sitemap": {"fetchTimeoutMs": 5000, "maxDocuments": CAP},
    })
    yield d
    d.stop()


def test_the_document_cap_leaves_the_rest_unfetched_and_every_taken_document_complete(node, site) -> None:
    children = [site.url(f"/cap/{i}.xml") for i in range(6)]
    for i in range(6):  # consecutive children share a URL: each later one is a duplicate of the earlier
        site.put(f"/cap/{i}.xml", urlset(f"https://shop.test/cap/{i}", f"https://shop.test/cap/{i + 1}"))
    root = site.url("/cap/index.xml")
    site.put("/cap/index.xml", index(*children))

    [result] = walk(node.url, root)

    assert result["state"] == "completed"
    assert result["sitemapsDiscovered"] == CAP  # the three children past the cap are counted, never held
    assert (result["sitemapsProcessed"], result["sitemapsSkipped"]) == (CAP, 3)
    assert (result["created"], result["duplicates"]) == (4, 2)
    assert [site.hits.get(f"/cap/{i}.xml", 0) for i in range(6)] == [1, 1, 1, 0, 0, 0]  # never fetched
    for i in range(4):  # the first claimer wins, in document order
        t = target(node.url, f"https://shop.test/cap/{i}")
        assert t["sitemapUrl"] == children[max(i - 1, 0)]
        assert schedule(node.url, f"https://shop.test/cap/{i}|desktop") is not None
    assert target(node.url, "https://shop.test/cap/4") is None
    # Every taken child's row is written (after its reconcile, while the next one ran), with its parent.
    for i in range(3):
        row = sitemap_row(node.url, children[i])
        assert row["sitemap"]["parentUrl"] == root and row["sitemap"]["entryCount"] == 2
    assert sitemap_row(node.url, children[3]) is None
    done = progress(node.url, root)
    assert done["state"] == "completed" and done["sitemapsProcessed"] == CAP


def test_children_past_the_document_cap_are_counted_never_held(node, site, monkeypatch) -> None:
    # A hostile index of indexes: every child listed past the cap would be one more queued URL.
    wide = 5000
    for half in ("a", "b"):
        site.put(f"/wide/{half}.xml", index(*(site.url(f"/wide/{half}/{i}.xml") for i in range(wide))))
    site.put("/wide/a/0.xml", urlset("https://shop.test/wide/0"))
    root = site.url("/wide/index.xml")
    site.put("/wide/index.xml", index(site.url("/wide/a.xml"), site.url("/wide/b.xml")))
    walker = node.parts["sitemapper"]
    held: list[int] = []  # child URLs the walk holds, after every document
    progress_of = walker._progress

    async def counting(w) -> None:
        held.append(len(w.discovered))
        await progress_of(w)

    monkeypatch.setattr(walker, "_progress", counting)

    [result] = walk(node.url, root)

    assert result["state"] == "completed"
    # The root, both indexes and the first child fill the cap; every later listing is only counted.
    assert (result["sitemapsDiscovered"], result["sitemapsProcessed"]) == (CAP, CAP)
    assert result["sitemapsSkipped"] == 2 * wide - 1 and result["failed"] == []
    assert len(held) == CAP and max(held) <= CAP
    assert site.hits.get("/wide/a/0.xml") == 1 and site.hits.get("/wide/a/1.xml") is None
    assert result["created"] == 1
    row = progress(node.url, root)
    assert (row["sitemapsDiscovered"], row["sitemapsSkipped"]) == (CAP, 2 * wide - 1)


def test_huge_invalid_locs_are_sampled_clipped_and_the_progress_row_stays_small(node, site) -> None:
    # A loc past the URL length limit is invalid; its sample must not carry the megabyte along into the
    # result, nor into the progress row rewritten after every document.
    huge = [f"https://shop.test/huge/{i}/" + "x" * (1 << 20) for i in range(4)]
    root = site.url("/huge.xml")
    site.put("/huge.xml", urlset(*huge, "https://shop.test/huge/ok"))

    [result] = walk(node.url, root)

    assert result["state"] == "completed" and result["created"] == 1
    assert result["invalid"] == 4 and len(result["invalidSample"]) == 4
    assert len(json.dumps(result)) < 64 * 1024
    [raw] = node.ask("store", "get", [sitemap_run_key(root)])
    assert len(raw) < 64 * 1024 and decode_json(raw)["invalid"] == 4
    for sample, loc in zip(result["invalidSample"], huge):
        assert sample["loc"] == loc[:SAMPLE_TEXT] + f"… ({len(loc)} characters)"
        assert sample["error"] == "not a valid absolute http(s) URL"


def test_a_urlset_root_is_one_document_with_its_row(node, site) -> None:
    root = site.url("/solo.xml")
    site.put("/solo.xml", urlset("https://shop.test/solo/1", "https://shop.test/solo/2"))

    [result] = walk(node.url, root)

    assert result["state"] == "completed" and result["created"] == 2
    assert result["sitemapsProcessed"] == result["sitemapsDiscovered"] == 1
    row = sitemap_row(node.url, root)
    assert row["sitemap"]["parentUrl"] is None and row["sitemap"]["entryCount"] == 2


def test_a_walk_taken_over_midway_stops_at_its_next_document_and_leaves_the_row_alone(node, site) -> None:
    kids = [site.url(f"/lost/{i}.xml") for i in range(6)]
    for i in range(6):
        site.delayed(f"/lost/{i}.xml", urlset(f"https://shop.test/lost/{i}"), 2.0)  # room to take over
    root = site.url("/lost/index.xml")
    site.put("/lost/index.xml", index(*kids))
    r = httpx.post(f"{node.url}/sitemaps", json={"url": root}, timeout=30)
    assert r.json()["sitemaps"][0]["started"] is True
    wait_for(lambda: (progress(node.url, root) or {}).get("sitemapsProcessed", 0) >= 2,
             timeout=30, interval=0.05, what="the index and the first child")
    # Another walker takes the run over (its fresh row): this walk must stop without touching it.
    theirs = {"state": "running", "node": "node-x", "runId": "elsewhere", "updatedAt": now_ms()}
    node.ask("store", "apply", [(sitemap_run_key(root), encode_json(theirs))])
    wait_for(lambda: not any(run["root"] == root for run in node.ask("sitemapper", "status")["running"]),
             timeout=30, what="the walk to stop")
    time.sleep(0.5)
    [raw] = node.ask("store", "get", [sitemap_run_key(root)])
    assert decode_json(raw) == theirs
    created = [target(node.url, f"https://shop.test/lost/{i}") is not None for i in range(6)]
    assert created == [True, True, False, False, False, False]  # kids[2] was fetched, never written
    assert [site.hits.get(f"/lost/{i}.xml", 0) for i in range(4, 6)] == [0, 0]


def test_a_walk_listing_a_url_a_bots_miss_made_confirms_its_target(node, site) -> None:
    url = "https://shop.test/confirm/!found"
    assert node.ask("keeper", "discover_target", url, 0)["written"] == 1
    assert target(node.url, url)["discovered"] is True and target(node.url, url)["sitemapUrl"] is None
    site.put("/confirm.xml", urlset(url))
    [result] = walk(node.url, site.url("/confirm.xml"))
    assert result["state"] == "completed" and result["updated"] == 1  # reattached: a patch
    t = target(node.url, url)
    assert t["sitemapUrl"] == site.url("/confirm.xml") and "discovered" not in t
