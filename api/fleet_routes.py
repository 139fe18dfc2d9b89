"""The render fleet's two hot routes, claim and job_result, answered in front of FastAPI.

A result costs the ingress about 0.65 ms of CPU, and two thirds of it was FastAPI's stack around the
route (matching the path against every router, solving the auth dependency, its exception and
exit-stack middleware), not the route. Here the same handlers (``api.render_queue``) run with the same
auth dependency and the same error answers (``api.errors``), so a fleet sees the same
bytes either way; any other method or spelling of the path goes on to FastAPI as before.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response

from prerender_ray.api import render_queue
from prerender_ray.api.auth import require
from prerender_ray.api.errors import error_response

ROUTES = {"/render_queue/claim": render_queue.claim, "/render_queue/job_result": render_queue.job_result}


class FleetRoutes:
    """ASGI: POSTs to the fleet's hot routes go straight to their handlers; everything else to ``app``.
    ``fastapi_app`` is what a handler's ``request.app`` is (its state holds the node context)."""

    def __init__(self, app: Any, fastapi_app: FastAPI):
        self.app = app
        self.fastapi_app = fastapi_app
        self.fleet = require("fleet")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        handler = ROUTES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        scope["app"] = self.fastapi_app
        request = Request(scope, receive)
        try:
            response: Response = await handler(request, await self.fleet(request))
        except Exception as e:
            answer = error_response(request, e)
            if answer is None:  # as FastAPI's server-error middleware: uvicorn answers 500 and logs it
                raise
            response = answer
        await response(scope, receive, send)
