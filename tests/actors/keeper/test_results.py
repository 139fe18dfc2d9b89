"""Result apply without Ray: one posted result, at most once per grant, written where the plan says
(docs/queue.md#result-outcomes)."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.actors.keeper import results as results_part
from prerender_ray.identity.nodes import Ownership
from prerender_ray.storage.pages import Page
from prerender_ray.storage.registry import Target, target_key
from prerender_ray.timeutil import Clock, now_ms
from tests.actors.keeper.conftest import SITE
from tests.actors.keeper.test_claims import put_due

HTML = b"<html><body>rendered</body></html>"


def rendered(key: str, url: str, **kw) -> dict:
    return {"id": key, "url": url, "statusCode": 200, "outcome": "rendered", "renderTime": 120,
            "headers": {"content-type": "text/html; charset=utf-8"}, **kw}


async def claimed(keeper, path: str, worker: str | None = None) -> dict:
    await put_due(keeper, path)
    keeper.claims.publish()
    [job] = [j for j in await keeper.claims.claim(10, [worker] * 10) if j["deviceType"] == "desktop"]
    return job


async def test_a_rendered_result_stores_the_page_moves_the_row_on_and_ends_the_lease(keepers) -> None:
    k = keepers()
    await k.load()
    job = await claimed(k, "/p")
    before = now_ms()
    answer = await k.results.process(rendered(job["id"], job["url"]), HTML)
    assert answer["outcome"] == "rendered"
    page = Page.decode(k.store.pages[job["id"].encode()])  # type: ignore[attr-defined]
    assert page.cache_key == job["id"]
    assert k.rows.row(job["id"]).next_render_time > before  # the next render is a cadence away
    lease = await k.leases.lease_of(job["id"])
    assert lease is None or lease["leaseExpiresAt"] is None


async def test_a_replayed_result_is_acknowledged_and_changes_nothing(keepers) -> None:
    k = keepers()
    await k.load()
    job = await claimed(k, "/p")
    await k.results.process(rendered(job["id"], job["url"]), HTML)
    stored, due = k.store.pages[job["id"].encode()], k.rows.row(job["id"]).next_render_time  # type: ignore[attr-defined]
    again = await k.results.process(rendered(job["id"], job["url"]), b"<html>a replay</html>")
    assert "ignored" in again
    assert k.store.pages[job["id"].encode()] == stored and k.rows.row(job["id"]).next_render_time == due  # type: ignore[attr-defined]


async def test_a_result_from_another_worker_than_the_grants_is_ignored(keepers) -> None:
    k = keepers()
    await k.load()
    job = await claimed(k, "/p", worker="w1")
    answer = await k.results.process(rendered(job["id"], job["url"]), HTML, worker="w2")
    assert "ignored" in answer
    assert job["id"].encode() not in k.store.pages  # type: ignore[attr-defined]
    assert (await k.results.process(rendered(job["id"], job["url"]), HTML, worker="w1"))["outcome"] == "rendered"


async def test_a_result_for_a_key_never_granted_is_refused(keepers) -> None:
    k = keepers()
    await k.load()
    key = k.conf.rules.keys_of(SITE + "/never")[0]
    assert "refused" in await k.results.process(rendered(key, SITE + "/never"), HTML)


async def test_a_noindex_page_ends_suppressed_with_its_rows_parked(keepers) -> None:
    k = keepers()
    await k.load()
    job = await claimed(k, "/hidden")
    meta = {"id": job["id"], "url": job["url"], "statusCode": 200, "outcome": "non-indexable",
            "reason": "noindex", "isIndexable": False}
    await k.results.process(meta, HTML)
    target = Target.decode(job["url"], k.store.registry[target_key(job["url"])])  # type: ignore[attr-defined]
    assert target.state == "suppressed" and target.suppressed_reason == "noindex"


async def test_a_failed_write_reopens_the_grant_for_the_fleets_retry(keepers) -> None:
    k = keepers()
    await k.load()
    job = await claimed(k, "/p")
    real = k.store.apply

    async def broken(*args, **kw):
        raise RuntimeError("the store is away")

    k.results.store.apply = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await k.results.process(rendered(job["id"], job["url"]), HTML)
    k.results.store.apply = real  # type: ignore[method-assign]
    assert (await k.results.process(rendered(job["id"], job["url"]), HTML))["outcome"] == "rendered"


async def test_a_result_posted_to_a_node_that_does_not_own_the_key_is_applied_by_its_owner(keepers) -> None:
    a = keepers("node-a", members=("node-a", "node-b"))
    b = keepers("node-b", members=("node-a", "node-b"))
    await a.load()
    await b.load()
    owners = Ownership(["node-a", "node-b"])
    path = next(p for p in (f"/p{i}" for i in range(100)) if owners.owner(SITE + p) == "node-b")
    await put_due(a, path)  # a does not own it: the put goes on to b
    assert len(a.rows) == 0 and len(b.rows) == 2
    b.claims.publish()
    [job] = [j for j in await b.claims.claim(10) if j["deviceType"] == "desktop"]
    assert (await a.results.process(rendered(job["id"], job["url"]), HTML))["outcome"] == "rendered"
    assert b.rows.row(job["id"]).next_render_time > now_ms() and len(a.rows) == 0


class Later(Clock):
    """The system clock, moved to ``at`` (epoch ms)."""

    def __init__(self, at: int):
        self.at = at

    def now_ms(self) -> int:
        return self.at


async def test_an_identical_render_keeps_its_validators_and_a_changed_one_gets_new_ones(keepers, monkeypatch) -> None:
    k = keepers()
    await k.load()
    k.leases.table.grace_ms = 0  # type: ignore[attr-defined]  # re-granted at once: no release grace
    job = await claimed(k, "/v")
    shell = {"etag": '"the-app-shell"', "last-modified": "Mon, 01 Jan 2024 00:00:00 GMT"}
    await k.results.process(rendered(job["id"], job["url"], headers={"content-type": "text/html", **shell}), HTML)
    first = Page.decode(k.store.pages[job["id"].encode()]).headers  # type: ignore[attr-defined]
    assert first["etag"] != shell["etag"] and first["last-modified"] != shell["last-modified"]

    async def again(content: bytes) -> dict:
        k.claims.mirror.pop(job["id"], None)  # the keeper's copy of that grace
        later = now_ms() + 3_600_000  # an hour on: a Last-Modified of now would differ
        monkeypatch.setattr(k.rows, "clock", Later(later))  # the keeper's parts read time there
        await k.targets.revalidate_key(job["id"])
        [j] = [j for j in await k.claims.claim(10) if j["id"] == job["id"]]
        await k.results.process(rendered(j["id"], j["url"], headers={"content-type": "text/html", **shell}), content)
        return Page.decode(k.store.pages[job["id"].encode()]).headers  # type: ignore[attr-defined]

    same = await again(HTML)
    assert same["etag"] == first["etag"] and same["last-modified"] == first["last-modified"]
    changed = await again(HTML.replace(b"rendered", b"changed"))
    assert changed["etag"] != first["etag"]


GOOD = b"<html><body><main>" + b" ".join(b"word%d <a href='/l%d'>more</a>" % (i, i) for i in range(120)) \
    + b"</main></body></html>"
SHELL = b"<html><head><script src='/app.js'></script></head><body><div id='root'></div></body></html>"


async def test_a_shell_render_keeps_the_good_page_holds_the_lease_and_is_counted(keepers) -> None:
    from prometheus_client import REGISTRY

    k = keepers()
    await k.load()
    k.leases.table.grace_ms = 0  # type: ignore[attr-defined]
    job = await claimed(k, "/g")
    await k.results.process(rendered(job["id"], job["url"]), GOOD)
    good = k.store.pages[job["id"].encode()]  # type: ignore[attr-defined]
    k.claims.mirror.pop(job["id"], None)
    await k.targets.revalidate_key(job["id"])
    [j] = [j for j in await k.claims.claim(10) if j["id"] == job["id"]]
    labels = {"route": "prerender", "why": "empty-shell", "action": "refused"}
    before = REGISTRY.get_sample_value("prerender_render_guard_total", labels) or 0
    answer = await k.results.process(rendered(j["id"], j["url"]), SHELL)
    assert answer == {"outcome": "bad-render", "detail": "fast"}
    assert k.store.pages[job["id"].encode()] == good  # type: ignore[attr-defined]
    lease = await k.leases.lease_of(job["id"])
    assert lease is not None and lease["leaseExpiresAt"] is not None  # the fast lane: retried at expiry
    target = Target.decode(job["url"], k.store.registry[target_key(job["url"])])  # type: ignore[attr-defined]
    assert target.strikes == 1 and target.refused is not None
    assert target.refused["why"] == "empty-shell" and target.refused["new"]["textChars"] == 0
    assert target.refused["stored"]["links"] == 120
    assert REGISTRY.get_sample_value("prerender_render_guard_total", labels) == before + 1


async def test_an_identical_render_writes_a_freshness_record_and_leaves_the_page_as_stored(keepers, monkeypatch) -> None:
    from prerender_ray.storage.touches import touch_key

    def nonced(nonce: bytes) -> bytes:
        return HTML.replace(b"<body>", b'<body><script nonce="%s">x()</script>' % nonce)

    k = keepers()
    await k.load()
    k.leases.table.grace_ms = 0  # type: ignore[attr-defined]  # re-granted at once: no release grace
    job = await claimed(k, "/same")
    key = job["id"]
    store = k.store
    await k.results.process(rendered(key, job["url"]), nonced(b"n1"))
    stored = store.pages[key.encode()]  # type: ignore[attr-defined]
    assert store.writes == {"page": 1, "freshness": 0}  # type: ignore[attr-defined]

    async def again(content: bytes, later: int) -> Page:
        k.claims.mirror.pop(key, None)  # the keeper's copy of the release grace
        monkeypatch.setattr(k.rows, "clock", Later(later))
        await k.targets.revalidate_key(key)
        [j] = [j for j in await k.claims.claim(10) if j["id"] == key]
        await k.results.process(rendered(j["id"], j["url"]), content)
        [raw] = await store.get_pages([key])
        assert raw is not None
        return Page.decode(raw)

    later = now_ms() + 3_600_000
    page = await again(nonced(b"n2"), later)  # only the nonce differs
    assert store.writes == {"page": 1, "freshness": 1}  # type: ignore[attr-defined]
    assert store.pages[key.encode()] == stored  # type: ignore[attr-defined]  # not rewritten
    assert page.last_cached == later and page.expires_at is not None and page.expires_at > later
    assert page.content == Page.decode(stored).content  # the first render's bytes, its nonce with them
    assert (await store.page_metas([key]))[0].last_cached == later  # type: ignore[union-attr]

    await k.targets.revalidate([job["url"]])  # every device's page expires now: by a touch too
    assert store.writes["page"] == 1 and store.pages[key.encode()] == stored  # type: ignore[attr-defined]
    assert (await store.page_metas([key]))[0].expires_at <= k.rows.clock.now_ms()  # type: ignore[union-attr,operator]

    page = await again(HTML.replace(b"rendered", b"changed"), later + 1000)
    assert store.writes["page"] == 2 and touch_key(key) not in store.pages  # type: ignore[attr-defined]
    assert page.last_cached == later + 1000


class Counting:
    """The keeper's lease table, counting the calls each method gets."""

    def __init__(self, leases) -> None:
        self.leases, self.calls = leases, {}

    def __getattr__(self, name: str):
        method = getattr(self.leases, name)

        async def counted(*args, **kw):
            self.calls[name] = self.calls.get(name, 0) + 1
            return await method(*args, **kw)
        return counted


async def test_results_that_arrive_together_are_applied_as_one_group_each_once(keepers) -> None:
    """Twenty results at once, both pages of ten URLs among them: one call begins them all and one
    finishes them; the desktop and mobile results of one target are planned in different waves
    (each from its own read of the target), and a replay inside the group changes nothing (it is
    asked to come back: the first might still fail), a replay after it is acknowledged."""
    k = keepers()
    await k.load()
    paths = [f"/g{i}" for i in range(10)]
    await put_due(k, *paths)
    k.claims.publish()
    jobs = await k.claims.claim(50)
    assert len(jobs) == 20
    counting = k.results.leases = Counting(k.leases)  # type: ignore[assignment]
    store_writes = 0
    real_apply = k.store.apply

    async def apply(*args, **kw):
        nonlocal store_writes
        store_writes += 1
        return await real_apply(*args, **kw)

    k.results.store.apply = apply  # type: ignore[method-assign]
    items = [(rendered(j["id"], j["url"]), HTML + j["id"].encode(), None) for j in jobs]
    answers = await k.results.process_many(items + [items[0]])
    assert [a["outcome"] for a in answers[:20]] == ["rendered"] * 20
    assert isinstance(answers[20], results_part.ResultBusy)  # racing its first: neither applied nor acknowledged
    assert await k.results.process(*items[0][:2]) == {"ignored": "duplicate"}  # once that one is answered
    assert counting.calls == {"begin_results": 2, "finish_results": 1}  # the second: the late replay
    assert store_writes == 2  # two waves: a URL's two pages never plan from one read of its target
    for j in jobs:
        assert Page.decode(k.store.pages[j["id"].encode()]).cache_key == j["id"]  # type: ignore[attr-defined]
        assert k.rows.row(j["id"]).next_render_time > now_ms()
        assert (await k.leases.lease_of(j["id"]) or {}).get("leaseExpiresAt") is None


async def test_concurrent_callers_share_a_group_and_a_failed_write_fails_only_its_wave(keepers) -> None:
    k = keepers()
    await k.load()
    await put_due(k, "/a", "/b", "/c")
    k.claims.publish()
    jobs = await k.claims.claim(10)
    assert len(jobs) == 6
    real_apply, writes = k.store.apply, []

    async def flaky(*args, **kw):  # the first write fails: the wave it carried fails with it
        writes.append(sorted(op[0].decode() for op in args[1] or [] if op[1] is not None))
        if len(writes) == 1:
            raise RuntimeError("the store is away")
        return await real_apply(*args, **kw)

    k.results.store.apply = flaky  # type: ignore[method-assign]
    got = await asyncio.gather(*(k.results.process(rendered(j["id"], j["url"]), HTML) for j in jobs),
                               return_exceptions=True)
    failed = sorted(j["id"] for j, g in zip(jobs, got) if isinstance(g, BaseException))
    assert len(writes) == 2 and failed == writes[0]  # one group, two waves: the first one's three failed
    assert len({k.conf.rules.url_of(key) for key in failed}) == 3
    assert all(g["outcome"] == "rendered" for g in got if not isinstance(g, BaseException))
    k.results.store.apply = real_apply  # type: ignore[method-assign]
    for key in failed:  # the fleet's retry applies each: its grant was reopened
        assert (await k.results.process(rendered(key, k.conf.rules.url_of(key)), HTML))["outcome"] == "rendered"
    assert all(j["id"].encode() in k.store.pages for j in jobs)  # type: ignore[attr-defined]


def landed_on_404(job: dict, landed: str) -> dict:
    """A redirect that landed on a page the renderer found gone (docs/queue.md#redirects)."""
    return {"id": job["id"], "url": job["url"], "outcome": "redirected", "statusCode": 404,
            "redirectedTo": landed, "isIndexable": False, "reason": "http-error",
            "headers": {"content-type": "text/html"}}


def target_of(k, url: str) -> Target | None:
    payload = k.store.registry.get(target_key(url))
    return None if payload is None else Target.decode(url, payload)


async def test_redirects_from_other_urls_never_strike_or_delete_a_tracked_destination(keepers) -> None:
    """Two grants of other URLs claiming that /b is gone (gone.maxStrikes 2) deleted /b, its pages and
    rows: another URL's result is no evidence /b's own render gave. /b is made due, so its own render
    judges it at once."""
    k = keepers()
    await k.load()
    await put_due(k, "/a1", "/a2", "/b")
    k.claims.publish()
    jobs = {(j["url"], j["deviceType"]): j for j in await k.claims.claim(10)}
    b = SITE + "/b"
    for device in ("desktop", "mobile"):  # /b has its pages
        job = jobs[(b, device)]
        assert (await k.results.process(rendered(job["id"], b), HTML))["outcome"] == "rendered"
    pages = {key: k.store.pages[key.encode()] for key in k.conf.rules.keys_of(b)}  # type: ignore[attr-defined]
    for source in ("/a1", "/a2"):
        job = jobs[(SITE + source, "desktop")]
        assert (await k.results.process(landed_on_404(job, b), None))["outcome"] == "redirect"
    target = target_of(k, b)
    assert target is not None and not target.suppressed and not target.strikes
    assert {key: k.store.pages.get(key.encode()) for key in pages} == pages  # type: ignore[attr-defined]
    desktop = k.conf.rules.keys_of(b)[0]
    assert k.rows.row(desktop).next_render_time <= now_ms()  # due: its own render decides


async def test_a_redirect_onto_an_untracked_gone_url_suppresses_it_once(keepers) -> None:
    """The reference's outcome for one honest redirect: the destination becomes an http-gone row
    (docs/queue.md#redirects); a second source's redirect onto it adds no strike (it deleted it)."""
    k = keepers()
    await k.load()
    await put_due(k, "/c1", "/c2")
    k.claims.publish()
    jobs = {(j["url"], j["deviceType"]): j for j in await k.claims.claim(10)}
    gone = SITE + "/gone"
    await k.results.process(landed_on_404(jobs[(SITE + "/c1", "desktop")], gone), None)
    target = target_of(k, gone)
    assert target is not None and target.suppressed and target.suppressed_reason == "http-gone"
    assert target.strikes == 1 and target_of(k, SITE + "/c1") is None
    await k.results.process(landed_on_404(jobs[(SITE + "/c2", "desktop")], gone), None)
    assert target_of(k, gone) == target


async def test_a_destination_suppress_creates_only_and_leaves_an_existing_target_alone(keepers) -> None:
    """The keeper's half: the plan read the destination absent, but it exists by the time the owner
    applies it (another node's result, a put): left as it is, pages and rows included."""
    k = keepers()
    await k.load()
    [url] = await put_due(k, "/d")
    stored = k.store.registry[target_key(url)]  # type: ignore[attr-defined]
    rows = [k.rows.row(key) for key in k.conf.rules.keys_of(url)]
    for _ in range(3):
        await k.targets.suppress(url, "http-error", 404)
    assert k.store.registry[target_key(url)] == stored  # type: ignore[attr-defined]
    assert [k.rows.row(key) for key in k.conf.rules.keys_of(url)] == rows


class Lines:
    """A logger that keeps each line's event and fields."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def _line(self, event: str, **fields) -> None:
        self.lines.append((event, fields))

    info = warning = error = _line


@pytest.mark.parametrize("name", ["E" * 100_000, ["TimeoutError"] * 20_000])
async def test_a_fleet_sent_error_name_reaches_the_log_clipped(keepers, name) -> None:
    k = keepers()
    await k.load()
    job = await claimed(k, "/long-error")
    k.results.log = log = Lines()  # type: ignore[assignment]
    meta = {"id": job["id"], "url": job["url"], "outcome": "error", "error": {"name": name, "message": "m"}}
    await k.results.process(meta, None)
    [fields] = [f for event, f in log.lines if event == "render result"]
    assert 0 < len(fields["error"]) <= 400 and fields["error"].startswith(str(name)[:100])
