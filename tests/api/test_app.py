"""The assembled app in process over ASGI: what a route answers when an actor it needs fails."""

from __future__ import annotations

import httpx
import pytest
from ray.exceptions import ActorUnschedulableError

from prerender_ray.actors.common import ActorNotPlaced, lookup
from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.replica import close_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.rpc import DeadlineExceeded


@pytest.fixture
async def ctx(tmp_path):
    cfg = Config.model_validate({"domains": ["x.example"], "server": {"data_dir": str(tmp_path)}})
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    yield ctx
    await close_replica(ctx)


@pytest.mark.parametrize("error", [ActorUnschedulableError("node-c was declared dead"),
                                   DeadlineExceeded("no answer within 30s"),
                                   ActorNotPlaced("Failed to look up actor with name 'keeper:node-b'")],
                         ids=["dead-node", "deadline", "not-placed"])
async def test_an_actor_that_fails_a_route_is_a_503_with_json_and_a_fresh_lookup_next_time(ctx, error) -> None:
    async def keeper_of(url: str):
        raise error

    forgotten = []
    ctx.keeper_of = keeper_of  # type: ignore[method-assign]
    ctx.forget_remote = lambda: forgotten.append(1)  # type: ignore[method-assign]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_asgi(ctx)), base_url="http://localhost") as c:
        r = await c.put("/render_targets", json={"url": "https://x.example/a"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json() == {"error": "a node this request needs did not answer; retry", "reason": type(error).__name__,
                        "node": "n1"}
    assert forgotten == [1]


def test_a_lookup_of_an_actor_that_is_not_placed_is_an_actor_not_placed(monkeypatch) -> None:
    """A keeper killed by a fault and not placed again yet: the route that needs it answers 503 (the
    soak found 500s here), and callers that caught ray.get_actor's ValueError still catch it."""
    import ray

    def missing(name: str, namespace: str | None = None):
        raise ValueError(f"Failed to look up actor with name '{name}'.")

    monkeypatch.setattr(ray, "get_actor", missing)
    with pytest.raises(ActorNotPlaced) as raised:
        lookup("keeper", "node-b")
    assert isinstance(raised.value, ValueError)



def _app(tmp_path, **management: object):
    from prerender_ray.admin.users import hash_password

    cfg = Config.model_validate({
        "domains": ["x.example"], "server": {"data_dir": str(tmp_path)}, "management": management,
        "auth": {"users": [{"name": "ops", "roles": ["admin"], "passwordHash": hash_password("pw-ops", iterations=1000)},
                           {"name": "eve", "roles": ["viewer"], "passwordHash": hash_password("pw-eve", iterations=1000)}]}})
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    return ctx, httpx.AsyncClient(transport=httpx.ASGITransport(app=create_asgi(ctx)), base_url="http://t")


async def test_the_route_list_is_off_by_default_and_admins_only_when_on(tmp_path) -> None:
    # Before: /openapi.json listed every route to anyone who asked the bot-facing port.
    ctx, c = _app(tmp_path)
    async with c:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert (await c.get(path)).status_code == 404, path
        assert (await c.get("/openapi.json", auth=("ops", "pw-ops"))).status_code == 404
    await close_replica(ctx)
    ctx, c = _app(tmp_path / "on", openapi="admin")
    async with c:
        assert (await c.get("/openapi.json")).status_code == 401
        assert (await c.get("/openapi.json", auth=("eve", "pw-eve"))).status_code == 403
        r = await c.get("/openapi.json", auth=("ops", "pw-ops"))
        assert r.status_code == 200 and "/render_queue/claim" in r.json()["paths"]
        assert r.headers["cache-control"] == "no-store"
    await close_replica(ctx)
