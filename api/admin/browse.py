"""Read-only admin views of the replicated data: ``sitemaps`` (roots and their runs), ``sitemap`` (one
document's entries, paged, each with its state), ``pages`` (browse by cache-key prefix with a signed
cursor), ``page-content`` (a stored page as text/plain, never HTML), ``unrouted`` (this replica's
tally).

Sitemap rows are the sitemap walker's (``s:<url>`` with the parsed entries in ``e:<url>\\x00<n>`` chunks,
``r:<root>`` run rows, see ``prerender_ray.storage.registry``); pages come from this node's page store.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response

from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.admin.explain import describe_page
from prerender_ray.admin.sessions import TokenError
from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import (
    DEADLINE_S,
    admin_router,
    answer,
    body_int,
    ctx_of,
    heavy,
    query_int,
)
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, read_object
from prerender_ray.api.bot.replica import opened
from prerender_ray.api.context import NodeContext
from prerender_ray.api.sitemaps import public_sitemap, root_rows
from prerender_ray.identity.urls import UrlError, whatwg_path
from prerender_ray.serving.negotiation import EncodingError, decode_body
from prerender_ray.storage.keys import SITEMAP_RUN
from prerender_ray.storage.pages import Page, PageDecodeError, decode_meta
from prerender_ray.storage.registry import (
    ENTRY_CHUNK,
    RecordError,
    Target,
    decode_entries,
    decode_json,
    entries_key,
    sitemap_key,
    sitemap_run_key,
)
from prerender_ray.timeutil import now_ms

router = admin_router()
READ_DEADLINE_S = 3.0
MAX_OFFSET = 10_000_000
MAX_PREFIX = 8192
RUN_FIELDS = ("state", "node", "trigger", "startedAt", "updatedAt", "finishedAt", "sitemapsProcessed",
              "sitemapsDiscovered", "created", "updated", "removed", "error")


def _sitemap_url(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise bad_request("url is required")
    try:
        whatwg_path(value.strip())
    except UrlError as e:
        raise bad_request(f"Not a valid absolute http(s) URL: {e}") from None
    return value.strip()


def _run(raw: bytes | None) -> dict | None:
    try:
        row = decode_json(raw) if raw else None
    except RecordError:
        return None
    return {k: row.get(k) for k in RUN_FIELDS} if row else None


# ---------------------------------------------------------------------------------------- sitemaps


@router.get("/sitemaps")
async def sitemaps(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """Roots only (entries are never read here), sorted by url, each with its run row."""
    ctx = ctx_of(request)
    roots = await root_rows(ctx)
    keys = [sitemap_run_key(r["url"]) for r in roots] + [SITEMAP_RUN + b"all"]
    runs = await ctx.store.within(DEADLINE_S).get(keys)
    for row, run in zip(roots, runs):
        row["refresh"] = _run(run)
    return answer({"node": ctx.node.name, "sitemaps": roots, "lastFullPass": _run(runs[-1])})


async def _entry_states(ctx: NodeContext, entries: list[dict]) -> tuple[list[dict], bool]:
    """Each page-list entry's state: invalid, filtered, non-indexable, cached, stale, scheduled or
    no target (None when a read timed out). Two batched reads per page of entries."""
    out: list[dict] = []
    pending: list[tuple[dict, str, str]] = []
    for e in entries:
        item = {"loc": e.get("loc"), "lastmod": e.get("lastmod"), "changefreq": e.get("changefreq"),
                "priority": e.get("priority"), "state": None}
        out.append(item)
        try:
            loc = e.get("loc")
            url = ctx.rules.canonical(loc if isinstance(loc, str) else "")
        except UrlError:
            item.update(state="invalid", stateDetail="not an absolute URL")
            continue
        route_class = ctx.rules.route_class(url)
        if route_class != "prerender":
            item.update(state="filtered", stateDetail=f"{route_class} route")
            continue
        key = ctx.rules.keys_of(url)[0]
        item["cacheKey"] = key
        pending.append((item, url, key))
    if not pending:
        return out, False
    try:
        targets, pages = await _read_held(ctx, [u for _, u, _ in pending], [k for _, _, k in pending])
    except Exception:
        return out, True
    now, swr = now_ms(), ctx.cfg.page.swr_ttl
    for (item, url, _), t, p in zip(pending, targets, pages):
        try:
            target = Target.decode(url, t) if t else None
            page = describe_page(decode_meta(p)[0], now, swr) if p else None
        except (RecordError, PageDecodeError):
            item.update(state=None, stateDetail="unreadable row")
            continue
        if target is not None and target.suppressed:
            item["state"] = "non-indexable"
        elif page is not None:
            item["state"] = "cached" if page["fresh"] else "stale"
        elif target is not None:
            item.update(state="scheduled", stateDetail="target, not yet cached")
        else:
            item["state"] = "no target"
    return out, not await _due_times(ctx, [(item, url, key) for item, url, key in pending
                                           if item["state"] == "scheduled"])


async def _due_times(ctx: NodeContext, scheduled: list[tuple[dict, str, str]]) -> bool:
    """``nextRenderTime`` of each scheduled entry (when its first render is due), asked of each
    owner's keeper in one call; False when an owner did not answer in time (the entries keep no
    time, and the answer says it is degraded)."""
    by_owner: dict[str, list[tuple[dict, str]]] = {}
    for item, url, key in scheduled:
        by_owner.setdefault(ctx.owner_of(url), []).append((item, key))
    ok = True
    for owner, items in by_owner.items():
        keeper = (await ctx.keeper_at(owner)).within(READ_DEADLINE_S)
        try:
            dues = await keeper.due_times([k for _, k in items])
        except Exception:
            ok = False
            continue
        for (item, _), due in zip(items, dues):
            item["nextRenderTime"] = due
    return ok


@router.post("/sitemap")
async def sitemap(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """``{url, offset?, limit?}``: one stored sitemap, its run row, its target count and a page of its
    entries (``limit`` 1 to ``management.pageSize``)."""
    ctx = ctx_of(request)
    body = await read_object(request, 64 * 1024, keys={"url", "offset", "limit"})
    url = _sitemap_url(body.get("url"))
    size = ctx.cfg.management.page_size
    limit = body_int(body, "limit", default=size, minimum=1, maximum=size)
    offset = body_int(body, "offset", default=0, minimum=0, maximum=MAX_OFFSET)
    async with heavy(ctx).slot():
        try:
            raw, run = await ctx.store.within(READ_DEADLINE_S).get([sitemap_key(url), sitemap_run_key(url)])
        except Exception:
            return answer({"error": "sitemap read timed out", "url": url}, 504)
        if raw is None:
            return answer({"error": f"No sitemap stored under {url}", "url": url}, 404)
        try:
            row = decode_json(raw)
        except RecordError:
            return answer({"error": f"The sitemap row of {url} is unreadable", "url": url}, 500)
        chunks = row["chunks"] if isinstance(row.get("chunks"), int) else 0
        first, last = offset // ENTRY_CHUNK, (offset + limit - 1) // ENTRY_CHUNK
        keys = [entries_key(url, i) for i in range(first, min(last + 1, chunks))]
        entries: list[dict] = []
        degraded: list[str] = []
        for data in (await ctx.store.within(READ_DEADLINE_S).get(keys) if keys else []):
            try:
                entries += decode_entries(data) if data else []
            except RecordError:
                degraded.append("unreadable entry chunk")
                break
        skip = offset - first * ENTRY_CHUNK
        entries = entries[skip:skip + limit]
        is_index = bool(row.get("isIndex"))
        target_count = None
        if is_index:
            entries = [{"loc": e.get("loc"), "lastmod": e.get("lastmod")} for e in entries]
        else:
            entries, timed_out = await _entry_states(ctx, entries)
            if timed_out:
                degraded.append("entry state reads timed out")
            try:
                _, n = await ctx.sitemap_urls(url, 0, READ_DEADLINE_S)
                target_count = {"count": n, "truncated": False}
            except Exception:
                degraded.append("target count timed out")
    count = row.get("entryCount") if isinstance(row.get("entryCount"), int) else None
    return answer({"node": ctx.node.name, "sitemap": public_sitemap(row), "refresh": _run(run),
                   "targetCount": target_count, "entries": entries, "offset": offset, "limit": limit,
                   "nextOffset": offset + limit if count is not None and offset + limit < count else None,
                   "degraded": degraded or None})


# ------------------------------------------------------------------------------------------- pages


@router.get("/pages")
async def pages(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """``?prefix&cursor&limit``: cached pages in key order (metadata only). ``nextCursor`` continues
    the same listing; a cursor that this cluster did not issue for this prefix is a 400."""
    ctx = ctx_of(request)
    prefix = request.query_params.get("prefix") or ""
    if len(prefix) > MAX_PREFIX:
        raise bad_request(f"prefix is longer than {MAX_PREFIX} characters")
    size = ctx.cfg.management.page_size
    limit = query_int(request, "limit", default=size, minimum=1, maximum=size)
    cursors = request.app.state.sessions.cursors
    scope = "pages\x00" + prefix
    cursor = request.query_params.get("cursor")
    start = None
    if cursor:
        try:
            start = cursors.read(cursor, scope) + "\x00"
        except TokenError as e:
            raise bad_request(f"cursor was not issued for this listing ({e}); start again without it") \
                from None
    async with heavy(ctx).slot():
        try:
            listing = await ctx.store.within(READ_DEADLINE_S).page_keys(prefix, start, limit + 1)
        except Exception:
            return answer({"error": "page-cache read timed out"}, 504)
    found = listing["pages"]
    now, swr = now_ms(), ctx.cfg.page.swr_ttl
    rows = []
    for key, payload in found[:limit]:
        entry: dict = {"cacheKey": key}
        try:
            meta, body = decode_meta(payload)
            entry.update(describe_page(meta, now, swr) or {}, bytes=body.nbytes)
        except PageDecodeError as e:
            entry["error"] = str(e)
        try:
            entry["url"], entry["deviceType"] = ctx.rules.url_of(key), ctx.rules.device_of(key)
        except ValueError:
            entry["url"] = entry["deviceType"] = None
        rows.append(entry)
    # the store read its most records a call (deleted pages) before the page filled: go on from there
    resume = listing.get("resume")
    truncated = len(found) > limit or resume is not None
    # The store's count taken with these rows: an overview's snapshot (another replica's, or older)
    # once said 200 beside 202 rows.
    total = listing["total"]
    after = None if not truncated else cursors.issue(scope, rows[-1]["cacheKey"] if len(found) > limit else resume)
    return answer({"node": ctx.node.name, "prefix": prefix, "limit": limit, "pages": rows,
                   "truncated": truncated, "nextCursor": after, "total": total})


@router.get("/page-content")
async def page_content(request: Request, who: Principal = Depends(require("viewer"))) -> Response:
    """A stored page's body, decoded, as text/plain (stored markup is origin-influenced: rendered as
    HTML it would run with the admin's session)."""
    ctx = ctx_of(request)
    key = request.query_params.get("cacheKey")
    if not key:
        raise bad_request("cacheKey is required")
    if len(key) > 9000:
        raise bad_request("cacheKey is too long")
    async with heavy(ctx).slot():
        try:
            [raw] = await ctx.store.within(READ_DEADLINE_S).get_pages([key])
        except Exception:
            return answer({"error": "page-cache read timed out", "cacheKey": key}, 504)
        if raw is None:
            return answer({"error": "No cached page under this key", "cacheKey": key}, 404)
        try:
            page = Page.decode(raw)
            text = decode_body(page.content, page.content_encoding, ctx.cfg.server.max_html_bytes)
        except (PageDecodeError, EncodingError) as e:
            return answer({"error": f"the stored page cannot be decoded: {e}", "cacheKey": key}, 500)
    return Response(text, status_code=200, headers={
        "content-type": "text/plain; charset=utf-8", "x-content-type-options": "nosniff",
        "content-disposition": "inline", "cache-control": "no-store",
        "content-security-policy": "default-src 'none'; sandbox",
        "x-page-status-code": str(page.status_code)})


# ------------------------------------------------------------------------------- unrouted, config


@router.get("/unrouted")
async def unrouted(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """A non-draining look at THIS replica's unrouted tally (bot requests served without
    prerendering, by path bucket). Only forwarded mode tallies; the tally is reset every
    ``ingress.report.interval`` when it is logged."""
    ctx = ctx_of(request)
    state = opened(ctx)
    rep = ctx.cfg.ingress.report
    report: dict[str, Any] = {"overflowed": {}, "unclassified": [], "passthrough": []}
    body = {"node": ctx.node.name, "replica": ctx.replica, "perReplica": True, "interval": rep.interval,
            "enabled": bool(state is not None and state.services.report_unrouted), "report": report}
    if state is None:
        body["available"] = False
        return answer(body)
    body["available"] = True
    for cls, t in state.services.unrouted.peek().items():
        rows = sorted(t.buckets.items(), key=lambda kv: (-kv[1].count, kv[0]))
        report[cls] = [{"bucket": name, "count": b.count, "samplePath": b.sample_path,
                        "firstMs": b.first_ms, "lastMs": b.last_ms} for name, b in rows]
        report["overflowed"][cls] = t.overflowed
    return answer(body)


async def _read_held(ctx: NodeContext, urls: list[str], keys: list[str]) -> tuple[list, list]:
    """Targets of ``urls`` and pages of ``keys`` (one key per URL), each from a store that holds it:
    one call of each kind per group of URLs with the same holders."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, url in enumerate(urls):
        groups.setdefault(ctx.read_order(url), []).append(i)
    targets: list = [None] * len(urls)
    pages: list = [None] * len(urls)
    for idx in groups.values():
        async def read(store: StoreClient, idx: list[int] = idx) -> tuple[list, list]:
            return (await store.get_targets([urls[i] for i in idx]), await store.get_pages([keys[i] for i in idx]))

        # the group's URLs share their holders, so its first URL routes the read of them all
        got_t, got_p = await ctx.read_from_holders(urls[idx[0]], read, READ_DEADLINE_S)
        for i, t, p in zip(idx, got_t, got_p):
            targets[i], pages[i] = t, p
    return targets, pages

