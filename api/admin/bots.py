"""``GET bots``: this replica's view of bot traffic by class: the policies in force, the URLs bots
asked for that had no cached page (per class, most asked first), and the verifier's state.

Per replica, like ``unrouted``: each ingress replica keeps its own bounded tallies (metrics carry the
node-wide counts: ``prerender_bot_class_serves_total``, ``prerender_bot_page_age_seconds``).
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import admin_router, answer, ctx_of, query_int
from prerender_ray.api.auth import require
from prerender_ray.api.bot.replica import opened
from prerender_ray.serving.bots import BOT_CLASSES

router = admin_router()
MAX_LIMIT = 1_000


@router.get("/bots")
async def bots(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    ctx = ctx_of(request)
    limit = query_int(request, "limit", default=50, minimum=1, maximum=MAX_LIMIT)
    cfg = ctx.cfg.bots
    body: dict = {
        "node": ctx.node.name, "replica": ctx.replica, "perReplica": True,
        "policies": {
            "default": cfg.default.model_dump(),
            "classes": {c: (cfg.classes.get(c) or cfg.default).model_dump() for c in BOT_CLASSES},  # type: ignore[call-overload]
            "named": {name: p.model_dump() for name, p in cfg.named.items()},
            "denyStatus": cfg.deny_status, "failedClass": cfg.failed_class,
        },
        "verification": {"enabled": cfg.verify.enabled},
    }
    state = opened(ctx)
    body["available"] = state is not None
    if state is None:
        body["missed"] = {}
        return answer(body)
    services = state.services
    body["missed"] = services.misses.top(limit)
    body["missedEvicted"] = services.misses.evicted
    if services.verifier is not None:
        body["verification"].update(services.verifier.snapshot())
    return answer(body)
