"""The QueueKeeper without Ray: its parts, wired once, the load and the loops.

Parts (each a module of this package, each taking what it needs in its constructor): ``Rows`` (the
schedule rows and their funnel), ``Claims`` (the ready set and grants), ``Status`` (queue status and
pause), ``Targets`` (target writes), ``Results`` (result apply), ``Handoff`` (membership changes) and
``Repair`` (reconcile). The other actors are reached through the typed interfaces of
``prerender_ray.rpc``, so tests run a keeper against a real lease table and an in-memory store.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.common import MEMBERSHIP_CHECK_DEADLINE_S, end_if_cancelled, survivable
from prerender_ray.actors.keeper.claims import Claims
from prerender_ray.actors.keeper.discovery import Discoveries
from prerender_ray.actors.keeper.handoff import Handoff
from prerender_ray.actors.keeper.indexnow import Notifier
from prerender_ray.actors.keeper.repair import Repair
from prerender_ray.actors.keeper.results import Results
from prerender_ray.actors.keeper.rows import CurrentConfig, Rows
from prerender_ray.actors.keeper.status import Status
from prerender_ray.actors.keeper.targets import Targets
from prerender_ray.config.model import Config
from prerender_ray.config.overrides import LiveConfig
from prerender_ray.identity.membership import Membership, MembershipView
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.queue import drain
from prerender_ray.rpc import LeaseApi, Peers, StoreApi, call, wait_for
from prerender_ray.storage.keys import KEEPER_EPOCH, OVERRIDES_KEY
from prerender_ray.storage.rocks import Store
from prerender_ray.tasks import Tasks
from prerender_ray.timeutil import SYSTEM_CLOCK, Clock

STORE_SYNC_S = 300.0
# A keeper checks its membership more often than the other processes (5 s): each answer confirms it
# may grant for MEMBERSHIP_TRUST_MS (``Handoff.trusted``), four of these.
MEMBERSHIP_CHECK_S = 2.5
SETTLE_S = 10.0  # grants on their way to the lease table when the drain begins (its call's deadline is 5 s)
FREEZE_EVERY_S = 300.0
LEASE_TABLE_TRIES = 30


class Keeper:
    def __init__(self, cfg: Config, info: NodeInfo, db: Store, *, store: StoreApi, leases: LeaseApi,
                 peers: Peers, log: Any, membership: Membership | None = None,
                 fetch_membership: Callable[[], Awaitable[Membership]] | None = None,
                 broadcaster: Any = None, after_load: Callable[[], None] = lambda: None,
                 clock: Clock = SYSTEM_CLOCK):
        self.info = info
        self.node = info.name
        self.log = log
        self.store = store
        self.leases = leases
        self.live_config = LiveConfig(cfg)  # the file's config, and live overrides on top of it
        self.conf = CurrentConfig(cfg)
        # the one membership of this process (``membership``: the controller's at placement; it is
        # read again before the load, and only a higher epoch replaces it)
        self.view = MembershipView(membership) if membership is not None else MembershipView.alone(info)
        self.after_load = after_load  # e.g. freeze the loaded rows out of the cyclic GC
        self.tasks = Tasks()  # every background task of its parts: ended before the rows' db closes
        self.rows = Rows(db, self.conf, self.view, self.node, log, clock)
        self.claims = Claims(self.rows, self.conf, leases, info.url, log)
        self.status = Status(self.rows, self.claims, store, info, log, self.tasks, broadcaster,
                             status_sync_ms=cfg.queue.status_sync_interval)
        self.targets = Targets(self.rows, self.conf, store, peers, self.view, self.node)
        self.results = Results(self.rows, self.claims, self.targets, self.conf, leases, store, peers,
                               self.view, self.node, log)
        self.handoff = Handoff(self.rows, self.claims, leases, peers, self.view, self.node, log, self.tasks,
                               fetch_membership)
        self.repair = Repair(self.rows, self.conf, store, self.handoff, self.view, self.node, log, self.tasks)
        self.discoveries = Discoveries(self.rows, self.conf, self.targets, store, peers, self.view,
                                       self.node, log)
        # the few edges that point back up, wired here once
        self.rows.on_due = self.claims.publish_soon
        self.claims.on_published = self.status.derive
        self.claims.on_idle = self.status.idle
        self.status.on_overrides = self.apply_overrides
        self.targets.publish_now = self.claims.publish_now
        self.targets.woke = lambda: self.status.current == "queued"
        self.handoff.on_departed = self.repair.rebuild_soon
        self.claims.trusted = self.handoff.trusted
        self._fence_if_away(db)
        self.targets.accept = self.results.accept = self.handoff.accept
        self.targets.moved_past = self.results.moved_past = self.handoff.moved_past
        self.results.on_result = self.discoveries.result_for
        self.index_now = Notifier(cfg.index_now) if cfg.index_now.enabled else None
        if self.index_now is not None:
            self.results.on_changed = self.index_now.changed
        self.rows.on_unowned = self.handoff.kick
        self.loaded_at: float | None = None
        self._frozen_at = self.rows.clock.monotonic()

    @property
    def cfg(self) -> Config:
        return self.conf.cfg

    def _fence_if_away(self, db: Store) -> None:
        """A keeper that starts among other nodes, new or back after membership changes it did not
        see (its rows were placed under another epoch), cannot know who owned and granted its keys
        meanwhile: none is granted until its previous owner said its hand-off is done, or a lease's
        length passed, unless handed over with its lease (``Rows.fence``). A restart under the same
        epoch (a crash in a stable cluster) fences nothing: its own leases are read back."""
        stored = db.get(KEEPER_EPOCH)
        epoch = self.view.epoch
        if epoch >= 0 and (stored is None or int(stored) != epoch):
            self.handoff.fence(None)
        if epoch >= 0:
            db.put(KEEPER_EPOCH, str(epoch).encode())

    def start(self) -> None:
        """The load and the loops, on the running event loop."""
        for coro in (self.load(), self._publisher(), self._status_syncer(), self._verifier(),
                     self._membership_checker()):
            self.tasks.spawn(coro)
        if self.cfg.render.reconcile.enabled:
            self.tasks.spawn(self.repair.timer())
        if self.status.mqtt is not None:
            self.tasks.spawn(self.status.forget_old_host())
        if self.index_now is not None:
            self.index_now.start(self.tasks)

    # ------------------------------------------------------------------------------ live config

    def apply_overrides(self, raw: bytes | None) -> dict:
        """Apply the stored live overrides (``o:config``) if they changed: new rules, and the rows
        held reclassified in memory (route cadences, routes, default interval, sitemap boost)."""
        cfg = self.live_config.changed(raw, self.log)
        if self.live_config.error:
            metrics.loop_errors.labels("keeper-overrides").inc()
        if cfg is None:
            return {"changed": False}
        t0 = time.perf_counter()
        self.conf.swap(cfg)
        moved = self.rows.reclassify()
        if self.claims.serving:
            self.claims.publish()
        ms = round((time.perf_counter() - t0) * 1000, 1)
        self.log.warning("live config applied", moved=moved, rows=len(self.rows), ms=ms,
                         overrides=self.live_config.names())
        return {"changed": True, "moved": moved, "ms": ms}

    async def read_overrides(self) -> None:
        try:
            (raw,) = await self.store.get([OVERRIDES_KEY])
            self.apply_overrides(raw)
        except Exception as e:
            self.log.warning("config overrides not read", error=repr(e)[:300])

    # ------------------------------------------------------------------------------------- load

    async def load(self) -> None:
        t0 = time.perf_counter()
        try:
            # Replicated data first: a node that joins or restarts catches up from a peer.
            sync = await self.store.wait_synced(STORE_SYNC_S)
            if sync.get("state") != "synced":
                self.log.warning("loading before the store caught up", sync=sync)
            await self.handoff.fetch_membership()
            await self.read_overrides()  # classify the rows with the live config, not the file's
            await self._restore_mirror()
            await self.rows.load()
        except Exception as e:
            self.rows.phase = "failed"
            metrics.loop_errors.labels("keeper-load").inc()
            self.log.error("keeper load failed", error=repr(e))
            return
        self.after_load()
        rows = self.rows
        rows.load_ms = (time.perf_counter() - t0) * 1000
        self.loaded_at = self.rows.clock.time()
        rows.phase = "live"
        metrics.keeper_rows.set(len(rows))
        metrics.keeper_live.set(1)
        metrics.keeper_load_seconds.set(rows.load_ms / 1000)
        self.log.info("keeper live", rows=len(rows), load_ms=round(rows.load_ms, 1), unreadable=rows.unreadable)
        self.claims.publish()
        await self.status.sync()
        self.handoff.kick()  # hands over what it no longer owns, then tells the others it is done

    async def _restore_mirror(self) -> None:
        for _ in range(LEASE_TABLE_TRIES):
            try:
                # rpc's wait_for: a load cancelled by the close as the table answers goes no further
                # (one that went on would hold the close up to its deadline, then write to a closed db)
                self.claims.restore_mirror(await wait_for(self.leases.blocked(), 10))
                await wait_for(self.leases.reopen_answering(), 10)  # what a dead predecessor left
                return
            except Exception as e:  # the lease table may still be starting
                self.log.info("waiting for the lease table", error=type(e).__name__)
                await asyncio.sleep(1)
        raise RuntimeError("the lease table did not answer")

    # ------------------------------------------------------------------------------------ loops

    async def _publisher(self) -> None:
        interval = self.cfg.queue.keeper.publish_interval / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.claims.publish()
                self.status.derive()

                if self.rows.clock.monotonic() - self._frozen_at > FREEZE_EVERY_S:
                    # rows added since the load (sitemaps, discovery): keep them out of full GC passes
                    gc.freeze()
                    self._frozen_at = self.rows.clock.monotonic()
            except Exception as e:
                metrics.loop_errors.labels("keeper-publish").inc()
                self.log.error("publish failed", error=repr(e))

    async def _status_syncer(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.queue.status_sync_interval / 1000)
            try:
                await self.status.sync()
                metrics.queue_due.set(self.rows.ranking.state(self.rows.clock.now_ms())["now"]["due"] if self.rows.live else 0)
            except Exception as e:
                metrics.loop_errors.labels("keeper-status").inc()
                self.log.error("status sync failed", error=repr(e))

    async def _membership_checker(self) -> None:
        """Every few seconds, the controller's membership applied as a push is (``Handoff.check_membership``)."""
        while True:
            await asyncio.sleep(MEMBERSHIP_CHECK_S)
            end_if_cancelled()
            try:
                await call(self.handoff.check_membership(), MEMBERSHIP_CHECK_DEADLINE_S)
            except BaseException as e:
                if not survivable(e):
                    raise
                metrics.loop_errors.labels("membership-check").inc()
                self.log.error("membership check failed", error=repr(e))

    async def _verifier(self) -> None:
        interval = self.cfg.queue.keeper.verify_interval / 1000
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            if not self.rows.live:
                continue
            try:
                await self.rows.verify()
            except Exception as e:
                metrics.loop_errors.labels("keeper-verify").inc()
                self.log.error("verification walk failed", error=repr(e))

    # ------------------------------------------------- what other keepers ask (rpc.KeeperApi)

    async def process_result(self, meta: dict, content: bytes | None, forwarded: bool = False,
                             worker: str | None = None, epoch: int | None = None) -> dict:
        return await self.results.process(meta, content, forwarded, worker, epoch)

    async def apply_rows(self, rows: list, deletes: list[str], epoch: int | None = None) -> None:
        if epoch is not None:
            await self.handoff.accept(epoch, "apply_rows")
        await self.targets.apply_rows(rows, deletes)

    async def put_targets(self, items: list[dict], forwarded: bool = False, absent_only: bool = False,
                          deleted_within_ms: int = 0, epoch: int | None = None) -> dict:
        return await self.targets.put_targets(items, forwarded, absent_only, deleted_within_ms, epoch)

    async def suppress(self, url: str, reason: str | None, status: int | None) -> dict:
        return await self.targets.suppress(url, reason, status)

    async def discover_target(self, url: str, deleted_within_ms: int, forwarded: bool = False,
                              epoch: int | None = None) -> dict:
        return await self.discoveries.discover(url, deleted_within_ms, forwarded, epoch)

    async def adopt(self, rows: list, leases: list, epoch: int, fences: list | None = None) -> int:
        return await self.handoff.adopt(rows, leases, epoch, fences)

    async def handoff_done(self, sender: str, epoch: int, fence: list | None = None) -> list | None:
        return await self.handoff.handoff_done(sender, epoch, fence)

    # ------------------------------------------------------------------------------------ stop

    async def drain(self, period_ms: int) -> dict:
        """Before a stop: say ``paused`` (claims get ``[]``), then wait until every lease this node
        granted has its result, or ``period_ms`` is over. Results keep being applied meanwhile."""
        d = drain.Drain(period_ms, self.rows.clock.now_ms())
        await self.status.begin_drain()
        settled = await self.claims.settle(SETTLE_S)

        async def awaiting() -> int | None:
            return (await self.leases.status()).get("awaitingResults")

        report = await drain.run(d, awaiting)
        (self.log.info if report["ended"] == "drained" else self.log.warning)(
            "drain ended", **report, period_ms=period_ms, grants_settled=settled)
        return {"node": self.node, **report}

    # ------------------------------------------------------------------------------------ reads

    def state(self) -> dict:
        rows = self.rows
        return {"phase": rows.phase, "live": rows.live, "rows": len(rows), "pid": os.getpid(),
                "loadMs": rows.load_ms, "queueStatus": self.status.current, "paused": self.claims.paused,
                "draining": self.status.draining, "members": list(self.view.current.names),
                "epoch": self.view.epoch,
                "membershipCheckedAt": self.handoff.checked_at,
                "membershipConfirmedAt": self.handoff.confirmed_at,
                "reason": None if rows.live else f"keeper is {rows.phase}"}

    def due_times(self, keys: list[str]) -> list[int | None]:
        """When each key's next render is due (epoch ms; None: no row here), from memory."""
        return [row.next_render_time if (row := self.rows.row(k)) is not None else None for k in keys]

    async def diagnose(self, key: str) -> dict:
        """Admin: ``key`` due now, its next job asking prerender-ray's worker for a diagnostics report
        (``renderOptions.diagnostics``; the flag lives in memory until its result or its expiry)."""
        now = self.rows.clock.now_ms()
        until = self.claims.diagnose.add(key, now)
        due = await self.targets.render_now(key)
        lease = await self.leases.lease_of(key)
        return {"cacheKey": key, "nextRenderTime": due, "diagnosticsUntil": until, "scheduleOwnedBy": self.node,
                "renderInFlight": lease is not None and lease.get("leaseExpiresAt") is not None}

    async def schedule_row(self, key: str) -> dict:
        """This node's row for ``key`` (the leaf the explainer proxies to; it never proxies on)."""
        now = self.rows.clock.now_ms()
        row = self.rows.row(key)
        lease = await self.leases.lease_of(key)
        described = None
        if row is not None:
            due = row.next_render_time
            described = {"cacheKey": key, "nextRenderTime": due, "fromSitemap": row.from_sitemap,
                         "effectiveInterval": row.effective_interval,
                         "dueInMs": None if due is None else due - now,
                         "overdue": None if due is None else due <= now,
                         "leased": lease is not None and lease.get("leaseExpiresAt") is not None,
                         "leaseExpiresAt": (lease or {}).get("leaseExpiresAt"), "heldUntil": (lease or {}).get("heldUntil"),
                         "score": self.rows.ranking.score_of(key, now)}
        return {"node": self.node, "renderSchedule": described, "checkedAt": now}

    async def queue_state(self) -> tuple[int, dict]:
        now = self.rows.clock.now_ms()
        rows, claims = self.rows, self.claims
        trust = {"live": rows.live, "phase": rows.phase, "exact": rows.exact,
                 "unreadableRows": rows.unreadable, "loadMs": rows.load_ms, "publishMs": claims.publish_ms,
                 "publishedAt": int(claims.published_at * 1000) if claims.published_at else None,
                 "verify": rows.verify_report, "stateAt": now}
        live_now = {"status": self.status.current, "paused": claims.paused}
        if not rows.live:
            return 503, {"error": f"the keeper is {rows.phase}; counts are not exact yet", "reason": rows.phase,
                         "node": self.node, "trust": trust, "now": live_now}
        leases = await self.leases.status()
        st = rows.ranking.state(now, leased=list(claims.mirror))
        due = st["now"]["due"]
        doc = {
            "node": self.node, "generatedAt": now,
            "now": {**st["now"], **live_now, "inFlight": leases["inFlight"],
                    "unclaimed": max(0, due - st["now"]["leased"]), "held": st["held"]},
            "coming": st["coming"], "lateness": st["lateness"], "dueHistogram": st["dueHistogram"],
            "classes": st["classes"][:200], "listsTruncated": len(st["classes"]) > 200,
            "flow": rows.flows.report(now), "leases": leases, "trust": trust,
            "discovery": self.discoveries.report(),
            "fences": self.rows.fence_report(now),
        }
        return 200, json.loads(json.dumps(doc, default=str))

    async def close(self) -> None:
        """End every task of the keeper's parts, then close the rows' db: one still running (a load, a
        hand-off pass, a repair, a status write) would write to it, or call peers, after the close."""
        stuck = await self.tasks.close()
        if stuck:
            self.log.error("keeper tasks did not end when cancelled", tasks=[t.get_name() for t in stuck])
        self.handoff.close()
        self.claims.close()
        self.status.close()
        if self.index_now is not None:
            await self.index_now.close()
        self.rows.db.flush()
        self.rows.db.close()
