"""A sitemap walker killed mid-walk: Ray restarts its process and the new walker resumes the run
(what only Ray shows: the kill of a real process and its restart; the rest of the walker's tests run
on one node without Ray, ``test_sitemaps.py``)."""

from __future__ import annotations

import pytest
import ray

from prerender_ray.actors.common import lookup
from tests.api.test_sitemaps import HOST, finished, start, u
from tests.sitemap_server import SitemapSite, index, urlset
from tests.support import deploy_on, progress, target, wait_for


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.close()


@pytest.fixture(scope="module")
def node(ray_cluster, tmp_path_factory, site):
    d = deploy_on(ray_cluster, tmp_path_factory.mktemp("sitemaps-restart") / "data", {
        "domains": ["shop.test", f"{HOST}:{site.port}"],
        "origin": {"staging": {"ip": "127.0.0.1"}},
        "sitemap": {"fetchTimeoutMs": 5000, "maxBytes": 1024 * 1024},
    })
    yield d
    d.stop()


def test_a_killed_walker_resumes_its_run_after_restart(node, site) -> None:
    kids = [u(site, f"/kill/{i}.xml") for i in range(6)]
    for i in range(6):
        site.delayed(f"/kill/{i}.xml", urlset(f"https://shop.test/kill/{i}"), 1.0)
    root = u(site, "/kill/index.xml")
    site.put("/kill/index.xml", index(*kids))
    walker = lookup("sitemapper", "node-a")
    pid = ray.get(walker.status.remote())["pid"]
    assert start(node.url, root)["started"] is True
    first = wait_for(lambda: (p := progress(node.url, root)) and p["sitemapsProcessed"] >= 2 and p,
                     timeout=30)
    assert first["state"] == "running"

    ray.kill(walker, no_restart=False)
    wait_for(lambda: _pid(walker) not in (None, pid), timeout=60, what="a new walker process")
    row = finished(node.url, root, timeout=90)
    assert row["state"] == "completed" and row["trigger"] == "resumed" and row["runId"] != first["runId"]
    assert "after a restart" in row["takenOverFrom"]
    assert row["sitemapsProcessed"] == 7
    assert all(target(node.url, f"https://shop.test/kill/{i}") for i in range(6))


def _pid(handle: object) -> int | None:
    try:
        return ray.get(handle.status.remote(), timeout=2)["pid"]  # type: ignore[attr-defined]
    except Exception:
        return None
