"""Schedule repair (reconcile): restore the rows missing for targets this node owns.

A target whose rows went missing never renders again and nothing reports it. Reconcile walks the
replicated targets (read-only phase), counts the owned keys without a row, and only then writes the
missing ones back (jittered over the cadence, so a mass repair is not a herd; keys with no cached
page first), at most ``render.reconcile.maxRestores`` per pass.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.keeper.handoff import Handoff
from prerender_ray.actors.keeper.rows import CurrentConfig, Rows
from prerender_ray.identity.membership import Membership, MembershipView
from prerender_ray.rpc import StoreApi
from prerender_ray.storage.keys import TARGET
from prerender_ray.storage.registry import RecordError, Target
from prerender_ray.tasks import Tasks
from prerender_ray.timeutil import fnv1a32

SCAN_CHUNK = 2_000
SNAPSHOT_TRIES = 3
PAGE_CHECK_CHUNK = 500
WRITE_CHUNK = 1_000


class Repair:
    def __init__(self, rows: Rows, conf: CurrentConfig, store: StoreApi, handoff: Handoff, view: MembershipView,
                 node: str, log: Any, tasks: Tasks):
        self.rows = rows
        self.conf = conf
        self.store = store
        self.handoff = handoff
        self.view = view
        self.node = node
        self.log = log
        self.tasks = tasks  # the keeper's: a pass is ended before its rows' db closes
        self.running = False
        self.last: dict | None = None
        self._admin_task: asyncio.Task | None = None
        self._rebuilds: set[asyncio.Task] = set()

    async def timer(self) -> None:
        """Every ``render.reconcile.interval``, after a start delay staggered by node name."""
        rc = self.conf.cfg.render.reconcile
        stagger = fnv1a32(self.node) % max(1, rc.start_jitter)
        await asyncio.sleep((rc.start_delay + stagger) / 1000)
        while True:
            if self.rows.live:
                try:
                    await self.reconcile()
                except Exception as e:
                    metrics.loop_errors.labels("reconcile").inc()
                    self.log.error("reconcile failed", error=repr(e))
            await asyncio.sleep(self.conf.cfg.render.reconcile.interval / 1000)

    def rebuild_soon(self, departed: list[str], before: Membership) -> None:
        """The slice of departed nodes: their rows died with them. ``before`` is the membership they
        left, fixed now: another change may come before the pass runs."""
        task = self.tasks.spawn(self._rebuild(departed, before))
        self._rebuilds.add(task)
        task.add_done_callback(self._rebuilds.discard)

    async def _rebuild(self, departed: list[str], before: Membership) -> None:
        # after a running pass (it may predate the change) and after a load still under way
        while self.running or self.rows.phase == "loading":
            await asyncio.sleep(1)
        try:
            await self.reconcile(departed=departed, before=before)
        except Exception as e:
            metrics.loop_errors.labels("rebuild").inc()
            self.log.error("rebuilding a departed node's slice failed", departed=departed, error=repr(e))

    def status(self) -> dict:
        """For the admin overview: the switch, the cadence, whether a pass runs, the last pass."""
        rc = self.conf.cfg.render.reconcile
        return {"node": self.node, "enabled": rc.enabled, "interval": rc.interval,
                "maxRestores": rc.max_restores, "running": self.running, "lastRun": self.last}

    def start(self) -> dict:
        """Admin trigger: start a pass in the background and answer at once (the pass shares the
        timer's overlap guard: a second trigger while one runs starts nothing)."""
        task = self._admin_task
        if self.running or (task is not None and not task.done()):
            return {"started": False, "alreadyRunning": True, "lastRun": self.last}
        if not self.rows.live:
            return {"started": False, "alreadyRunning": False, "reason": f"the keeper is {self.rows.phase}",
                    "lastRun": self.last}

        async def run() -> None:
            try:
                await self.reconcile()
            except Exception as e:  # recorded in self.last by reconcile() itself
                metrics.loop_errors.labels("reconcile").inc()
                self.log.error("reconcile failed", error=repr(e))

        self._admin_task = self.tasks.spawn(run())
        return {"started": True, "alreadyRunning": False, "lastRun": self.last}

    async def reconcile(self, *, departed: list[str] | None = None, before: Membership | None = None) -> dict:
        """One pass. ``departed``: only URLs that were owned by these nodes in ``before`` (default:
        the membership before the last change; their rows died with them); None: every owned target."""
        if self.running:
            return {"skipped": True, "reason": "a reconcile pass is already running on this node",
                    "lastRun": self.last}
        if not self.rows.live:
            return {"skipped": True, "reason": f"the keeper is {self.rows.phase}", "lastRun": self.last}
        self.running = True
        started = self.rows.clock.now_ms()
        run: dict[str, Any] = {"node": self.node, "startedAt": started}
        try:
            run.update(await self._pass(departed, before or self.handoff.previous))
        except Exception as e:
            run["error"] = repr(e)
            raise
        finally:
            run["finishedAt"] = self.rows.clock.now_ms()
            self.last = run
            self.running = False
        level = self.log.warning if run.get("restored") or run.get("truncated") else self.log.info
        level("reconcile", **{k: v for k, v in run.items() if k != "node"})
        return run

    async def _pass(self, departed: list[str] | None, previous: Membership | None) -> dict:
        """Against one membership snapshot; a change while it reads (before anything is written)
        starts it over against the new one, up to ``SNAPSHOT_TRIES`` times."""
        for _ in range(SNAPSHOT_TRIES - 1):
            m = self.view.current
            done = await self._pass_under(m, departed, previous)
            if done is not None:
                return done
        return await self._pass_under(self.view.current, departed, previous, last=True) or {}

    async def _pass_under(self, m: Membership, departed: list[str] | None, previous: Membership | None,
                          last: bool = False) -> dict | None:
        rules = self.conf.rules
        cap = self.conf.cfg.render.reconcile.max_restores
        examined = owned = missing = 0
        collected: list[tuple[Target, str]] = []
        cursor: bytes | None = None
        t0 = time.perf_counter()
        while True:  # phase 1: read only; nothing is written while the scan runs
            chunk = await self.store.scan(TARGET, cursor, SCAN_CHUNK)
            for k, payload in chunk:
                examined += 1
                url = k[len(TARGET):].decode()
                if m.owner(url) != self.node:
                    continue
                if departed is not None and (previous is None or previous.owner(url) not in departed):
                    continue
                owned += 1
                keys = [key for key in rules.keys_of(url) if key not in self.rows.ranking]
                if not keys:
                    continue
                try:
                    target = Target.decode(url, payload)
                except RecordError:
                    continue
                for key in keys:
                    missing += 1
                    if len(collected) < cap:
                        collected.append((target, key))
            if len(chunk) < SCAN_CHUNK:
                break
            cursor = chunk[-1][0] + b"\x00"
            await asyncio.sleep(0)
        collected = await self._pageless_first(collected)
        if self.view.epoch != m.epoch and not last:
            return None  # decided against a membership that is gone: read again under the new one
        # (the last try writes anyway: the funnel keeps rows it no longer owns out of the ranking
        # and the hand-off takes them to their owner)
        now = self.rows.clock.now_ms()
        rows = [rules.restore_row(target, key, now) for target, key in collected]
        for i in range(0, len(rows), WRITE_CHUNK):  # phase 2: the writes
            self.rows.write(rows[i:i + WRITE_CHUNK])
            await asyncio.sleep(0)
        metrics.reconcile_rows.labels("missing").inc(missing)
        metrics.reconcile_rows.labels("restored").inc(len(rows))
        return {"examined": examined, "owned": owned, "missing": missing, "restored": len(rows),
                "truncated": missing > len(rows), "scope": "departed" if departed is not None else "all",
                "ms": round((time.perf_counter() - t0) * 1000, 1)}

    async def _pageless_first(self, collected: list[tuple[Target, str]]) -> list[tuple[Target, str]]:
        """Keys bots cannot be served at all (no cached page) come back first."""
        has_page: set[str] = set()
        for i in range(0, len(collected), PAGE_CHECK_CHUNK):
            keys = [key for _, key in collected[i:i + PAGE_CHECK_CHUNK]]
            found = await self.store.has_pages(keys)
            has_page.update(k for k, present in zip(keys, found) if present)
        return sorted(collected, key=lambda tk: tk[1] in has_page)
