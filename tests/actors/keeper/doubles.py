"""In-process stand-ins for the actors a keeper talks to, implementing the same typed interfaces
(``prerender_ray.rpc``) as the real clients: a node store in dicts, and other nodes' keepers as plain
``Keeper`` objects. The lease table is the real one (``actors.leasetable.DurableLeases``) on a temp RocksDB."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from prerender_ray import logs
from prerender_ray.actors.keeper.keeper import Keeper
from prerender_ray.actors.leasetable import DurableLeases
from prerender_ray.config.model import Config
from prerender_ray.identity.membership import Membership
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.rpc import Op
from prerender_ray.storage.history import decoded, head_key, plan_ops, slots_of, summarized
from prerender_ray.storage.pages import PageMeta, decode_meta, retimed
from prerender_ray.storage.registry import target_key
from prerender_ray.storage.rocks import Store
from prerender_ray.storage.touches import Touch, is_touch_key, touch_key
from prerender_ray.timeutil import SYSTEM_CLOCK, Clock


class MemoryStore:
    """``rpc.StoreApi`` over two dicts (registry and pages), with the NodeStore's read semantics:
    freshness records live in ``pages`` under their own keys, a page write deletes its key's, and
    reads apply one whose ETag is the page's (writes here are in order, so it is never older)."""

    def __init__(self) -> None:
        self.registry: dict[bytes, bytes] = {}
        self.pages: dict[bytes, bytes] = {}
        self.history: dict[bytes, bytes] = {}  # render history records (kept apart: tests count pages)
        self.writes = {"page": 0, "freshness": 0}

    @staticmethod
    def _write(db: dict[bytes, bytes], ops: Sequence[Op]) -> int:
        for key, payload in ops:
            assert isinstance(key, bytes)
            if payload is None:
                db.pop(key, None)
            else:
                db[key] = payload
        return len(ops)

    async def apply(self, registry: Sequence[Op], pages: Sequence[Op] | None = None,
                    history: Sequence[list] | None = None) -> int:
        if history:
            keys = [item[0] for item in history]
            self._write(self.history, plan_ops(history, {k: self.history.get(head_key(k)) for k in keys}))
        for key, payload in pages or []:
            assert isinstance(key, bytes)
            if payload is not None:
                self.writes["freshness" if is_touch_key(key) else "page"] += 1
            if not is_touch_key(key):
                self.pages.pop(touch_key(key), None)
        return self._write(self.registry, registry) + self._write(self.pages, pages or [])

    def _page(self, key: str) -> bytes | None:
        payload, touch = self.pages.get(key.encode()), self.pages.get(touch_key(key))
        if payload is None or touch is None:
            return payload
        t = Touch.decode(key, touch)
        return retimed(payload, t.last_cached, t.expires_at) if t.etag == self._meta(payload).headers.get(
            "etag", "") else payload

    @staticmethod
    def _meta(payload: bytes) -> PageMeta:
        return decode_meta(payload)[0]

    async def apply_absent(self, registry: Sequence[Op], deleted_within_ms: int = 0) -> list[bytes | None]:
        # no tombstones here: a delete forgets the key, so a recent one is never seen
        out: list[bytes | None] = []
        for key, payload in registry:
            assert isinstance(key, bytes) and payload is not None
            held = self.registry.get(key)
            if held is None:
                self.registry[key] = payload
            out.append(held)
        return out

    async def apply_if(self, registry: Sequence[Op], expected: list[bytes | None]) -> list[bool]:
        out = []
        for (key, payload), want in zip(registry, expected, strict=True):
            out.append(self.registry.get(key) == want)
            if out[-1]:
                await self.apply([(key, payload)])
        return out

    async def get(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.registry.get(k) for k in keys]

    async def get_targets(self, urls: list[str]) -> list[bytes | None]:
        return [self.registry.get(target_key(u)) for u in urls]

    async def get_pages(self, keys: list[str]) -> list[bytes | None]:
        return [self._page(k) for k in keys]

    async def has_pages(self, keys: list[str]) -> list[bool]:
        return [k.encode() in self.pages for k in keys]

    async def page_metas(self, keys: list[str]) -> list[PageMeta | None]:
        return [self._meta(p) if (p := self._page(k)) is not None else None for k in keys]

    async def targets_and_metas(self, urls: list[str], keys: list[str]) -> tuple[list, list]:
        return await self.get_targets(urls), await self.page_metas(keys)

    async def page_times(self, keys: list[str]) -> list[int | None]:
        return [m.last_cached if m is not None else None for m in await self.page_metas(keys)]

    async def scan(self, prefix: bytes, start: bytes | None = None, limit: int = 1000) -> list[tuple[bytes, bytes]]:
        keys = sorted(k for k in self.registry if k.startswith(prefix) and (start is None or k >= start))
        return [(k, self.registry[k]) for k in keys[:limit]]

    async def render_history(self, key: str, screenshots: bool = False) -> dict:
        entries, reports = slots_of(key, self.history.get(head_key(key)), reports=True)
        got = decoded([self.history.get(k) for k in reports])
        return {"renderHistory": decoded([self.history.get(k) for k in entries]),
                "reports": got if screenshots else [summarized(r) for r in got]}

    async def wait_synced(self, timeout: float) -> dict:
        return {"state": "synced"}


class LocalPeers:
    """``rpc.Peers``: the other nodes' keepers, in this process."""

    def __init__(self) -> None:
        self.keepers: dict[str, Keeper] = {}
        self.renewed: list[list[str]] = []

    async def of(self, node: str) -> Any:
        return self.keepers[node]

    async def renew(self, nodes: list[str]) -> None:
        self.renewed.append(list(nodes))


FIRST_EPOCH = 1  # the membership a keeper made with ``members`` starts at; a test's changes go above it


def make_keeper(tmp: Path, cfg: Config, node: str = "node-a", *, store: MemoryStore | None = None,
                peers: LocalPeers | None = None, members: Sequence[str] = (), clock: Clock = SYSTEM_CLOCK,
                fetch: Callable[[], Awaitable[Membership]] | None = None) -> Keeper:
    """A keeper of ``node`` with its own schedule and lease RocksDBs under ``tmp``; not started (tests
    drive ``load``, publishes and calls themselves). ``fetch``: its controller (None: none)."""
    log = logs.get("keeper-test")
    root = tmp / node
    root.mkdir(parents=True, exist_ok=True)
    leases = DurableLeases(cfg, Store(root / "leases"), log, clock)
    peers = peers if peers is not None else LocalPeers()
    keeper = Keeper(cfg, NodeInfo(node, "127.0.0.1", 9926), Store(root / "schedule"), store=store or MemoryStore(),
                    leases=leases, peers=peers, log=log,
                    membership=Membership.of(FIRST_EPOCH, members) if members else None,
                    fetch_membership=fetch, clock=clock)
    peers.keepers[node] = keeper
    return keeper
