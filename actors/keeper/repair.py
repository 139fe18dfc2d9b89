"""Schedule repair (reconcile): restore the rows missing for targets this node owns.

A target whose rows went missing never renders again and nothing reports it. Reconcile walks the
replicated targets (read-only phase), counts the owned keys without a row, and only then writes the
missing ones back (jittered over the cadence, so a mass repair is not a herd; keys with no cached
page first), at most ``render.reconcile.maxRestores`` per pass. A mixin of ``QueueKeeper``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prerender_ray import metrics
from prerender_ray.storage.registry import TARGET, RecordError, Target
from prerender_ray.timeutil import fnv1a32, now_ms

SCAN_CHUNK = 2_000
PAGE_CHECK_CHUNK = 500


class KeeperRepair:
    def init_repair(self) -> None:
        self.reconciling = False
        self.last_reconcile: dict | None = None
        if self.cfg.render.reconcile.enabled:
            self._tasks.append(asyncio.get_running_loop().create_task(self._reconciler()))

    async def _reconciler(self) -> None:
        rc = self.cfg.render.reconcile
        stagger = fnv1a32(self.node) % max(1, rc.start_jitter)
        await asyncio.sleep((rc.start_delay + stagger) / 1000)
        while True:
            if self.phase == "live":
                try:
                    await self.reconcile()
                except Exception as e:
                    metrics.loop_errors.labels("reconcile").inc()
                    self.log.error("reconcile failed", error=repr(e))
            await asyncio.sleep(rc.interval / 1000)

    async def reconcile_status(self) -> dict:
        """For the admin overview: the switch, the cadence, whether a pass runs, the last pass."""
        rc = self.cfg.render.reconcile
        return {"node": self.node, "enabled": rc.enabled, "interval": rc.interval,
                "maxRestores": rc.max_restores, "running": self.reconciling, "lastRun": self.last_reconcile}

    async def start_reconcile(self) -> dict:
        """Admin trigger: start a pass in the background and answer at once (the pass shares the
        timer's overlap guard: a second trigger while one runs starts nothing)."""
        task = getattr(self, "_admin_reconcile", None)
        if self.reconciling or (task is not None and not task.done()):
            return {"started": False, "alreadyRunning": True, "lastRun": self.last_reconcile}
        if self.phase != "live":
            return {"started": False, "alreadyRunning": False, "reason": f"the keeper is {self.phase}",
                    "lastRun": self.last_reconcile}

        async def run() -> None:
            try:
                await self.reconcile()
            except Exception as e:  # recorded in last_reconcile by reconcile() itself
                metrics.loop_errors.labels("reconcile").inc()
                self.log.error("reconcile failed", error=repr(e))

        self._admin_reconcile = asyncio.get_running_loop().create_task(run())
        return {"started": True, "alreadyRunning": False, "lastRun": self.last_reconcile}

    async def reconcile(self, *, departed: list[str] | None = None) -> dict:
        """One pass. ``departed``: only URLs that were owned by these nodes before a membership
        change (their rows died with them); None: every owned target."""
        if self.reconciling:
            return {"skipped": True, "reason": "a reconcile pass is already running on this node",
                    "lastRun": self.last_reconcile}
        if self.phase != "live":
            return {"skipped": True, "reason": f"the keeper is {self.phase}", "lastRun": self.last_reconcile}
        self.reconciling = True
        started = now_ms()
        run: dict[str, Any] = {"node": self.node, "startedAt": started}
        try:
            run.update(await self._reconcile_pass(departed))
        except Exception as e:
            run["error"] = repr(e)
            raise
        finally:
            run["finishedAt"] = now_ms()
            self.last_reconcile = run
            self.reconciling = False
        level = self.log.warning if run.get("restored") or run.get("truncated") else self.log.info
        level("reconcile", **{k: v for k, v in run.items() if k != "node"})
        return run

    async def _reconcile_pass(self, departed: list[str] | None) -> dict:
        cap = self.cfg.render.reconcile.max_restores
        previous = getattr(self, "previous_ownership", None)
        examined = owned = missing = 0
        collected: list[tuple[Target, str]] = []
        cursor: bytes | None = None
        t0 = time.perf_counter()
        while True:  # phase 1: read only; nothing is written while the scan runs
            chunk = await self.node_store.scan(TARGET, cursor, SCAN_CHUNK)
            for k, payload in chunk:
                examined += 1
                url = k[len(TARGET):].decode()
                if self.ownership.owner(url) != self.node:
                    continue
                if departed is not None and (previous is None or previous.owner(url) not in departed):
                    continue
                owned += 1
                keys = [key for key in self.rules.keys_of(url) if key not in self.ranking]
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
        now = now_ms()
        rows = [self.rules.restore_row(target, key, now) for target, key in collected]
        for i in range(0, len(rows), 1000):  # phase 2: the writes
            self.write_rows(rows[i:i + 1000])
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
            found = await self.node_store.has_pages(keys)
            has_page.update(k for k, present in zip(keys, found) if present)
        return sorted(collected, key=lambda tk: tk[1] in has_page)
