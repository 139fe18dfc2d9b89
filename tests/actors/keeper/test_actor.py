"""Crash safety of the queue: restarts of the keeper, of the lease table and of the whole node lose
no row and never grant an in-flight key twice."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest
import ray

from prerender_ray.actors.common import lookup
from prerender_ray.storage.rocks import REGISTRY, SCHEDULE, store_path
from tests.support import (
    claim,
    deploy_on,
    get,
    post_result,
    put_target,
    rocksdb_options,
    schedule,
    take,
    wait_for,
)


def _pid(kind: str) -> int | None:
    try:
        return ray.get(lookup(kind, "node-a").status.remote(), timeout=2).get("pid")
    except Exception:
        return None


def restart(kind: str, base: str) -> None:
    """Kill the actor (Ray restarts it) and wait until the node is ready again."""
    handle = lookup(kind, "node-a")
    before = _pid(kind)
    ray.kill(handle, no_restart=False)
    wait_for(lambda: _pid(kind) not in (None, before), timeout=60, what=f"a new {kind} process")
    wait_for(lambda: get(f"{base}/readyz").status_code == 200, timeout=60, what="readiness")


def claim_all(base: str) -> set[str]:
    """Everything grantable now: claims over two publishes of the ready set, so nothing is missed."""
    ids: set[str] = set()
    for i in range(3):
        if i:
            time.sleep(1.1)
        for _ in range(4):
            ids |= {j["id"] for j in claim(base, 25)}
    return ids


@pytest.fixture(scope="module")
def node(ray_cluster, tmp_path_factory):
    d = deploy_on(ray_cluster, tmp_path_factory.mktemp("crash") / "data")
    yield d
    d.stop()


def test_restarts_lose_no_row_and_never_regrant_work_in_flight(node) -> None:
    urls = [f"https://crash.example/p/{i}" for i in range(15)]
    keys = [k for u in urls for k in put_target(node.url, u, nextRenderTime=1)["cacheKeys"]]
    in_flight: dict[str, dict] = {}
    wait_for(lambda: in_flight.update({j["id"]: j for j in claim(node.url, 10)}) or len(in_flight) >= 10,
             what="ten grants")
    granted = set(in_flight)

    restart("keeper", node.url)
    assert all(schedule(node.url, k) is not None for k in keys)  # no row lost
    second = claim_all(node.url)
    assert not second & granted  # leases live in the lease table, not the keeper
    assert second == set(keys) - granted

    restart("leases", node.url)
    assert not claim_all(node.url) & (granted | second)  # persisted: nothing re-granted

    for job in list(in_flight.values())[:3]:  # late results of the first grants are still accepted
        assert post_result(job).status_code == 204
        assert schedule(node.url, job["id"])["nextRenderTime"] > time.time() * 1000

    # ... once: the answered grant is durable, so a replay after another restart applies nothing
    job = next(iter(in_flight.values()))
    due = schedule(node.url, job["id"])["nextRenderTime"]
    restart("leases", node.url)
    assert post_result(job, outcome="non-indexable", reason="noindex", html=None).status_code == 204
    assert schedule(node.url, job["id"])["nextRenderTime"] == due


@pytest.mark.parametrize("kind", ["keeper", "store"])
def test_results_posted_while_a_process_is_killed_lose_nothing_acknowledged(node, kind: str) -> None:
    """Results arrive in groups while the keeper (or the store) is killed with SIGKILL mid-stream:
    every result answered 204 is applied (its page stored, its row moved on); every other one is
    applied by the fleet's retry once the node is back, never acknowledged without being applied
    (a grant a dead keeper was answering opens again)."""
    urls = [f"https://crash.example/{kind}-batch/{i}" for i in range(60)]
    keys = [k for u in urls for k in put_target(node.url, u, nextRenderTime=1)["cacheKeys"]]
    jobs = list(take(node.url, keys).values())
    jobs = [j for j in jobs if j["id"] in set(keys)]
    start = time.time() * 1000
    pid = _pid(kind)

    def post(job: dict, html: bytes) -> int | None:
        try:
            return post_result(job, html=html, retry_503=False).status_code
        except httpx.HTTPError:
            return None

    page = {j["id"]: b"<html><body>" + j["id"].encode() * 200 + b"</body></html>" for j in jobs}
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(post, j, page[j["id"]]) for j in jobs]
        wait_for(lambda: sum(f.done() for f in futures) >= 8, timeout=60, interval=0.005, what="the first answers")
        if kind == "keeper":  # killed while a group is begun and not finished: the store holds it there
            store_pid = _pid("store")
            os.kill(store_pid, signal.SIGSTOP)
            try:
                time.sleep(1)
                os.kill(pid, signal.SIGKILL)
            finally:
                os.kill(store_pid, signal.SIGCONT)
        else:
            os.kill(pid, signal.SIGKILL)
        first = {j["id"]: f.result() for j, f in zip(jobs, futures)}
    wait_for(lambda: _pid(kind) not in (None, pid), timeout=60, what=f"a new {kind} process")
    wait_for(lambda: get(f"{node.url}/readyz").status_code == 200, timeout=60, what="readiness")
    acknowledged = [k for k, status in first.items() if status == 204]
    assert 0 < len(acknowledged) < len(jobs), first  # the kill landed mid-stream
    for job in jobs:  # the fleet retries what was not acknowledged: every retry is applied or a duplicate
        if first[job["id"]] != 204:
            wait_for(lambda j=job: post(j, page[j["id"]]) == 204, timeout=60, interval=0.5,
                     what=f"the retry of {job['id']}")
    store = lookup("store", "node-a")
    pages = dict(zip(keys, ray.get(store.get_pages.remote(keys), timeout=30)))
    assert [k for k in keys if pages[k] is None] == []
    assert [k for k in keys if schedule(node.url, k)["nextRenderTime"] < start] == []


def test_the_keeper_writes_its_schedule_blind_while_the_registry_keeps_its_memtable_bloom(node) -> None:
    """The schedule is never read for absent keys (the keeper holds every row), the registry is."""
    def running(purpose: str) -> str:
        return rocksdb_options(store_path(node.data_dir, "node-a", purpose))

    assert "memtable_whole_key_filtering=false\n" in running(SCHEDULE)
    assert "memtable_whole_key_filtering=true\n" in running(REGISTRY)


def test_reconcile_restores_missing_rows_jittered_and_pageless_keys_first(node) -> None:
    from prerender_ray.storage.registry import Target, target_key

    store, keeper = lookup("store", "node-a"), lookup("keeper", "node-a")
    urls = [f"https://crash.example/lost/{i}" for i in range(40)]
    # a crash between the target commit and its schedule rows: targets without rows
    ray.get(store.apply.remote([(target_key(u), Target(url=u).encode()) for u in urls]))
    assert schedule(node.url, f"{urls[0]}|desktop") is None
    run = ray.get(keeper.reconcile.remote())
    assert run["missing"] >= 80 and run["restored"] == run["missing"] and run["truncated"] is False
    dues = {schedule(node.url, f"{u}|{d}")["nextRenderTime"] for u in urls for d in ("desktop", "mobile")}
    assert len(dues) > 20  # jittered over the cadence, not a herd
    again = ray.get(keeper.reconcile.remote())
    assert again["missing"] == 0 and again["restored"] == 0


def test_a_restarted_keeper_and_ingress_come_back_with_the_live_overrides(node) -> None:
    from prerender_ray.config.overrides import Overrides
    from prerender_ray.storage.keys import OVERRIDES_KEY

    route = {"match": "prefix", "path": "/live-crash/", "renderInterval": 7_200_000}
    url = "https://crash.example/live-crash/1"
    put_target(node.url, url, nextRenderTime=int(time.time() * 1000) + 86_400_000)
    store = lookup("store", "node-a")
    ray.get(store.apply.remote([(OVERRIDES_KEY, Overrides({"ingress.routes": [route]}).encode())]), timeout=30)

    def live_class() -> bool:
        doc = get(f"{node.url}/prerender_admin/queue-state").json()
        return any("/live-crash/" in c["route"] and c["rows"] == 2 for c in doc["classes"])

    ray.get(lookup("keeper", "node-a").sync_status.remote(), timeout=30)  # what the admin API nudges
    assert live_class()
    restart("keeper", node.url)  # the new process reads the row before it loads its rows
    assert live_class()

    replica = lookup("ingress", "node-a", 0)
    before = ray.get(replica.status.remote(), timeout=10)["pid"]
    ray.kill(replica, no_restart=False)

    def new_replica_up() -> bool:
        try:
            st = ray.get(lookup("ingress", "node-a", 0).status.remote(), timeout=5)
        except Exception:
            return False
        return st["pid"] != before and st["up"]

    wait_for(new_replica_up, timeout=60, what="a new ingress process serving")
    # it read the row before it served its first request
    assert get(f"{node.url}/prerender_admin/config").json()["config"]["ingress"]["routes"] == [route]
    ray.get(store.apply.remote([(OVERRIDES_KEY, None)]), timeout=30)
    wait_for(lambda: get(f"{node.url}/prerender_admin/config").json()["config"]["ingress"]["routes"] == [],
             timeout=30, what="the file's routes back on the ingress")


def test_a_whole_node_restart_keeps_rows_and_leases(ray_cluster, node) -> None:
    # last: it stops the module's node and starts every actor anew on the same data (a deployment of
    # its own cost a third start); the fixture's stop then finds the module's controller gone
    keys = put_target(node.url, "https://crash.example/node-restart", nextRenderTime=1)["cacheKeys"]
    got: dict[str, dict] = {}
    wait_for(lambda: got.update({j["id"]: j for j in claim(node.url, 25)}) or set(keys) <= set(got),
             what="both devices granted")
    node.stop()
    d = deploy_on(ray_cluster, node.data_dir)
    try:
        assert all(schedule(d.url, k)["nextRenderTime"] == 1 for k in keys)
        assert not claim_all(d.url) & set(keys)
        assert post_result(got[keys[0]]).status_code == 204
    finally:
        d.stop()
