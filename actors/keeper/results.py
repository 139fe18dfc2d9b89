"""The keeper's result apply: one posted render result, at most once per grant.

The plan (what the result does to targets, pages and schedule rows) is pure
(``prerender_ray.queue.results``); this part checks the grant, reads the rows the plan needs, writes
what it says (rows of keys another node owns go to that node's keeper) and releases the lease.
"""

from __future__ import annotations

from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.keeper.claims import Claims
from prerender_ray.actors.keeper.rows import CurrentConfig, Rows
from prerender_ray.actors.keeper.targets import Targets
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue import diagnostics
from prerender_ray.queue.results import Plan, Result, resolve_outcome
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.rpc import KeeperApi, LeaseApi, Peers, StoreApi
from prerender_ray.storage import history
from prerender_ray.storage.registry import Target, target_key
from prerender_ray.storage.touches import touch_key
from prerender_ray.timeutil import now_ms

RELEASE_GRACE_MS = 5_000  # a released key is not offered again at once (the lease table's grace)


class Results:
    def __init__(self, rows: Rows, claims: Claims, targets: Targets, conf: CurrentConfig, leases: LeaseApi,
                 store: StoreApi, peers: Peers, ownership: Ownership, node: str, log: Any):
        self.rows = rows
        self.claims = claims
        self.targets = targets
        self.conf = conf
        self.leases = leases
        self.store = store
        self.peers = peers
        self.ownership = ownership
        self.node = node
        self.log = log

    async def _keeper_of(self, url: str) -> KeeperApi | None:
        owner = self.ownership.owner(url)
        return None if owner == self.node else await self.peers.of(owner)

    async def process(self, meta: dict, content: bytes | None, forwarded: bool = False,
                      worker: str | None = None) -> dict:
        """Apply one render result, at most once per grant. Raises on failure: the lease is then held
        (released last) and the grant stays open for the fleet's retry.

        The lease table checks and marks the key's latest grant first: a second result for an answered
        grant (a replay, or a retry after a lost 204) and a result from another worker than the
        latest grant's (the key was re-granted: the late result of a previous holder) are acknowledged
        and change nothing, neither the new lease nor the schedule, strikes or page."""
        r = Result.parse(meta, content)
        now = now_ms()
        rules, planner = self.conf.rules, self.conf.planner
        url = rules.url_of(r.id)
        owner = None if forwarded else await self._keeper_of(url)
        if owner is not None:  # the sender's membership view lagged ours: the owner decides (one hop)
            return await owner.process_result(meta, content, True, worker)
        verdict, granted_at = await self.leases.begin_result(r.id, worker)
        if verdict == "unknown":
            return {"refused": f"no lease was granted for {r.id!r}"}
        if verdict != "apply":
            metrics.results_ignored.labels(verdict).inc()
            self.log.info("render result ignored", key=r.id, why=verdict, worker=worker)
            return {"ignored": verdict}
        try:
            dest = planner.destination(r)
            urls = [url] + ([rules.url_of(dest)] if dest else [])
            found = [Target.decode(u, b) if b else None for u, b in zip(urls, await self.store.get_targets(urls))]
            stored = metas = None
            if r.content:  # the stored pages: an identical render keeps its validators, touches its times
                keys = [r.id] + ([dest] if dest else [])
                metas = dict(zip(keys, await self.store.page_metas(keys)))
                stored = {k: m.headers if m is not None else None for k, m in metas.items()}
            plan = planner.plan(r, found[0], found[1] if dest else None, now, granted_at=granted_at,
                                stored=stored, stored_pages=metas)
            await self.apply(plan, self._history(r, plan, meta, worker, now))
        except BaseException:
            try:
                await self.leases.abandon(r.id, granted_at)
            except Exception as e:
                self.log.warning("could not reopen the grant of a failed result", key=r.id, error=repr(e))
            raise
        await self.leases.release(r.id, not plan.release, granted_at)
        if plan.release:
            self.claims.note_released(r.id, now + RELEASE_GRACE_MS)
        if not self.claims.diagnose.answered(r.id) and self.claims.diagnose.waiting(r.id, now):
            # asked while this render was in flight: its reschedule must not push the diagnosis back
            try:
                await self.targets.render_now(r.id)
            except Exception as e:
                self.log.warning("diagnostics render not made due", key=r.id, error=repr(e)[:300])
        metrics.render_outcomes.labels(plan.outcome, plan.detail).inc()
        if plan.content_change is not None:
            metrics.render_content.labels(plan.route, plan.content_change).inc()
        if plan.guard is not None:
            metrics.render_guard.labels(plan.route, plan.guard.why, plan.guard.action).inc()
        if r.render_time is not None:
            sc = f"{r.status_code // 100}xx" if r.status_code else "none"
            metrics.render_seconds.labels(sc).observe(r.render_time / 1000)
        self.rows.flow("results", 1)
        self.log.info("render result", key=r.id, outcome=plan.outcome, detail=plan.detail,
                      status=r.status_code, error=(r.error or {}).get("name"))
        return {"outcome": plan.outcome, "detail": plan.detail}

    def _history(self, r: Result, plan: Plan, meta: dict, worker: str | None, now: int) -> list:
        """The render-history item of this result (and its diagnostics report when it carries one):
        ``[cache key, entry, report]``. The new fields are dropped, never raised, when malformed."""
        try:
            summary, problems = diagnostics.parse_summary(meta.get("renderSummary"))
            report, more = diagnostics.parse_report(meta.get("diagnostics"))
            problems += more
            if problems:
                metrics.diagnostics_dropped.inc()
                self.log.warning("render diagnostics dropped in part", key=r.id, problems=problems[:10],
                                 worker=worker)
            entry = history.entry(now, render_ms=r.render_time, outcome=resolve_outcome(r, r.is_indexable),
                                  verdict=f"{plan.outcome}/{plan.detail}" if plan.detail else plan.outcome,
                                  reason=r.reason, status_code=r.status_code, summary=summary, worker=worker)
            record = None
            if report is not None:
                heading = {k: entry.get(k) for k in ("at", "renderMs", "outcome", "statusCode", "worker")}
                record = history.encode({**heading, **report})
            return [plan.refile_key or r.id, history.encode(entry), record]
        except Exception as e:  # diagnostics never cost a result
            self.log.error("render history not kept", key=r.id, error=repr(e)[:300])
            return []

    async def apply(self, plan: Plan, record: list | None = None) -> None:
        """Write what ``plan`` says: registry, pages and the render history (``record``, see
        ``_history``) in one store call, rows through the funnel here or at their owner, then the
        follow-ups (a redirect's destination adopted or suppressed). A deleted target's keys lose their
        history, the result's own record included."""
        rules = self.conf.rules
        registry: list = []
        pages: list = []
        forgotten: list[str] = []
        local_rows: list[ScheduleRow] = []
        local_deletes: list[str] = []
        foreign: dict[str, tuple[list, list]] = {}

        def route_row(key: str, row: ScheduleRow | None) -> None:
            owner = self.ownership.owner(rules.url_of(key))  # the one key parser, any layout
            if owner == self.node:
                (local_rows.append(row) if row else local_deletes.append(key))
            else:
                rows, deletes = foreign.setdefault(owner, ([], []))
                (rows.append(row) if row else deletes.append(key))

        kept = {p.cache_key for p in plan.status_pages}  # a retired target's tombstones stay
        for url, target in plan.targets.items():
            if target is None:
                registry.append((target_key(url), None))
                for key in rules.all_keys(url):
                    if key not in kept:
                        pages.append((key.encode(), None))
                    route_row(key, None)
                    forgotten.append(key)
            else:
                registry.append((target_key(url), target.encode()))
        if plan.page is not None:
            pages.append((plan.page.cache_key.encode(), plan.page.encode()))
        if plan.touch is not None:  # the page stays as stored (and replicated); only its times move
            pages.append((touch_key(plan.touch.cache_key), plan.touch.encode()))
        pages += [(k.encode(), None) for k in plan.page_deletes]
        pages += [(p.cache_key.encode(), p.encode()) for p in plan.status_pages]
        for row in plan.rows:
            route_row(row.cache_key, row)
        for key in plan.row_deletes:
            route_row(key, None)
        items = [[key, None, None] for key in forgotten]
        if record and record[0] not in forgotten:
            items.append(record)
        if registry or pages or items:
            await self.store.apply(registry, pages, items or None)
        self.rows.write(local_rows)
        self.rows.delete(local_deletes)
        for owner, (rows, deletes) in foreign.items():
            await (await self.peers.of(owner)).apply_rows(rows, deletes)
        if plan.adopt is not None:
            url, due, interval = plan.adopt
            item = {"url": url, "nextRenderTime": due, "renderInterval": interval}
            keeper = await self._keeper_of(url)
            await (self.targets.put_targets([item]) if keeper is None else keeper.put_targets([item]))
        if plan.suppress_dest is not None:
            url, reason, status = plan.suppress_dest
            keeper = await self._keeper_of(url)
            await (self.targets.suppress(url, reason, status) if keeper is None
                   else keeper.suppress(url, reason, status))
