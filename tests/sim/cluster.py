"""The simulated cluster: the real parts of several nodes in one process, on the virtual loop.

Each node has the real keeper (``Keeper``, all its parts), the real lease table (``DurableLeases``)
and the real node store (``NodeStore``), each on its own RocksDB in a temp dir, reading time from
the node's virtual clock. They reach each other only through the typed clients (``KeeperClient``,
``LeaseClient``, ``StoreClient``) over ``SimHandle``s, so every call crosses the simulated network,
the node's own calls included (a node's processes are separate actors: they only lose no messages).
A simulated controller assigns membership epochs, pushes them and answers the periodic checks.

Killing a node cancels every task it started (tasks are tagged with their node through a context
variable inherited by every task and callback they create), closes its RocksDBs and keeps the dirs;
a restart opens them again, as Ray restarting the node's actors does.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.actors.keeper.keeper import Keeper
from prerender_ray.actors.leasetable import DurableLeases, LeaseClient
from prerender_ray.actors.store.actor import NodeStore, StoreClient
from prerender_ray.actors.store.replication import SHIP_DEADLINE_S
from prerender_ray.config.loading import parse
from prerender_ray.config.model import Config
from prerender_ray.identity.membership import Confirmations, Membership, next_epoch
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.rpc import call
from prerender_ray.storage.rocks import LEASES, SCHEDULE, Store, store_path
from prerender_ray.timeutil import Clock
from tests.sim.invariants import Oracle
from tests.sim.network import CONTROLLER, Network

NODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_node", default=None)
EPOCH_0_MS = 1_800_000_000_000  # virtual wall clock at loop time 0 (2027-01-15)
SITE = "https://shop.test"


def sim_config(**sections: Any) -> Config:
    raw: dict = {"domains": ["shop.test"], "cluster": {"replicas": 2}, **sections}
    return parse(raw, {}).config


class NodeClock(Clock):
    """A node's view of the virtual time (``skew_ms``: its wall clock's error)."""

    def __init__(self, skew_ms: int = 0):
        self.skew_ms = skew_ms

    def now_ms(self) -> int:
        return EPOCH_0_MS + int(asyncio.get_running_loop().time() * 1000) + self.skew_ms

    def time(self) -> float:
        return self.now_ms() / 1000

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()


class Quiet:
    """A logger that keeps the last lines (a failure prints them) and writes nothing."""

    def __init__(self, node: str, sink: list[str]):
        self.node, self.sink = node, sink

    def _say(self, level: str, event: str, **kw: Any) -> None:
        self.sink.append(f"{self.node} {level} {event} {kw}"[:400])
        if len(self.sink) > 400:
            del self.sink[:200]

    def debug(self, event: str, **kw: Any) -> None:
        pass

    def info(self, event: str, **kw: Any) -> None:
        self._say("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._say("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._say("error", event, **kw)

    exception = error


class SimPeers:
    """``rpc.Peers`` (and the store's handle cache): other nodes' actors over the network."""

    def __init__(self, net: Network, node: str, kind: str, wrap: Callable[[Any], Any]):
        self.net, self.node, self.kind, self.wrap = net, node, kind, wrap

    async def of(self, node: str) -> Any:
        return self.wrap(self.net.handle(self.node, node, self.kind))

    get = of

    async def renew(self, nodes: list[str]) -> None:
        pass


class SimNode:
    """One node's processes, made by ``Cluster``; ``start`` places them, ``kill`` ends them."""

    def __init__(self, cluster: Cluster, name: str):
        self.cluster = cluster
        self.name = name
        self.clock = NodeClock()
        self.up = False
        self.keeper: Keeper | None = None
        self.leases: DurableLeases | None = None
        self.store: NodeStore | None = None
        self.incarnation = 0

    @property
    def data_dir(self) -> Path:
        return self.cluster.root

    def start(self) -> None:
        """Place the node's actors (what a node joining or Ray restarting them does)."""
        c, net, name = self.cluster, self.cluster.net, self.name
        self.incarnation += 1
        c.homes.pop(name, None)  # placed anew: its handle finds Ray's controller
        token = NODE.set(name)
        try:
            m = c.controller.membership
            log = Quiet(name, c.log)
            leases = c.make_leases(c.cfg, Store(store_path(self.data_dir, name, LEASES)), log, self.clock)
            store = c.make_store(c.cfg.model_dump(by_alias=True), name, str(self.data_dir),
                                 m.to_wire() if name in m.names else None, fetch=self._membership, clock=self.clock,
                                 stores=SimPeers(net, name, "store", lambda h: StoreClient(h, SHIP_DEADLINE_S)),
                                 log=log)
            peers = SimPeers(net, name, "keeper", KeeperClient)
            keeper = c.make_keeper(c.cfg, NodeInfo(name, "127.0.0.1", 9926), Store(store_path(self.data_dir, name, SCHEDULE)),
                                   store=StoreClient(net.handle(name, name, "store"), 10.0),
                                   leases=LeaseClient(net.handle(name, name, "leases")),
                                   peers=peers, log=log, membership=m if name in m.names else None,
                                   fetch_membership=self._keeper_membership, clock=self.clock)
            self.keeper, self.leases, self.store = keeper, leases, store
            net.serve(name, "leases", leases)
            net.serve(name, "store", store)
            net.serve(name, "keeper", keeper)
            net.serve(name, "node", NodeFacade(self))
            net.up(name)
            leases.start()
            keeper.start()
        finally:
            NODE.reset(token)
        self.up = True

    async def _membership(self) -> Membership:
        doc = await call(self.cluster.net.handle(self.name, self.cluster.controller_of(self.name), "controller")
                         .membership.remote(), 3.0)
        return Membership.from_wire(doc)

    async def _keeper_membership(self) -> Membership:
        """The keeper's check names its node: the controller's answer confirms it (``Confirmations``)."""
        doc = await call(self.cluster.net.handle(self.name, self.cluster.controller_of(self.name), "controller")
                         .membership.remote(self.name), 3.0)
        return Membership.from_wire(doc)

    async def kill(self) -> None:
        """The node's processes die: their tasks end, their memory is lost, their RocksDBs stay."""
        net = self.cluster.net
        net.down(self.name)
        self.up = False
        mine = [t for t in self.cluster.tasks_of(self.name) if not t.done() and t is not asyncio.current_task()]
        for t in mine:
            t.cancel()
        await asyncio.gather(*mine, return_exceptions=True)
        assert self.keeper is not None and self.leases is not None and self.store is not None
        self.keeper.claims.close()
        self.store.page_log.close()  # its files' lock goes with the process
        for db in (self.keeper.rows.db, self.leases.db, self.store.pages, self.store.registry):
            db.close()
        self.keeper = self.leases = self.store = None


class NodeFacade:
    """What reaches a node from outside in the simulation: the fleet's claims and results (as the
    ingress passes them to its keeper), target writes, and the controller's membership push."""

    def __init__(self, node: SimNode):
        self.node = node

    async def claim(self, limit: int, worker: str) -> list[dict]:
        assert self.node.keeper is not None
        return await self.node.keeper.claims.claim(limit, [worker] * limit)

    async def result(self, meta: dict, content: bytes | None, worker: str) -> dict:
        assert self.node.keeper is not None
        return await self.node.keeper.process_result(meta, content, False, worker)

    async def put_targets(self, items: list[dict]) -> dict:
        assert self.node.keeper is not None
        return await self.node.keeper.put_targets(items)

    async def push_membership(self, doc: dict, to: str = "both") -> None:
        """The controller's push to the keeper, the store, or (``both``) the keeper then the store.
        The real controller sends each process its own call: they arrive in any order, and one may
        be lost (``Cluster.set_members`` sends them apart)."""
        k, s = self.node.keeper, self.node.store
        assert k is not None and s is not None
        if to in ("keeper", "both"):
            await k.handoff.set_membership(Membership.from_wire(doc))
        if to in ("store", "both"):
            await s.set_membership(doc)


class Controller:
    """The simulated controller: the node list, an epoch per change, pushes and the checks' answers.
    ``endpoint``: its address on the network (another one when Ray places a second controller)."""

    def __init__(self, endpoint: str = CONTROLLER, started_ms: int = EPOCH_0_MS) -> None:
        self.endpoint = endpoint
        self.clock = NodeClock()
        self.membership = Membership.of(0, ["nobody"])  # replaced by the cluster's first change
        self.confirmations = Confirmations(started_ms)
        self.lost: set[str] = set()  # members Ray stopped listing while they still run (``Cluster.ray_loses``)
        self.cut_from_ray = False  # on the side of a partition without Ray's head (``Cluster.controller_cut_off``)

    def change(self, names: list[str]) -> Membership:
        self.membership = Membership.of(next_epoch(self.membership.epoch, self.clock.now_ms()), sorted(names))
        return self.membership


class ControllerFacade:
    def __init__(self, controller: Controller):
        self.controller = controller

    async def membership(self, node: str | None = None) -> dict:
        c = self.controller
        if not c.cut_from_ray:  # the real one reads Ray's list every pass (2 s): fresh whenever asked
            c.confirmations.listed(c.clock.now_ms())
        if node is not None and not c.confirmations.confirm(node, c.clock.now_ms()):
            raise ConnectionError(f"{node} is leaving the membership")  # the real one's NodeLeaving
        return c.membership.to_wire()


class Cluster:
    def __init__(self, root: Path, net: Network, cfg: Config | None = None):
        self.root = root
        self.net = net
        self.cfg = cfg or sim_config()
        self.log: list[str] = []
        self.nodes: dict[str, SimNode] = {}
        self.controller = Controller()  # Ray's: the one a node placed now finds
        self.homes: dict[str, str] = {}  # node -> the controller its handle still reaches, when not Ray's
        self.retired: list[Controller] = []  # replaced by Ray, still running where it was cut off
        self.recalls_membership = True  # a controller Ray places again reads the last one (a twin's seam)
        self.oracle = Oracle()
        self._tasks: dict[str, weakref.WeakSet[asyncio.Task]] = {}
        # the seams a broken twin replaces (tests/sim/twins.py)
        self.make_keeper: Callable[..., Keeper] = Keeper
        self.make_leases: Callable[..., DurableLeases] = DurableLeases
        self.make_store: Callable[..., NodeStore] = NodeStore

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tag every task with the node it runs for (none: the driver or the controller)."""
        tasks = self._tasks

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context | None = None) -> asyncio.Task:
            task = asyncio.Task(coro, loop=loop, context=context)
            node = (context or contextvars.copy_context()).get(NODE)
            if node is not None:
                tasks.setdefault(node, weakref.WeakSet()).add(task)
            return task

        loop.set_task_factory(factory)  # type: ignore[arg-type]

        def context_of(node: str) -> contextvars.Context:
            ctx = contextvars.copy_context()
            ctx.run(NODE.set, node)
            return ctx

        self.net.context_of = context_of
        self.net.serve(self.controller.endpoint, "controller", ControllerFacade(self.controller))

    def controller_of(self, node: str) -> str:
        """The controller a node's handle reaches: Ray's, unless it was cut off with an older one."""
        return self.homes.get(node, self.controller.endpoint)

    async def controller_cut_off(self, minority: list[str], detect_s: float) -> None:
        """The controller is cut off with ``minority`` while Ray's head is on the other side: it can
        no longer read Ray's node list, and its nodes' handles still reach it. After ``detect_s``
        (Ray's health checks) Ray declares the minority's nodes dead, the controller among their
        actors, and places a controller on the head's side. It reads the last membership from Ray's
        store (the real one's ``_recall``) and keeps the minority in it until their trust ran out
        (``Confirmations``: the old one may have answered them until a trust after this one's start),
        then drops them: what they granted until then counts as gone with them (``Oracle.node_left``),
        and a grant of theirs after it is a second holder. ``heal`` ends the minority (its raylet is
        told it is dead)."""
        old = self.controller
        majority = [n for n in old.membership.names if n not in minority]
        endpoint = f"{CONTROLLER}{len(self.retired) + 2}"
        self.net.partition({*minority, old.endpoint}, {*majority, endpoint})
        old.cut_from_ray = True
        for name in minority:
            self.homes[name] = old.endpoint
        await asyncio.sleep(detect_s)
        self.log.append(f"t={asyncio.get_running_loop().time():.3f} Ray lists {sorted(minority)} dead and places "
                        f"a controller at {endpoint}")
        new = Controller(endpoint, old.clock.now_ms())
        new.lost = set(minority)
        self.retired.append(old)
        self.controller = new
        self.net.serve(endpoint, "controller", ControllerFacade(new))
        if self.recalls_membership:
            new.membership = old.membership
            await self._drop_when_untrusted(new, minority)
            return
        for name in minority:  # knows nothing: its first membership is the nodes Ray lists
            self.oracle.node_left(name)
        await self.set_members(majority)

    async def _drop_when_untrusted(self, c: Controller, away: list[str]) -> None:
        """The controller keeps ``away`` (Ray no longer lists them) members until their trust ran out."""
        while True:
            members = list(c.membership.names)
            alive = [n for n in members if n not in c.lost]
            if not set(c.confirmations.held(members, alive, c.clock.now_ms())) & set(away):
                break
            await asyncio.sleep(1.0)
        gone = [n for n in away if n in c.membership.names]
        if len(gone) == len(c.membership.names):
            return  # the head is a member: Ray never loses every node at once
        for name in gone:
            self.oracle.node_left(name)
        if gone:
            self.log.append(f"t={asyncio.get_running_loop().time():.3f} the controller drops {gone}")
            await self.set_members([n for n in c.membership.names if n not in gone])

    def retire_cut_off_controllers(self) -> None:
        """After a heal: a controller Ray replaced ran on a node Ray declared dead, and ends with it."""
        for old in self.retired:
            self.net.down(old.endpoint)
        self.retired.clear()
        self.homes.clear()

    def tasks_of(self, node: str) -> list[asyncio.Task]:
        return list(self._tasks.get(node, ()))

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]

    async def ray_loses(self, away: list[str], detect_s: float) -> None:
        """Ray's head is on the controller's side of a partition and stops listing ``away`` after
        ``detect_s`` (its health checks), though they still run, cut off; unless the partition healed
        first. The controller keeps them members until their trust ran out, as the real one does
        (``Confirmations``), then drops them: what they granted until then counts as gone with them
        (``Oracle.node_left``), and a grant of theirs after it is a second holder."""
        await asyncio.sleep(detect_s)
        c = self.controller
        if any(self.net.connected(c.endpoint, n) for n in away):
            return
        c.lost |= set(away)
        self.log.append(f"t={asyncio.get_running_loop().time():.3f} Ray lists {sorted(away)} dead")
        await self._drop_when_untrusted(c, away)

    async def set_members(self, names: list[str], unsent: Collection[tuple[str, str]] = ()) -> Membership:
        """The controller's change: a new epoch, pushed to every member's keeper and store, each its
        own message (either may be lost or overtaken: the periodic checks correct it). ``unsent``:
        (node, "keeper" or "store") pushes lost for sure (a scripted history's shape)."""
        m = self.controller.change(names)
        self.controller.lost -= set(names)  # listed again: a node Ray placed anew
        for name in m.names:
            node = self.nodes.get(name)
            if node is not None and node.up:
                for to in ("keeper", "store"):
                    if (name, to) in unsent:
                        continue
                    fut = self.net.handle(self.controller.endpoint, name, "node").push_membership.remote(m.to_wire(), to)
                    fut.add_done_callback(_quietly)
        return m


def _quietly(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
