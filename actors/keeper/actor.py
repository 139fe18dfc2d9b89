"""QueueKeeper: holds every schedule row this node owns in memory and is their only writer.

This actor is a shell: it opens the node's schedule store, builds the typed clients of the other
actors, wires a ``Keeper`` (``keeper.py``) and forwards each call to the part that answers it. It
loads the schedule store (serving claims from the first chunk on), publishes the ready set every
second, grants claims through the LeaseTable, applies render results and target changes, and reports
the node's queue status on change. RocksDB is the durable side: every write lands there before it
is acknowledged.
"""

from __future__ import annotations

import functools
import gc
from typing import Any

import ray

from prerender_ray import logs
from prerender_ray.actors.common import Handles, bulk_gc, controller_membership, untraced
from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.actors.keeper.keeper import Keeper
from prerender_ray.actors.leasetable import LeaseClient
from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.config.model import Config
from prerender_ray.identity.membership import Membership
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.queue.status import Via
from prerender_ray.storage.pagelog.mirror import RETRY_AFTER_S, refusal
from prerender_ray.storage.rocks import SCHEDULE, Store, store_path

LEASE_DEADLINE_S = 5.0
STORE_DEADLINE_S = 10.0


def _freeze_loaded_rows() -> None:
    """The rows live as long as the process: keep the cyclic GC from walking them every pass, and
    let bulk writes (sitemaps) allocate without a collection every few hundred objects."""
    gc.collect()
    gc.freeze()
    bulk_gc()


class QueueKeeper:
    """The shell, plain: ``QueueKeeperActor`` below is what Ray places. ``membership`` is the
    controller's at placement (``Membership.to_wire``; None: this node alone); ``peers`` (other nodes'
    keepers) and ``fetch_membership`` (the controller's current membership) default to Ray's; the
    LocalNode harness and the simulated cluster pass their own."""

    def __init__(self, config: dict, node: dict, data_dir: str, leases: Any, store: Any,
                 membership: dict | None = None, peers: Any = None,
                 fetch_membership: Any = None):
        untraced(self)
        cfg = Config.model_validate(config)
        info = NodeInfo(**node)
        logs.setup(info.name, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="keeper")
        log = logs.get("keeper")
        broadcaster = None
        m = cfg.fleet.mqtt
        if m.url:
            from prerender_ray.actors.fleet_mqtt import StatusBroadcaster

            broadcaster = StatusBroadcaster(m, info.host, info.name, m.password or None, log)
        self.keeper = Keeper(
            cfg, info, Store(store_path(data_dir, info.name, SCHEDULE), memtable_bloom=False),  # written blind
            store=StoreClient(store, STORE_DEADLINE_S), leases=LeaseClient(leases, LEASE_DEADLINE_S),
            peers=peers if peers is not None else Handles("keeper", wrap=KeeperClient), log=log,
            membership=Membership.from_wire(membership) if membership is not None else None,
            fetch_membership=fetch_membership or functools.partial(controller_membership, node=info.name),
            broadcaster=broadcaster, after_load=_freeze_loaded_rows)
        self.keeper.start()

    # ------------------------------------------------------------------------- the render fleet

    async def claim_json(self, limits: list[int], workers: list[str | None] | None = None) -> list[bytes]:
        return await self.keeper.claims.claim_json(limits, workers)

    async def claim(self, limit: int, workers: list[str | None] | None = None) -> list[dict]:
        return await self.keeper.claims.claim(limit, workers)

    async def process_result(self, meta: dict, content: bytes | None, forwarded: bool = False,
                             worker: str | None = None, epoch: int | None = None) -> dict:
        return await self.keeper.process_result(meta, content, forwarded, worker, epoch)

    async def process_results(self, items: list, forwarded: bool = False) -> list[dict]:
        """[meta, content, worker] each; one answer each, ``{"error": ...}`` for one that failed."""
        answers = await self.keeper.results.process_many(items, forwarded)
        return [_failed(a) if isinstance(a, BaseException) else a for a in answers]

    # ---------------------------------------------------------------------------------- targets

    async def put_targets(self, items: list[dict], forwarded: bool = False, absent_only: bool = False,
                          deleted_within_ms: int = 0, epoch: int | None = None) -> dict:
        return await self.keeper.put_targets(items, forwarded, absent_only, deleted_within_ms, epoch)

    async def put_listed(self, sitemap_url: str, urls: list[str], intervals: list[int],
                         dues: list[int | None], forwarded: bool = False, absent_only: bool = False) -> dict:
        return await self.keeper.targets.put_listed(sitemap_url, urls, intervals, dues, forwarded, absent_only)

    async def discover_target(self, url: str, deleted_within_ms: int, forwarded: bool = False,
                              epoch: int | None = None) -> dict:
        return await self.keeper.discover_target(url, deleted_within_ms, forwarded, epoch)

    async def patch_targets(self, items: list[list]) -> dict:
        return await self.keeper.targets.patch_targets(items)

    async def delete_targets(self, urls: list[str]) -> dict:
        return await self.keeper.targets.delete_targets(urls)

    async def suppress(self, url: str, reason: str | None, status: int | None) -> dict:
        return await self.keeper.targets.suppress(url, reason, status)

    async def revalidate(self, urls: list[str]) -> dict:
        return await self.keeper.targets.revalidate(urls)

    async def revalidate_prefix(self, prefix: str, within: int) -> dict:
        return await self.keeper.targets.revalidate_prefix(prefix, within)

    async def lastmod_due(self, urls: list[str], lastmods: list[int], within: int) -> dict:
        return await self.keeper.targets.lastmod_due(urls, lastmods, within)

    async def revalidate_key(self, key: str) -> dict | None:
        return await self.keeper.targets.revalidate_key(key)

    async def render_now(self, key: str) -> int | None:
        return await self.keeper.targets.render_now(key)

    async def apply_rows(self, rows: list[ScheduleRow], deletes: list[str], epoch: int | None = None) -> None:
        await self.keeper.apply_rows(rows, deletes, epoch)

    async def diagnose(self, key: str) -> dict:
        return await self.keeper.diagnose(key)

    # ------------------------------------------------------------------------- status, control

    async def status(self) -> dict:
        return self.keeper.state()

    async def sync_status(self) -> None:
        await self.keeper.status.sync()

    async def set_pause(self, scope: str, paused: bool | None, by: str, via: Via) -> dict:
        return await self.keeper.status.set_pause(scope, paused, by, via)

    def apply_overrides(self, raw: bytes | None) -> dict:
        return self.keeper.apply_overrides(raw)

    async def drain(self, period_ms: int) -> dict:
        return await self.keeper.drain(period_ms)

    # ------------------------------------------------------------------------------ membership

    async def set_membership(self, wire: dict) -> dict:
        """A push from the controller (``Membership.to_wire``); malformed is a ValueError, no change."""
        return await self.keeper.handoff.set_membership(Membership.from_wire(wire))

    async def adopt(self, rows: list[ScheduleRow], leases: list, epoch: int, fences: list | None = None) -> int:
        return await self.keeper.adopt(rows, leases, epoch, fences)

    async def handoff_done(self, sender: str, epoch: int, fence: list | None = None) -> list | None:
        return await self.keeper.handoff_done(sender, epoch, fence)

    # ---------------------------------------------------------------------------------- repair

    async def verify(self) -> dict:
        return await self.keeper.rows.verify()

    async def reconcile(self, *, departed: list[str] | None = None) -> dict:
        return await self.keeper.repair.reconcile(departed=departed)

    async def start_reconcile(self) -> dict:
        return self.keeper.repair.start()

    async def reconcile_status(self) -> dict:
        return self.keeper.repair.status()

    # ------------------------------------------------------------------------------ admin reads

    async def due_times(self, keys: list[str]) -> list[int | None]:
        return self.keeper.due_times(keys)

    async def schedule_row(self, key: str) -> dict:
        return await self.keeper.schedule_row(key)

    async def queue_state(self) -> tuple[int, dict]:
        return await self.keeper.queue_state()

    async def close(self) -> None:
        await self.keeper.close()


QueueKeeperActor = ray.remote(QueueKeeper)


def _failed(e: BaseException) -> dict:
    """A result's failure as its answer; a store that refused it (its page log is full) asks the fleet
    to come back later (``retryAfter``: the route's ``Retry-After``)."""
    if refusal(e) is not None:
        return {"error": f"the page store refused the result: {refusal(e)}"[:500], "retryAfter": RETRY_AFTER_S}
    return {"error": repr(e)[:500]}
