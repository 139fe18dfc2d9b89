"""The ingress application: one FastAPI app per replica, assembling every router."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import admin, health, render_queue, targets
from .context import NodeContext


def create_app(ctx: NodeContext) -> FastAPI:
    app = FastAPI(title="prerender-ray", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.ctx = ctx
    app.include_router(health.router)
    app.include_router(render_queue.router)
    app.include_router(targets.router)
    app.include_router(admin.router)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = exc.detail if isinstance(exc.detail, dict) else {"error": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"error": "bad request", "details": errors}, status_code=400)

    return app
