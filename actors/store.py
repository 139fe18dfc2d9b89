"""NodeStore: the one writer of this node's replicated stores (pages and registry).

Every value is stored in the replication envelope (hybrid-logical-clock version + node), deletes are
tombstones, so the same write can be applied on every node in any order with one outcome. Derived
indexes (targets by sitemap) are maintained here, on every write, local or replicated.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import ray

from prerender_ray import logs
from prerender_ray.config import Config
from prerender_ray.registry import TARGET, TARGET_BY_SITEMAP, Target, by_sitemap_key
from prerender_ray.replication import Clock, payload_of, unwrap, wrap
from prerender_ray.stores import PAGES, REGISTRY, Store, store_path

Op = tuple[bytes, bytes | None]  # (key, payload) ; payload None = delete


@ray.remote
class NodeStore:
    def __init__(self, config: dict, node: str, data_dir: str):
        cfg = Config.model_validate(config)
        logs.setup(node, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="store")
        self.log = logs.get("store")
        self.node = node
        self.cfg = cfg
        self.clock = Clock(node)
        self.pages = Store(store_path(data_dir, node, PAGES))
        self.registry = Store(store_path(data_dir, node, REGISTRY))
        self.started = time.time()
        self.log.info("store open", pages=str(self.pages.path), registry=str(self.registry.path))

    # ------------------------------------------------------------------------------------ writes

    def _index_ops(self, key: bytes, old: bytes | None, new: bytes | None) -> list[Op]:
        """Keep the targets-by-sitemap index in step with a target write."""
        if not key.startswith(TARGET):
            return []
        url = key[len(TARGET):].decode()
        before = _sitemap_of(url, old)
        after = _sitemap_of(url, new)
        if before == after:
            return []
        ops: list[Op] = []
        if before:
            ops.append((by_sitemap_key(before, url), None))
        if after:
            ops.append((by_sitemap_key(after, url), b""))
        return ops

    def _write(self, db: Store, ops: Iterable[Op], *, index: bool) -> list[tuple[bytes, bytes]]:
        """Apply local writes with fresh versions; returns the enveloped records (to ship)."""
        out: list[tuple[bytes, bytes]] = []
        batch: list[tuple[bytes, bytes | None]] = []
        for key, payload in ops:
            record = wrap(self.clock.now(), payload)
            if index:
                batch += self._index_ops(key, payload_of(db.get(key)), payload)
            batch.append((key, record))
            out.append((key, record))
        db.write(batch)
        return out

    async def apply(self, registry: list[Op] = (), pages: list[Op] = ()) -> int:
        """Local writes (targets, control rows, pages); replication to peers ships the same records."""
        n = len(self._write(self.registry, registry, index=True)) if registry else 0
        n += len(self._write(self.pages, pages, index=False)) if pages else 0
        return n

    # ------------------------------------------------------------------------------------- reads

    async def get(self, keys: list[bytes]) -> list[bytes | None]:
        """Registry payloads (None when absent or deleted)."""
        return [payload_of(v) for v in self.registry.get_many(keys)]

    async def get_targets(self, urls: list[str]) -> list[bytes | None]:
        return [payload_of(v) for v in self.registry.get_many([TARGET + u.encode() for u in urls])]

    async def scan(self, prefix: bytes, start: bytes | None = None, limit: int = 1000) -> list[tuple[bytes, bytes]]:
        """Live registry records under ``prefix`` from ``start``, key order, at most ``limit``."""
        out = []
        for k, v in self.registry.items(prefix, start):
            payload = payload_of(v)
            if payload is not None:
                out.append((k, payload))
                if len(out) >= limit:
                    break
        return out

    async def urls_of_sitemap(self, sitemap_url: str, limit: int) -> tuple[list[str], int]:
        """Target URLs attributed to a sitemap (up to ``limit``) and how many there are."""
        prefix = TARGET_BY_SITEMAP + sitemap_url.encode() + b"\x00"
        urls, n = [], 0
        for k in self.registry.keys(prefix):
            n += 1
            if len(urls) < limit:
                urls.append(k[len(prefix):].decode())
        return urls, n

    async def get_pages(self, keys: list[str]) -> list[bytes | None]:
        return [payload_of(v) for v in self.pages.get_many([k.encode() for k in keys])]

    async def page_keys(self, prefix: str, start: str | None, limit: int) -> list[tuple[str, bytes]]:
        out = []
        for k, v in self.pages.items(prefix.encode(), start.encode() if start else None):
            payload = payload_of(v)
            if payload is not None:
                out.append((k.decode(), payload))
                if len(out) >= limit:
                    break
        return out

    async def counts(self) -> dict:
        targets = sum(1 for _, v in self.registry.items(TARGET) if unwrap(v)[1] is not None)
        return {"targets": targets, "pages": self.pages.estimate_keys()}

    async def status(self) -> dict:
        return {"live": True, "pid": os.getpid(), "pages": self.pages.estimate_keys(),
                "registry": self.registry.estimate_keys()}

    async def close(self) -> None:
        for db in (self.pages, self.registry):
            db.flush()
            db.close()


def _sitemap_of(url: str, payload: bytes | None) -> str | None:
    if payload is None:
        return None
    try:
        return Target.decode(url, payload).sitemap_url
    except ValueError:
        return None
