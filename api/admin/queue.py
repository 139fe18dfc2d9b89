"""The queue across the cluster: ``queue-state`` (this node, or ``?scope=cluster`` summed over every
node), the ``schedule`` leaf, pause intent (``queue``), ``revalidate`` and ``reconcile``.

Cluster views ask every node's keeper directly (Ray actor calls, each within
``management.peerTimeoutMs``); a node that does not answer is named, never silently left out.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray import logs
from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.admin.fanout import sum_documents
from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import (
    DEADLINE_S,
    admin_router,
    answer,
    ctx_of,
    fan_out,
    heavy,
    member_names,
    parse_key,
    peer_timeout_s,
)
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, read_object
from prerender_ray.api.context import NodeContext
from prerender_ray.identity.urls import UrlError
from prerender_ray.queue.status import MISSING, PauseRequestError, validate_admin_pause
from prerender_ray.storage.keys import QUEUE_CONTROL, QUEUE_STATUS
from prerender_ray.storage.registry import RecordError, decode_json
from prerender_ray.timeutil import now_ms

router = admin_router()
log = logs.get("admin")
CLUSTER = "all"
NUDGE_AFTER_S = 1.0  # a cluster pause reaches the other keepers' stores by replication first
OWNER_NOTE = ("reconcile restores missing schedule rows only for targets THIS node owns; run it on each "
              "node to repair the whole cluster")


async def registry_rows(ctx: NodeContext, prefix: bytes, limit: int = 1000) -> dict[str, dict]:
    """Replicated rows under ``prefix`` (one per node or scope, so a single page), name -> row."""
    out = {}
    for k, v in await ctx.store.within(DEADLINE_S).scan(prefix, None, limit):
        try:
            out[k[len(prefix):].decode()] = decode_json(v)
        except (RecordError, UnicodeDecodeError):
            continue
    return out


# ------------------------------------------------------------------------------------ queue-state


@router.get("/queue-state")
async def queue_state(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """This node's queue document (503 with the reason while the keeper cannot vouch for it), or with
    ``?scope=cluster`` every node's, summed, with the nodes that did not answer named."""
    ctx = ctx_of(request)
    scope = request.query_params.get("scope") or "node"
    if scope not in ("node", "cluster"):
        raise bad_request(f"Unknown scope {scope!r}: use node (default) or cluster",
                          knownScopes=["node", "cluster"])
    if scope == "node":
        try:
            status, doc = await ctx.keeper.within(DEADLINE_S).queue_state()
        except Exception as e:
            return answer({"error": "the keeper did not answer", "reason": type(e).__name__,
                           "node": ctx.node.name}, 503)
        return answer(doc, status)
    async with heavy(ctx).slot():
        found = await fan_out(ctx, ctx.keeper_at, KeeperClient.queue_state)
    return answer(*cluster_state(ctx, found))


def cluster_state(ctx: NodeContext, found: dict[str, tuple[bool, tuple[int, dict] | str]]) -> tuple[dict, int]:
    nodes: dict[str, dict] = {}
    live: list[dict] = []
    for name, (_, got) in found.items():
        if isinstance(got, str):  # the reason it did not answer
            nodes[name] = {"answered": False, "error": got}
            continue
        status, doc = got
        trust = doc.get("trust") or {}
        nodes[name] = {"answered": True, "httpStatus": status, "phase": trust.get("phase"),
                       "exact": trust.get("exact"), "status": (doc.get("now") or {}).get("status"),
                       "error": doc.get("error") if status != 200 else None}
        if status == 200:
            live.append(doc)
    counted = [n for n, v in nodes.items() if v.get("httpStatus") == 200]
    sections = ("now", "coming", "lateness", "dueHistogram", "flow")
    summed = sum_documents([{k: d.get(k) for k in sections} for d in live])
    summed.get("now", {}).pop("status", None)
    doc = {"scope": "cluster", "node": ctx.node.name, "generatedAt": now_ms(), "nodes": nodes,
           "counted": counted, "complete": len(counted) == len(nodes),
           "unanswered": sorted(n for n, v in nodes.items() if not v["answered"]),
           "notLive": sorted(n for n, v in nodes.items() if v["answered"] and v["httpStatus"] != 200),
           "peerTimeoutMs": ctx.cfg.management.peer_timeout_ms, **summed,
           "leases": {"inFlight": sum(d.get("leases", {}).get("inFlight") or 0 for d in live)},
           "trust": {"exact": bool(live) and all(d.get("trust", {}).get("exact") for d in live)
                     and len(counted) == len(nodes)},
           "discovery": _discovery(live)}
    if not live:
        doc["error"] = "no node could vouch for its queue state"
        return doc, 503
    return doc, 200


def _discovery(live: list[dict]) -> dict:
    """Each node's ``discovery`` budget summed: the unrendered discovered targets it counts, and the
    sites whose share is spent, with the nodes where it is (each owner counts its slice)."""
    spent: dict[str, list[str | None]] = {}
    for d in live:
        for site in (d.get("discovery") or {}).get("spent") or []:
            spent.setdefault(site, []).append(d.get("node"))
    return {"unrendered": sum((d.get("discovery") or {}).get("unrendered") or 0 for d in live), "spent": spent}


# ---------------------------------------------------------------------------------------- schedule


def key_from(ctx: NodeContext, body: dict) -> str:
    if body.get("cacheKey") is not None:
        return parse_key(ctx, body.get("cacheKey"))
    url = body.get("url")
    if url is None:
        raise bad_request("cacheKey is required")
    canonical = canonical_url(ctx, url)
    device = body.get("deviceType") or ctx.rules.supported[0]
    if not isinstance(device, str) or device.lower() not in ctx.rules.supported:
        raise bad_request(f"deviceType must be one of {list(ctx.rules.supported)}")
    return ctx.rules.keys.key(canonical, device.lower())


def canonical_url(ctx: NodeContext, url: object) -> str:
    if not isinstance(url, str) or not url.strip():
        raise bad_request("url is required")
    try:
        return ctx.rules.canonical(url.strip())
    except UrlError as e:
        raise bad_request(f"Not a valid absolute URL: {e}", reason=e.reason) from None


@router.post("/schedule")
async def schedule(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """This node's schedule row for ``{cacheKey}`` or ``{url, deviceType}``: the leaf the explainer
    proxies to. It never proxies onward (null is an authoritative "no row" only from the owner)."""
    ctx = ctx_of(request)
    key = key_from(ctx, await read_object(request, 64 * 1024, keys={"cacheKey", "url", "deviceType"}))
    try:
        return answer(await ctx.keeper.within(3.0).schedule_row(key))
    except Exception:
        return answer({"error": "local schedule read timed out", "node": ctx.node.name}, 504)


# ------------------------------------------------------------------------------------ pause intent


async def known_scopes(ctx: NodeContext) -> list[str]:
    statuses = await registry_rows(ctx, QUEUE_STATUS)
    controls = await registry_rows(ctx, QUEUE_CONTROL)
    return sorted({CLUSTER, *statuses, *controls, *member_names(ctx)})


@router.post("/queue")
async def queue(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """``{scope?, paused}``: pause intent for ``all`` or one node (default: this node). ``paused`` is
    true (pause), false (run, even under a cluster pause) or null (a node inherits ``all`` again)."""
    ctx = ctx_of(request)
    body = await read_object(request, 16 * 1024, keys={"scope", "paused"})
    scope = body.get("scope")
    if scope is not None and (not isinstance(scope, str) or not scope):
        raise bad_request('scope must be a node name or "all"')
    if "paused" in body and body["paused"] is not None and type(body["paused"]) is not bool:
        raise bad_request("paused must be true (pause), false (force run), or null (inherit)")
    try:
        known = await known_scopes(ctx)
    except Exception as e:
        return answer({"error": "the registry did not answer; nothing was changed",
                       "reason": type(e).__name__}, 503)
    try:
        write = validate_admin_pause(scope, body.get("paused", MISSING), node_scope=ctx.node.name,
                                     known_scopes=known)
    except PauseRequestError as e:
        extra: dict[str, Any] = {"knownScopes": e.known_scopes} if e.known_scopes else {}
        raise bad_request(str(e), **extra) from None
    by = who.name
    applied_on, result = ctx.node.name, None
    if write.scope not in (CLUSTER, ctx.node.name) and write.scope in ctx.peers:
        # The node's own keeper writes its intent and applies it at once.
        try:
            keeper = await ctx.keeper_at(write.scope)
            result = await keeper.within(peer_timeout_s(ctx)).set_pause(write.scope, write.paused, by, "admin")
            applied_on = write.scope
        except Exception as e:
            log.warning("pause: the node's keeper did not answer; writing the intent here", node=write.scope,
                        error=type(e).__name__)
            ctx.forget_remote()
    if result is None:
        result = await ctx.keeper.within(DEADLINE_S).set_pause(write.scope, write.paused, by, "admin")
    if write.scope == CLUSTER:
        asyncio.get_running_loop().create_task(nudge_other_keepers(ctx))
    log.warning("queue pause intent", scope=write.scope, paused=write.paused, by=by)
    return answer({**result, "appliedOn": applied_on, "updatedBy": by})


async def nudge_other_keepers(ctx: NodeContext) -> None:
    """Best effort: after replication had a moment, ask the other keepers to re-resolve now rather
    than at their next status sync (which is the guarantee: ``appliesRemotelyWithinMs``). Pause
    intent and live config overrides both ride on that sync."""
    await asyncio.sleep(NUDGE_AFTER_S)
    others = [n for n in member_names(ctx) if n != ctx.node.name]
    for name in others:
        try:
            await (await ctx.keeper_at(name)).within(peer_timeout_s(ctx)).sync_status()
        except Exception as e:
            log.info("pause nudge not delivered", node=name, error=type(e).__name__)


# ------------------------------------------------------------------------------- revalidate, repair


@router.post("/revalidate")
async def revalidate(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """``{url, deviceType?}``: that device's key (every scheduled device without ``deviceType``) due
    now on the owning node. 409 without a target: it would render once and be dropped."""
    ctx = ctx_of(request)
    body = await read_object(request, 64 * 1024, keys={"url", "deviceType"})
    url = canonical_url(ctx, body.get("url"))
    device = body.get("deviceType")
    if device is not None:
        if not isinstance(device, str) or device.lower() not in ctx.rules.supported:
            raise bad_request(f"deviceType must be one of {list(ctx.rules.supported)}")
        keys = [ctx.rules.keys.key(url, device.lower())]
    else:
        keys = ctx.rules.keys_of(url)
    keeper = await ctx.keeper_of(url)
    owner = ctx.owner_of(url)
    try:
        done = [await keeper.within(DEADLINE_S).revalidate_key(k) for k in keys]
    except Exception as e:
        return answer({"error": f"the owner {owner} did not answer; nothing may have changed",
                       "reason": type(e).__name__, "scheduleOwnedBy": owner}, 504)
    found = [d for d in done if d is not None]
    if len(found) < len(done):
        return answer({"error": "No target for this URL: a render would happen once and be dropped; add it "
                       "as a target (PUT /render_targets) or through a sitemap first", "canonicalUrl": url,
                       "cacheKeys": keys}, 409)
    log.info("admin revalidate", url=url, keys=len(keys), by=who.name)
    return answer({"canonicalUrl": url, "cacheKeys": keys, "cacheKey": keys[0],
                   "nextRenderTime": found[0]["nextRenderTime"], "scheduleOwnedBy": owner,
                   "wokeLocalConsumers": any(d.get("wokeLocalConsumers") for d in found),
                   "node": ctx.node.name})


@router.post("/reconcile")
async def reconcile(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """Start a schedule-repair pass on this node (owner-only, scan then write, capped, jittered)."""
    ctx = ctx_of(request)
    await read_object(request, 1024, keys=(), allow_empty=True)
    got = await ctx.keeper.within(DEADLINE_S).start_reconcile()
    body = {"node": ctx.node.name, "ownerScopeNote": OWNER_NOTE, **got}
    if not got["started"] and not got["alreadyRunning"]:
        return answer({**body, "error": got.get("reason")}, 503)
    log.warning("admin reconcile", node=ctx.node.name, by=who.name, started=got["started"])
    return answer(body, 202 if got["started"] else 200)
