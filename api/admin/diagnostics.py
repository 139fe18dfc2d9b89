"""Diagnostics for one URL: ``POST diagnose`` (admin) makes a key due now with the diagnostics flag on
its owner's keeper; ``GET diagnostics`` (viewer) answers the key's render history and its last
diagnostics reports, screenshots included, from this node's page store (``storage/history.py``)."""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray import logs
from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import DEADLINE_S, admin_router, answer, ctx_of, heavy, parse_key
from prerender_ray.api.admin.queue import canonical_url
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, read_object
from prerender_ray.serving.origin_policy import compiled

router = admin_router()
log = logs.get("admin")
READ_DEADLINE_S = 5.0


@router.post("/diagnose")
async def diagnose(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """``{url, deviceType?}``: that device's key (the first supported one without ``deviceType``) due
    now on the owning node, its next job asking for a diagnostics report. A URL without a target
    renders once (as render-now does)."""
    ctx = ctx_of(request)
    body = await read_object(request, 64 * 1024, keys={"url", "deviceType"})
    url = canonical_url(ctx, body.get("url"))
    device = body.get("deviceType")
    if device is not None and (not isinstance(device, str) or device.lower() not in ctx.rules.supported):
        raise bad_request(f"deviceType must be one of {list(ctx.rules.supported)}")
    if ctx.rules.route_class(url) != "prerender":
        raise bad_request("This URL is not on a prerendered route: it is never rendered", canonicalUrl=url)
    if ctx.cfg.domains and not compiled(tuple(ctx.cfg.domains)).url_allowed(url):
        raise bad_request("This URL's host is not in domains: it is never rendered", canonicalUrl=url)
    key = ctx.rules.keys.key(url, (device or ctx.rules.supported[0]).lower())
    owner = ctx.owner_of(url)
    try:
        got = await (await ctx.keeper_of(url)).within(DEADLINE_S).diagnose(key)
    except Exception as e:
        return answer({"error": f"the owner {owner} did not answer; nothing may have changed",
                       "reason": type(e).__name__, "scheduleOwnedBy": owner}, 504)
    log.info("admin diagnose", key=key, by=who.name)
    return answer({"canonicalUrl": url, **got, "node": ctx.node.name})


@router.get("/diagnostics")
async def diagnostics(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """``?cacheKey=``: the key's render history and full diagnostics reports, newest first (empty on a
    node that holds none of the key's pages)."""
    ctx = ctx_of(request)
    key = parse_key(ctx, request.query_params.get("cacheKey"))
    async with heavy(ctx).slot():  # reports carry screenshots: up to a few MB
        try:
            got = await ctx.store.within(READ_DEADLINE_S).render_history(key, True)
        except TimeoutError:
            return answer({"error": "page-store read timed out", "cacheKey": key}, 504)
    return answer({"cacheKey": key, "node": ctx.node.name, **got})
