"""QueueKeeper: holds every schedule row this node owns in memory and is their only writer."""

from __future__ import annotations

import asyncio
import time

import ray

from prerender_ray import logs, metrics
from prerender_ray.config import Config
from prerender_ray.stores import SCHEDULE, Store, store_path


@ray.remote
class QueueKeeper:
    def __init__(self, config: dict, node: str, data_dir: str, leases, store):
        cfg = Config.model_validate(config)
        logs.setup(node, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="keeper")
        self.log = logs.get("keeper")
        self.cfg = cfg
        self.node = node
        self.leases = leases
        self.store = store
        self.db = Store(store_path(data_dir, node, SCHEDULE))
        self.phase = "loading"
        self.rows = 0
        self.load_ms: float | None = None
        self._load_task = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        t0 = time.perf_counter()
        n = 0
        for _ in self.db.keys():
            n += 1
            if n % 10_000 == 0:
                await asyncio.sleep(0)  # serve calls while loading
        self.rows = n
        self.load_ms = (time.perf_counter() - t0) * 1000
        self.phase = "live"
        metrics.keeper_rows.set(n)
        metrics.keeper_live.set(1)
        self.log.info("keeper live", rows=n, load_ms=round(self.load_ms, 1))

    async def status(self) -> dict:
        return {"phase": self.phase, "live": self.phase == "live", "rows": self.rows, "loadMs": self.load_ms}

    async def close(self) -> None:
        self._load_task.cancel()
        self.db.flush()
        self.db.close()
