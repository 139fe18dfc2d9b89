"""The node's queue status (what the render fleet is told) and queue control (pause intent).

The status follows each publish (``queued`` only while the published set holds grantable work); a
change is announced at once: metrics, log, the status row in the replicated registry and, when
configured, the retained MQTT message of the reference fleet. Pause intent is re-read with the live
config overrides on every status sync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.keeper.claims import Claims
from prerender_ray.actors.keeper.rows import Rows
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.queue.status import Status as QueueStatus
from prerender_ray.queue.status import StatusReporter, Via, derive_status, fleet_write, resolve_desired_pause
from prerender_ray.rpc import StoreApi
from prerender_ray.storage.keys import OVERRIDES_KEY, QUEUE_CONTROL, QUEUE_STATUS
from prerender_ray.storage.registry import decode_json, encode_json
from prerender_ray.tasks import Tasks

CLUSTER_SCOPE = "all"
STATUSES = ("unready", "empty", "queued", "paused")


class Status:
    def __init__(self, rows: Rows, claims: Claims, store: StoreApi, info: NodeInfo, log: Any, tasks: Tasks,
                 broadcaster: Any = None, status_sync_ms: int = 1000):
        self.rows = rows
        self.claims = claims
        self.store = store
        self.info = info
        self.node = info.name
        self.log = log
        self.tasks = tasks  # the keeper's: a status write does not outlive its close
        self.mqtt = broadcaster  # the reference fleet's MQTT status (or None)
        self.status_sync_ms = status_sync_ms
        self.reporter = StatusReporter()
        self.pause_source = "default"
        self.changed_at = self.rows.clock.now_ms()
        self.draining = False  # a stop began: paused whatever the intent, until the process ends
        self.on_overrides: Callable[[bytes | None], Any] = lambda raw: None
        self._pause_lock = asyncio.Lock()

    @property
    def current(self) -> str:
        return self.reporter.status

    @property
    def paused(self) -> bool:
        return self.claims.paused

    def report(self, status: QueueStatus, *, force: bool | None = None) -> None:
        if self.reporter.report(status, force=force):
            self._announce()

    def idle(self) -> None:
        """A claim found nothing grantable: ``empty`` until a publish finds work."""
        self.report("empty", force=False)

    def derive(self) -> None:
        """After each publish: ``queued`` only while the published ready set holds grantable work
        (due, not leased, not held), so a fleet told ``queued`` gets jobs when it claims; due rows that
        are all in flight read ``empty`` until a lease ends (never empty mid-load)."""
        status = derive_status(paused=self.claims.paused, serving=self.claims.serving,
                               loading=not self.rows.live, due=len(self.claims.ready))
        if self.reporter.sync(status):
            self._announce()

    def _announce(self) -> asyncio.Task:
        now = self.rows.clock.now_ms()
        self.changed_at = now
        status = self.reporter.status
        for s in STATUSES:
            metrics.queue_status.labels(s).set(1 if s == status else 0)
        self.log.info("queue status", status=status)
        if self.mqtt is not None:
            self.mqtt.publish(status, now)
        row = encode_json({"hostname": self.info.host, "node": self.node, "status": status, "updatedTime": now,
                           "url": self.info.url})
        return self.tasks.spawn(self._write(row))

    async def _write(self, row: bytes) -> None:
        try:
            await self.store.apply([(QUEUE_STATUS + self.node.encode(), row)])
        except Exception as e:
            self.log.warning("queue status write failed", error=repr(e))

    async def sync(self) -> None:
        """Resolve the pause intent (this node's row, then the cluster's), then the status; apply
        changed live config overrides."""
        rows = await self.store.get([QUEUE_CONTROL + self.node.encode(), QUEUE_CONTROL + CLUSTER_SCOPE.encode(),
                                     OVERRIDES_KEY])
        try:  # live config rides on the same read; a failure must not stop pause intent
            self.on_overrides(rows[2])
        except Exception as e:
            metrics.loop_errors.labels("keeper-overrides").inc()
            self.log.error("config overrides failed", error=repr(e)[:500])
        node_row, cluster_row = (decode_json(r) if r else None for r in rows[:2])
        intent = resolve_desired_pause(node_row, cluster_row)
        self.claims.paused = intent.paused or self.draining
        self.pause_source = "stopping" if self.draining and not intent.paused else intent.source
        self.derive()

    async def begin_drain(self) -> None:
        """A stop: ``paused`` at once and for good (claims get ``[]``; a resume or the status sync
        cannot lift it), announced like any change, the status row written before this returns so
        ``GET /queue_status`` says it. Again: nothing new is announced."""
        if self.draining:
            return
        self.draining = True
        self.claims.paused = True
        self.pause_source = "stopping"
        self.reporter.report("paused", force=True)
        await self._announce()

    async def set_pause(self, scope: str, paused: bool | None, by: str, via: Via) -> dict:
        """Write pause intent (None deletes it: a node inherits the cluster's), then re-resolve. The
        fleet's write is conditional on what the row holds (``fleet_write``): refused, it changes
        nothing and the answer says why (``refused``)."""
        key = QUEUE_CONTROL + scope.encode()
        async with self._pause_lock:  # a fleet write reads the row first: no admin write between
            write: bool | str = True
            if via == "fleet":
                [raw] = await self.store.get([key])
                write = fleet_write(decode_json(raw) if raw else None, paused)
                if isinstance(write, str):
                    return {"refused": write, "scope": scope, "node": self.node}
            if write:  # a value of None deletes the row
                await self.store.apply([(key, None if paused is None else encode_json(
                    {"paused": bool(paused), "updatedBy": by, "updatedTime": self.rows.clock.now_ms(), "via": via}))])
        await self.sync()
        return {"scope": scope, "paused": paused, "inherited": paused is None, "node": self.node,
                "local": {"status": self.reporter.status, "paused": self.claims.paused, "source": self.pause_source},
                "appliesRemotelyWithinMs": self.status_sync_ms}

    async def forget_old_host(self) -> None:
        """The status row names the host this node last announced; a different one is cleared."""
        if self.mqtt is None:
            return
        for _ in range(30):  # the store may still be starting
            try:
                [raw] = await self.store.get([QUEUE_STATUS + self.node.encode()])
                break
            except Exception:
                await asyncio.sleep(1)
        else:
            return
        try:
            old = decode_json(raw).get("hostname") if raw else None
        except Exception:
            old = None
        if isinstance(old, str) and old != self.info.host:
            self.mqtt.forget(old)

    def close(self) -> None:
        if self.mqtt is not None:
            self.mqtt.close()
