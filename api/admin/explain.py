"""``POST explain``: why is this URL (not) fresh? The config-only part comes from
``prerender_ray.admin.explain``; this module reads the live rows and, when this node does not own the URL,
asks the owner for its schedule row over HTTP (the schedule proxy).

The proxy (docs/sitemaps.md#schedule-proxy): the destination is a node of the
cluster's own membership (``ctx.peers``), never anything from the request; only the caller's
``authorization`` header and our session cookie are forwarded; the owner re-checks the caller's role
on its leaf route ``/prerender_admin/schedule``, which never proxies onward; the whole exchange is
bounded by ``management.peerTimeoutMs``; the answer is capped in size and validated. It never raises:
a failure costs the one field and is reported in ``residency.peerError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import httpx
from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.admin.explain import (
    Explainer,
    describe_page,
    describe_refused,
    describe_suppression,
    verdict,
)
from prerender_ray.admin.sessions import SESSION_COOKIE
from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import admin_router, answer, ctx_of, peer_timeout_s
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, read_object
from prerender_ray.api.context import NodeContext
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.identity.urls import UrlError
from prerender_ray.jsonbody import JsonError, parse_json
from prerender_ray.rpc import call
from prerender_ray.serving.origin_policy import NoCookies
from prerender_ray.storage.pages import PageDecodeError, decode_meta
from prerender_ray.storage.registry import RecordError, Target
from prerender_ray.timeutil import now_ms

router = admin_router()
SCHEDULE_PATH = "/prerender_admin/schedule"
PEER_ANSWER_MAX_BYTES = 256 * 1024
T = TypeVar("T")
READ_DEADLINE_S = 3.0  # per live row, as the reference's readWithTimeout


def explainer(ctx: NodeContext) -> Explainer:
    return ctx.compiled.explainer  # built once per config version


# ----------------------------------------------------------------------------------- the proxy


def forwardable(headers: Any) -> dict[str, str]:
    """The caller's credentials and nothing else: ``authorization``, and of the cookies only ours."""
    out = {}
    if headers.get("authorization"):
        out["authorization"] = headers["authorization"]
    cookies = [c.strip() for c in (headers.get("cookie") or "").split(";")]
    ours = [c for c in cookies if c.startswith(SESSION_COOKIE + "=")]
    if ours:
        out["cookie"] = ours[0]
    return out


def _client(ctx: NodeContext) -> httpx.AsyncClient:
    client = ctx.admin_http
    if client is None or client.is_closed:
        # No jar: only the caller's own credentials (``forwardable``) go to the owner.
        client = ctx.admin_http = httpx.AsyncClient(follow_redirects=False, trust_env=False, cookies=NoCookies())
    return client


async def fetch_schedule_from_peer(client: httpx.AsyncClient, peers: dict[str, NodeInfo], owner: str,
                                   key: str, credentials: dict[str, str], timeout_s: float,
                                   *, open_cluster: bool = False) -> dict:
    """The owner's schedule row for ``key``: ``{"row": ..., "node": ...}`` or ``{"error": reason}``.

    ``open_cluster``: no users are configured (loopback-only auth), so a request without credentials
    is still worth making; otherwise it is refused before any request, as in the reference."""
    found = {n.lower(): info for n, info in peers.items()}
    info = found.get(owner.lower())
    if info is None:
        return {"error": f'unknown node "{owner}"'}
    if not credentials and not open_cluster:
        return {"error": "no forwardable credentials on this request"}
    url = f"{info.url}{SCHEDULE_PATH}"
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json={"cacheKey": key},
                                     headers={**credentials, "accept": "application/json",
                                              "accept-encoding": "identity"},
                                     timeout=timeout_s) as r:
                if not 200 <= r.status_code < 300:
                    return {"error": f"peer responded {r.status_code}"}
                raw = bytearray()
                # Raw bytes: httpx would inflate a coded answer a whole chunk at a time, uncapped.
                async for chunk in r.aiter_raw():
                    raw += chunk
                    if len(raw) > PEER_ANSWER_MAX_BYTES:
                        return {"error": f"peer answered more than {PEER_ANSWER_MAX_BYTES} bytes"}
    except TimeoutError:
        return {"error": "peer timed out"}
    except httpx.TimeoutException:
        return {"error": "peer timed out"}
    except Exception as e:  # connection refused, reset, TLS, protocol errors: never raised to the caller
        return {"error": f"peer fetch failed: {type(e).__name__}: {str(e)[:200]}"}
    try:
        doc = parse_json(bytes(raw), what="peer answer")
    except JsonError:
        return {"error": "peer answered garbage: not JSON"}
    if not isinstance(doc, dict) or "renderSchedule" not in doc:
        return {"error": "peer answered garbage: no renderSchedule"}
    row = doc["renderSchedule"]
    if row is not None and not (isinstance(row, dict) and row.get("cacheKey") == key):
        return {"error": "peer answered garbage: renderSchedule is not a row for this key"}
    return {"row": row, "node": doc.get("node"), "checkedAt": doc.get("checkedAt")}


# ----------------------------------------------------------------------------------- live rows


async def _timed(what: str, coro: Awaitable[T], timed_out: list[str]) -> T | None:
    try:
        return await call(coro, READ_DEADLINE_S)
    except Exception as e:
        timed_out.append(f"{what}: {type(e).__name__}")
        return None


async def explain_live(request: Request, ctx: NodeContext, doc: dict) -> dict:
    canonical, key = doc["resolved"]["canonicalUrl"], doc["resolved"]["cacheKey"]
    failed: list[str] = []

    async def held(store: StoreClient) -> tuple[list, list, dict]:
        # one holder's copy of all three (the holders hold the same records); the next holder if not
        targets, pages, history = await asyncio.gather(
            store.get_targets([canonical]), store.get_pages([key]), store.render_history(key))
        return targets, pages, history

    reads, row = await asyncio.gather(
        _timed("holder", ctx.read_from_holders(canonical, held, READ_DEADLINE_S), failed),
        _timed("schedule", ctx.keeper.schedule_row(key), failed),
    )
    targets, pages, history = reads or (None, None, None)
    now = now_ms()
    target = None
    if targets and targets[0] is not None:
        try:
            target = Target.decode(canonical, targets[0])
        except RecordError:
            failed.append("target: unreadable")
    meta = None
    if pages and pages[0] is not None:
        try:
            meta = decode_meta(pages[0])[0]
        except PageDecodeError:
            failed.append("page: unreadable")
    owner = ctx.owner_of(canonical)
    here = ctx.node.name
    schedule = row["renderSchedule"] if isinstance(row, dict) else None
    source = "local (owner)" if owner == here else "local (not owner)"
    authoritative = owner == here and row is not None
    peer_error = None
    if owner != here and schedule is None and ctx.cfg.management.proxy_to_owner:
        got = await fetch_schedule_from_peer(
            _client(ctx), ctx.peers, owner, key, forwardable(request.headers), peer_timeout_s(ctx),
            open_cluster=not ctx.cfg.auth.users)
        if "error" in got:
            peer_error = got["error"]
        else:
            schedule, authoritative, source = got["row"], True, f"owner {owner}"
    elif owner != here and not ctx.cfg.management.proxy_to_owner:
        peer_error = "management.proxyToOwner is off"
    page = describe_page(meta, now, ctx.cfg.page.swr_ttl)
    return {
        **doc,
        "rows": {"renderTarget": target.as_json() if target else None, "renderSchedule": schedule,
                 "prerenderedPage": page, "suppression": describe_suppression(target, ctx.cfg),
                 "refusedRender": describe_refused(target, key)},
        "verdict": verdict(prerendered=doc["eligibility"]["prerendered"], target=target, schedule=schedule,
                           page=page, reliable=not failed),
        "residency": {"queriedNode": here, "scheduleOwnedBy": owner,
                      "scheduleReadIsAuthoritative": owner == here, "scheduleAuthoritative": authoritative,
                      "scheduleSource": source, "peerError": peer_error},
        # this node's copy, as the page (a holder of the URL's pages holds them); reports without
        # their screenshots (GET diagnostics has those)
        "renderHistory": (history or {}).get("renderHistory", []),
        "diagnostics": (history or {}).get("reports", []),
        "degraded": {"timedOutReads": failed} if failed else None,
        "checkedAt": now,
    }


@router.post("/explain")
async def explain(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """``{url, deviceType?}``: route, allowlist, canonical URL and key, the live rows, residency."""
    ctx = ctx_of(request)
    body = await read_object(request, 64 * 1024, keys={"url", "deviceType"})
    url, device = body.get("url"), body.get("deviceType")
    if not isinstance(url, str) or not url.strip():
        raise bad_request("url is required")
    if device is not None and not isinstance(device, str):
        raise bad_request("deviceType must be a string")
    try:
        doc = explainer(ctx).explain(url.strip(), device)
    except UrlError as e:
        raise bad_request(f"Not a valid absolute URL: {e}", reason=e.reason) from None
    return answer(await explain_live(request, ctx, doc))
