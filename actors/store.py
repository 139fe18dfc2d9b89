"""NodeStore: the one writer of this node's replicated stores (pages and registry)."""

from __future__ import annotations

import time

import ray

from prerender_ray import logs
from prerender_ray.config import Config
from prerender_ray.stores import PAGES, REGISTRY, Store, store_path


@ray.remote
class NodeStore:
    def __init__(self, config: dict, node: str, data_dir: str):
        cfg = Config.model_validate(config)
        logs.setup(node, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="store")
        self.log = logs.get("store")
        self.node = node
        self.cfg = cfg
        self.pages = Store(store_path(data_dir, node, PAGES))
        self.registry = Store(store_path(data_dir, node, REGISTRY))
        self.started = time.time()
        self.log.info("store open", pages=str(self.pages.path), registry=str(self.registry.path))

    async def status(self) -> dict:
        return {"live": True, "pages": self.pages.estimate_keys(), "registry": self.registry.estimate_keys()}

    async def close(self) -> None:
        self.pages.flush()
        self.registry.flush()
        self.pages.close()
        self.registry.close()
