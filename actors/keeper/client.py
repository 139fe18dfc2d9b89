"""Typed calls to a node's QueueKeeper actor, each under a deadline: what other actors and the ingress
ask of a keeper, as methods tools can follow (``rpc.KeeperApi`` is the part one keeper asks of another)."""

from __future__ import annotations

from typing import Any

from prerender_ray.actors.client import MEMBERSHIP_DEADLINE_S, NodeActorClient
from prerender_ray.queue.status import Via
from prerender_ray.rpc import call

DEADLINE_S = 10.0
LONG_DEADLINE_S = 30.0  # calls that may go on to another node (a forwarded result, a forwarded put)
BULK_DEADLINE_S = 120.0  # a sitemap walk's batch (up to 2,000 URLs), written and replicated
DRAIN_SLACK_S = 20.0  # past the drain period: the keeper's settle and its last lease-table look


class KeeperClient(NodeActorClient):
    def __init__(self, handle: Any, deadline_s: float = DEADLINE_S, long_deadline_s: float = LONG_DEADLINE_S):
        self.handle = handle
        self.deadline_s = deadline_s
        self.long_deadline_s = long_deadline_s

    async def process_result(self, meta: dict, content: bytes | None, forwarded: bool = False,
                             worker: str | None = None, epoch: int | None = None) -> dict:
        return await call(self.handle.process_result.remote(meta, content, forwarded, worker, epoch),
                          self.long_deadline_s)

    async def apply_rows(self, rows: list, deletes: list[str], epoch: int | None = None) -> None:
        return await call(self.handle.apply_rows.remote(rows, deletes, epoch), self.deadline_s)

    async def put_targets(self, items: list[dict], forwarded: bool = False, absent_only: bool = False,
                          deleted_within_ms: int = 0, epoch: int | None = None) -> dict:
        return await call(self.handle.put_targets.remote(items, forwarded, absent_only, deleted_within_ms, epoch),
                          self.long_deadline_s)

    async def discover_target(self, url: str, deleted_within_ms: int, forwarded: bool = False,
                              epoch: int | None = None) -> dict:
        return await call(self.handle.discover_target.remote(url, deleted_within_ms, forwarded, epoch),
                          self.long_deadline_s)

    async def suppress(self, url: str, reason: str | None, status: int | None) -> dict:
        return await call(self.handle.suppress.remote(url, reason, status), self.deadline_s)

    async def adopt(self, rows: list, leases: list, epoch: int, fences: list | None = None) -> int:
        return await call(self.handle.adopt.remote(rows, leases, epoch, fences), self.long_deadline_s)

    async def handoff_done(self, sender: str, epoch: int, fence: list | None = None) -> list | None:
        return await call(self.handle.handoff_done.remote(sender, epoch, fence), self.deadline_s)

    # ---------------------------------------------------------- the ingress's (fleet, routes, bots)

    async def claim_json(self, limits: list[int], workers: list[str | None] | None = None) -> list[bytes]:
        return await call(self.handle.claim_json.remote(limits, workers), self.deadline_s)

    async def process_results(self, items: list, forwarded: bool = False) -> list[dict]:
        return await call(self.handle.process_results.remote(items, forwarded), self.long_deadline_s)

    async def revalidate(self, urls: list[str]) -> dict:
        return await call(self.handle.revalidate.remote(urls), self.long_deadline_s)

    async def revalidate_prefix(self, prefix: str, within: int) -> dict:
        return await call(self.handle.revalidate_prefix.remote(prefix, within), self.long_deadline_s)

    async def revalidate_key(self, key: str) -> dict | None:
        return await call(self.handle.revalidate_key.remote(key), self.deadline_s)

    async def render_now(self, key: str) -> int | None:
        return await call(self.handle.render_now.remote(key), self.deadline_s)

    async def diagnose(self, key: str) -> dict:
        return await call(self.handle.diagnose.remote(key), self.deadline_s)

    async def sync_status(self) -> None:
        await call(self.handle.sync_status.remote(), self.deadline_s)

    async def set_pause(self, scope: str, paused: bool | None, by: str, via: Via) -> dict:
        return await call(self.handle.set_pause.remote(scope, paused, by, via), self.deadline_s)

    async def start_reconcile(self) -> dict:
        return await call(self.handle.start_reconcile.remote(), self.deadline_s)

    async def reconcile_status(self) -> dict:
        return await call(self.handle.reconcile_status.remote(), self.deadline_s)

    async def due_times(self, keys: list[str]) -> list[int | None]:
        return await call(self.handle.due_times.remote(keys), self.deadline_s)

    async def schedule_row(self, key: str) -> dict:
        return await call(self.handle.schedule_row.remote(key), self.deadline_s)

    async def queue_state(self) -> tuple[int, dict]:
        return await call(self.handle.queue_state.remote(), self.deadline_s)

    # ------------------------------------------------------------------ a sitemap walk's writes

    async def put_listed(self, sitemap_url: str, urls: list[str], intervals: list[int], dues: list[int | None],
                         forwarded: bool = False, absent_only: bool = False) -> dict:
        return await call(self.handle.put_listed.remote(sitemap_url, urls, intervals, dues, forwarded, absent_only),
                          BULK_DEADLINE_S)

    async def patch_targets(self, items: list[list]) -> dict:
        return await call(self.handle.patch_targets.remote(items), BULK_DEADLINE_S)

    async def delete_targets(self, urls: list[str]) -> dict:
        return await call(self.handle.delete_targets.remote(urls), BULK_DEADLINE_S)

    async def lastmod_due(self, urls: list[str], lastmods: list[int], within: int) -> dict:
        return await call(self.handle.lastmod_due.remote(urls, lastmods, within), BULK_DEADLINE_S)

    # ------------------------------------------------------------------------ the controller's

    async def set_membership(self, wire: dict) -> dict:
        return await call(self.handle.set_membership.remote(wire), MEMBERSHIP_DEADLINE_S)

    async def drain(self, period_ms: int) -> dict:
        """Until the node's granted leases are answered or ``period_ms`` is over (``Keeper.drain``)."""
        return await call(self.handle.drain.remote(period_ms), period_ms / 1000 + DRAIN_SLACK_S)
