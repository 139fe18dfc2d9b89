"""``GET overview``: "how far behind is the queue, and on which node?" in one document.

- Nodes: every member and every node that left a status row, with its replicated queue status and
  pause override (the ``q:`` and ``c:`` rows), what its keeper says right now (asked within
  ``management.peerTimeoutMs``) and whether the replicated status can be trusted (``stale``): a node
  that did not answer, is no longer a member, or whose live status differs from its row.
- Backlog: due now, in flight, unclaimed, and a 24 h histogram of due times (hour by hour ahead),
  summed over the nodes that answered (``partial`` says when one did not).
- Table counts (targets, pages): exact, kept by the node's store with every write, asked at most
  every ``COUNTS_FRESH_MS`` per replica (``countsAsOf`` says when).
- Leases in flight, and each node's last reconcile.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.admin.fanout import sum_documents
from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import admin_router, answer, ctx_of, fan_out, heavy
from prerender_ray.api.admin.queue import CLUSTER, registry_rows
from prerender_ray.api.auth import require
from prerender_ray.api.context import NodeContext
from prerender_ray.queue.status import resolve_desired_pause
from prerender_ray.storage.keys import QUEUE_CONTROL, QUEUE_STATUS
from prerender_ray.timeutil import now_ms

router = admin_router()
COUNTS_WAIT_S = 2.0  # an overview waits this long for a fresh count, then shows the previous one
COUNTS_FRESH_MS = 2_000  # the store answers counts in O(1): a count is at most this old
COUNTS_DEADLINE_S = 120.0


class CountsSnapshot:
    """Table counts, refreshed in the background at most once per interval (per replica)."""

    def __init__(self, interval_ms: int):
        self.interval_s = (interval_ms or 900_000) / 1000
        self.value: dict | None = None
        self.as_of: int | None = None
        self.error: str | None = None
        self.task: asyncio.Task | None = None
        self._taken = 0.0

    async def get(self, ctx: NodeContext) -> None:
        stale = self.value is None or time.monotonic() - self._taken > self.interval_s
        if stale and (self.task is None or self.task.done()):
            self._taken = time.monotonic()
            self.task = asyncio.get_running_loop().create_task(self._count(ctx))
        if self.task is not None and not self.task.done():
            await asyncio.wait({self.task}, timeout=COUNTS_WAIT_S)

    async def _count(self, ctx: NodeContext) -> None:
        try:
            self.value = await ctx.store.within(COUNTS_DEADLINE_S).counts()
            self.as_of, self.error = now_ms(), None
        except Exception as e:
            self.error = f"{type(e).__name__}: {str(e)[:200]}"

    def report(self) -> dict:
        return {"counts": self.value, "countsAsOf": self.as_of, "countsError": self.error,
                "countsPending": self.task is not None and not self.task.done()}


def counts_of(ctx: NodeContext) -> CountsSnapshot:
    snap = ctx.counts
    if snap is None:
        snap = ctx.counts = CountsSnapshot(COUNTS_FRESH_MS)
    return snap


def _control(row: dict | None) -> dict | None:
    return {k: row.get(k) for k in ("paused", "updatedBy", "updatedTime")} if row else None


def _node_entry(ctx: NodeContext, name: str, now: int, status_row: dict | None, control: dict,
                state: tuple[bool, tuple[int, dict] | str] | None,
                repair: tuple[bool, dict | str] | None) -> dict:
    info = ctx.peers.get(name)
    override = control.get(name)
    entry = {"name": name, "url": info.url if info else (status_row or {}).get("url"),
             "isThisNode": name == ctx.node.name, "member": info is not None,
             "status": (status_row or {}).get("status"),
             "statusChangedTime": (status_row or {}).get("updatedTime"),
             "override": _control(override)}
    changed = entry["statusChangedTime"]
    entry["statusAgeMs"] = now - changed if isinstance(changed, int) else None
    intent = resolve_desired_pause(override, control.get(CLUSTER))
    entry["intent"] = {"paused": intent.paused, "source": intent.source}
    live = None
    if state is not None and not isinstance(state[1], str):
        code, doc = state[1]
        now_part, trust = doc.get("now") or {}, doc.get("trust") or {}
        live = {"phase": trust.get("phase"), "status": now_part.get("status"),
                "paused": now_part.get("paused"), "exact": trust.get("exact")}
        if code == 200:
            leases = doc.get("leases") or {}
            live.update({k: now_part.get(k) for k in ("held", "due", "inFlight", "unclaimed")})
            live.update({"oldestLease": leases.get("oldest"), "leaseCapacity": leases.get("capacity"),
                         "next24h": (doc.get("coming") or {}).get("next24h")})
    entry["live"] = live
    entry["answered"] = live is not None
    entry["error"] = None if state is None or state[0] else state[1]
    if not entry["member"]:
        entry["stale"], entry["staleReason"] = True, "not a member of the cluster now (its row is left over)"
    elif live is None:
        entry["stale"], entry["staleReason"] = True, f"did not answer: {entry['error']}"
    elif entry["status"] != live["status"]:
        entry["stale"], entry["staleReason"] = True, "the replicated status differs from the live one"
    else:
        entry["stale"], entry["staleReason"] = False, None
    entry["reconcile"] = repair[1] if repair is not None and repair[0] else None
    return entry


@router.get("/overview")
async def overview(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    ctx = ctx_of(request)
    async with heavy(ctx).slot():
        statuses, controls = await asyncio.gather(registry_rows(ctx, QUEUE_STATUS),
                                                  registry_rows(ctx, QUEUE_CONTROL))
        states, repairs = await asyncio.gather(fan_out(ctx, ctx.keeper_at, KeeperClient.queue_state),
                                               fan_out(ctx, ctx.keeper_at, KeeperClient.reconcile_status))
        snap = counts_of(ctx)
        if ctx.cfg.management.snapshot_table_counts:
            await snap.get(ctx)
    now = now_ms()
    names = sorted(set(states) | set(statuses))
    nodes = [_node_entry(ctx, n, now, statuses.get(n), controls, states.get(n), repairs.get(n))
             for n in names]
    live_docs = [got[1] for _, got in states.values() if not isinstance(got, str) and got[0] == 200]
    summed = sum_documents([{"now": d.get("now"), "coming": d.get("coming")} for d in live_docs])
    now_part, coming = summed.get("now", {}), summed.get("coming", {})
    unanswered = sorted(n for n, (_, got) in states.items() if isinstance(got, str) or got[0] != 200)
    cluster = controls.get(CLUSTER)
    cfg = ctx.cfg
    body = {
        "generatedAt": now, "node": ctx.node.name, "replica": ctx.replica,
        "control": {"cluster": _control(cluster),
                    "knownScopes": sorted({CLUSTER, *names, *controls})},
        "nodes": nodes,
        "backlog": {"due": now_part.get("due"), "dueSitemap": now_part.get("dueSitemap"),
                    "dueDiscovered": now_part.get("dueDiscovered"), "inFlight": now_part.get("inFlight"),
                    "unclaimed": now_part.get("unclaimed"), "held": now_part.get("held"),
                    "next15m": coming.get("next15m"), "next60m": coming.get("next60m"),
                    "next24h": coming.get("next24h"),
                    "histogram": {"binMs": 3_600_000, "fromMs": now, "bins": coming.get("byHour") or [],
                                  "overdue": now_part.get("due")},
                    "nodesCounted": len(live_docs), "partial": bool(unanswered), "unanswered": unanswered},
        "leases": {"inFlight": sum((d.get("leases") or {}).get("inFlight") or 0 for d in live_docs),
                   "capacity": sum((d.get("leases") or {}).get("capacity") or 0 for d in live_docs)},
        **(snap.report() if cfg.management.snapshot_table_counts else
           {"counts": None, "countsAsOf": None, "countsError": "management.snapshotTableCounts is off"}),
        "intervals": {"statusSyncInterval": cfg.queue.status_sync_interval,
                      "jobLeaseTime": cfg.queue.job_lease_time,
                      "defaultRenderInterval": cfg.render.default_interval,
                      "peerTimeoutMs": cfg.management.peer_timeout_ms,
                      "countsInterval": COUNTS_FRESH_MS},
        "reconcile": {n["name"]: n["reconcile"] for n in nodes if n["reconcile"] is not None},
    }
    return answer(body)
