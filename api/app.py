"""The ingress application: one FastAPI app per replica, assembling every router."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from . import health
from .context import NodeContext


def create_app(ctx: NodeContext) -> FastAPI:
    app = FastAPI(title="prerender-ray", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.ctx = ctx
    app.include_router(health.router)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"error": "bad request", "details": errors}, status_code=400)

    return app
