"""What a request handler can reach on its node: config, identity, the node's actors and stores."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from prerender_ray import logs
from prerender_ray.actors.client import ActorClient
from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.actors.leasetable import LeaseClient
from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.actors.walker.client import DEADLINE_S as WALKER_DEADLINE_S
from prerender_ray.actors.walker.client import WalkerClient
from prerender_ray.admin.sessions import LoginLimiter
from prerender_ray.compiled import CompiledConfig
from prerender_ray.config.loading import findings
from prerender_ray.config.model import Config
from prerender_ray.config.overrides import LiveConfig
from prerender_ray.identity.nodes import NodeInfo, Ownership
from prerender_ray.queue.targets import Rules

if TYPE_CHECKING:  # what the routes make on first use (they import this module)
    import httpx

    from prerender_ray.actors.ingress import IngressClient
    from prerender_ray.api.admin.common import HeavySlots
    from prerender_ray.api.admin.overview import CountsSnapshot
    from prerender_ray.api.auth import Authenticator
    from prerender_ray.batching import GroupCommit
    from prerender_ray.serving.proxies import Proxies
    from prerender_ray.serving.verification import Resolver

log = logs.get("api")

# Deadlines (seconds) for control-plane calls from a request handler.
STATUS_DEADLINE = 2.0
CALL_DEADLINE = 5.0
READ_DEADLINE_S = 10.0  # the node clients' own: a route that needs another passes it (``within``)

C = TypeVar("C", bound=ActorClient)
T = TypeVar("T")


class HoldersUnavailable(Exception):
    """No node that holds a URL's target and pages answered a read within its deadline
    (``NodeContext.read_from_holders``): the route answers 503 naming each holder asked and why."""

    def __init__(self, url: str, failed: dict[str, str]):
        super().__init__(f"no holder of {url} answered: {failed}")
        self.url = url
        self.failed = failed  # node -> what became of its read


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
    """A route's view of its node. The constructor takes actor handles (Ray's, or ``rpc.Local`` ones in
    the LocalNode harness); routes see only typed clients: ``keeper``, ``leases`` and ``store`` of this
    node, ``keeper_at``/``store_at``/``walker_at``/``ingress_at`` of any node."""

    # What a replica makes on first use and keeps (None until then); set by the module that uses it.
    heavy_slots: HeavySlots | None = None  # api/admin/common.py
    admin_http: httpx.AsyncClient | None = None  # api/admin/explain.py
    counts: CountsSnapshot | None = None  # api/admin/overview.py
    proxies: Proxies | None = None  # api/auth.py
    authenticator: Authenticator | None = None  # api/auth.py
    claims: GroupCommit[tuple[int, str | None], bytes] | None = None  # api/render_queue.py
    results: GroupCommit[tuple[dict, bytes | None, str | None, int], dict] | None = None  # api/render_queue.py
    ready: tuple[float, bool, dict] | None = None  # api/health.py: (taken at, ready, body)
    reserved_paths: tuple[str, ...] | None = None  # api/app.py: our own routes, never bot requests
    peer_failures: LoginLimiter | None = None  # api/peer.py: wrong peer tokens per client address

    def __init__(self, cfg: Config, node: NodeInfo, data_dir: str, keeper: Any = None, leases: Any = None,
                 store: Any = None, replica: int = 0, findings: list | None = None,
                 ownership: Ownership | None = None, peers: dict[str, NodeInfo] | None = None,
                 started: float | None = None, lookup: Callable[[str, str], Awaitable[Any]] | None = None,
                 resolver: Resolver | None = None):
        self.node = node
        self.data_dir = data_dir
        # This node's actors (handles are None in tests that need no actor: a call then fails).
        self.keeper = KeeperClient(keeper)
        self.leases = LeaseClient(leases)
        self.store = StoreClient(store, READ_DEADLINE_S)
        self.replica = replica
        self.ownership = ownership if ownership is not None else Ownership()
        self.peers = peers if peers is not None else {}
        self.started = time.time() if started is None else started
        self.bot_resolver = resolver  # a test's fake DNS for bot verification; None: the system's
        if not self.ownership.names:
            self.ownership.update([self.node.name])
        self.peers.setdefault(self.node.name, self.node)
        # Everything read from the config is read through this one reference, so a config change
        # is one assignment (``prerender_ray.api.bot.replica.reconfigure``).
        self.state: ReplicaConfig = ReplicaConfig(CompiledConfig(cfg), list(findings or []), LiveConfig(cfg))
        self._handles: dict[str, Any] = {}  # kind -> Handles
        # How another node's actors are found: Ray's named actors by default; the LocalNode harness
        # and the simulated cluster pass their own (kind, node) -> handle.
        self._lookup = lookup

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
        """Does this node hold ``url``'s target and pages? Every member does while R >= the node count;
        a node the membership no longer lists (it left while it still runs) holds nothing."""
        names = self.ownership.names
        return self.node.name in names and (len(names) <= self.cfg.cluster.replicas
                                            or self.node.name in self.holders_of(url))

    def read_order(self, url: str) -> tuple[str, ...]:
        """The nodes whose stores a read of ``url``'s target and pages asks, in turn: this one first
        when it holds them (no hop), then the URL's holders, the owner first."""
        holders = self.holders_of(url)
        if self.holds(url):
            return (self.node.name, *(h for h in holders if h != self.node.name))
        return holders

    async def read_from_holders(self, url: str, read: Callable[[StoreClient], Awaitable[T]],
                                deadline_s: float) -> T:
        """``read`` (given a holder's store client, bounded by what is left of ``deadline_s``) from
        the first holder of ``url`` to answer, asked in ``read_order``. The next holder is asked when
        one has not answered within ``cluster.holderReadTimeoutMs`` or failed; the slower ones are still
        heard, so a loaded holder is not given up on while another is asked (a cut-off owner once made
        ``GET /render_targets`` a 503 while the URL's other holder was up). The holders hold the same
        records, so the first answer is the answer. ``HoldersUnavailable`` when none answered in time."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        turn_s = self.cfg.cluster.holder_read_timeout_ms / 1000
        order = self.read_order(url)
        asked: dict[asyncio.Future[T], str] = {}
        failed: dict[str, str] = {}
        try:
            for i, node in enumerate(order):
                if loop.time() >= end:
                    break
                asked[asyncio.ensure_future(self._read_at(node, read, end - loop.time()))] = node
                until = end if i == len(order) - 1 else min(end, loop.time() + turn_s)
                while asked:
                    done, _ = await asyncio.wait(asked, timeout=max(0.0, until - loop.time()),
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if not done:
                        break  # the next holder's turn (or the deadline)
                    answers = []
                    for call_ in done:  # every one looked at: no failure is left unretrieved
                        holder = asked.pop(call_)
                        error = asyncio.CancelledError() if call_.cancelled() else call_.exception()
                        if error is None:
                            answers.append(call_.result())
                        else:
                            failed[holder] = type(error).__name__
                            log.info("holder read failed", url=url, holder=holder,
                                     error=f"{type(error).__name__}: {str(error)[:200]}")
                            self.forget_remote()  # a stale handle is looked up afresh
                    if answers:
                        return answers[0]
        finally:
            for call_, holder in asked.items():
                call_.cancel()
                failed.setdefault(holder, f"no answer within {deadline_s:g}s")
        raise HoldersUnavailable(url, failed)

    async def _read_at(self, node: str, read: Callable[[StoreClient], Awaitable[T]], deadline_s: float) -> T:
        store = await self.store_at(node)
        return await read(store.within(deadline_s))

    async def keeper_of(self, url: str) -> KeeperClient:
        """The keeper of the node that owns ``url``."""
        return await self.keeper_at(self.ownership.owner(url))

    async def keeper_at(self, node: str) -> KeeperClient:
        return self.keeper if node == self.node.name else await self._client("keeper", node, KeeperClient)

    async def store_at(self, node: str) -> StoreClient:
        if node == self.node.name:
            return self.store
        return await self._client("store", node, lambda handle: StoreClient(handle, READ_DEADLINE_S))

    async def walker_at(self, node: str) -> WalkerClient:
        return await self._client("sitemapper", node, lambda handle: WalkerClient(handle, WALKER_DEADLINE_S))

    async def ingress_at(self, node: str, index: int) -> IngressClient:
        """Ingress replica ``index`` of ``node`` (a lookup is given the node as ``node:index``: the
        replica's actor name is ``ingress:node:index``)."""
        from prerender_ray.actors.ingress import IngressClient  # it imports this module

        if self._lookup is not None:
            handle = await self._lookup("ingress", f"{node}:{index}")
        else:
            from prerender_ray.actors.common import lookup_async  # Ray only where a request needs an actor

            handle = await lookup_async("ingress", node, index)
        return IngressClient(handle, CALL_DEADLINE)

    async def sitemap_urls(self, sitemap: str, limit: int, deadline_s: float) -> tuple[list[str], int]:
        """The targets attributed to ``sitemap`` across the cluster (``actors/store/everywhere.py``)."""
        from prerender_ray.actors.store.everywhere import urls_of_sitemap

        return await urls_of_sitemap(sitemap, limit, node=self.node.name, names=self.ownership.names,
                                     replicas=self.cfg.cluster.replicas, local=self.store,
                                     store_of=self.store_at, deadline_s=deadline_s)

    @property
    def has_lookup(self) -> bool:
        """Other nodes' actors are found by the lookup given (a test harness), not by Ray."""
        return self._lookup is not None

    def forget_remote(self) -> None:
        """Membership changed or a call failed: look every other node's actors up afresh."""
        self._handles.clear()

    async def _client(self, kind: str, node: str, wrap: Callable[[Any], C]) -> C:
        """A named actor of ``node`` as its client, through the one handle cache (``actors.common.Handles``:
        the lookup runs off the event loop, a handle is trusted for seconds)."""
        if self._lookup is not None:
            return wrap(await self._lookup(kind, node))
        handles = self._handles.get(kind)
        if handles is None:
            from prerender_ray.actors.common import Handles  # Ray only where a request needs an actor

            handles = self._handles[kind] = Handles(kind, wrap=wrap)
        return await handles.get(node)
