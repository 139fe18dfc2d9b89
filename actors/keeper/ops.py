"""The keeper's calls: claims, results, target changes, queue status and control, queue state.

A mixin of ``QueueKeeper`` (keeper/actor.py holds its state, load, publish and verification); split only
to keep each module readable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.common import Handles, call
from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.batching import GroupCommit
from prerender_ray.config.overrides import OVERRIDES_KEY
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.flow import Flow
from prerender_ray.queue.results import Planner, Result
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.queue.status import derive_status, resolve_desired_pause
from prerender_ray.storage.pages import Page
from prerender_ray.storage.registry import (
    QUEUE_CONTROL,
    QUEUE_STATUS,
    Target,
    decode_json,
    encode_json,
    target_key,
)
from prerender_ray.timeutil import now_ms

FLOWS = ("added", "rescheduled", "removed", "granted", "results")
LEASE_DEADLINE_S = 5.0
STORE_DEADLINE_S = 10.0
CLUSTER_SCOPE = "all"


class KeeperOps:
    # ----------------------------------------------------------------------------------- set-up

    def init_ops(self) -> None:
        self._now = 0
        # Concurrent claims share one LeaseTable call (one actor hop, one RocksDB batch).
        self._grants: GroupCommit[list[tuple], list[tuple]] = GroupCommit(self._grant_batch)
        self.planner = Planner(self.rules)
        self.flows = Flow(FLOWS)
        self.ownership = Ownership([self.node])
        self.keepers = Handles("keeper")  # other nodes' keepers
        self.node_store = StoreClient(self.store, STORE_DEADLINE_S)
        self.status_changed_at = now_ms()
        self.mqtt = None
        m = self.cfg.fleet.mqtt
        if m.url:
            from prerender_ray.actors.fleet_mqtt import StatusBroadcaster

            self.mqtt = StatusBroadcaster(m, self.info.host, self.node, m.password or None, self.log)
            asyncio.get_running_loop().create_task(self._forget_old_host())

    async def _forget_old_host(self) -> None:
        """The status row names the host this node last announced; a different one is cleared."""
        for _ in range(30):  # the store may still be starting
            try:
                [raw] = await self.node_store.get([QUEUE_STATUS + self.node.encode()])
                break
            except Exception:
                await asyncio.sleep(1)
        else:
            return
        try:
            old = decode_json(raw).get("hostname") if raw else None
        except Exception:
            old = None
        if isinstance(old, str) and old != self.info.host and self.mqtt is not None:
            self.mqtt.forget(old)

    def close_ops(self) -> None:
        if self.mqtt is not None:
            self.mqtt.close()

    def flow(self, name: str, n: int) -> None:
        self.flows.add(name, n, now_ms())

    def _keeper_of(self, url: str) -> Any:
        owner = self.ownership.owner(url)
        return None if owner == self.node else self.keepers.get(owner)

    # --------------------------------------------------------------------------------- status

    def note_work(self) -> None:
        """Work arrived (render-now, revalidate, a due write): publish soon; the status follows what
        that publish finds grantable (announcing ``queued`` before it flapped back to ``empty`` when
        the work was not grantable yet)."""
        self._publish_soon()

    def _report(self, status: str, *, force: bool | None = None) -> None:
        if self.reporter.report(status, force=force):
            self._announce()

    def _announce(self) -> None:
        now = now_ms()
        self.status_changed_at = now
        status = self.reporter.status
        for s in ("unready", "empty", "queued", "paused"):
            metrics.queue_status.labels(s).set(1 if s == status else 0)
        self.log.info("queue status", status=status)
        if self.mqtt is not None:
            self.mqtt.publish(status, now)
        row = encode_json({"hostname": self.info.host, "node": self.node, "status": status, "updatedTime": now,
                           "url": self.info.url})
        asyncio.get_running_loop().create_task(self._write_status(row))

    async def _write_status(self, row: bytes) -> None:
        try:
            await self.node_store.apply([(QUEUE_STATUS + self.node.encode(), row)])
        except Exception as e:
            self.log.warning("queue status write failed", error=repr(e))

    async def refresh_status(self) -> None:
        self.derive_status()

    def derive_status(self) -> None:
        """After each publish: ``queued`` only while the published ready set holds grantable work
        (due, not leased, not held), so a fleet told ``queued`` gets jobs when it claims; due rows that
        are all in flight read ``empty`` until a lease ends (never empty mid-load)."""
        status = derive_status(paused=self.paused, serving=self.published_at is not None,
                               loading=self.phase != "live", due=len(self.ready))
        if self.reporter.sync(status):
            self._announce()

    async def sync_status(self) -> None:
        """Resolve the pause intent (this node's row, then the cluster's), then the status; apply
        changed live config overrides."""
        rows = await self.node_store.get([QUEUE_CONTROL + self.node.encode(), QUEUE_CONTROL + CLUSTER_SCOPE.encode(),
                                         OVERRIDES_KEY])
        try:  # live config rides on the same read; a failure must not stop pause intent
            self.apply_overrides(rows[2])
        except Exception as e:
            metrics.loop_errors.labels("keeper-overrides").inc()
            self.log.error("config overrides failed", error=repr(e)[:500])
        node_row, cluster_row = (decode_json(r) if r else None for r in rows[:2])
        intent = resolve_desired_pause(node_row, cluster_row)
        self.paused, self.pause_source = intent.paused, intent.source
        await self.refresh_status()

    async def _status_syncer(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.queue.status_sync_interval / 1000)
            try:
                await self.sync_status()
                metrics.queue_due.set(self.ranking.state(now_ms())["now"]["due"] if self.phase == "live" else 0)
            except Exception as e:
                metrics.loop_errors.labels("keeper-status").inc()
                self.log.error("status sync failed", error=repr(e))

    async def set_pause(self, scope: str, paused: bool | None, by: str) -> dict:
        """Write pause intent (None deletes it: a node inherits the cluster's), then re-resolve."""
        key = QUEUE_CONTROL + scope.encode()
        if paused is None:
            await self.node_store.apply([(key, None)])
        else:
            await self.node_store.apply([(key, encode_json({"paused": bool(paused), "updatedBy": by,
                                                          "updatedTime": now_ms()}))])
        await self.sync_status()
        return {"scope": scope, "paused": paused, "inherited": paused is None, "node": self.node,
                "local": {"status": self.reporter.status, "paused": self.paused, "source": self.pause_source},
                "appliesRemotelyWithinMs": self.cfg.queue.status_sync_interval}

    async def status(self) -> dict:
        return {"phase": self.phase, "live": self.phase == "live", "rows": len(self.ranking), "pid": os.getpid(),
                "loadMs": self.load_ms, "queueStatus": self.reporter.status, "paused": self.paused,
                "reason": None if self.phase == "live" else f"keeper is {self.phase}"}

    # ---------------------------------------------------------------------------------- claims

    async def claim(self, limit: int, workers: list[str | None] | None = None) -> list[dict]:
        """Grant up to ``limit`` due jobs in rank order; every grant is exclusive (LeaseTable)."""
        return [job for job in await self._claim_slots(limit, workers) if job is not None]

    async def _claim_slots(self, limit: int, workers: list[str | None] | None) -> list[dict | None]:
        """``limit`` slots, slot i for ``workers[i]`` (the claiming x-worker-id: each grant records its
        worker, so a result from another worker is told apart); a slot left empty is None."""
        slots: list[dict | None] = [None] * limit
        if self.paused or self.published_at is None:
            return slots
        workers = workers if workers is not None else [None] * limit
        self._now = now = now_ms()
        jobs: list[dict] = []
        for _ in range(3):
            free = [i for i, job in enumerate(slots) if job is None]
            want = len(free)
            if self.cursor >= len(self.ready) and self._refill_allowed():
                self.publish()  # a full set drained inside a second: more due rows are waiting
            cands = []
            while self.cursor < len(self.ready) and len(cands) < want:
                key = self.ready[self.cursor]
                self.cursor += 1
                if self._blocked(key):
                    continue
                held = self.ranking.get(key)
                if held is None or held.due is None or held.due > now:
                    metrics.claim_health.labels("stale").inc()
                    continue
                cands.append(held)
            if not cands:
                break
            keys = [h.key for h in cands]
            self.pending.update(keys)
            try:
                answers = await self._grant(
                    [[h.key, h.due, int(h.interval) if h.interval else self._cadence_for(h.route),
                      workers[slot]] for h, slot in zip(cands, free)])
            finally:
                self.pending.difference_update(keys)
            full = False
            for (key, expires, refused), h, slot in zip(answers, cands, free):
                if expires is not None:
                    self.mirror[key] = expires
                    url = self.rules.url_of(key)
                    job = {"id": key, "url": url, "deviceType": self.rules.device_of(key),
                           "expiresAt": expires, "callbackOrigin": self.info.url,
                           "isFromSitemap": h.from_sitemap}
                    slots[slot] = job
                    jobs.append(job)
                else:
                    self.mirror[key] = now + 60_000
                    metrics.claim_health.labels(refused or "refused").inc()
                    full = full or refused == "full"
            if full or len(jobs) >= limit:
                break
        if jobs:
            metrics.claims.inc(len(jobs))
            self.flow("granted", len(jobs))
        elif self.phase == "live":  # nothing grantable now: the fleet idles until a publish finds work
            self._report("empty", force=False)
        return slots

    async def claim_json(self, limits: list[int], workers: list[str | None] | None = None) -> list[bytes]:
        """Claims from several requests at once (an ingress groups concurrent ones): one ranked pass
        for their sum, dealt out in request order (each request's jobs granted to its worker), each
        answer the JSON array the fleet receives."""
        per_slot = [w for limit, w in zip(limits, workers or [None] * len(limits)) for _ in range(limit)]
        slots = await self._claim_slots(sum(limits), per_slot)
        out, at = [], 0
        for limit in limits:
            jobs = [job for job in slots[at:at + limit] if job is not None]
            out.append(json.dumps(jobs, ensure_ascii=False, separators=(",", ":")).encode())
            at += limit
        return out

    def _refill_allowed(self) -> bool:
        capacity = self.cfg.queue.ready.capacity
        return len(self.ready) >= capacity > 0 and time.time() - (self.published_at or 0) > 0.1

    async def _grant(self, items: list[list]) -> list[list]:
        """Exclusive grants for ``items``; the table decides them, grouped with concurrent claims.
        Lists, not tuples, on the wire: Ray packs arguments with msgpack in strict mode, where every
        tuple falls back to pickle (measured 3x the cost of a list for 2,000 pairs)."""
        return await self._grants.submit(items)

    async def _grant_batch(self, groups: list[list[list]]) -> list[list[list]]:
        answers = await call(self.leases.grant_many.remote([i for items in groups for i in items]), LEASE_DEADLINE_S)
        out, at = [], 0
        for items in groups:
            out.append(answers[at:at + len(items)])
            at += len(items)
        return out

    # --------------------------------------------------------------------------------- results

    async def process_result(self, meta: dict, content: bytes | None, forwarded: bool = False,
                             worker: str | None = None) -> dict:
        """Apply one render result, at most once per grant. Raises on failure: the lease is then held
        (released last) and the grant stays open for the fleet's retry.

        The lease table checks and marks the key's latest grant first: a second result for an answered
        grant (a replay, or a retry after a lost 204) and a result from another worker than the
        latest grant's (the key was re-granted: the late result of a previous holder) are acknowledged
        and change nothing, neither the new lease nor the schedule, strikes or page."""
        r = Result.parse(meta, content)
        now = now_ms()
        url = self.rules.url_of(r.id)
        owner = None if forwarded else self._keeper_of(url)
        if owner is not None:  # the sender's membership view lagged ours: the owner decides (one hop)
            return await call(owner.process_result.remote(meta, content, True, worker), STORE_DEADLINE_S * 3)
        verdict, granted_at = await call(self.leases.begin_result.remote(r.id, worker), LEASE_DEADLINE_S)
        if verdict == "unknown":
            return {"refused": f"no lease was granted for {r.id!r}"}
        if verdict != "apply":
            metrics.results_ignored.labels(verdict).inc()
            self.log.info("render result ignored", key=r.id, why=verdict, worker=worker)
            return {"ignored": verdict}
        try:
            dest = self.planner.destination(r)
            urls = [url] + ([self.rules.url_of(dest)] if dest else [])
            found = [Target.decode(u, b) if b else None
                     for u, b in zip(urls, await self.node_store.get_targets(urls))]
            plan = self.planner.plan(r, found[0], found[1] if dest else None, now, granted_at=granted_at)
            await self._apply(plan, now)
        except BaseException:
            try:
                await call(self.leases.abandon.remote(r.id, granted_at), LEASE_DEADLINE_S)
            except Exception as e:
                self.log.warning("could not reopen the grant of a failed result", key=r.id, error=repr(e))
            raise
        await call(self.leases.release.remote(r.id, not plan.release, granted_at), LEASE_DEADLINE_S)
        if plan.release:
            self.mirror[r.id] = now + 5_000
        metrics.render_outcomes.labels(plan.outcome, plan.detail).inc()
        if r.render_time is not None:
            sc = f"{r.status_code // 100}xx" if r.status_code else "none"
            metrics.render_seconds.labels(sc).observe(r.render_time / 1000)
        self.flow("results", 1)
        self.log.info("render result", key=r.id, outcome=plan.outcome, detail=plan.detail,
                      status=r.status_code, error=(r.error or {}).get("name"))
        return {"outcome": plan.outcome, "detail": plan.detail}

    async def _apply(self, plan: Any, now: int) -> None:
        registry: list = []
        pages: list = []
        local_rows: list[ScheduleRow] = []
        local_deletes: list[str] = []
        foreign: dict[str, tuple[list, list]] = {}

        def route_row(key: str, row: ScheduleRow | None) -> None:
            owner = self.ownership.owner(self.rules.url_of(key))  # the one key parser, any layout
            if owner == self.node:
                (local_rows.append(row) if row else local_deletes.append(key))
            else:
                rows, deletes = foreign.setdefault(owner, ([], []))
                (rows.append(row) if row else deletes.append(key))

        for url, target in plan.targets.items():
            if target is None:
                registry.append((target_key(url), None))
                for key in self.rules.all_keys(url):
                    pages.append((key.encode(), None))
                    route_row(key, None)
            else:
                registry.append((target_key(url), target.encode()))
        if plan.page is not None:
            pages.append((plan.page.cache_key.encode(), plan.page.encode()))
        pages += [(k.encode(), None) for k in plan.page_deletes]
        for row in plan.rows:
            route_row(row.cache_key, row)
        for key in plan.row_deletes:
            route_row(key, None)
        if registry or pages:
            await self.node_store.apply(registry, pages)
        self.write_rows(local_rows)
        self.delete_rows(local_deletes)
        for owner, (rows, deletes) in foreign.items():
            await call(self.keepers.get(owner).apply_rows.remote(rows, deletes), STORE_DEADLINE_S)
        if plan.adopt is not None:
            url, due, interval = plan.adopt
            item = {"url": url, "nextRenderTime": due, "renderInterval": interval}
            keeper = self._keeper_of(url)
            await (self.put_targets([item]) if keeper is None else call(keeper.put_targets.remote([item]),
                                                                          STORE_DEADLINE_S))
        if plan.suppress_dest is not None:
            url, reason, status = plan.suppress_dest
            keeper = self._keeper_of(url)
            await (self.suppress(url, reason, status) if keeper is None else
                   call(keeper.suppress.remote(url, reason, status), STORE_DEADLINE_S))

    async def apply_rows(self, rows: list[ScheduleRow], deletes: list[str]) -> None:
        """Schedule writes routed here by another node's keeper (this node owns the keys)."""
        self.write_rows(rows)
        self.delete_rows(deletes)

    # --------------------------------------------------------------------------------- targets

    async def put_targets(self, items: list[dict], forwarded: bool = False,
                          absent_only: bool = False) -> dict:
        """Put semantics for canonical URLs: (re)activate, one jittered row per device. Items this
        node does not own (the caller's membership view lagged) go on to their owners.

        ``absent_only``: create only the targets that do not exist; the answer's ``held`` lists the
        others as [url, stored payload], untouched (a sitemap walk decides about those)."""
        return await self._put([it["url"] for it in items], [it.get("sitemapUrl") for it in items],
                               [it.get("renderInterval") for it in items],
                               [it.get("nextRenderTime") for it in items], forwarded, absent_only)

    async def put_listed(self, sitemap_url: str, urls: list[str], intervals: list[int],
                         dues: list[int | None], forwarded: bool = False, absent_only: bool = False) -> dict:
        """``put_targets`` for URLs listed by one sitemap, as columns (what a sitemap walk sends:
        no dict per URL to build, ship and read)."""
        return await self._put(urls, [sitemap_url] * len(urls), intervals, dues, forwarded, absent_only)

    async def _put(self, urls: list[str], sitemaps: list[str | None], intervals: list, dues: list,
                   forwarded: bool, absent_only: bool) -> dict:
        written, held = 0, []
        if len(self.ownership.names) > 1 and not forwarded:
            foreign: dict[str, list[int]] = {}
            mine = []
            for i, url in enumerate(urls):
                owner = self.ownership.owner(url)
                (mine.append(i) if owner == self.node else foreign.setdefault(owner, []).append(i))
            for owner, idx in foreign.items():
                keeper = self.keepers.get(owner)
                items = [{"url": urls[i], "sitemapUrl": sitemaps[i], "renderInterval": intervals[i],
                          "nextRenderTime": dues[i]} for i in idx]
                answer = await call(keeper.put_targets.remote(items, True, absent_only), STORE_DEADLINE_S * 3)
                written += answer["written"]
                held += answer.get("held", [])
            if foreign:
                urls, sitemaps, intervals, dues = ([col[i] for i in mine] for col in (urls, sitemaps, intervals, dues))
        now = now_ms()
        routes: dict[str, Any] = {}  # found while building the rows: ranking them asks no router again
        registry, rows = self.rules.put_many(urls, sitemaps, intervals, dues, now=now, node=self.node,
                                             routes=routes)
        if not absent_only:
            await self.node_store.apply(registry)
        elif registry:
            live = await self.node_store.apply_absent(registry)
            fresh = [i for i, payload in enumerate(live) if payload is None]
            if len(fresh) < len(urls):  # rows only for the targets just created (same now: same dues)
                held += [[urls[i], payload] for i, payload in enumerate(live) if payload is not None]
                urls, sitemaps, intervals, dues = ([col[i] for i in fresh]
                                                   for col in (urls, sitemaps, intervals, dues))
                routes = {}
                _, rows = self.rules.put_many(urls, sitemaps, intervals, dues, now=now, node=self.node,
                                              routes=routes)
        self.write_rows(rows, lambda key: routes[key] if key in routes else self._route_of(key))
        self.flow("added", len(urls))
        answer: dict[str, Any] = {"written": written + len(urls)}
        if absent_only:
            answer["held"] = held
        return answer

    async def patch_targets(self, items: list[list]) -> dict:
        """Merge fields into existing targets ([url, changes] pairs); never touches schedule rows (the
        render clock)."""
        found = await self.node_store.get_targets([u for u, _ in items])
        registry = []
        for (url, changes), data in zip(items, found):
            if data is not None:
                registry.append([target_key(url), Target.decode(url, data).patched(**changes).encode()])
        await self.node_store.apply(registry)
        return {"patched": len(registry)}

    async def delete_targets(self, urls: list[str]) -> dict:
        found = await self.node_store.get_targets(urls)
        registry, pages, keys = [], [], []
        for url, data in zip(urls, found):
            registry.append((target_key(url), None))
            for key in self.rules.all_keys(url):
                pages.append((key.encode(), None))
                keys.append(key)
        await self.node_store.apply(registry, pages)
        self.delete_rows(keys)
        return {"deleted": sum(1 for d in found if d is not None)}

    async def suppress(self, url: str, reason: str | None, status: int | None) -> dict:
        [data] = await self.node_store.get_targets([url])
        existing = Target.decode(url, data) if data else None
        s = self.rules.suppress(existing, url, reason=reason, status_code=status, now=now_ms())
        if s.deleted:
            return await self.delete_targets([url])
        pages = [(k.encode(), None) for k in self.rules.all_keys(url)]
        await self.node_store.apply([(target_key(url), s.target.encode())], pages)
        self.write_rows(s.rows)
        return {"suppressed": url, "strikes": s.target.strikes}

    async def revalidate(self, urls: list[str]) -> dict:
        """Every device of each target due now (cadence left to config); cached pages expire now."""
        now = now_ms()
        found = await self.node_store.get_targets(urls)
        rows, pages = [], []
        for url, data in zip(urls, found):
            if data is None:
                continue
            target = Target.decode(url, data)
            rows += self.rules.revalidate(target, now)
            keys = self.rules.keys_of(url)
            for key, raw in zip(keys, await self.node_store.get_pages(keys)):
                if raw is not None:
                    page = Page.decode(raw)
                    pages.append((key.encode(), dataclasses.replace(page, expires_at=now).encode()))
        if pages:
            await self.node_store.apply([], pages)
        self.write_rows(rows)
        self.note_work()
        return {"revalidating": len(rows), "examined": len(urls)}

    async def revalidate_key(self, key: str) -> dict | None:
        """Admin: one key due now; None when the URL has no target (it would render once, then drop)."""
        url = self.rules.url_of(key)
        [data] = await self.node_store.get_targets([url])
        if data is None:
            return None
        row = self.rules.due_now(Target.decode(url, data), key, now_ms())
        self.write_rows([row])
        self._publish_now()  # one key: publish at once, so the answer can say whether consumers woke
        return {"cacheKey": key, "nextRenderTime": row.next_render_time, "scheduleOwnedBy": self.node,
                "wokeLocalConsumers": self.reporter.status == "queued", "node": self.node}

    async def render_now(self, key: str) -> int:
        """Render-now: the key due this minute (a one-off row when there is no target)."""
        url = self.rules.url_of(key)
        [data] = await self.node_store.get_targets([url])
        row = self.rules.due_now(Target.decode(url, data) if data else None, key, now_ms())
        self.write_rows([row])
        self._publish_now()
        return row.next_render_time

    # ------------------------------------------------------------------------------ admin reads

    async def due_times(self, keys: list[str]) -> list[int | None]:
        """When each key's next render is due (epoch ms; None: no row here), from memory."""
        return [row.next_render_time if (row := self.row(k)) is not None else None for k in keys]

    async def schedule_row(self, key: str) -> dict:
        """This node's row for ``key`` (the leaf the explainer proxies to; it never proxies on)."""
        now = now_ms()
        row = self.row(key)
        lease = await call(self.leases.lease_of.remote(key), LEASE_DEADLINE_S)
        described = None
        if row is not None:
            due = row.next_render_time
            described = {"cacheKey": key, "nextRenderTime": due, "fromSitemap": row.from_sitemap,
                         "effectiveInterval": row.effective_interval,
                         "dueInMs": None if due is None else due - now,
                         "overdue": None if due is None else due <= now,
                         "leased": lease is not None and lease.get("leaseExpiresAt") is not None,
                         "leaseExpiresAt": (lease or {}).get("leaseExpiresAt"), "heldUntil": (lease or {}).get("heldUntil"),
                         "score": self.ranking.score_of(key, now)}
        return {"node": self.node, "renderSchedule": described, "checkedAt": now}

    async def queue_state(self) -> tuple[int, dict]:
        now = now_ms()
        trust = {"live": self.phase == "live", "phase": self.phase, "exact": self.exact,
                 "unreadableRows": self.unreadable, "loadMs": self.load_ms, "publishMs": self.publish_ms,
                 "publishedAt": int(self.published_at * 1000) if self.published_at else None,
                 "verify": self.verify_report, "stateAt": now}
        live_now = {"status": self.reporter.status, "paused": self.paused}
        if self.phase != "live":
            return 503, {"error": f"the keeper is {self.phase}; counts are not exact yet", "reason": self.phase,
                         "node": self.node, "trust": trust, "now": live_now}
        leases = await call(self.leases.status.remote(), LEASE_DEADLINE_S)
        st = self.ranking.state(now, leased=list(self.mirror))
        due = st["now"]["due"]
        doc = {
            "node": self.node, "generatedAt": now,
            "now": {**st["now"], **live_now, "inFlight": leases["inFlight"],
                    "unclaimed": max(0, due - st["now"]["leased"]), "held": st["held"]},
            "coming": st["coming"], "lateness": st["lateness"], "dueHistogram": st["dueHistogram"],
            "classes": st["classes"][:200], "listsTruncated": len(st["classes"]) > 200,
            "flow": self.flows.report(now), "leases": leases, "trust": trust,
        }
        return 200, json.loads(json.dumps(doc, default=str))
