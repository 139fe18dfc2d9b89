"""``GET bots``: the cluster's view of bot traffic by class: the policies in force, the URLs bots
asked for that had no cached page (per class, most asked first), and the verifier's state.

Each ingress replica keeps its own bounded tallies (``replica_report``); this route asks every
replica of every node (``IngressReplica.bots_report``, within ``management.peerTimeoutMs``) and merges
them (``prerender_ray.admin.fanout.merge_missed``): a URL's counts add up over the replicas that
answered, and ``replicas`` names each one with its error when it did not. (It once showed the one
replica that answered the request as if it were the node: half the misses were missing.) Metrics carry
the node-wide counts too: ``prerender_bot_class_serves_total``, ``prerender_bot_page_age_seconds``,
``prerender_bot_verifications_total``, ``prerender_bot_markdown_served_total``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray.admin.fanout import merge_missed, sum_documents
from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import (
    admin_router,
    answer,
    ctx_of,
    heavy,
    member_names,
    peer_timeout_s,
    query_int,
)
from prerender_ray.api.auth import require
from prerender_ray.api.bot.replica import opened
from prerender_ray.api.context import NodeContext
from prerender_ray.serving.bots import BOT_CLASSES

router = admin_router()
MAX_LIMIT = 1_000  # rows per class, asked of each replica and answered


def replica_report(ctx: NodeContext) -> dict:
    """This replica's tallies: its missed URLs (the ``MAX_LIMIT`` most asked per class), how many it
    evicted, and its verifier's counts."""
    state = opened(ctx)
    if state is None:
        return {"available": False}
    services = state.services
    return {"available": True, "missed": services.misses.top(MAX_LIMIT), "evicted": services.misses.evicted,
            "verification": services.verifier.snapshot() if services.verifier is not None else None,
            "classes": services.class_stats.snapshot()}


async def _reports(ctx: NodeContext) -> dict[str, tuple[bool, Any]]:
    """``node/replica`` -> (True, its report) or (False, why not), every replica asked at once."""
    import ray

    deadline = peer_timeout_s(ctx)

    async def one(node: str, index: int) -> tuple[bool, Any]:
        if node == ctx.node.name and index == ctx.replica:
            return True, replica_report(ctx)
        try:
            return True, await (await ctx.ingress_at(node, index)).within(deadline).bots_report()
        except ValueError:  # not placed (yet), or the node is gone
            return False, f"no ingress replica {index} on {node}"
        except TimeoutError:
            return False, f"no answer within {deadline * 1000:g} ms"
        except Exception as e:  # a dead actor, a lost node: reported, the view goes on
            return False, f"{type(e).__name__}: {str(e)[:200]}"

    if not ctx.has_lookup and not ray.is_initialized():  # no Ray and no harness: a lookup would start Ray
        asked = [(ctx.node.name, ctx.replica)]
    else:
        asked = [(n, i) for n in member_names(ctx) for i in range(ctx.cfg.server.replicas)]
        if ctx.replica not in range(ctx.cfg.server.replicas):  # a replica outside the count (tests)
            asked.append((ctx.node.name, ctx.replica))
    found = await asyncio.gather(*(one(n, i) for n, i in asked))
    return {f"{n}/{i}": got for (n, i), got in zip(asked, found)}


def _verification(reports: list[dict]) -> dict:
    snaps = [r["verification"] for r in reports if r.get("verification")]
    if not snaps:
        return {}
    merged = sum_documents([{k: v for k, v in s.items() if k != "rangeSets"} for s in snaps])
    merged["rangeSets"] = snaps[0].get("rangeSets")  # the same ranges on every replica, not counts
    return merged


@router.get("/bots")
async def bots(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    ctx = ctx_of(request)
    limit = query_int(request, "limit", default=50, minimum=1, maximum=MAX_LIMIT)
    cfg = ctx.cfg.bots
    async with heavy(ctx).slot():
        found = await _reports(ctx)
    reports = [doc for ok, doc in found.values() if ok and isinstance(doc, dict) and doc.get("available")]
    body: dict = {
        "node": ctx.node.name, "scope": "cluster",
        "replicas": {name: None if ok and isinstance(doc, dict) and doc.get("available")
                     else (doc if not ok else "bot path not open") for name, (ok, doc) in found.items()},
        "answered": len(reports), "asked": len(found), "partial": len(reports) < len(found),
        "policies": {
            "default": cfg.default.model_dump(),
            "classes": {c: (cfg.classes.get(c) or cfg.default).model_dump() for c in BOT_CLASSES},  # type: ignore[call-overload]
            "named": {name: p.model_dump() for name, p in cfg.named.items()},
            "denyStatus": cfg.deny_status, "failedClass": cfg.failed_class,
        },
        "verification": {"enabled": cfg.verify.enabled, **_verification(reports)},
        "available": bool(reports),
        "missed": merge_missed([r.get("missed") or {} for r in reports], limit),
        "missedEvicted": sum(r.get("evicted") or 0 for r in reports),
        # per class: serves by verification state and method, verification outcomes by method and
        # reason, Markdown answers, misses (class_stats.py), added up over the replicas
        "classes": sum_documents([r["classes"] for r in reports if isinstance(r.get("classes"), dict)]),
        "signatureAgents": len(cfg.web_bot_auth.agents),
    }
    return answer(body)
