"""Controller: one detached actor that watches Ray's node table and makes sure every alive node has
its store, lease table, keeper and ingress replicas, and that every node knows the membership."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.experimental import internal_kv

from prerender_ray import logs, metrics
from prerender_ray.actors.client import ActorClient, NodeActorClient, spawn
from prerender_ray.actors.common import DeadlineExceeded, controller_membership, placement, untraced
from prerender_ray.actors.keeper.client import DRAIN_SLACK_S, KeeperClient
from prerender_ray.actors.walker.client import WalkerClient
from prerender_ray.config.model import Config
from prerender_ray.identity.membership import Confirmations, Membership, next_epoch
from prerender_ray.identity.nodes import NodeInfo, actor_name, describe_ray_node, valid_name
from prerender_ray.storage.rocks import node_dir
from prerender_ray.timeutil import now_ms

if TYPE_CHECKING:
    from prerender_ray.actors.ingress import IngressClient
    from prerender_ray.actors.leasetable import LeaseClient
    from prerender_ray.actors.store.actor import StoreClient

# The node actors' modules (FastAPI, the keeper, the store...) are imported where a node is placed,
# not at the top: every process that looks the controller up (a store's, keeper's or walker's
# membership check) has Ray import this module to load the handle's class, and paid 0.3-0.7 s of CPU
# importing every actor kind with it.

WATCH_INTERVAL_S = 2.0
STATUS_DEADLINE_S = 3.0
START_DEADLINE_S = 90.0
STARTUP_GRACE_S = 60.0  # actors placed this recently may not answer yet (imports, catch-up, load)
DEAD_CHECK_PASSES = 5  # every ~10 s: is an actor gone for good?
REPLACE_AFTER_S = 30.0  # a node placed (or placed again) this recently is left alone: no crash loop
GONE_PROBE_S = 2.0  # one probe of an actor being killed
EXPECTED_TERMINATION = 1  # Ray's NodeDeathInfo reason for a raylet that ended on its own


class NodeLeaving(RuntimeError):
    """A keeper's membership check while Ray no longer lists its node, or while this controller cannot
    read Ray's list: not confirmed."""


@dataclass
class Placement:
    info: NodeInfo
    store: Any = None
    leases: Any = None
    keeper: Any = None
    sitemapper: Any = None
    ingress: list[Any] = field(default_factory=list)
    error: str | None = None
    alive: bool = True
    placed_at: float = field(default_factory=time.time)

    def handles(self) -> list[Any]:
        return [*self.ingress, self.sitemapper, self.keeper, self.leases, self.store]

    def clients(self) -> NodeClients:
        """The node's actors as typed clients, each call under ``STATUS_DEADLINE_S`` (a stop, a close
        and a drain have their own, built into the method)."""
        from prerender_ray.actors.ingress import IngressClient
        from prerender_ray.actors.leasetable import LeaseClient
        from prerender_ray.actors.store.actor import StoreClient

        d = STATUS_DEADLINE_S
        return NodeClients(StoreClient(self.store, d), LeaseClient(self.leases, d), KeeperClient(self.keeper, d),
                           WalkerClient(self.sitemapper, d), [IngressClient(r, d) for r in self.ingress])


@dataclass
class NodeClients:
    store: StoreClient
    leases: LeaseClient
    keeper: KeeperClient
    walker: WalkerClient
    ingress: list[IngressClient]

    def closed_in_order(self) -> list[NodeActorClient]:
        """After the ingress stopped: the walker, the keeper, the leases, the store last."""
        return [self.walker, self.keeper, self.leases, self.store]


@ray.remote
class Controller:
    def __init__(self, config: dict, data_dir: str, epoch: str):
        untraced(self)
        self.cfg = Config.model_validate(config)
        self.config = config
        logs.setup("controller", level=self.cfg.logging.level, json_lines=self.cfg.logging.json_lines,
                   process="controller")
        self.log = logs.get("controller")
        self.data_dir = data_dir
        self.epoch = epoch
        self.nodes: dict[str, Placement] = {}
        # The membership every node follows: a new epoch for every change of the alive nodes
        # (``next_epoch``: above the last, and at least the wall clock, so a controller placed again
        # starts above every epoch a running process holds).
        # A controller Ray placed again (its node died, or was cut off from Ray's head) starts from
        # the last membership, kept in Ray's store: the nodes it cannot list stay members until the
        # old one's answers to them ran out (``Confirmations``), not dropped while they still grant.
        self.membership: Membership | None = self._recall()
        # A node Ray no longer lists stays a member until it cannot grant any more (it may still run,
        # cut off from this side of a partition): its keys then go to others, granted at once.
        self.confirmations = Confirmations(now_ms())
        self._held_said: set[str] = set()
        self.stopping = False
        self.draining = False
        self._lock = asyncio.Lock()
        self._unwaited: set[asyncio.Future] = set()  # pushes sent and not waited for (kept from the GC)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    # ------------------------------------------------------------------------------------ watching

    async def _watch(self) -> None:
        passes = 0
        while not self.stopping:
            passes += 1
            if self.draining:  # a node placed now would grant while the others say paused
                await asyncio.sleep(WATCH_INTERVAL_S)
                continue
            try:
                await self.sync_nodes()
                if passes % DEAD_CHECK_PASSES == 0:
                    await self._replace_dead()
                if passes % 10 == 0:  # restarted actors learn the membership within ~20 s
                    await self._push_membership()
            except Exception as e:  # the loop must survive anything one pass throws
                metrics.loop_errors.labels("controller").inc()
                self.log.error("node watch failed", error=repr(e))
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def sync_nodes(self) -> None:
        async with self._lock:
            if self.stopping:
                return
            asked = now_ms()  # the list is as fresh as this at least (``Confirmations.held``)
            table = await asyncio.to_thread(ray.nodes)
            alive = [n for n in table if n.get("Alive")]
            seen: dict[str, NodeInfo] = {}
            for raw in alive:
                info = describe_ray_node(raw, default_name=self.cfg.server.node_name, default_port=self.cfg.server.port,
                                         advertise_host=self.cfg.server.advertise_host,
                                         tls=bool(self.cfg.server.tls.cert_file))
                if not valid_name(info.name):
                    self.log.error("node name is not usable", name=info.name, ray_node=info.ray_node_id)
                    continue
                if info.name in seen:
                    self.log.error("two alive nodes share a name; the second is not used", name=info.name,
                                   ray_node=info.ray_node_id)
                    continue
                seen[info.name] = info
            for name, p in self.nodes.items():
                if p.alive and (name not in seen or seen[name].ray_node_id != p.info.ray_node_id):
                    p.alive = False
                    self.log.warning("node left", node=name)
            fresh = [info for name, info in seen.items()
                     if (held := self.nodes.get(name)) is None or not held.alive
                     or held.info.ray_node_id != info.ray_node_id]
            members = self.membership.nodes if self.membership is not None else ()
            # a raylet that ended on its own (SIGTERM, `ray stop`) said so: it runs nothing any more
            ended = {raw.get("NodeID") for raw in table if not raw.get("Alive") and raw.get("DeathReason") == EXPECTED_TERMINATION}
            stopped = [name for name, p in self.nodes.items() if p.info.ray_node_id in ended]
            keep = set(self.confirmations.held([n.name for n in members], [*seen, *stopped], asked))
            if keep and keep != self._held_said:
                self.log.info("nodes Ray lost stay members until they stopped granting", nodes=sorted(keep),
                              leave_at={n: self.confirmations.leaves_at(n) for n in sorted(keep)})
            self._held_said = keep
            changed = self._new_membership([*seen.values(), *(n for n in members if n.name in keep)])
            assert self.membership is not None or not seen
            for info in fresh:  # placed knowing the membership they join (and its epoch)
                self.nodes[info.name] = self._place(info)
            if changed:
                assert self.membership is not None
                self.log.info("membership", epoch=self.membership.epoch, nodes=list(self.membership.names))
                await asyncio.to_thread(self._remember, self.membership)
                await self._push_membership()

    def _new_membership(self, alive: list[NodeInfo]) -> bool:
        """A new epoch when the alive nodes (names or addresses) differ from the membership's; an
        empty list never replaces one."""
        if not alive:
            return False
        if self.membership is not None and set(self.membership.nodes) == set(alive):
            return False
        last = self.membership.epoch if self.membership is not None else 0
        self.membership = Membership(next_epoch(last, now_ms()), tuple(alive))
        return True

    def _wire(self) -> dict | None:
        return self.membership.to_wire() if self.membership is not None else None

    def _kv_key(self) -> bytes:
        return f"prerender-ray/{self.data_dir}/{self.epoch}/membership".encode()

    def _recall(self) -> Membership | None:
        try:
            raw = internal_kv._internal_kv_get(self._kv_key())
            recalled = Membership.from_wire(json.loads(raw)) if raw else None
        except Exception as e:  # unreadable: start from the nodes Ray lists, as before
            self.log.warning("the last membership could not be read", error=repr(e)[:200])
            return None
        if recalled is not None:
            self.log.info("placed again: the last membership", epoch=recalled.epoch, nodes=list(recalled.names))
        return recalled

    def _remember(self, m: Membership | None) -> None:
        try:
            if m is None:
                internal_kv._internal_kv_del(self._kv_key())
            else:
                internal_kv._internal_kv_put(self._kv_key(), json.dumps(m.to_wire()).encode(), overwrite=True)
        except Exception as e:  # a controller placed again would start from the nodes Ray lists
            self.log.warning("the membership could not be kept in Ray's store", error=repr(e)[:200])

    def _place(self, info: NodeInfo) -> Placement:
        """Create (or find, after a controller restart) the node's actors, pinned to it. The current
        membership (every alive node, its epoch) lets a new node catch up from a peer and know what
        it owns from the start."""
        from prerender_ray.actors.ingress import IngressReplicaActor
        from prerender_ray.actors.keeper.actor import QueueKeeperActor
        from prerender_ray.actors.leasetable import LeaseTableActor
        from prerender_ray.actors.store.actor import NodeStoreActor
        from prerender_ray.actors.walker.actor import SitemapWalkerActor

        members = self._wire()
        metrics.prepare_dir(node_dir(self.data_dir, info.name) / "metrics" / self.epoch)
        opts = lambda kind, i=None, **kw: placement(  # noqa: E731
            info.ray_node_id, actor_name(kind, info.name, i), data_dir=self.data_dir, node=info.name,
            epoch=self.epoch, **kw)
        p = Placement(info)
        p.store = spawn(NodeStoreActor, opts("store"), self.config, info.name, self.data_dir, members,
                        controller_membership)  # the store's periodic check asks the controller
        p.leases = spawn(LeaseTableActor, opts("leases"), self.config, info.name, self.data_dir)
        p.keeper = spawn(QueueKeeperActor, opts("keeper"), self.config, dataclasses.asdict(info), self.data_dir,
                         p.leases, p.store, members)
        p.sitemapper = spawn(SitemapWalkerActor, opts("sitemapper"), self.config, dataclasses.asdict(info),
                             self.data_dir, p.store, p.keeper)
        p.ingress = [
            spawn(IngressReplicaActor, opts("ingress", i), self.config, dataclasses.asdict(info), i, self.data_dir,
                  p.keeper, p.leases, p.store)
            for i in range(self.cfg.server.replicas)
        ]
        self.log.info("node placed", node=info.name, url=info.url, replicas=len(p.ingress))
        return p

    async def _replace_dead(self) -> None:
        """Ray restarts a crashed actor, but not one killed for good (``ray kill``, restarts used up):
        its name is free and its node's other actors hold a dead handle. The node is placed again
        whole, as a restart of the node is (its data dir kept)."""
        for name, p in list(self.nodes.items()):
            if not p.alive or time.time() - p.placed_at < REPLACE_AFTER_S:
                continue
            dead = [h for h in p.handles() if await self._is_dead(h)]
            if not dead:
                continue
            async with self._lock:
                if self.stopping or self.nodes.get(name) is not p or not p.alive:
                    continue
                # A node that died takes its actors with it: that is a departure (sync_nodes), and
                # actors placed on it would hold its names until Ray failed them.
                table = await asyncio.to_thread(ray.nodes)
                if not any(n.get("NodeID") == p.info.ray_node_id and n.get("Alive") for n in table):
                    continue
                self.log.error("an actor of the node is gone for good; placing the node again", node=name,
                               dead=[h._ray_actor_id.hex() for h in dead])
                await self._stop_node(p)
                self.nodes[name] = self._place(p.info)

    async def _is_dead(self, handle: Any) -> bool:
        """Dead for good, as the GCS says (a restarting actor is not)."""
        try:
            await ActorClient(handle, STATUS_DEADLINE_S).ready(STATUS_DEADLINE_S)
            return False
        except ray.exceptions.ActorDiedError:
            pass
        except Exception:
            return False  # slow, restarting, unreachable: not known to be dead
        try:
            info = await asyncio.to_thread(ray._private.state.actors, actor_id=handle._ray_actor_id.hex())
        except Exception:
            return False
        return bool(info) and info.get("State") == "DEAD"

    async def _push_membership(self) -> None:
        wire = self._wire()
        if wire is None:
            return
        for p in self.nodes.values():
            if not p.alive:
                continue
            c = p.clients()
            # Each call is sent now (a task), whether or not it is waited for.
            calls = [asyncio.ensure_future(x) for x in (
                *(r.set_membership(wire) for r in c.ingress), c.keeper.set_membership(wire),
                c.store.set_membership(wire), c.walker.set_membership(wire))]
            if time.time() - p.placed_at < STARTUP_GRACE_S:
                # Actors still in __init__ (the keeper loads its rows) run these calls when they are
                # up: Ray queues them. Waiting here only timed out and logged a failure every start.
                for task in calls:
                    self._unwaited.add(task)
                    task.add_done_callback(self._unasked)
                continue
            for task in calls:
                try:
                    await task
                except Exception as e:  # retried every ~20 s
                    self.log.warning("membership push failed", node=p.info.name, error=repr(e))

    # -------------------------------------------------------------------------------------- status

    # The reads a driver makes are sent again to a controller Ray places again: a call that met the
    # old one dying would otherwise say "the controller is gone" (the caller's deadline still holds).
    @ray.method(max_task_retries=-1)
    async def status(self) -> dict:
        nodes = []
        for name in sorted(self.nodes):
            p = self.nodes[name]
            if p.alive:
                nodes.append(await self._node_status(p))
        m = self.membership
        return {"nodes": nodes, "membership": list(m.names) if m else [], "membershipEpoch": m.epoch if m else None,
                "epoch": self.epoch,
                "healthy": bool(nodes) and all(n["healthy"] for n in nodes)}

    async def _node_status(self, p: Placement) -> dict:
        async def ask(client: ActorClient) -> dict:
            try:
                return await client.status()
            except DeadlineExceeded:
                return {"live": False, "reason": "no answer within deadline"}
            except Exception as e:
                return {"live": False, "reason": f"unavailable: {type(e).__name__}"}

        c = p.clients()
        keeper, leases, store, walker = await asyncio.gather(ask(c.keeper), ask(c.leases), ask(c.store),
                                                             ask(c.walker))
        replicas = await asyncio.gather(*(ask(r) for r in c.ingress))
        return node_status(p.info, keeper, leases, store, walker, list(replicas))

    async def membership_wire(self, node: str | None = None) -> dict | None:
        """The membership as a push carries it (``Membership.to_wire``): what an actor that starts,
        checks or missed the pushes applies. None before the first node is seen. ``node``: a
        keeper's check, which confirms its membership (``Confirmations``): refused while it leaves."""
        now = now_ms()
        if node is not None and not self.confirmations.confirm(node, now):
            if not self.confirmations.listed_lately(now):
                raise NodeLeaving(f"not confirmed: this controller has not read Ray's node list for "
                                  f"{(now - self.confirmations.listed_at) / 1000:.0f}s (cut off from Ray's head?)")
            raise NodeLeaving(f"{node} is leaving the membership: Ray no longer lists it")
        return self._wire()

    # -------------------------------------------------------------------------------------- stopping

    @ray.method(max_task_retries=-1)
    async def drain_budget_s(self) -> float:
        """How long a caller of ``drain`` should wait for its answer."""
        return self.cfg.fleet.drain_period / 1000 + DRAIN_SLACK_S

    async def drain(self) -> dict:
        """Before a stop, every node at once: say paused, then accept the results of the leases it
        granted until none is outstanding or ``fleet.drainPeriod`` is over (``Keeper.drain``)."""
        self.draining = True
        period = self.cfg.fleet.drain_period
        nodes = [p for p in self.nodes.values() if p.alive]
        self.log.info("draining", nodes=[p.info.name for p in nodes], period_ms=period)
        reports = await asyncio.gather(*(self._drain_node(p, period) for p in nodes))
        return {"nodes": list(reports), "periodMs": period}

    async def _drain_node(self, p: Placement, period_ms: int) -> dict:
        try:
            return await p.clients().keeper.drain(period_ms)
        except Exception as e:  # the stop goes on: a drain is a courtesy to the fleet, bounded
            self.log.warning("drain failed", node=p.info.name, error=repr(e))
            return {"node": p.info.name, "ended": "failed", "error": repr(e)[:300]}

    async def stop(self) -> dict:
        """Stop every node's actors: ingress first (stop accepting), then walker, keeper, leases, store."""
        async with self._lock:
            self.stopping = True
            self._task.cancel()
            stopped = []
            for p in self.nodes.values():
                await self._stop_node(p)
                stopped.append(p.info.name)
            self.nodes.clear()
            await asyncio.to_thread(self._remember, None)
            return {"stopped": stopped}

    async def _stop_node(self, p: Placement) -> None:
        c = p.clients()
        await asyncio.gather(*(self._quiet(r.stop()) for r in c.ingress))
        for client in c.closed_in_order():
            await self._quiet(client.close())
        handles = p.handles()
        for handle in handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                pass
        # ray.kill returns at once: wait until the processes are gone (their port and their RocksDB
        # locks free), so actors placed right after find them free.
        await asyncio.gather(*(self._gone(h) for h in handles))

    async def _gone(self, handle: Any, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                await ActorClient(handle, GONE_PROBE_S).ready(GONE_PROBE_S)
            except ray.exceptions.RayActorError:
                return
            except Exception:
                pass
            await asyncio.sleep(0.2)

    def _unasked(self, task: asyncio.Future) -> None:
        """A push not waited for is done: its failure is not news (the next push and the checks follow)."""
        self._unwaited.discard(task)
        if not task.cancelled():
            task.exception()

    async def _quiet(self, step: Awaitable[None]) -> None:
        try:
            await step
        except Exception as e:
            self.log.warning("stop step failed", error=repr(e))


def node_status(info: NodeInfo, keeper: dict, leases: dict, store: dict, walker: dict,
                replicas: list[dict]) -> dict:
    """One node's health from its actors' status answers (``{"live": False, "reason": ...}`` for one
    that did not answer): what ``status`` reports per node, and what the LocalNode harness reports."""
    up = sum(1 for r in replicas if r.get("up"))
    return {
        "name": info.name, "url": info.url, "rayNodeId": info.ray_node_id,
        "keeper": {"state": keeper.get("phase", "down"), "rows": keeper.get("rows"),
                   "reason": keeper.get("reason"), "members": keeper.get("members"),
                   "membershipCheckedAt": keeper.get("membershipCheckedAt")},
        "leasesInFlight": leases.get("inFlight"),
        "ingressReplicas": {"up": up, "configured": len(replicas)},
        "queueStatus": keeper.get("queueStatus", "unready"),
        # reported, not part of health: bots and the fleet are served without it
        "sitemapWalker": {"live": bool(walker.get("live")), "running": len(walker.get("running") or []),
                          "reason": walker.get("reason")},
        "errors": [r["error"] for r in replicas if r.get("error")]
        + [x["reason"] for x in (keeper, leases, store) if not x.get("live") and x.get("reason")],
        "healthy": bool(keeper.get("live") and leases.get("live") and store.get("live")) and up == len(replicas),
    }
