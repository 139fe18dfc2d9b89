"""What a request handler can reach on its node: config, identity, the node's actors and stores."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prerender_ray.config.compiled import CompiledConfig
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo, Ownership

# Deadlines (seconds) for control-plane calls from a request handler.
STATUS_DEADLINE = 2.0
CALL_DEADLINE = 5.0


@dataclass
class NodeContext:
    cfg: Config
    node: NodeInfo
    data_dir: str
    keeper: Any = None  # actor handles (None in tests that need no Ray)
    leases: Any = None
    store: Any = None
    replica: int = 0
    findings: list = field(default_factory=list)
    ownership: Ownership = field(default_factory=Ownership)
    peers: dict[str, NodeInfo] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ownership.names:
            self.ownership.update([self.node.name])
        self.peers.setdefault(self.node.name, self.node)
        self.compile(self.cfg)
        self._remote: dict[str, Any] = {}

    def compile(self, cfg: Config) -> None:
        """This replica's config version, compiled once (``CompiledConfig``), swapped in one step."""
        self.compiled = CompiledConfig(cfg)
        self.cfg, self.rules = cfg, self.compiled.rules

    def owner_of(self, url: str) -> str:
        return self.ownership.owner(url)

    def owner_actors(self, url: str) -> tuple[Any, Any]:
        """(keeper, lease table) of the node that owns ``url``."""
        owner = self.ownership.owner(url)
        if owner == self.node.name:
            return self.keeper, self.leases
        return self.actor("keeper", owner), self.actor("leases", owner)

    def forget_remote(self) -> None:
        self._remote.clear()

    def actor(self, kind: str, node: str) -> Any:
        from prerender_ray.actors.common import lookup

        handle = self._remote.get(f"{kind}:{node}")
        if handle is None:
            handle = self._remote[f"{kind}:{node}"] = lookup(kind, node)
        return handle
