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
        self._handles: dict[str, Any] = {}  # kind -> Handles

    def compile(self, cfg: Config) -> None:
        """This replica's config version, compiled once (``CompiledConfig``), swapped in one step."""
        self.compiled = CompiledConfig(cfg)
        self.cfg, self.rules = cfg, self.compiled.rules

    def owner_of(self, url: str) -> str:
        return self.ownership.owner(url)

    async def keeper_of(self, url: str) -> Any:
        """The keeper of the node that owns ``url`` (this node's own without a lookup)."""
        owner = self.ownership.owner(url)
        return self.keeper if owner == self.node.name else await self.actor("keeper", owner)

    def forget_remote(self) -> None:
        """Membership changed or a call failed: look every other node's actors up afresh."""
        self._handles.clear()

    async def actor(self, kind: str, node: str) -> Any:
        """A named actor of ``node``, through the one handle cache (``actors.common.Handles``: the
        lookup runs off the event loop, a handle is trusted for seconds)."""
        handles = self._handles.get(kind)
        if handles is None:
            from prerender_ray.actors.common import Handles  # Ray only where a request needs an actor

            handles = self._handles[kind] = Handles(kind)
        return await handles.get(node)
