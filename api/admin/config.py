"""The config as it runs: ``config`` (effective config, redacted, the risky-config findings, the live
overrides) and ``config-override`` (change the live options on every node, without a restart).

Overrides are one replicated registry row (``prerender_ray.config.overrides``): written here on this node,
shipped to every peer, and applied by every ingress replica and sitemap walker within
``OVERRIDES_POLL_S`` and by every keeper at once when the nudge reaches it (at the latest at its next
status sync, ``queue.statusSyncInterval``); this node's replica and keeper apply it before answering.
"""

from __future__ import annotations

import asyncio

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import DEADLINE_S, admin_router, answer, ctx_of, log
from prerender_ray.api.admin.queue import nudge_other_keepers
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, check_keys, read_object
from prerender_ray.api.bot.replica import apply_overrides
from prerender_ray.config.loading import redact
from prerender_ray.config.overrides import (
    LIVE_PATHS,
    OVERRIDES_POLL_S,
    OverrideError,
    Overrides,
    camel_path,
    plan,
)
from prerender_ray.storage.keys import OVERRIDES_KEY
from prerender_ray.timeutil import now_ms

router = admin_router()
MAX_BODY = 256 * 1024  # a long route list fits
NUDGE_DEADLINE_S = 5.0


@router.get("/config")
async def config(request: Request, who: Principal = Depends(require("viewer"))) -> JSONResponse:
    """The effective config (secrets only as set/unset, password hashes never shown), the risky
    settings found at start-up, and the live overrides in force on this replica."""
    ctx = ctx_of(request)
    data = redact(ctx.cfg)
    compiled = ctx.rules.router.compiled
    live = ctx.state.live
    try:
        rows = Overrides.decode(live.raw).rows()
    except OverrideError:
        rows = []
    return answer({"node": ctx.node.name, "config": data,
                   "warnings": [{"severity": f.severity, "key": f.key, "message": f.message}
                                for f in ctx.findings],
                   "routes": {"compiled": [r.as_dict() for r in compiled.routes],
                              "warnings": list(compiled.warnings), "dropped": compiled.dropped},
                   "overrides": {"enabled": ctx.cfg.management.overrides.enabled,
                                 "livePaths": [camel_path(p) for p in LIVE_PATHS], "rows": rows,
                                 "error": live.error,
                                 "keeperSyncMs": ctx.cfg.queue.status_sync_interval,
                                 "pollMs": OVERRIDES_POLL_S * 1000}})


@router.post("/config-override")
async def config_override(request: Request, who: Principal = Depends(require("admin"))) -> JSONResponse:
    """``{set?: [{path, value, note?}], clear?: [path], dryRun?}``: all or nothing. 400 with
    ``invalid`` when any entry is wrong (an unknown or restart-only option, a value that does not
    validate, a route that would be dropped); 409 when overrides are disabled."""
    ctx = ctx_of(request)
    if not ctx.cfg.management.overrides.enabled:
        return answer({"error": "live overrides are disabled (management.overrides.enabled: false)",
                       "applied": False}, 409)
    body = await read_object(request, MAX_BODY, keys={"set", "clear", "dryRun"})
    for entry in body.get("set") or ():
        if isinstance(entry, dict):  # the rest of an entry's shape is plan()'s to judge
            check_keys(entry, ("path", "value", "note"), "a set entry")
    dry_run = body.get("dryRun", False)
    if type(dry_run) is not bool:
        raise bad_request("dryRun must be true or false")
    live = ctx.state.live
    (raw,) = await ctx.store.within(DEADLINE_S).get([OVERRIDES_KEY])
    try:
        current = Overrides.decode(raw)
    except OverrideError as e:  # replaced by this write
        log.warning("config overrides row unreadable; a write replaces it", error=str(e))
        current = Overrides()
    try:
        result = plan(live.base, current, body.get("set"), body.get("clear"), by=who.name or "admin", now=now_ms())
    except OverrideError as e:
        raise bad_request(str(e)) from None
    out = {"node": ctx.node.name, "dryRun": dry_run, **result.body(),
           "appliesRemotelyWithinMs": max(ctx.cfg.queue.status_sync_interval, OVERRIDES_POLL_S * 1000)}
    if result.invalid:
        return answer({"error": "Nothing was written: some entries are invalid", **out, "applied": False}, 400)
    if dry_run:
        return answer({**out, "applied": False})
    new = result.overrides
    stored = new.encode() if new.values else None  # nothing left: a tombstone, replicated like a write
    await ctx.store.within(DEADLINE_S).apply([(OVERRIDES_KEY, stored)])
    log.warning("config overrides written", by=who.name, changes=[c["path"] for c in result.changes],
                overrides=sorted(camel_path(p) for p in new.values))
    # This replica and this node's keeper apply it now; the rest within one status sync.
    apply_overrides(ctx, stored)
    try:
        await ctx.keeper.within(NUDGE_DEADLINE_S).sync_status()
        keeper = "applied"
    except Exception as e:  # it reads the row at its next status sync anyway
        keeper = f"pending ({type(e).__name__})"
    asyncio.get_running_loop().create_task(nudge_other_keepers(ctx))
    return answer({**out, "applied": True, "keeper": keeper})
