"""The ingress application: one FastAPI app per replica, assembling every router."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi import Depends, FastAPI, Request, routing
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray.exceptions import RayError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prerender_ray import logs
from prerender_ray.admin.users import Principal
from prerender_ray.api import health, peer, render_queue, sitemaps, targets
from prerender_ray.api.admin import routes as admin
from prerender_ray.api.auth import require
from prerender_ray.api.bot.middleware import BotMiddleware
from prerender_ray.api.context import HoldersUnavailable, NodeContext
from prerender_ray.rpc import DeadlineExceeded
from prerender_ray.serving.classify import reserved_prefixes
from prerender_ray.serving.dates import Dater

log = logs.get("ingress")
# No OpenTelemetry: FastAPI's native telemetry (newer releases) checks its providers on every request.
_NO_TELEMETRY: dict[str, Any] = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                 if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def create_asgi(ctx: NodeContext) -> Dated:
    """What uvicorn serves: the bot path in front of the FastAPI app, so a bot request pays neither
    FastAPI's routing nor its per-request middleware (bench/bench_serving.py); every answer dated."""
    return Dated(BotMiddleware(create_app(ctx), ctx))


class Dated:
    """ASGI: every answer gets our Date, and no Last-Modified later than it
    (``prerender_ray.serving.dates``; uvicorn's own Date is off)."""

    def __init__(self, app: Any):
        self.app = app
        self.dater = Dater()
        # the bot path right behind: the HTTP protocol answers its memo hits itself, dated by this
        # same Dater (``api.connections.GuardedHttp``)
        self.bot: BotMiddleware | None = app if isinstance(app, BotMiddleware) else None

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

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = exc.detail if isinstance(exc.detail, dict) else {"error": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(DeadlineExceeded)
    @app.exception_handler(RayError)
    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        """An actor this request needed did not answer in time, died, or is on a node Ray declared
        dead: the caller may retry (a route that can say more catches it itself)."""
        ctx.forget_remote()  # the next request looks the actors up afresh
        log.warning("actor call failed", path=request.url.path, error=type(exc).__name__, detail=str(exc)[:300])
        return JSONResponse({"error": "a node this request needs did not answer; retry", "reason": type(exc).__name__,
                             "node": ctx.node.name}, status_code=503, headers={"retry-after": "1"})

    @app.exception_handler(HoldersUnavailable)
    async def _no_holder(request: Request, exc: HoldersUnavailable) -> JSONResponse:
        """Every node that holds the URL was asked in turn (``NodeContext.read_from_holders``) and none
        answered: the body names each and what became of its read."""
        ctx.forget_remote()
        log.warning("no holder answered", path=request.url.path, url=exc.url, holders=exc.failed)
        return JSONResponse({"error": "no node that holds this URL answered; retry", "url": exc.url,
                             "holders": exc.failed, "node": ctx.node.name},
                            status_code=503, headers={"retry-after": "1"})

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"error": "bad request", "details": errors}, status_code=400)

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
