"""Typed calls to a node's QueueKeeper actor, each under a deadline: what other actors and the ingress
ask of a keeper, as methods tools can follow (``rpc.KeeperApi`` is the part one keeper asks of another)."""

from __future__ import annotations

from typing import Any

from prerender_ray.rpc import call

DEADLINE_S = 10.0
LONG_DEADLINE_S = 30.0  # calls that may go on to another node (a forwarded result, a forwarded put)


class KeeperClient:
    def __init__(self, handle: Any, deadline_s: float = DEADLINE_S, long_deadline_s: float = LONG_DEADLINE_S):
        self.handle = handle
        self.deadline_s = deadline_s
        self.long_deadline_s = long_deadline_s

    async def process_result(self, meta: dict, content: bytes | None, forwarded: bool = False,
                             worker: str | None = None) -> dict:
        return await call(self.handle.process_result.remote(meta, content, forwarded, worker), self.long_deadline_s)

    async def apply_rows(self, rows: list, deletes: list[str]) -> None:
        return await call(self.handle.apply_rows.remote(rows, deletes), self.deadline_s)

    async def put_targets(self, items: list[dict], forwarded: bool = False, absent_only: bool = False,
                          deleted_within_ms: int = 0) -> dict:
        return await call(self.handle.put_targets.remote(items, forwarded, absent_only, deleted_within_ms),
                          self.long_deadline_s)

    async def discover_target(self, url: str, deleted_within_ms: int, forwarded: bool = False) -> dict:
        return await call(self.handle.discover_target.remote(url, deleted_within_ms, forwarded), self.long_deadline_s)

    async def suppress(self, url: str, reason: str | None, status: int | None) -> dict:
        return await call(self.handle.suppress.remote(url, reason, status), self.deadline_s)

    async def adopt(self, rows: list, leases: list) -> int:
        return await call(self.handle.adopt.remote(rows, leases), self.long_deadline_s)
