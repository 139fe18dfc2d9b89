"""What a request handler can reach on its node: config, identity, the node's actors and stores."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prerender_ray.compiled import CompiledConfig
from prerender_ray.config.loading import findings
from prerender_ray.config.model import Config
from prerender_ray.config.overrides import LiveConfig
from prerender_ray.identity.nodes import NodeInfo, Ownership
from prerender_ray.queue.targets import Rules

# Deadlines (seconds) for control-plane calls from a request handler.
STATUS_DEADLINE = 2.0
CALL_DEADLINE = 5.0


@dataclass(frozen=True, eq=False)
class ReplicaConfig:
    """The config a replica runs: one version compiled once (``CompiledConfig``), its findings and
    the live overrides. Replaced whole when a live option changes: once the bot path is open, by a
    ``prerender_ray.api.bot.replica.ReplicaState``, which extends it with the services built from it."""

    compiled: CompiledConfig
    findings: list
    live: LiveConfig  # the file's config plus the overrides row: one per replica, carried over

    @property
    def cfg(self) -> Config:
        return self.compiled.cfg

    @property
    def rules(self) -> Rules:
        return self.compiled.rules

    @classmethod
    def of(cls, cfg: Config, live: LiveConfig, found: list | None = None) -> ReplicaConfig:
        """``found`` are the config's findings when the caller has them; else they are derived."""
        compiled = CompiledConfig(cfg)
        if found is None:
            found = findings(cfg, compiled.router.compiled.prerender_count)
        return cls(compiled, found, live)


class NodeContext:
    def __init__(self, cfg: Config, node: NodeInfo, data_dir: str, keeper: Any = None, leases: Any = None,
                 store: Any = None, replica: int = 0, findings: list | None = None,
                 ownership: Ownership | None = None, peers: dict[str, NodeInfo] | None = None,
                 started: float | None = None, extras: dict[str, Any] | None = None):
        self.node = node
        self.data_dir = data_dir
        self.keeper = keeper  # actor handles (None in tests that need no Ray)
        self.leases = leases
        self.store = store
        self.replica = replica
        self.ownership = ownership if ownership is not None else Ownership()
        self.peers = peers if peers is not None else {}
        self.started = time.time() if started is None else started
        self.extras = extras if extras is not None else {}
        if not self.ownership.names:
            self.ownership.update([self.node.name])
        self.peers.setdefault(self.node.name, self.node)
        # Everything read from the config is read through this one reference, so a config change
        # is one assignment (``prerender_ray.api.bot.replica.reconfigure``).
        self.state: ReplicaConfig = ReplicaConfig(CompiledConfig(cfg), list(findings or []), LiveConfig(cfg))
        self._handles: dict[str, Any] = {}  # kind -> Handles

    @property
    def cfg(self) -> Config:
        return self.state.cfg

    @property
    def rules(self) -> Rules:
        return self.state.rules

    @property
    def findings(self) -> list:
        return self.state.findings

    @property
    def compiled(self) -> CompiledConfig:
        return self.state.compiled

    def owner_of(self, url: str) -> str:
        return self.ownership.owner(url)

    def holders_of(self, url: str) -> tuple[str, ...]:
        """The nodes that hold ``url``'s target and pages, the owner first (``cluster.replicas``)."""
        return self.ownership.holders(url, self.cfg.cluster.replicas)

    def holds(self, url: str) -> bool:
        """Does this node hold ``url``'s target and pages? (Every node does while R >= the node count.)"""
        return len(self.ownership.names) <= self.cfg.cluster.replicas or self.node.name in self.holders_of(url)

    async def keeper_of(self, url: str) -> Any:
        """The keeper of the node that owns ``url`` (this node's own without a lookup)."""
        owner = self.ownership.owner(url)
        return self.keeper if owner == self.node.name else await self.actor("keeper", owner)

    async def store_of(self, url: str) -> Any:
        """The store to read ``url``'s target and pages from: this node's when it holds them, else the
        URL's owner's (the first holder)."""
        if self.holds(url):
            return self.store
        return await self.actor("store", self.holders_of(url)[0])

    async def sitemap_urls(self, sitemap: str, limit: int, deadline_s: float) -> tuple[list[str], int]:
        """The targets attributed to ``sitemap`` across the cluster (``actors/store/everywhere.py``)."""
        from prerender_ray.actors.store.everywhere import urls_of_sitemap

        return await urls_of_sitemap(sitemap, limit, node=self.node.name, names=self.ownership.names,
                                     replicas=self.cfg.cluster.replicas, local=self.store,
                                     store_of=lambda n: self.actor("store", n), deadline_s=deadline_s)

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
