"""The fleet's hot routes in front of FastAPI (``api/fleet_routes.py``): the same answers as the
FastAPI routes, byte for byte, without FastAPI's stack."""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import pytest
from fastapi import FastAPI

from prerender_ray.admin.users import hash_password
from prerender_ray.api.app import Dated, create_app, create_asgi
from prerender_ray.api.bot.middleware import BotMiddleware
from prerender_ray.api.bot.replica import close_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.api.render_queue import RESULT_BATCH_BYTES
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.queue.metadata import MAX_METADATA_BYTES
from prerender_ray.rpc import DeadlineExceeded
from tests.support import result_body

FLEET, VIEWER = ("fleet", "pw-fleet"), ("eve", "pw-eve")
URL = "https://x.example/a"
BOMB = gzip.compress(b" " * (60 * 1024 * 1024))  # past server.maxHtmlBytes once decoded


@pytest.fixture
async def ctx(tmp_path):
    cfg = Config.model_validate({
        "domains": ["x.example"], "server": {"data_dir": str(tmp_path)},
        "auth": {"users": [{"name": "fleet", "roles": ["fleet"], "passwordHash": hash_password("pw-fleet", iterations=1000)},
                           {"name": "eve", "roles": ["viewer"], "passwordHash": hash_password("pw-eve", iterations=1000)}]}})
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    yield ctx
    await close_replica(ctx)


def result(job_url: str = URL, key: str | None = None, *, size: int | str | None = None, meta: bytes | None = None,
           content: bytes | None = None, **kw: object) -> dict:
    """A result as the reference fleet posts it (``tests.support.result_body``), or spoiled."""
    body, headers = result_body({"id": key or f"{job_url}|desktop", "url": job_url}, **kw)
    if meta is not None:
        body = meta + body[int(headers["x-metadata-size"]):]
        headers["x-metadata-size"] = str(len(meta))
    if content is not None:
        body = body[:int(headers["x-metadata-size"])] + content
    if size == "absent":
        del headers["x-metadata-size"]
    elif size is not None:
        headers["x-metadata-size"] = str(size)
    return {"content": body, "headers": headers}


CASES = {  # name: (path, auth, request keywords)
    "claim-anonymous": ("/render_queue/claim", None, {"json": {"limit": 5}}),
    "claim-console-anonymous": ("/render_queue/claim", None, {"json": {}, "headers": {"x-prerender-console": "1"}}),
    "claim-viewer": ("/render_queue/claim", VIEWER, {"json": {"limit": 5}}),
    "claim-wrong-password": ("/render_queue/claim", ("fleet", "nope"), {"json": {"limit": 5}}),
    "claim-no-keeper": ("/render_queue/claim", FLEET, {"json": {"limit": 5}}),
    "claim-empty-body": ("/render_queue/claim", FLEET, {}),
    "claim-junk": ("/render_queue/claim", FLEET, {"content": b"{"}),
    "claim-unknown-key": ("/render_queue/claim", FLEET, {"json": {"limit": 5, "max": 1}}),
    "claim-limit-junk": ("/render_queue/claim", FLEET, {"json": {"limit": "many"}}),
    "claim-too-large": ("/render_queue/claim", FLEET, {"content": b" " * (64 * 1024 + 1)}),
    "claim-bad-length": ("/render_queue/claim", FLEET, {"content": b"{}", "headers": {"content-length": "x2"}}),
    "result-anonymous": ("/render_queue/job_result", None, result()),
    "result-no-size": ("/render_queue/job_result", FLEET, result(size="absent")),
    "result-size-past-body": ("/render_queue/job_result", FLEET, result(size=100_000)),
    "result-size-junk": ("/render_queue/job_result", FLEET, result(size="1e3")),
    "result-meta-junk": ("/render_queue/job_result", FLEET, result(meta=b"{not json")),
    "result-meta-deep": ("/render_queue/job_result", FLEET, result(meta=b"[" * 10_000 + b"]" * 10_000)),
    "result-off-domain": ("/render_queue/job_result", FLEET, result(key="https://elsewhere.example/a|desktop")),
    "result-not-gzip": ("/render_queue/job_result", FLEET, result(encoding="gzip", content=b"plain text")),
    "result-not-br": ("/render_queue/job_result", FLEET, result(encoding="br", content=b"plain text")),
    "result-keeper-fails": ("/render_queue/job_result", FLEET, result()),
    "result-bomb": ("/render_queue/job_result", FLEET, result(content=BOMB)),
    "result-other-owner": ("/render_queue/job_result", FLEET, result("https://x.example/b")),
    "claim-granted": ("/render_queue/claim", FLEET, {"json": {"limit": 2}}),
    "result-applied": ("/render_queue/job_result", FLEET, result()),
    "result-refused": ("/render_queue/job_result", FLEET, result()),
    "result-store-full": ("/render_queue/job_result", FLEET, result()),
    "trailing-slash": ("/render_queue/claim/", FLEET, {"json": {"limit": 5}}),
    "get": ("/render_queue/claim", FLEET, {"method": "GET"}),
}


KEEPER = {  # what this node's keeper answers in a case (none: no keeper placed)
    "claim-granted": b'[{"id":"https://x.example/a|desktop","url":"https://x.example/a"}]',
    "result-applied": {},
    "result-refused": {"refused": "the lease on this key is another worker's"},
    "result-store-full": {"error": "the page log is full", "retryAfter": 120},
}


class Keeper:
    """This node's keeper, answering every call with ``answer``."""

    def __init__(self, answer: object):
        self.answer = answer

    def within(self, deadline_s: float) -> Keeper:
        return self

    async def claim_json(self, limits: list[int], workers: list[str | None]) -> list:
        return [self.answer] * len(limits)

    async def process_results(self, group: list) -> list:
        return [self.answer] * len(group)


def fastapi_only(ctx: NodeContext) -> Dated:
    """The app as it was before the fleet's routes went in front of it."""
    app = create_app(ctx)
    bot = BotMiddleware(app, ctx)
    return Dated(bot, bot)


async def answer(app: object, path: str, auth: tuple | None, kw: dict) -> tuple:
    kw = dict(kw)
    method = kw.pop("method", "POST")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.request(method, path, auth=auth, **kw)
    return r.status_code, sorted((k, v) for k, v in r.headers.items() if k != "date"), r.content


@pytest.mark.parametrize("case", CASES)
async def test_each_fleet_route_answers_as_the_fastapi_route_did(ctx, case, monkeypatch) -> None:
    path, auth, kw = CASES[case]

    async def unreachable(url: str):
        raise DeadlineExceeded("node-b did not answer within 30s")

    monkeypatch.setattr(ctx, "keeper_of", unreachable)
    monkeypatch.setattr(ctx, "owner_of", lambda url: "n1" if url == URL else "node-b")
    monkeypatch.setattr(ctx, "forget_remote", lambda: None)
    if case in KEEPER:
        monkeypatch.setattr(ctx, "keeper", Keeper(KEEPER[case]))
    before = await answer(fastapi_only(ctx), path, auth, kw)
    ctx.claims = ctx.results = None  # each app's group commits start afresh
    now = await answer(create_asgi(ctx), path, auth, kw)
    assert now == before
    assert before[0] != 500, before


async def test_the_fleet_routes_skip_fastapi_and_every_other_request_reaches_it(ctx, monkeypatch) -> None:
    reached: list[str] = []
    served = FastAPI.__call__

    async def recorded(self, scope, receive, send):
        reached.append(f"{scope['method']} {scope['path']}")
        await served(self, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", recorded)
    app = create_asgi(ctx)
    for path, auth, kw in (CASES["claim-no-keeper"], CASES["result-meta-junk"], CASES["claim-anonymous"]):
        await answer(app, path, auth, kw)
    assert reached == []
    for case in ("trailing-slash", "get"):
        await answer(app, *CASES[case])
    await answer(app, "/healthz", None, {"method": "GET"})
    assert reached == ["POST /render_queue/claim/", "GET /render_queue/claim", "GET /healthz"]


async def test_result_metadata_is_capped_and_a_keeper_call_carries_at_most_its_batch_bytes(ctx, monkeypatch) -> None:
    """Only content bytes were counted against a keeper call's bound, and the whole metadata (a
    fleet's unknown fields included) was shipped: three results queued together, each with 3 MiB of
    page and an unknown field just under the metadata cap, went two to a call (over 10 MiB). Now the
    keeper gets only the fields it reads, and whole bodies count."""
    calls: list[list] = []
    first, release = asyncio.Event(), asyncio.Event()

    class Recording:
        def within(self, deadline_s: float) -> Recording:
            return self

        async def process_results(self, group: list) -> list:
            calls.append(group)
            if len(calls) == 1:  # the first call stays in flight while the others queue behind it
                first.set()
                await asyncio.wait_for(release.wait(), 30)
            return [{}] * len(group)

    monkeypatch.setattr(ctx, "keeper", Recording())
    monkeypatch.setattr(ctx, "owner_of", lambda url: "n1")
    page = b"<html>" + b"x" * (3 << 20) + b"</html>"
    padding = "p" * (MAX_METADATA_BYTES - 4096)  # an unknown field: the metadata just under the cap
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_asgi(ctx)), base_url="http://t",
                                 auth=FLEET) as c:
        def post(path: str, extra: str = padding) -> asyncio.Task:
            return asyncio.create_task(c.post("/render_queue/job_result", **result(
                f"https://x.example/{path}", html=page, encoding="identity", padding=extra)))

        posts = [post("p0")]
        await asyncio.wait_for(first.wait(), 30)
        posts += [post(f"p{i}") for i in (1, 2, 3)]
        deadline = asyncio.get_running_loop().time() + 30
        while ctx.results is None or len(ctx.results) < 3:  # queued behind the first call
            assert asyncio.get_running_loop().time() < deadline, "the results never queued"
            await asyncio.sleep(0.01)
        release.set()
        answers = await asyncio.gather(*posts)
    assert [a.status_code for a in answers] == [204] * 4
    assert sum(len(g) for g in calls) == 4
    for group in calls:
        assert all(set(meta) == {"id", "url", "headers", "renderTime", "statusCode", "outcome"} for meta, _, _ in group)
        sent = sum(len(json.dumps(meta)) + len(content or b"") for meta, content, _ in group)
        assert len(group) == 1 or sent <= RESULT_BATCH_BYTES, [len(group), sent]


async def test_metadata_past_its_bound_is_413_unparsed_and_never_reaches_the_keeper(ctx, monkeypatch) -> None:
    """10 MB of metadata JSON took a second and 255 MiB of the loop that serves bots to parse: more
    than ``MAX_METADATA_BYTES`` is refused before the parser sees it (ours stays under it)."""
    calls: list[list] = []

    class Recording:
        def within(self, deadline_s: float) -> Recording:
            return self

        async def process_results(self, group: list) -> list:
            calls.append(group)
            return [{}] * len(group)

    monkeypatch.setattr(ctx, "keeper", Recording())
    monkeypatch.setattr(ctx, "owner_of", lambda url: "n1")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_asgi(ctx)), base_url="http://t",
                                 auth=FLEET) as c:
        huge = await c.post("/render_queue/job_result", **result(padding="p" * MAX_METADATA_BYTES))
        assert huge.status_code == 413, huge.text
        assert huge.json()["error"] == f"the metadata is larger than {MAX_METADATA_BYTES} bytes"
        assert calls == []
        junk = b"[" + b"1," * (3 << 20) + b"1]"  # not even an object: refused by its size alone
        assert (await c.post("/render_queue/job_result", **result(meta=junk))).status_code == 413
        assert calls == []
        fits = await c.post("/render_queue/job_result", **result(padding="p" * (MAX_METADATA_BYTES - 4096)))
        assert fits.status_code == 204, fits.text
    assert len(calls) == 1
