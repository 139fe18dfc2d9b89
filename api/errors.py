"""The JSON answer for every error a route may raise, shared by the FastAPI app's exception handlers
and the fleet's routes in front of it (``api.fleet_routes``), so both answer the same bytes."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray.exceptions import RayError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prerender_ray import logs
from prerender_ray.api.context import HoldersUnavailable, NodeContext
from prerender_ray.rpc import DeadlineExceeded

log = logs.get("ingress")
HANDLED = (StarletteHTTPException, DeadlineExceeded, RayError, HoldersUnavailable, RequestValidationError)


def error_response(request: Request, exc: Exception) -> JSONResponse | None:
    """The answer to ``exc`` raised by a route, or None for one no handler takes (a 500). nosniff: an
    error names what it was given (a URL, a name), and no browser may read it as anything but JSON."""
    response = _answer(request, exc)
    if response is not None:
        response.headers["x-content-type-options"] = "nosniff"
    return response


def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The answer to a route's ``HTTPException``: its detail as JSON, its headers, nosniff."""
    response = error_response(request, exc)
    assert response is not None  # an HTTPException always has one
    return response


def _answer(request: Request, exc: Exception) -> JSONResponse | None:
    if isinstance(exc, StarletteHTTPException):
        body = exc.detail if isinstance(exc.detail, dict) else {"error": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))
    ctx: NodeContext = request.app.state.ctx
    if isinstance(exc, (DeadlineExceeded, RayError)):
        # An actor this request needed did not answer in time, died, or is on a node Ray declared
        # dead: the caller may retry (a route that can say more catches it itself).
        ctx.forget_remote()  # the next request looks the actors up afresh
        log.warning("actor call failed", path=request.url.path, error=type(exc).__name__, detail=str(exc)[:300])
        return JSONResponse({"error": "a node this request needs did not answer; retry", "reason": type(exc).__name__,
                             "node": ctx.node.name}, status_code=503, headers={"retry-after": "1"})
    if isinstance(exc, HoldersUnavailable):
        # Every node that holds the URL was asked in turn (``NodeContext.read_from_holders``) and none
        # answered: the body names each and what became of its read.
        ctx.forget_remote()
        log.warning("no holder answered", path=request.url.path, url=exc.url, holders=exc.failed)
        return JSONResponse({"error": "no node that holds this URL answered; retry", "url": exc.url,
                             "holders": exc.failed, "node": ctx.node.name},
                            status_code=503, headers={"retry-after": "1"})
    if isinstance(exc, RequestValidationError):
        errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"error": "bad request", "details": errors}, status_code=400)
    return None
