"""Liveness, readiness and metrics, on every node."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from prerender_ray import metrics
from prerender_ray.actors.client import ActorClient
from prerender_ray.api.context import STATUS_DEADLINE, NodeContext
from prerender_ray.rpc import DeadlineExceeded

router = APIRouter()
_READY_CACHE_S = 1.0


@router.get("/healthz")
async def healthz(request: Request) -> dict:
    ctx: NodeContext = request.app.state.ctx
    return {"ok": True, "node": ctx.node.name, "replica": ctx.replica}


async def readiness(ctx: NodeContext) -> tuple[bool, dict]:
    """This node's keeper and stores are live. Cached for a second: probes may come often."""
    cached = ctx.ready
    if cached and time.monotonic() - cached[0] < _READY_CACHE_S:
        return cached[1], cached[2]
    body: dict = {"node": ctx.node.name}
    ready = True
    clients: tuple[tuple[str, ActorClient], ...] = (("store", ctx.store), ("leases", ctx.leases), ("keeper", ctx.keeper))
    for name, client in clients:
        try:
            st = await client.within(STATUS_DEADLINE).status()
        except DeadlineExceeded:
            st, ready = {"live": False, "reason": f"{name} did not answer within {STATUS_DEADLINE:g}s"}, False
        except Exception as e:  # a dead or restarting actor
            st, ready = {"live": False, "reason": f"{name} unavailable: {type(e).__name__}"}, False
        body[name] = st
        if not st.get("live"):
            ready = False
            body.setdefault("reason", st.get("reason") or f"{name} is {st.get('phase', 'not live')}")
    body["ready"] = ready
    ctx.ready = (time.monotonic(), ready, body)
    return ready, body


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    ready, body = await readiness(request.app.state.ctx)
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics_text() -> Response:
    return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
