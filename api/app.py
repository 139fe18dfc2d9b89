"""The ingress application: one FastAPI app per replica, assembling every router."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi import Depends, FastAPI, Request, routing
from fastapi.responses import JSONResponse

from prerender_ray.admin.users import Principal
from prerender_ray.api import health, peer, render_queue, sitemaps, targets
from prerender_ray.api.admin import routes as admin
from prerender_ray.api.auth import require
from prerender_ray.api.bot.middleware import BotMiddleware
from prerender_ray.api.context import NodeContext
from prerender_ray.api.errors import HANDLED, error_response
from prerender_ray.api.fleet_routes import FleetRoutes
from prerender_ray.serving.classify import reserved_prefixes
from prerender_ray.serving.dates import Dater

# No OpenTelemetry: FastAPI's native telemetry (newer releases) checks its providers on every request.
_NO_TELEMETRY: dict[str, Any] = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                 if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def create_asgi(ctx: NodeContext) -> Dated:
    """What uvicorn serves: the fleet's hot routes, then the bot path, in front of the FastAPI app, so
    neither a result nor a bot request pays FastAPI's routing and per-request middleware
    (bench/bench_results.py, bench/bench_serving.py); every answer dated."""
    app = create_app(ctx)
    bot = BotMiddleware(app, ctx)
    return Dated(FleetRoutes(bot, app), bot)


class Dated:
    """ASGI: every answer gets our Date, and no Last-Modified later than it
    (``prerender_ray.serving.dates``; uvicorn's own Date is off)."""

    def __init__(self, app: Any, bot: BotMiddleware | None = None):
        self.app = app
        self.dater = Dater()
        # the bot path behind: the HTTP protocol answers its memo hits itself, dated by this same
        # Dater (``api.connections.GuardedHttp``)
        self.bot = bot

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        dater = self.dater

        async def dated(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = dater.headers(message.get("headers", ()))
            await send(message)

        await self.app(scope, receive, dated)


def create_app(ctx: NodeContext) -> FastAPI:
    # No docs UI, and no public route list: the port faces bots (management.openapi).
    app = FastAPI(title="prerender-ray", docs_url=None, redoc_url=None, openapi_url=None, **_NO_TELEMETRY)
    app.state.ctx = ctx
    if ctx.cfg.management.enabled and ctx.cfg.management.openapi == "admin":
        @app.get("/openapi.json", include_in_schema=False)
        async def _openapi(who: Principal = Depends(require("admin"))) -> JSONResponse:
            return JSONResponse(app.openapi(), headers={"cache-control": "no-store"})
    app.include_router(peer.router)  # claimed before bot routing: the ingress decision reserves its path
    app.include_router(health.router)
    app.include_router(render_queue.router)
    app.include_router(targets.router)
    admin.install(app, ctx)  # the admin API, its console and the session verifier auth.py consults
    app.include_router(sitemaps.router)

    async def _error(request: Request, exc: Exception) -> JSONResponse:
        response = error_response(request, exc)
        assert response is not None  # registered for HANDLED only
        return response

    for kind in HANDLED:
        app.add_exception_handler(kind, _error)

    # Every route of ours is kept from the bot path, whatever ingress.routes say (read by api.bot).
    ctx.reserved_paths = reserved_prefixes(route_paths(app))
    return app


def route_paths(app: FastAPI) -> Iterator[str]:
    """The path of every route of ``app``, included routers flattened (FastAPI >= 0.165 keeps them
    as lazy branches in ``app.routes``; older releases list the routes themselves)."""
    flatten = getattr(routing, "iter_route_contexts", None)
    for route in flatten(app.routes) if flatten else app.routes:
        path = getattr(route, "path", None)
        if isinstance(path, str):
            yield path
