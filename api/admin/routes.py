"""The admin API under /prerender_admin (JSON, ``cache-control: no-store``) and its console.

- anyone: ``GET /`` (the console), ``GET session``, ``POST login``, ``POST logout``;
- viewer: ``GET overview``, ``config``, ``queue-state``, ``sitemaps``, ``pages``, ``page-content``,
  ``unrouted``, ``bots``, ``diagnostics``, ``robots``; ``POST explain``, ``schedule``, ``sitemap``;
- admin: ``POST queue``, ``revalidate``, ``reconcile``, ``diagnose``, ``robots/discover``.

Every data route checks the role itself (``Depends(require(...))``); an unknown route answers 404 only
after the same check, so it reveals nothing to an anonymous caller. With ``management.enabled: false``
every route, the console and login included, is 404.

The console is one self-contained page at ``/prerender_admin/`` (``static/console.html``, ``.js``,
``.css``; no build step, nothing loaded from anywhere else). The page itself is public (it holds no
data); everything it shows comes from the JSON routes. Its headers: a CSP that allows only our own
script, style and fetches (``default-src 'none'``, no inline script or style), images only as
``data:`` URLs (a diagnostics screenshot, shown from the JSON that carries it), no framing, no
sniffing, no referrer.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from prerender_ray.admin.users import Principal
from prerender_ray.api.admin import (
    bots,
    browse,
    config,
    diagnostics,
    explain,
    overview,
    queue,
    robots,
    session,
)
from prerender_ray.api.admin.common import NO_STORE, AdminRoute, answer, management_enabled
from prerender_ray.api.auth import require
from prerender_ray.api.context import NodeContext

MODULES = (session, queue, overview, explain, diagnostics, browse, config, robots, bots)
STATIC = Path(__file__).resolve().parent / "static"
FILES = {"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; "
       "font-src 'none'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'")
SECURITY = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer", "x-frame-options": "DENY",
            "cross-origin-opener-policy": "same-origin", "cross-origin-resource-policy": "same-origin"}
_files: dict[str, bytes] = {}

router = APIRouter(prefix="/prerender_admin", route_class=AdminRoute,
                   dependencies=[Depends(management_enabled)])


def _read(name: str) -> bytes:
    data = _files.get(name)
    if data is None:
        data = _files[name] = (STATIC / name).read_bytes()
    return data


# ------------------------------------------------------------------------------------- the console


@router.get("", include_in_schema=False)
async def console_redirect() -> RedirectResponse:
    return RedirectResponse("/prerender_admin/", status_code=308, headers=NO_STORE)


@router.get("/", include_in_schema=False)
async def console() -> Response:
    return Response(_read("console.html"), media_type="text/html; charset=utf-8",
                    headers={**SECURITY, **NO_STORE})


@router.get("/static/{name}", include_in_schema=False)
async def static(name: str) -> Response:
    if name not in FILES:
        return answer({"error": "Not Found"}, 404, headers=SECURITY)
    return Response(_read(name), media_type=FILES[name], headers={**SECURITY, "cache-control": "no-cache"})


# ---------------------------------------------------------------------------------- the JSON routes

for module in MODULES:
    router.include_router(module.router)

KNOWN: dict[str, set[str]] = {}  # route name -> methods, for the 405 answer
for module in MODULES:
    for route in module.router.routes:
        KNOWN.setdefault(route.path.lstrip("/"), set()).update(route.methods)


@router.api_route("/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
                  include_in_schema=False)
async def unknown(rest: str, request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """After the role check: 405 for a known route asked with another method, else 404."""
    allowed = KNOWN.get(rest)
    if allowed:
        return answer({"error": f"{request.method} is not allowed on {rest}", "allowed": sorted(allowed)},
                      405, headers={"Allow": ", ".join(sorted(allowed))})
    return answer({"error": f"Unknown route: {rest}"}, 404)


def install(app: FastAPI, ctx: NodeContext) -> None:
    """Mount the admin API and give the app its session verifier (``api.auth`` consults it)."""
    app.state.sessions = session.Sessions(ctx)
    app.include_router(router)
