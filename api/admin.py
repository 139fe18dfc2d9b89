"""The admin API under /prerender_admin (JSON, no-store)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray.auth import Principal
from prerender_ray.cachekeys import CacheKeyError

from .auth import require
from .bodies import bad_request, read_object
from .context import NodeContext

router = APIRouter(prefix="/prerender_admin")
DEADLINE_S = 10.0
NO_STORE = {"cache-control": "no-store"}


def answer(body: dict, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=NO_STORE)


async def _call(ref: object, timeout: float = DEADLINE_S) -> object:
    from prerender_ray.actors.common import call

    return await call(ref, timeout)


@router.get("/queue-state")
async def queue_state(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """This node's queue document; 503 with the reason while the keeper cannot vouch for it."""
    ctx: NodeContext = request.app.state.ctx
    try:
        status, doc = await _call(ctx.keeper.queue_state.remote())
    except Exception as e:
        return answer({"error": "the keeper did not answer", "reason": type(e).__name__, "node": ctx.node.name}, 503)
    return answer(doc, status)


def key_from(ctx: NodeContext, body: dict) -> str:
    key = body.get("cacheKey")
    if key is not None:
        if not isinstance(key, str) or not key:
            raise bad_request("cacheKey is required")
        try:
            url, device = ctx.rules.url_of(key), ctx.rules.device_of(key)
        except CacheKeyError as e:
            raise bad_request(str(e)) from None
        if device not in ctx.rules.supported:
            raise bad_request(f"unknown device type in {key!r}")
        return ctx.rules.keys.key(url, device)
    from .targets import _canonical

    url = _canonical(ctx, body.get("url"), prerender_only=False)
    device = body.get("deviceType") or ctx.rules.supported[0]
    if not isinstance(device, str) or device.lower() not in ctx.rules.supported:
        raise bad_request(f"deviceType must be one of {list(ctx.rules.supported)}")
    return ctx.rules.keys.key(url, device.lower())


@router.post("/schedule")
async def schedule(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """This node's schedule row for ``{cacheKey}`` or ``{url, deviceType}``; a leaf, never proxied."""
    ctx: NodeContext = request.app.state.ctx
    key = key_from(ctx, await read_object(request))
    try:
        return answer(await _call(ctx.keeper.schedule_row.remote(key)))
    except Exception:
        return answer({"error": "local schedule read timed out", "node": ctx.node.name}, 504)
