"""Sitemaps over HTTP: start walks (background or blocking), read progress and rows, delete.

Walks run in this node's SitemapWalker actor; reads go straight to the node's store, so they answer
while a walk keeps the walker busy.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from prerender_ray.actors.walker.client import WalkerClient
from prerender_ray.admin.users import Principal
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, bool_field, read_object
from prerender_ray.api.context import NodeContext
from prerender_ray.identity.urls import UrlError, whatwg_path
from prerender_ray.serving.origin_policy import OriginPolicy
from prerender_ray.sitemaps.rules import first_renders
from prerender_ray.storage.keys import SITEMAP
from prerender_ray.storage.registry import (
    ENTRY_CHUNK,
    RecordError,
    decode_entries,
    decode_json,
    entries_key,
    sitemap_key,
    sitemap_run_key,
)

router = APIRouter()
START_DEADLINE_S = 30.0
BLOCKING_DEADLINE_S = 900.0  # a blocking walk answers within this, or 504 while it goes on
DELETE_DEADLINE_S = 600.0
READ_DEADLINE_S = 10.0
SCAN_PAGE = 1000
NO_STORE = {"cache-control": "no-store", "x-content-type-options": "nosniff"}  # as every error: it names URLs


def answer(body: object, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=NO_STORE)


async def _walker(ctx: NodeContext) -> WalkerClient:
    return await ctx.walker_at(ctx.node.name)


def sitemap_url(value: object) -> str:
    """A sitemap URL as given (trimmed): it must be an absolute http(s) URL, else 400."""
    if not isinstance(value, str) or not value.strip():
        raise bad_request("url is required")
    url = value.strip()
    try:
        whatwg_path(url)
    except UrlError as e:
        raise bad_request(f"Not a valid absolute http(s) URL: {e}") from None
    return url


def progress_path(root: str) -> str:
    return f"/sitemap_refresh?root={quote(root, safe='')}"


@router.post("/sitemaps")
async def refresh(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """``{url?, revalidate?, background?}``: walk one root, or every root when ``url`` is absent."""
    ctx: NodeContext = request.app.state.ctx
    body = await read_object(request, keys={"url", "revalidate", "background"}, allow_empty=True)
    url = sitemap_url(body["url"]) if body.get("url") is not None else None
    if url is not None and (refused := OriginPolicy(ctx.cfg).url_refusal(url)):
        # Refused now rather than walked: the fetch would be refused, and no bot could read its pages.
        raise bad_request(f"sitemap {url} cannot be fetched: {refused}", reason="host-not-allowed", url=url)
    revalidate = bool_field(body, "revalidate", False)
    background = bool_field(body, "background", ctx.cfg.sitemap.background)
    walker = await _walker(ctx)
    if background:
        try:
            if url is None:
                started = (await walker.within(START_DEADLINE_S).start_all(revalidate))["sitemaps"]
            else:
                started = [await walker.within(START_DEADLINE_S).start(url, revalidate)]
        except Exception as e:  # a dead or restarting walker: nothing was started
            return answer({"error": "the sitemap walker did not answer", "reason": type(e).__name__,
                           "node": ctx.node.name}, 503)
        for s in started:
            s["progress"] = progress_path(s["url"])
        return answer({"background": True, "sitemaps": started,
                       "firstRenders": first_renders(revalidate, ctx.cfg.page, ctx.cfg.render.first_render)})
    from prerender_ray.actors.common import DeadlineExceeded

    try:
        if url is None:
            results = await walker.within(BLOCKING_DEADLINE_S).refresh_all(revalidate)
        else:
            results = [await walker.within(BLOCKING_DEADLINE_S).refresh(url, revalidate)]
    except DeadlineExceeded:
        return answer({"error": f"the walk did not finish within {BLOCKING_DEADLINE_S:g}s; it goes on in the "
                       "background", "progress": progress_path(url) if url else None}, 504)
    if url is not None and results[0].get("state") == "refused":
        return answer({"error": results[0]["reason"], "url": url, "progress": progress_path(url)}, 409)
    if url is not None and results[0].get("state") == "failed":
        return answer({"error": results[0]["error"], "url": url, "result": results[0]}, 502)
    return answer(results)


@router.get("/sitemap_refresh")
async def refresh_progress(request: Request, root: str = Query(...),
                           who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """The progress row of a root's walk (``root=all``: the last refresh-all)."""
    ctx: NodeContext = request.app.state.ctx
    key = root if root == "all" else sitemap_url(root)
    [raw] = await ctx.store.within(READ_DEADLINE_S).get([sitemap_run_key(key)])
    if raw is None:
        return answer({"error": f"No refresh recorded for {key}", "root": key}, 404)
    return answer(decode_json(raw))


@router.get("/sitemaps")
async def read(request: Request, url: str | None = Query(None), offset: int = Query(0, ge=0),
               limit: int | None = Query(None, ge=1),
               who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """Without ``url``: every root with its run state. With it: that row, its refresh row (for a
    root) and a page of its entries (``offset``, ``limit`` up to ``management.pageSize`` x 20)."""
    ctx: NodeContext = request.app.state.ctx
    if url is None:
        return answer(await _roots(ctx))
    url = sitemap_url(url)
    [raw, run] = await ctx.store.within(READ_DEADLINE_S).get([sitemap_key(url), sitemap_run_key(url)])
    if raw is None:
        return answer({"error": f"No sitemap stored under {url}", "url": url}, 404)
    row = decode_json(raw)
    limit = min(limit or ctx.cfg.management.page_size, ctx.cfg.management.page_size * 20)
    first, last = offset // ENTRY_CHUNK, (offset + limit - 1) // ENTRY_CHUNK
    chunks = row["chunks"] if isinstance(row.get("chunks"), int) else 0
    keys = [entries_key(url, i) for i in range(first, min(last + 1, chunks))]
    entries: list[dict] = []
    for data in (await ctx.store.within(READ_DEADLINE_S).get(keys) if keys else []):
        try:
            entries += decode_entries(data) if data else []
        except RecordError:
            break
    skip = offset - first * ENTRY_CHUNK
    return answer({"node": ctx.node.name, "sitemap": public_sitemap(row),
                   "refresh": decode_json(run) if run else None,
                   "entries": entries[skip:skip + limit], "offset": offset, "limit": limit})


@router.delete("/sitemaps")
async def delete(request: Request, url: str = Query(...),
                 who: Principal = Depends(require("admin"))) -> JSONResponse:
    ctx: NodeContext = request.app.state.ctx
    url = sitemap_url(url)
    result = await (await _walker(ctx)).within(DELETE_DEADLINE_S).delete(url)
    if not result["deleted"]:
        return answer({"error": f"No sitemap stored under {url}", "url": url}, 404)
    return answer(result)


def public_sitemap(row: dict) -> dict:
    """A sitemap row as the API shows it (never its entries)."""
    return {"url": row.get("url"), "isIndex": bool(row.get("isIndex")), "entryCount": row.get("entryCount"),
            "lastRefreshed": row.get("lastRefreshed"), "parentUrl": row.get("parentUrl"),
            "bytes": row.get("bytes"), "compressed": row.get("compressed"), "finalUrl": row.get("finalUrl")}


async def root_rows(ctx: NodeContext) -> list[dict]:
    """Every root sitemap (no parent), sorted by url."""
    rows: list[dict] = []
    start: bytes | None = None
    while True:
        page = await ctx.store.within(READ_DEADLINE_S).scan(SITEMAP, start, SCAN_PAGE)
        for _, v in page:
            try:
                row = decode_json(v)
            except RecordError:
                continue
            if not row.get("parentUrl") and isinstance(row.get("url"), str):
                rows.append(public_sitemap(row))
        if len(page) < SCAN_PAGE:
            break
        start = page[-1][0] + b"\x00"
    return sorted(rows, key=lambda r: r["url"])


async def _roots(ctx: NodeContext) -> dict:
    rows = await root_rows(ctx)
    keys = [sitemap_run_key(r["url"]) for r in rows]
    runs = await ctx.store.within(READ_DEADLINE_S).get(keys) if keys else []
    for row, run in zip(rows, runs):
        state = decode_json(run) if run else None
        row["refresh"] = None if state is None else {
            k: state.get(k) for k in ("state", "node", "startedAt", "updatedAt", "finishedAt", "error",
                                      "sitemapsProcessed", "sitemapsDiscovered", "created", "updated")}
        row["progress"] = progress_path(row["url"])
    return {"node": ctx.node.name, "sitemaps": rows}
