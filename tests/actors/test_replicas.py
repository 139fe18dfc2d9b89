"""Per-URL data on R nodes (``cluster.replicas: 3`` on five nodes; docs/architecture.md#tiers): each URL's target
and pages live on exactly its three holders, every node serves every URL to bots (a node without a copy
reads a holder), and a node's loss and return end with R copies again, nothing lost."""

from __future__ import annotations

import time

import httpx
import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.identity.nodes import Ownership
from tests.support import (
    CLUSTER_SERIES,
    dashboard_series,
    deploy_on,
    exposed_series,
    put_target,
    ready,
    wait_for,
    write_page,
)

R = 3
URLS = [f"https://site.test/r/{i}" for i in range(40)]
KEYS = [f"{u}|desktop" for u in URLS]
FUTURE = int(time.time() * 1000) + 30 * 86_400_000
FIVE = ("node-a", "node-b", "node-c", "node-d", "node-e")
FOUR = tuple(n for n in FIVE if n != "node-c")
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster(ray_cluster, tmp_path_factory):
    with ray_cluster.added(*FIVE[1:]):
        d = deploy_on(ray_cluster, tmp_path_factory.mktemp("replicas") / "data", {
            "domains": ["site.test"], "cluster": {"replicas": R}, "render": {"reconcile": {"startDelay": "1h"}}})
        yield ray_cluster, d
        d.stop()


def held(names: tuple[str, ...]) -> dict[str, dict[str, set[str]]]:
    """Which nodes hold each URL's target and page (asked of each node's store)."""
    out: dict[str, dict[str, set[str]]] = {u: {"target": set(), "page": set()} for u in URLS}
    for name in names:
        try:
            store = lookup("store", name)
            targets = ray.get(store.get_targets.remote(URLS), timeout=30)
            pages = ray.get(store.has_pages.remote(KEYS), timeout=30)
        except (ValueError, ray.exceptions.RayError):
            continue
        for u, t, p in zip(URLS, targets, pages):
            if t is not None:
                out[u]["target"].add(name)
            if p:
                out[u]["page"].add(name)
    return out


def misplaced(names: tuple[str, ...]) -> list[str]:
    """URLs whose target or page is not held by exactly their holders under ``names``."""
    own = Ownership(list(names))
    return [f"{u} {where}" for u, where in held(names).items()
            if any(nodes != set(own.holders(u, R)) for nodes in where.values())]


def test_each_url_lives_on_its_holders_and_every_node_serves_it(cluster) -> None:
    rc, d = cluster
    own = Ownership(list(FIVE))
    for i, url in enumerate(URLS):
        assert put_target(d.urls[FIVE[i % 5]], url, nextRenderTime=FUTURE)["owner"] == own.owner(url)
    for url, key in zip(URLS, KEYS):  # as a result stores it: on its owner, shipped from there
        write_page(own.owner(url), key, f"<html><body>rendered {url}</body></html>".encode())
    wait_for(lambda: not misplaced(FIVE), timeout=60, what="every URL on exactly its three holders")
    assert {n: sum(n in own.holders(u, R) for u in URLS) for n in FIVE} == {
        n: ray.get(lookup("store", n).counts.remote(), timeout=30)["targets"] for n in FIVE}

    for name, base in d.urls.items():  # every node serves every URL; a non-holder reads a holder
        for url in URLS:
            r = httpx.get(f"{base}/p/{url}", headers={"user-agent": "Googlebot/2.1"}, timeout=30)
            assert r.status_code == 200 and f"rendered {url}" in r.text, (name, url, r.status_code)
            t = httpx.get(f"{base}/render_targets", params={"url": url}, timeout=30)
            assert t.status_code == 200 and t.json()["url"] == url
    reads = {n: _metric(base, "prerender_holder_reads_total", 'outcome="page"') for n, base in d.urls.items()}
    assert all(v > 0 for v in reads.values()), reads  # each node holds a share only: each read others
    # the dashboard's cluster panels have their series on every node (the rest: tests/api/bot/test_middleware.py)
    missing = {n: CLUSTER_SERIES - exposed_series(base) for n, base in d.urls.items()}
    assert not any(missing.values()), missing
    assert CLUSTER_SERIES <= dashboard_series()


def test_a_lost_node_s_urls_get_their_copies_back_and_its_return_ends_with_r_again(cluster) -> None:
    rc, d = cluster
    if misplaced(FIVE):
        test_each_url_lives_on_its_holders_and_every_node_serves_it(cluster)
    rc.remove_node("node-c")
    wait_for(lambda: not misplaced(FOUR), timeout=120, interval=1, what="three copies of every URL on the four survivors")
    rc.add_node("node-c")  # the same name and data dir: it pulls its share, the others drop theirs
    wait_for(lambda: not misplaced(FIVE), timeout=180, interval=1, what="exactly the holders among five again")
    wait_for(lambda: "node-c" in (d.refresh() and d.urls) and ready(d.urls["node-c"]), timeout=60,
             what="node-c serving")
    base = d.urls["node-c"]
    for url in URLS[:12]:
        r = httpx.get(f"{base}/p/{url}", headers={"user-agent": "Googlebot/2.1"}, timeout=30)
        assert r.status_code == 200 and f"rendered {url}" in r.text, (url, r.status_code)


def test_a_restarted_ingress_replica_serves_other_nodes_urls_from_its_first_request(cluster) -> None:
    """It reads the controller's membership before it serves: knowing only its own node, it took
    every URL for its own and sent the ones it does not hold to the origin (seen for 9 s in the soak)."""
    rc, d = cluster
    if misplaced(FIVE):
        test_each_url_lives_on_its_holders_and_every_node_serves_it(cluster)
    name = "node-a"
    own = Ownership(list(FIVE))
    far = [u for u in URLS if name not in own.holders(u, R)][:6]
    replica = lookup("ingress", name, 0)
    before = ray.get(replica.status.remote(), timeout=30)["pid"]
    ray.kill(replica, no_restart=False)
    wait_for(lambda: _status(name) not in (None, before), timeout=60, interval=0.1, what="the replica restarted")
    base = d.urls[name]
    for url in far:  # at once: before the first membership check (5 s) could have brought it
        r = httpx.get(f"{base}/p/{url}", headers={"user-agent": "Googlebot/2.1"}, timeout=30)
        assert r.status_code == 200 and f"rendered {url}" in r.text, (url, r.status_code, r.headers)


def _status(name: str) -> int | None:
    """The pid of the node's first ingress replica once it serves; None while it starts."""
    try:
        s = ray.get(lookup("ingress", name, 0).status.remote(), timeout=5)
    except (ValueError, ray.exceptions.RayError):
        return None
    return s["pid"] if s["up"] else None


def _metric(base: str, name: str, label: str) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
