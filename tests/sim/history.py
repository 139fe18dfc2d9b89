"""One simulated history: a seeded random walk of client actions and faults over a cluster, the
invariants checked after every step and at quiescence.

``simulate(seed)`` is the whole of it: the same seed gives the same history, the same network
trace and the same outcome (``Outcome.digest``). A failure raises ``SimFailure``, which names the
seed, the step and the invariant, and says how to replay it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prerender_ray.rpc import call
from tests.sim.cluster import SITE, Cluster, SimNode, sim_config
from tests.sim.invariants import ObservedLeases, Violation, observed
from tests.sim.loop import SimStuck, run
from tests.sim.network import CLIENT, CONTROLLER, Faults, Network

NAMES = ("n1", "n2", "n3", "n4", "n5")
PATHS = [f"/p{i}" for i in range(30)]
HTML = b"<html><body>rendered in the simulation</body></html>"
SETTLE_S = 600.0  # quiescence: membership checks (5 s), hand-off and rebalance retries (30 s), pushes on (15 s)


class SimFailure(AssertionError):
    def __init__(self, seed: int, step: int, cause: BaseException, tail: list[str]):
        name = cause.name if isinstance(cause, Violation) else type(cause).__name__
        super().__init__(f"simulation seed {seed} failed at step {step}: {cause}\n"
                         f"replay: SIM_SEED={seed} .venv/bin/python -m pytest -q tests/sim -k replay\n"
                         + "\n".join(tail[-30:]))
        self.seed, self.step, self.invariant, self.log = seed, step, name, tail


@dataclass
class Outcome:
    seed: int
    steps: int
    trace: list = field(repr=False)
    stats: dict = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return hashlib.sha256(repr(self.trace).encode()).hexdigest()[:16]


@dataclass
class Job:
    job: dict
    worker: str
    at: float


class World:
    """The driver: the cluster, its clients (a fleet of workers) and the oracle."""

    def __init__(self, seed: int, root: Path, faults: Faults, twin: Callable[[Cluster], None] | None,
                 replicas: int = 2, queue: dict | None = None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.net = Network(random.Random(self.rng.getrandbits(64)), faults)
        self.faults = faults
        self.cluster = Cluster(root, self.net, sim_config(cluster={"replicas": replicas}, queue=queue or {}))
        self.oracle = self.cluster.oracle
        self.cluster.make_leases = observed(ObservedLeases, self.oracle)
        if twin is not None:
            twin(self.cluster)
        self.jobs: list[Job] = []
        self.away: list[str] = []  # the two members ``lose_two`` took out, until ``back_together``
        self.background: list[asyncio.Future] = []  # the controller's drops after a partition
        self.strays = True
        self.log: list[str] = []
        self.step = 0

    def say(self, *what: Any) -> None:
        line = f"[{self.step}] t={asyncio.get_running_loop().time():.3f} " + " ".join(map(str, what))
        self.log.append(line)
        self.net.trace.append(("step", self.step, " ".join(map(str, what))))

    async def client_call(self, node: str, method: str, *args: Any, deadline: float = 30.0) -> Any:
        """A client outside the cluster (the fleet, an API user) calls a node's front door."""
        return await call(getattr(self.net.handle(CLIENT, node, "node"), method).remote(*args), deadline)

    # ------------------------------------------------------------------------------- actions

    def pick_live(self) -> SimNode | None:
        live = [n for n in self.cluster.nodes.values() if n.up]
        return self.rng.choice(live) if live else None

    async def put(self, on: str | None = None, after: float = 0.0) -> None:
        """A target write through a live node (``on``: that one, ``after`` seconds from now)."""
        if after:
            await asyncio.sleep(after)
        node = self.pick_live() if on is None else self.cluster.nodes[on]
        if node is None or not node.up:
            return
        urls = [SITE + p for p in self.rng.sample(PATHS, self.rng.randint(1, 4))]
        self.say("put", node.name, urls)
        try:
            answer = await self.client_call(node.name, "put_targets", [{"url": u, "nextRenderTime": 1} for u in urls])
        except Exception as e:
            self.say("put failed", type(e).__name__)
            return
        if answer.get("written") == len(urls):
            self.oracle.targets.update(urls)

    async def claim(self) -> None:
        node = self.pick_live()
        if node is None:
            return
        worker = f"w{self.rng.randint(1, 4)}"
        try:
            jobs = await self.client_call(node.name, "claim", self.rng.randint(1, 5), worker, deadline=10.0)
        except Exception as e:
            self.say("claim failed", node.name, type(e).__name__)
            return
        self.say("claimed", node.name, worker, [j["id"] for j in jobs])
        now = asyncio.get_running_loop().time()
        self.jobs += [Job(j, worker, now) for j in jobs]

    async def result(self, replay: bool = False) -> None:
        node = self.pick_live()
        if node is None or not self.jobs:
            return
        i = self.rng.randrange(len(self.jobs))
        job = self.jobs[i] if replay else self.jobs.pop(i)
        j = job.job
        meta = {"id": j["id"], "url": j["url"], "statusCode": 200, "outcome": "rendered", "renderTime": 100,
                "headers": {"content-type": "text/html; charset=utf-8"}}
        self.say("result", node.name, job.worker, j["id"], "replay" if replay else "")
        try:
            answer = await self.client_call(node.name, "result", meta, HTML, job.worker)
        except Exception as e:
            self.say("result failed", type(e).__name__)
            if not replay and self.rng.random() < 0.5:
                self.jobs.append(job)  # the fleet retries a result it got no answer for
            return
        self.say("result answer", answer)
        if isinstance(answer, dict) and answer.get("outcome") == "rendered":
            self.oracle.results.add(j["id"])

    async def kill(self) -> None:
        node = self.pick_live()
        if node is None or len(self.cluster.live()) <= 1:
            return
        self.say("crash", node.name)
        await node.kill()

    def restart(self) -> None:
        down = [n for n in self.cluster.nodes.values() if not n.up and n.name in self.cluster.controller.membership.names]
        if down:
            node = self.rng.choice(down)
            self.say("restart", node.name)
            node.start()

    async def leave(self) -> None:
        m = self.cluster.controller.membership
        if len(m.names) <= 2:
            return
        name = self.rng.choice(m.names)
        node = self.cluster.nodes[name]
        self.say("leave", name)
        if node.up:
            await node.kill()
        self.oracle.node_left(name)
        await self.cluster.set_members([n for n in m.names if n != name])

    async def join(self) -> None:
        m = self.cluster.controller.membership
        out = [n for n in NAMES if n not in m.names]
        if not out:
            return
        name = self.rng.choice(out)
        node = self.cluster.nodes.setdefault(name, SimNode(self.cluster, name))
        if node.up:
            await node.kill()
        self.say("join", name)
        await self.cluster.set_members([*m.names, name])
        node.start()

    async def lose_two(self) -> None:
        """Two members die at the same moment and the controller drops both in one change (Ray
        declared them dead); they come back together, with their disks, in ``back_together``."""
        m = self.cluster.controller.membership
        if len(m.names) < 3 or self.away:
            return
        self.away = sorted(self.rng.sample(m.names, 2))
        self.say("lose two", self.away)
        await asyncio.gather(*(self.cluster.nodes[name].kill() for name in self.away if self.cluster.nodes[name].up))
        for name in self.away:
            self.oracle.node_left(name)
        await self.cluster.set_members([n for n in m.names if n not in self.away])

    async def back_together(self, keepers_late: bool = False) -> None:
        """The two lost by ``lose_two`` restart together (same names, same data dirs) and the controller
        adds both in one change, while the survivors keep writing: puts decided under the smaller
        membership land around the moment it grows back. ``keepers_late``: the push to the survivors'
        keepers is lost (they learn the change at their next check, their stores at once)."""
        m = self.cluster.controller.membership
        back, self.away = [n for n in self.away if n not in m.names], []
        if not back:
            return
        survivors = [n for n in m.names if self.cluster.nodes[n].up]
        self.say("back together", back, "writes on", survivors)
        writing = [asyncio.ensure_future(self.put(on=self.rng.choice(survivors), after=self.rng.uniform(0, 4.0)))
                   for _ in range(self.rng.randint(2, 6) if survivors else 0)]
        started_first = self.rng.random() < 0.5  # Ray places the actors, then the controller adds them; or not
        for name in back if started_first else ():
            if not self.cluster.nodes[name].up:
                self.cluster.nodes[name].start()
        await self.cluster.set_members([*m.names, *back], unsent={(n, "keeper") for n in survivors} if keepers_late else ())
        for name in () if started_first else back:
            if not self.cluster.nodes[name].up:
                self.cluster.nodes[name].start()
        await asyncio.gather(*writing)

    def partition(self) -> None:
        """Two groups; the side without the controller (Ray's head with it) is lost to Ray after its
        health checks, unless healed first, while its nodes still run (``Cluster.ray_loses``)."""
        ctl = self.cluster.controller.endpoint
        names = [*self.cluster.controller.membership.names, ctl]
        self.rng.shuffle(names)
        cut = self.rng.randint(1, len(names) - 1)
        self.say("partition", names[:cut], names[cut:])
        self.net.partition(set(names[:cut]), set(names[cut:]))
        away = [n for n in (names[cut:] if ctl in names[:cut] else names[:cut]) if n != ctl]
        if away and len(away) < len(names) - 1:  # the head is a member: the controller is never alone
            self.background.append(asyncio.ensure_future(self.cluster.ray_loses(away, self.rng.choice((3.0, 8.0, 15.0)))))

    async def heal(self) -> None:
        """The partition heals; a node Ray listed dead meanwhile ends (its raylet is told so)."""
        self.say("heal")
        self.net.heal()
        for name in sorted(self.cluster.controller.lost):
            node = self.cluster.nodes[name]
            if node.up:
                self.say("ends: Ray listed it dead", name)
                await node.kill()
        self.cluster.retire_cut_off_controllers()

    # ------------------------------------------------------------------------------- the walk

    async def start(self, n: int) -> None:
        names = list(NAMES[:n])
        await self.cluster.set_members(names)
        for name in names:
            self.cluster.nodes[name] = node = SimNode(self.cluster, name)
            node.start()
        await asyncio.sleep(5)

    async def walk(self, steps: int, membership: bool) -> None:
        acts: list[tuple[float, Callable[[], Any]]] = [
            (4, self.put), (5, self.claim), (4, self.result), (0.7, lambda: self.result(replay=True))]
        if membership:
            acts += [(0.4, self.kill), (0.6, self.restart), (0.3, self.leave), (0.3, self.join),
                     (0.4, self.partition), (0.5, self.heal), (0.15, self.lose_two), (0.4, self.back_together)]
        weights = [w for w, _ in acts]
        for self.step in range(1, steps + 1):
            _, act = self.rng.choices(acts, weights)[0]
            got = act()
            if asyncio.iscoroutine(got):
                await got
            self.check_now()
            await asyncio.sleep(self.rng.choice((0.0, 0.01, 0.5, 2.0, 20.0)))

    def check_now(self) -> None:
        if self.oracle.violations:
            raise self.oracle.violations[0]

    async def settle(self) -> None:
        self.step += 1
        self.say("settle")
        self.net.faults = Faults.none()
        for pending in self.background:
            pending.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)
        await self.heal()
        # every node that ever ran is back: what one acknowledged is on its disk at least (replication is
        # asynchronous: a node that leaves for good takes what it had not shipped yet)
        await self.cluster.set_members(sorted(self.cluster.nodes))
        for node in self.cluster.nodes.values():
            if not node.up:
                node.start()
        await asyncio.sleep(SETTLE_S)
        self.check_now()
        self.oracle.check_settled(self.cluster, self.strays)


async def two_at_once(world: World) -> None:
    """The shape of tests/actors/test_netns_cluster.py's two-nodes-at-once test: two of three nodes die
    together while the survivor takes writes, and come back together while it goes on writing."""
    for world.step in range(1, 7):
        await world.put()
        world.check_now()
    await asyncio.sleep(world.rng.choice((1.0, 5.0, 20.0)))
    world.step += 1
    await world.lose_two()
    for _ in range(world.rng.randint(2, 6)):  # the survivor, alone
        world.step += 1
        await world.put()
        await asyncio.sleep(world.rng.choice((0.0, 0.75, 2.0)))
    world.step += 1
    await world.back_together(keepers_late=True)
    for _ in range(4):
        world.step += 1
        await world.put()
        world.check_now()
        await asyncio.sleep(world.rng.choice((0.0, 0.01, 0.5)))


async def controller_on_the_minority(world: World) -> None:
    """The controller is cut off with one node while Ray's head is with the two others
    (``Cluster.controller_cut_off``): Ray places a controller on the head's side, which gives the
    node's keys to the two, while the old one still answers the node it is cut off with. A fleet
    claims and answers on every side, and targets are written, for two and a half leases; then the
    cut heals. The node cut off must stop granting before the others may grant its keys."""
    loop = asyncio.get_running_loop()
    for world.step in range(1, 7):
        await world.put()
        world.check_now()
    await asyncio.sleep(2.0)
    minority = [world.rng.choice(world.cluster.controller.membership.names)]
    world.step += 1
    world.say("controller cut off with", minority)
    cut = asyncio.ensure_future(world.cluster.controller_cut_off(minority, world.rng.choice((3.0, 8.0))))
    end = loop.time() + 2.5 * world.cluster.cfg.queue.job_lease_time / 1000
    while loop.time() < end:
        world.step += 1
        act = world.rng.choices((world.claim, world.result, world.put), (5, 3, 1))[0]
        await act()
        world.check_now()
        await asyncio.sleep(world.rng.choice((0.5, 2.0, 10.0)))
    await cut
    world.step += 1
    await world.heal()


async def full_copy_from_a_cut_off_peer(world: World) -> None:
    """Every node holds everything (run with ``replicas`` of 3): n1 starts again cut off from n2,
    which goes on taking writes, so n1's catch-up has no answer; n3 joins while the cut lasts and
    pulls first from n1 (name order). What n2 took meanwhile reaches n3 only by a pull from n2."""
    for world.step in range(1, 4):
        await world.put(on="n2")
        await asyncio.sleep(1.0)
    world.step += 1
    world.say("crash", "n1", "and back cut off from n2")
    await world.cluster.nodes["n1"].kill()
    world.net.partition({"n1", "n3", CONTROLLER}, {"n2", "n3", CONTROLLER})  # n3 reaches both
    world.cluster.nodes["n1"].start()
    await asyncio.sleep(5.0)
    await _writes_on_n2_then_n3_joins(world, 4)


async def full_copy_while_a_write_is_on_its_way(world: World) -> None:
    """Every node holds everything (run with ``replicas`` of 3): n2 is cut off from n1 and takes
    writes, which wait in its outbox for n1; n3 joins meanwhile and pulls its full copy from n1 (first
    by name, caught up itself). n2 ships only to the members it knew when it wrote: what it took
    reaches n3 only if n2 sends it its own writes that n1 lacks."""
    world.step = 1
    await world.put(on="n2")
    await asyncio.sleep(1.0)
    world.step += 1
    world.say("cut", "n1", "from n2")
    world.net.partition({"n1", "n3", CONTROLLER}, {"n2", "n3", CONTROLLER})  # n3 reaches both
    await _writes_on_n2_then_n3_joins(world, world.rng.randint(2, 4))


async def _writes_on_n2_then_n3_joins(world: World, writes: int) -> None:
    """``writes`` puts on n2 while the cut stands, then n3 joins and catches up through it."""
    for _ in range(writes):
        world.step += 1
        await world.put(on="n2")
        await asyncio.sleep(world.rng.choice((0.0, 0.5, 2.0)))
    world.step += 1
    world.say("join", "n3")
    node = world.cluster.nodes.setdefault("n3", SimNode(world.cluster, "n3"))
    await world.cluster.set_members(["n1", "n2", "n3"])
    node.start()
    await asyncio.sleep(60.0)  # the cut lasts through n3's catch-up; ``settle`` heals it
    world.check_now()


# The scripted shapes ``python -m tests.sim --script`` and ``SIM_SCRIPT`` name: (script, queue section).
SCRIPTS: dict[str, tuple[Callable[[World], Awaitable[None]], dict | None]] = {
    "minority": (controller_on_the_minority, {"jobLeaseTime": "2m"}),
    "two-at-once": (two_at_once, None),
}


def simulate(seed: int, *, steps: int = 60, nodes: int = 3, faults: Faults | None = None, membership: bool = True,
             twin: Callable[[Cluster], None] | None = None, max_steps: int = 3_000_000,
             strays: bool = True, script: Callable[[World], Awaitable[None]] | None = None,
             replicas: int = 2, queue: dict | None = None) -> Outcome:
    """Run one history; raise ``SimFailure`` (with the seed and step) when an invariant breaks.
    ``script``: a fixed shape of steps instead of the random walk (``two_at_once``); ``replicas``:
    ``cluster.replicas`` (at least the node count: every node holds everything); ``queue``: the
    config's queue section (``jobLeaseTime``)."""
    with tempfile.TemporaryDirectory(prefix=f"sim-{seed}-") as tmp:
        world = World(seed, Path(tmp), faults if faults is not None else Faults.rough(), twin, replicas, queue)
        world.strays = strays

        async def main() -> None:
            world.cluster.install(asyncio.get_running_loop())
            await world.start(nodes)
            await (script(world) if script is not None else world.walk(steps, membership))
            await world.settle()
            for node in world.cluster.live():
                await node.kill()

        try:
            run(main(), steps=max_steps)
        except (Violation, SimStuck) as e:
            raise SimFailure(seed, world.step, e, world.log + world.cluster.log[-int(os.environ.get("SIM_LOG_TAIL", 20)):]) from e
        o = world.oracle
        stats = {**world.net.stats, "grants": sum(map(len, o.grants.values())), "applied": sum(o.finished.values()),
                 "targets": len(o.targets), "results": len(o.results)}
        return Outcome(seed, world.step, world.net.trace, stats)
