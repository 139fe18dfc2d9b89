"""Render targets for operators and scripts: put, read, delete, revalidate."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from prerender_ray.admin.users import Principal
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, int_field, read_object
from prerender_ray.api.context import NodeContext
from prerender_ray.config.base import duration_ms
from prerender_ray.identity.urls import UrlError
from prerender_ray.rpc import call
from prerender_ray.serving.origin_policy import compiled
from prerender_ray.storage.registry import Target

router = APIRouter()
DEADLINE_S = 30.0
MAX_URLS = 1000  # per revalidate request, as the hosted recache API allows
DEFAULT_WITHIN_MS = 3_600_000  # a paced revalidation spreads over an hour unless told
MAX_WITHIN_MS = 7 * 86_400_000
PACED_DEADLINE_S = 120.0  # a node scans every target under the prefix (2,000 per store call)
MAX_MS = 2**53 - 1  # times and intervals: exact in JSON for the JS fleet; 2**63 and up was a 500


def _canonical(ctx: NodeContext, url: object, *, prerender_only: bool = True) -> str:
    if not isinstance(url, str) or not url.strip():
        raise bad_request("url is required")
    try:
        canonical = ctx.rules.canonical(url.strip())
    except UrlError as e:
        raise bad_request(f"Not a valid absolute URL: {e}") from None
    if prerender_only and ctx.rules.route_class(canonical) != "prerender":
        raise bad_request(f"{canonical} is not in a prerender route; it would never be served from cache")
    return canonical


def _in_domains(ctx: NodeContext, url: str) -> str:
    """``url``, or a 400 naming the entry to add when a non-empty ``domains`` does not allow its host
    and port (as for a sitemap root): the fleet renders what it is handed, a cloud metadata address
    included. For what would be rendered (put, revalidate); read and delete take any URL."""
    if refused := compiled(tuple(ctx.cfg.domains)).url_refusal(url):  # an empty list allows any host
        raise bad_request(f"{url} cannot be a render target: {refused}", reason="host-not-allowed", url=url)
    return url


@router.put("/render_targets")
async def put_target(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """Put semantics: (re)activate the URL, one row per device, first render jittered unless
    ``nextRenderTime`` (epoch ms) is given."""
    ctx: NodeContext = request.app.state.ctx
    body = await read_object(request, keys={"url", "renderInterval", "nextRenderTime", "sitemapUrl"})
    url = _canonical(ctx, body.get("url"))
    item = {
        "url": url,
        "renderInterval": int_field(body, "renderInterval", minimum=1, maximum=MAX_MS, allow_none=True),
        "nextRenderTime": int_field(body, "nextRenderTime", minimum=1, maximum=MAX_MS, allow_none=True),
    }
    sitemap = body.get("sitemapUrl")
    if sitemap is not None and not isinstance(sitemap, str):
        raise bad_request("sitemapUrl must be a string or null")
    item["sitemapUrl"] = sitemap or None
    _in_domains(ctx, url)
    keeper = await ctx.keeper_of(url)
    await keeper.within(DEADLINE_S).put_targets([item])
    return JSONResponse({"url": url, "owner": ctx.owner_of(url), "cacheKeys": ctx.rules.keys_of(url)})


@router.get("/render_targets")
async def get_target(request: Request, url: str = Query(...),
                     who: Principal = Depends(require("viewer"))) -> JSONResponse:
    ctx: NodeContext = request.app.state.ctx
    canonical = _canonical(ctx, url, prerender_only=False)
    [data] = await ctx.read_from_holders(canonical, lambda store: store.get_targets([canonical]), DEADLINE_S)
    if data is None:
        return JSONResponse({"error": "No target for this URL", "url": canonical}, status_code=404)
    return JSONResponse(Target.decode(canonical, data).as_json())


@router.delete("/render_targets")
async def delete_target(request: Request, url: str = Query(...),
                        who: Principal = Depends(require("admin"))) -> JSONResponse:
    ctx: NodeContext = request.app.state.ctx
    canonical = _canonical(ctx, url, prerender_only=False)
    keeper = await ctx.keeper_of(canonical)
    result = await call(keeper.delete_targets([canonical]), DEADLINE_S)  # the client's is a sitemap batch's
    if not result["deleted"]:
        return JSONResponse({"error": "No target for this URL", "url": canonical}, status_code=404)
    return JSONResponse({"url": canonical, "deleted": True})


@router.post("/render_targets")
async def target_action(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """``{"action": "revalidate", "urls": [...]}``: every device due now, cached pages expire now.
    ``{"action": "revalidate", "prefix": "https://site/blog/", "within": "2h"}`` (or ``"all": true``):
    every target under the prefix due over the window, paced, on every node (``revalidate_paced``)."""
    ctx: NodeContext = request.app.state.ctx
    body = await read_object(request, keys={"action", "urls", "prefix", "all", "within"})
    if body.get("action") != "revalidate":
        raise bad_request("action must be 'revalidate'")
    given = [k for k in ("urls", "prefix", "all") if body.get(k) not in (None, False)]
    if len(given) != 1:
        raise bad_request("give exactly one of urls, prefix or all: true")
    if given[0] != "urls":
        return await _revalidate_paced(ctx, body)
    if "within" in body:
        raise bad_request("within paces a prefix or the whole site; urls are due now")
    urls = body.get("urls")
    if not isinstance(urls, list) or not urls or len(urls) > MAX_URLS:
        raise bad_request(f"urls must be a list of 1 to {MAX_URLS} URLs")
    by_owner: dict[str, list[str]] = defaultdict(list)
    for u in urls:
        canonical = _in_domains(ctx, _canonical(ctx, u, prerender_only=False))
        by_owner[ctx.owner_of(canonical)].append(canonical)
    total = {"revalidating": 0, "examined": 0}
    for owner, group in by_owner.items():
        keeper = await ctx.keeper_of(group[0])
        result = await keeper.within(DEADLINE_S).revalidate(group)
        for k in total:
            total[k] += result[k]
    return JSONResponse(total)


async def _revalidate_paced(ctx: NodeContext, body: dict) -> JSONResponse:
    if body.get("all") not in (None, True):
        raise bad_request("all must be true")
    prefix = "" if body.get("all") else _prefix(body.get("prefix"))
    try:
        within = duration_ms(body.get("within", DEFAULT_WITHIN_MS))
    except ValueError as e:
        raise bad_request(f"within: {e}") from None
    if not 0 <= within <= MAX_WITHIN_MS:
        raise bad_request(f"within must be between 0 and {MAX_WITHIN_MS // 86_400_000} days")

    async def one(node: str) -> tuple[str, dict | str]:
        try:
            keeper = await ctx.keeper_at(node)
            return node, await keeper.within(PACED_DEADLINE_S).revalidate_prefix(prefix, within)
        except Exception as e:  # the others still pace theirs; the answer says which did not
            return node, f"{type(e).__name__}: {str(e)[:200]}"

    answers = dict(await asyncio.gather(*(one(n) for n in ctx.ownership.names)))
    done = {n: a for n, a in answers.items() if isinstance(a, dict)}
    doc = {"prefix": prefix, "within": within, "targets": sum(a["targets"] for a in done.values()),
           "revalidating": sum(a["revalidating"] for a in done.values()),
           "nodes": {n: (a if isinstance(a, str) else {"targets": a["targets"], "revalidating": a["revalidating"]})
                     for n, a in answers.items()}}
    return JSONResponse(doc, status_code=200 if len(done) == len(answers) else 503)


def _prefix(value: object) -> str:
    """A URL prefix as given: absolute http(s), with a host, at most 2,048 characters."""
    if not isinstance(value, str) or not value.strip():
        raise bad_request("prefix must be an absolute http(s) URL prefix, like https://shop.example/blog/")
    prefix = value.strip()
    scheme, sep, rest = prefix.partition("://")
    host, slash, path = rest.partition("/")
    if not sep or scheme.lower() not in ("http", "https") or not host or len(prefix) > 2048:
        raise bad_request("prefix must be an absolute http(s) URL prefix, like https://shop.example/blog/")
    return f"{scheme.lower()}://{host.lower()}{slash}{path}"  # canonical URLs have them in lower case
