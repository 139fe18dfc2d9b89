"""robots.txt: ``robots/discover`` (fetch a domain's robots.txt, or every domain's, and walk the
sitemaps it lists) and ``robots`` (what was fetched: outcome, size, cut, sitemaps, groups, the
bots the policy serves although robots.txt disallows them, and what the site declares about the use
of its content against what each bot class is served there, under the config in force now).

Discovery runs in this node's SitemapWalker (sitemaps/robots.py says what each outcome means); the
report reads the replicated ``b:<origin>`` rows from this node's store, so it never fetches.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import DEADLINE_S, admin_router, answer, ctx_of
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, bool_field, read_object
from prerender_ray.api.context import NodeContext
from prerender_ray.api.sitemaps import progress_path
from prerender_ray.serving.origin_policy import OriginPolicy
from prerender_ray.sitemaps.content_signals import Signals
from prerender_ray.sitemaps.robots import configured_origins, origin_for, signals_report
from prerender_ray.storage.keys import ROBOTS
from prerender_ray.storage.registry import RecordError, decode_json, robots_key

router = admin_router()
MAX_BODY = 16 * 1024
MAX_DEADLINE_S = 900.0
HOW = "POST /prerender_admin/robots/discover"


def _origin(ctx: NodeContext, value: object) -> str:
    """The origin a ``domain`` names, allowed by ``domains``; anything else is a 400."""
    if not isinstance(value, str):
        raise bad_request("domain must be a host, host:port or an http(s) origin such as https://shop.example")
    try:
        origin = origin_for(value, ctx.cfg.ingress.default_protocol)
    except ValueError as e:
        raise bad_request(str(e)) from None
    refused = OriginPolicy(ctx.cfg).url_refusal(origin + "/robots.txt")
    if refused:
        raise bad_request(f"robots.txt of {origin} cannot be fetched: {refused}", reason="host-not-allowed",
                          domain=origin)
    return origin


@router.post("/robots/discover")
async def discover(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """``{domain?, refresh?, walk?}``: one domain's robots.txt, or every ``domains`` entry's; a copy
    younger than ``robots.ttl`` is reused unless ``refresh``; its allowed sitemaps are queued for
    walks unless ``walk: false``."""
    ctx = ctx_of(request)
    body = await read_object(request, MAX_BODY, keys={"domain", "refresh", "walk"}, allow_empty=True)
    refresh, walk = bool_field(body, "refresh", False), bool_field(body, "walk", True)
    if body.get("domain") is not None:
        origins = [_origin(ctx, body["domain"])]
    else:
        origins = [o for o in configured_origins(ctx.cfg.domains, ctx.cfg.ingress.default_protocol)
                   if OriginPolicy(ctx.cfg).url_refusal(o) is None]
        if not origins:
            raise bad_request("no domain to discover: `domains` is empty (or every fetch is refused); "
                              "name one with {\"domain\": ...}")
    deadline = min(MAX_DEADLINE_S, len(origins) * (ctx.cfg.robots.fetch_timeout_ms / 1000 + 5) + DEADLINE_S)
    try:
        walker = await ctx.walker_at(ctx.node.name)
    except ValueError:
        return answer({"error": "the sitemap walker of this node is not running; retry", "node": ctx.node.name},
                      503)
    doc = await walker.within(deadline).discover_robots(origins, refresh, walk)
    for domain in doc["domains"]:
        for w in domain["walks"]:
            w["progress"] = progress_path(w["url"])
    return answer(doc)


@router.get("/robots")
async def report(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """``?domain=``: that origin's last robots.txt report (404 before its first discovery); without
    it, every origin's, with its conflicts."""
    ctx = ctx_of(request)
    domain = request.query_params.get("domain")
    if domain is not None:
        origin = _origin(ctx, domain)
        [raw] = await ctx.store.within(DEADLINE_S).get([robots_key(origin)])
        row = _decode(raw)
        if row is None:
            return answer({"error": f"No robots.txt fetched for {origin} yet; {HOW} fetches it",
                           "domain": origin}, 404)
        return answer({"node": ctx.node.name, **_public(row, ctx)})
    rows = [_decode(v) for _, v in await ctx.store.within(DEADLINE_S).scan(ROBOTS, None, 1000)]
    found = [_public(r, ctx) for r in rows if r is not None]
    return answer({"node": ctx.node.name, "domains": found,
                   "conflicts": sum(len(d["robots"].get("conflicts") or ()) for d in found)})


def _decode(raw: bytes | None) -> dict | None:
    try:
        row = decode_json(raw) if raw else None
    except RecordError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("report"), dict) else None


def _public(row: dict[str, Any], ctx: NodeContext) -> dict:
    """A row as the API shows it: the report, never the stored text; what the site declares is set
    against the config in force now (a row written before declarations were kept declares none)."""
    signals = signals_report(Signals.from_row(row.get("signals")), ctx.cfg)
    return {"domain": row.get("origin"), "checkedAt": row.get("checkedAt"),
            "robots": {**row["report"], "contentSignals": signals}}
