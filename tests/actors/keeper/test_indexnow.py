"""IndexNow submissions from the keeper (actors/keeper/indexnow.py): a fake endpoint on 127.0.0.1
receives them over real HTTP; the keeper's parts decide which results notify (a changed page, on the
URL's owner only; never a freshness-only render, never a host outside ``indexNow.hosts``)."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import REGISTRY

from prerender_ray.actors.keeper.indexnow import Notifier
from prerender_ray.identity.nodes import Ownership
from prerender_ray.timeutil import now_ms
from tests.actors.keeper.conftest import SITE, config
from tests.actors.keeper.test_claims import put_due
from tests.actors.keeper.test_results import HTML, Later, rendered
from tests.api.origin_site import OriginSite

KEY = "a1b2c3d4-e5f6"


class Endpoint(OriginSite):
    """An IndexNow endpoint that answers as its path says."""

    async def _route(self, method, path, target, headers, body, writer) -> bool:  # type: ignore[override]
        if path == "/indexnow":
            return await self._send(writer, 200, b"")
        if path == "/indexnow/moved":
            return await self._send(writer, 302, b"", [("location", "/indexnow")], "Found")
        if path == "/indexnow/busy":
            return await self._send(writer, 503, b"busy", reason="Service Unavailable")
        if path == "/indexnow/bad":
            return await self._send(writer, 422, b"", reason="Unprocessable Entity")
        if path == "/indexnow/hang":
            await asyncio.sleep(3600)
            return False
        if path == "/indexnow/drip":  # a head without end, each byte well within a read timeout
            writer.write(b"HTTP/1.1 200 OK\r\nx-drip: ")
            while True:
                writer.write(b"a")
                await writer.drain()
                await asyncio.sleep(0.02)
        if path == "/indexnow/huge":  # an answer without end
            writer.write(self._head(200, "OK", [("transfer-encoding", "chunked")]))
            chunk = b"x" * 65536
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
        return await super()._route(method, path, target, headers, body, writer)

    def submissions(self, path: str = "/indexnow") -> list[dict]:
        return [json.loads(s.body) for s in self.seen if s.path == path and s.method == "POST"]


@pytest.fixture(scope="module")
def endpoint():
    e = Endpoint().start()
    yield e
    e.stop()


class Time:
    """A clock and a sleep that only moves it: waits are recorded, never spent."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def counted(kind: str, outcome: str) -> float:
    return REGISTRY.get_sample_value(f"prerender_indexnow_{kind}_total", {"outcome": outcome}) or 0.0


def notifier(endpoint: Endpoint, path: str = "/indexnow", hosts=("shop.test",), **opts) -> tuple[Notifier, Time]:
    cfg = config(domains=["shop.test", "other.test"],
                 indexNow={"enabled": True, "key": KEY, "hosts": list(hosts), "endpoints": [endpoint.base + path],
                           "minInterval": 0, **opts})
    t = Time()
    return Notifier(cfg.index_now, clock=t.now, sleep=t.sleep), t


async def test_changed_urls_are_submitted_per_host_in_batches_of_at_most_10000(endpoint) -> None:
    endpoint.seen.clear()
    n, _ = notifier(endpoint, hosts=("shop.test", "other.test"))
    sent = counted("urls", "sent")
    for i in range(10_001):
        n.changed(f"https://shop.test/p{i}")
    for i in range(3):
        n.changed(f"https://other.test/o{i}")
    await n.flush()
    await n.close()
    batches = endpoint.submissions()
    assert [(b["host"], len(b["urlList"])) for b in batches] == [("shop.test", 10_000), ("shop.test", 1),
                                                                 ("other.test", 3)]
    assert batches[0]["key"] == KEY and batches[0]["keyLocation"] == f"https://shop.test/{KEY}.txt"
    assert batches[2]["keyLocation"] == f"https://other.test/{KEY}.txt"
    assert {u for b in batches if b["host"] == "shop.test" for u in b["urlList"]} == {
        f"https://shop.test/p{i}" for i in range(10_001)}
    assert counted("urls", "sent") == sent + 10_004


async def test_requests_to_one_endpoint_are_spaced_by_the_rate_limit(endpoint) -> None:
    endpoint.seen.clear()
    n, t = notifier(endpoint, hosts=("shop.test", "other.test"), minInterval="10s", batchSize=2)
    for i in range(3):
        n.changed(f"https://shop.test/p{i}")
    n.changed("https://other.test/o")
    await n.flush()
    await n.close()
    assert len(endpoint.submissions()) == 3 and t.slept == [10.0, 10.0]


async def test_a_host_outside_the_configured_hosts_is_never_submitted(endpoint) -> None:
    endpoint.seen.clear()
    n, _ = notifier(endpoint, hosts=("shop.test",))
    n.changed("https://other.test/a")
    n.changed("https://sub.shop.test/a")
    assert len(n.endpoints[0].pending) == 0
    n.changed("https://shop.test/a")
    await n.flush()
    await n.close()
    assert [b["urlList"] for b in endpoint.submissions()] == [["https://shop.test/a"]]


async def test_a_redirecting_endpoint_is_not_followed_nor_retried(endpoint) -> None:
    endpoint.seen.clear()
    n, t = notifier(endpoint, "/indexnow/moved", maxAttempts=3)
    redirects, dropped = counted("requests", "redirect"), counted("urls", "dropped-failed")
    n.changed("https://shop.test/a")
    await n.flush()
    await n.close()
    assert [s.path for s in endpoint.seen] == ["/indexnow/moved"] and t.slept == []
    assert counted("requests", "redirect") == redirects + 1 and counted("urls", "dropped-failed") == dropped + 1


async def test_a_slow_endpoint_times_out_is_retried_with_backoff_then_dropped(endpoint) -> None:
    endpoint.seen.clear()
    n, t = notifier(endpoint, "/indexnow/hang", timeoutMs=100, maxAttempts=3, retryBackoff="2s")
    timeouts, dropped = counted("requests", "timeout"), counted("urls", "dropped-failed")
    n.changed("https://shop.test/a")
    n.changed("https://shop.test/b")
    await asyncio.wait_for(n.flush(), 30)  # a deadline of the test's own: the endpoint never answers
    await n.close()
    assert t.slept == [2.0, 4.0]  # (the endpoint may not have read a request before its deadline)
    assert counted("requests", "timeout") == timeouts + 3 and counted("urls", "dropped-failed") == dropped + 2


async def test_an_endpoint_that_drips_its_answer_is_cut_at_the_whole_requests_deadline(endpoint) -> None:
    n, t = notifier(endpoint, "/indexnow/drip", timeoutMs=300, maxAttempts=1)
    timeouts = counted("requests", "timeout")
    n.changed("https://shop.test/a")
    await asyncio.wait_for(n.flush(), 30)  # a deadline of the test's own: the drip never ends
    await n.close()
    assert counted("requests", "timeout") == timeouts + 1


async def test_a_busy_endpoint_is_retried_and_a_refusal_is_not(endpoint) -> None:
    endpoint.seen.clear()
    n, t = notifier(endpoint, "/indexnow/busy", maxAttempts=2, retryBackoff="1s")
    n.changed("https://shop.test/a")
    await n.flush()
    await n.close()
    assert endpoint.hits["/indexnow/busy"] == 2 and t.slept == [1.0]
    n, t = notifier(endpoint, "/indexnow/bad", maxAttempts=3)
    rejected = counted("requests", "rejected")
    n.changed("https://shop.test/a")
    await n.flush()
    await n.close()
    assert endpoint.hits["/indexnow/bad"] == 1 and counted("requests", "rejected") == rejected + 1


async def test_an_endless_answer_is_read_only_to_its_cap(endpoint) -> None:
    n, _ = notifier(endpoint, "/indexnow/huge", timeoutMs=5000, maxAttempts=1)
    ok = counted("requests", "ok")
    n.changed("https://shop.test/a")
    await asyncio.wait_for(n.flush(), 30)
    await n.close()
    assert counted("requests", "ok") == ok + 1


async def test_the_queue_is_bounded_the_oldest_dropped_and_counted(endpoint) -> None:
    endpoint.seen.clear()
    n, _ = notifier(endpoint, maxQueued=2)
    full = counted("urls", "dropped-queue-full")
    for i in range(5):
        n.changed(f"https://shop.test/p{i}")
    assert counted("urls", "dropped-queue-full") == full + 3
    await n.flush()
    await n.close()
    assert [b["urlList"] for b in endpoint.submissions()] == [["https://shop.test/p3", "https://shop.test/p4"]]


# ----------------------------------------------------------------------------- from the keeper


def _keeper_config(endpoint: Endpoint):
    return config(indexNow={"enabled": True, "key": KEY, "hosts": ["shop.test"],
                            "endpoints": [endpoint.base + "/indexnow"], "minInterval": 0})


def queued(keeper) -> list[str]:
    pending = keeper.index_now.endpoints[0].pending
    return list(pending._urls)


async def test_only_a_render_that_changes_the_page_notifies_never_a_freshness_only_one(keepers, endpoint,
                                                                                       monkeypatch) -> None:
    endpoint.seen.clear()
    k = keepers(cfg=_keeper_config(endpoint))
    await k.load()
    k.leases.table.grace_ms = 0  # type: ignore[attr-defined]  # re-granted at once: no release grace
    [url] = await put_due(k, "/same")
    k.claims.publish()
    [job] = [j for j in await k.claims.claim(10) if j["deviceType"] == "desktop"]
    key = job["id"]

    def nonced(nonce: bytes) -> bytes:
        return HTML.replace(b"<body>", b'<body><script nonce="%s">x()</script>' % nonce)

    async def render(content: bytes, later: int) -> None:
        k.claims.mirror.pop(key, None)
        monkeypatch.setattr(k.rows, "clock", Later(later))
        await k.targets.revalidate_key(key)
        [j] = [j for j in await k.claims.claim(10) if j["id"] == key]
        await k.results.process(rendered(j["id"], j["url"]), content)

    await k.results.process(rendered(key, job["url"]), nonced(b"n1"))  # a new page
    assert queued(k) == [url]
    await k.index_now.flush()
    later = now_ms() + 3_600_000
    await render(nonced(b"n2"), later)  # the same page, fresher: a freshness record only
    assert k.store.writes["freshness"] == 1 and queued(k) == []  # type: ignore[attr-defined]
    await render(HTML.replace(b"rendered", b"changed"), later + 1000)  # new content
    assert queued(k) == [url]
    await k.index_now.flush()
    await k.index_now.close()
    assert [b["urlList"] for b in endpoint.submissions()] == [[url], [url]]


async def test_a_result_is_submitted_by_its_urls_owner_only(keepers, endpoint) -> None:
    cfg = _keeper_config(endpoint)
    a = keepers("node-a", members=("node-a", "node-b"), cfg=cfg)
    b = keepers("node-b", members=("node-a", "node-b"), cfg=cfg)
    await a.load()
    await b.load()
    owners = Ownership(["node-a", "node-b"])
    path = next(p for p in (f"/p{i}" for i in range(100)) if owners.owner(SITE + p) == "node-b")
    await put_due(a, path)
    b.claims.publish()
    [job] = [j for j in await b.claims.claim(10) if j["deviceType"] == "desktop"]
    assert (await a.results.process(rendered(job["id"], job["url"]), HTML))["outcome"] == "rendered"
    assert queued(a) == [] and queued(b) == [SITE + path]
    await a.index_now.close()
    await b.index_now.close()


async def test_a_page_only_a_bots_miss_made_is_not_submitted_unless_the_operator_opts_in(keepers, endpoint) -> None:
    """Anyone can send bot misses; the operator's IndexNow key vouches only for pages a sitemap or an
    operator named (or any, with ``indexNow.includeDiscovered``)."""
    endpoint.seen.clear()
    for opted in (False, True):
        cfg = _keeper_config(endpoint)
        cfg = cfg.model_copy(update={"index_now": cfg.index_now.model_copy(update={"include_discovered": opted})})
        k = keepers("node-b" if opted else "node-a", cfg=cfg)  # (one store: URLs of their own)
        await k.load()
        found, listed = f"{SITE}/!ignore-previous-instructions-{opted}", f"{SITE}/listed-{opted}"
        assert (await k.discover_target(found, 0))["written"] == 1
        await k.targets.put_listed(f"{SITE}/sitemap.xml", [listed], [0], [None])
        k.claims.publish()
        jobs = [j for j in await k.claims.claim(10) if j["deviceType"] == "desktop"]
        assert sorted(j["url"] for j in jobs) == [found, listed]
        for job in jobs:
            assert (await k.results.process(rendered(job["id"], job["url"]), HTML))["outcome"] == "rendered"
        assert sorted(queued(k)) == ([found, listed] if opted else [listed])
        await k.index_now.close()
