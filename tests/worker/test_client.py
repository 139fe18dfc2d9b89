"""The queue client against fake queue servers on 127.0.0.1: what a claim and a result look like on the
wire, and how a host that is down, slow, busy or answering garbage is classified (no browser)."""

from __future__ import annotations

import base64
import json
import random
import time

import pytest
from structlog.testing import capture_logs

from prerender_ray.worker.backoff import HostHealth, Timing
from prerender_ray.worker.client import QueueClient
from prerender_ray.worker.outcome import Job, build_metadata, error_verdict, result_body
from tests.support import free_port
from tests.worker.site import FakeQueue


@pytest.fixture
def queue():
    q = FakeQueue().start()
    yield q
    q.stop()


def client(*queues: str, **kw) -> QueueClient:
    kw.setdefault("health", HostHealth(Timing(), random.Random(0)))
    return QueueClient(list(queues), user="fleet", password="s3cret", worker_id="w-1", **kw)


def now() -> float:
    return time.time() * 1000


async def test_a_claim_sends_the_limit_with_basic_auth_and_the_worker_id(queue: FakeQueue) -> None:
    queue.jobs = [queue.job("https://shop.example/a"), queue.job("https://shop.example/b"), {"id": 1}]
    c = client(queue.base)
    r = await c.claim(queue.base, 5)
    await c.close()
    assert r.kind == "jobs" and [j.url for j in r.jobs] == [
        "https://shop.example/a",
        "https://shop.example/b",
    ]
    seen = queue.claims()[0]
    assert json.loads(seen.body) == {"limit": 5}
    assert seen.headers["content-type"] == "application/json" and seen.headers["x-worker-id"] == "w-1"
    assert seen.headers["authorization"] == "Basic " + base64.b64encode(b"fleet:s3cret").decode()
    assert c.health.pick(now()) == queue.base  # jobs: poll again at once


async def test_an_empty_claim_idles_the_host_for_about_15_s(queue: FakeQueue) -> None:
    c = client(queue.base)
    r = await c.claim(queue.base, 2)
    await c.close()
    assert r.kind == "empty" and c.health.state(queue.base).failures == 0
    assert 11_000 <= c.health.wait_ms(now()) <= 18_750


@pytest.mark.parametrize("mode", ["garbage", "object", "drop"])
async def test_garbage_is_treated_like_an_unavailable_host(queue: FakeQueue, mode: str) -> None:
    queue.mode = mode
    c = client(queue.base)
    r = await c.claim(queue.base, 2)
    await c.close()
    assert r.kind == "unavailable"
    assert c.health.state(queue.base).failures == 1 and 400 <= c.health.wait_ms(now()) <= 1000


async def test_a_host_that_is_down_opens_the_circuit() -> None:
    down = f"http://127.0.0.1:{free_port()}"
    c = client(down)
    r = await c.claim(down, 2)
    r2 = await c.claim(down, 2)  # same open window: no escalation
    await c.close()
    assert r.kind == r2.kind == "unavailable" and "ConnectError" in r.detail
    assert c.health.state(down).failures == 1


async def test_a_slow_host_times_out_as_unavailable(queue: FakeQueue) -> None:
    queue.mode, queue.slow_s = "slow", 2.0
    c = client(queue.base, claim_timeout_s=0.3)
    t0 = time.monotonic()
    r = await c.claim(queue.base, 2)
    await c.close()
    assert r.kind == "unavailable" and time.monotonic() - t0 < 1.5


async def test_503_honours_retry_after_and_other_statuses_are_errors(queue: FakeQueue) -> None:
    queue.mode, queue.retry_after = "unavailable", "3"
    c = client(queue.base)
    r = await c.claim(queue.base, 2)
    assert r.kind == "unavailable" and r.status == 503
    assert 2_900 <= c.health.wait_ms(now()) <= 3_000
    queue.mode = "error"
    r = await c.claim(queue.base, 2)
    await c.close()
    assert r.kind == "error" and r.status == 500 and c.health.state(queue.base).failures >= 1


def _result(job: Job) -> tuple[bytes, dict]:
    return result_body(build_metadata(job, error_verdict("X", "y"), 10, None), None)


async def test_a_result_goes_to_the_callback_origin_and_204_is_delivered(queue: FakeQueue) -> None:
    granted_by = "http://127.0.0.1:1"  # the claim host is not where results go
    job = Job.parse(queue.job("https://shop.example/a"), granted_by=granted_by)
    c = client(granted_by, queue.base)
    body, headers = _result(job)
    assert await c.post_result(job, body, headers) == "delivered"
    await c.close()
    seen = queue.requests("/render_queue/job_result")[0]
    assert seen.body == body and seen.headers["x-metadata-size"] == headers["x-metadata-size"]
    assert seen.headers["content-type"] == "application/octet-stream" and seen.headers["x-worker-id"] == "w-1"
    assert "content-encoding" not in seen.headers


async def test_a_503_result_is_retried_while_the_lease_lasts(queue: FakeQueue) -> None:
    queue.result_statuses = [503, 502]
    job = Job.parse(queue.job("https://shop.example/a"))
    c = client(queue.base)
    assert await c.post_result(job, *_result(job)) == "delivered"
    await c.close()
    posts = queue.requests("/render_queue/job_result")
    assert len(posts) == 3 and posts[0].body == posts[2].body
    assert 0.4 <= posts[1].at - posts[0].at <= 2.0  # 0.5-1 s, then 1-2 s


async def test_retries_stop_after_three_and_never_outlive_the_lease(queue: FakeQueue) -> None:
    queue.result_statuses = [503] * 10
    short = Job.parse(queue.job("https://shop.example/short", lease_ms=1200))
    c = client(queue.base)
    assert await c.post_result(short, *_result(short)) == "expired"
    assert len(queue.requests("/render_queue/job_result")) <= 2
    gone = Job.parse(queue.job("https://shop.example/gone", lease_ms=-1))
    assert await c.post_result(gone, *_result(gone)) == "expired"
    assert len([s for s in queue.requests("/render_queue/job_result") if b"/gone" in s.body]) == 0
    await c.close()


@pytest.mark.parametrize("status, result", [(409, "not-held"), (413, "too-large"), (400, "rejected")])
async def test_job_level_refusals_are_not_retried_and_open_no_circuit(
    queue: FakeQueue, status: int, result: str
) -> None:
    queue.result_statuses = [status]
    job = Job.parse(queue.job("https://shop.example/a"))
    c = client(queue.base)
    assert await c.post_result(job, *_result(job)) == result
    await c.close()
    assert len(queue.requests("/render_queue/job_result")) == 1
    assert c.health.state(queue.base).failures == 0


async def test_queue_status_discovers_nodes_and_queued_wakes_the_claim_loop(queue: FakeQueue) -> None:
    woke = []
    other = "http://127.0.0.1:1"
    queue.status_rows = [
        {"node": "a", "hostname": "127.0.0.1", "status": "empty", "updatedTime": 1, "url": queue.base},
        {"node": "b", "hostname": "127.0.0.1", "status": "paused", "updatedTime": 1, "url": other},
    ]
    c = client(queue.base, wake=lambda: woke.append(1))
    await c.poll_status()
    assert set(c.health.hosts) == {queue.base, other}
    assert c.health.pick(now()) is None and not woke
    queue.status_rows[0].update(status="queued", updatedTime=2)
    await c.poll_status()
    assert woke and c.health.pick(now()) == queue.base
    woke.clear()
    c.health.on_empty(queue.base, now())
    await c.poll_status()  # the same change again: not re-applied (a status is a change, not a heartbeat)
    assert not woke and c.health.pick(now()) is None
    await c.close()
    assert all(s.headers.get("x-worker-id") == "w-1" for s in queue.requests("/queue_status"))


async def test_without_discovery_only_the_given_queues_are_claimed(queue: FakeQueue) -> None:
    queue.status_rows = [{"node": "b", "status": "queued", "updatedTime": 1, "url": "http://127.0.0.1:1"}]
    c = client(queue.base, discover=False)
    await c.poll_status()
    await c.close()
    assert list(c.health.hosts) == [queue.base]


BASIC = "Basic " + base64.b64encode(b"fleet:s3cret").decode()


@pytest.fixture
def other():
    q = FakeQueue().start()  # another port: another origin
    yield q
    q.stop()


@pytest.mark.parametrize("discover", [False, True])
async def test_a_callback_origin_nobody_vouched_for_gets_no_credentials_and_the_granting_queue_the_result(
    queue: FakeQueue, other: FakeQueue, discover: bool
) -> None:
    # the queue lists only itself: with or without discovery, `other` is a host the worker was never given
    queue.status_rows = [{"node": "a", "status": "queued", "updatedTime": 1, "url": queue.base}]
    queue.jobs = [queue.job(f"https://shop.example/{i}", callbackOrigin=other.base) for i in range(2)]
    c = client(queue.base, discover=discover)
    await c.poll_status()
    jobs = (await c.claim(queue.base, 2)).jobs
    with capture_logs() as logs:
        assert [await c.post_result(j, *_result(j)) for j in jobs] == ["delivered", "delivered"]
    await c.close()
    assert other.seen == []  # not even a request: nothing a host the queue named could read
    posts = queue.requests("/render_queue/job_result")
    assert len(posts) == 2 and all(p.headers["authorization"] == BASIC for p in posts)
    warned = [e for e in logs if e["log_level"] == "warning" and e.get("callback_origin") == other.base]
    assert len(warned) == 1 and warned[0]["queue"] == queue.base  # once per origin
    assert other.base not in c.health.hosts  # and never claimed from


async def test_a_node_the_queue_lists_gets_its_results_with_credentials(queue: FakeQueue, other: FakeQueue) -> None:
    queue.status_rows = [
        {"node": "a", "status": "empty", "updatedTime": 1, "url": queue.base},
        {"node": "b", "status": "empty", "updatedTime": 1, "url": other.base},
    ]
    queue.jobs = [queue.job("https://shop.example/a", callbackOrigin=other.base)]
    c = client(queue.base)
    await c.poll_status()
    job = (await c.claim(queue.base, 1)).jobs[0]
    assert await c.post_result(job, *_result(job)) == "delivered"
    await c.close()
    assert [p.headers["authorization"] for p in other.requests("/render_queue/job_result")] == [BASIC]
    assert queue.requests("/render_queue/job_result") == []


async def test_an_https_queue_never_sends_credentials_to_plain_http(queue: FakeQueue, other: FakeQueue) -> None:
    tls = f"https://127.0.0.1:{free_port()}"  # nothing listens there: a post to it fails
    c = client(tls, other.base, result_retries=0)
    # a node listed by an https queue with an http URL is not adopted (nor trusted)
    c.apply_status(tls, [{"node": "b", "status": "queued", "updatedTime": 1, "url": queue.base}])
    assert queue.base not in c.health.hosts
    # a job an https queue grants with an http callbackOrigin: its result goes back to that queue, even when
    # the http origin is one of the worker's own queues and even when it was discovered
    for callback in (queue.base, other.base):
        job = Job.parse(queue.job("https://shop.example/a", callbackOrigin=callback), granted_by=tls)
        assert await c.post_result(job, *_result(job)) == "failed"
    await c.close()
    assert queue.seen == [] and other.seen == []


async def test_the_queue_client_keeps_no_cookie() -> None:
    from prerender_ray.serving.origin_policy import NoCookies

    c = client("http://127.0.0.1:1")
    assert isinstance(c.client("http://127.0.0.1:1").cookies.jar, NoCookies)
    await c.close()
