"""IngressReplica: uvicorn serving the FastAPI app inside a Ray actor pinned to its node.

Several replicas per node share one port with SO_REUSEPORT, so the kernel spreads connections over
them. Not Ray Serve: its proxy costs an actor hop per request (measured ~340 req/s against
~6,400-8,600 for uvicorn inside an actor: docs/architecture.md#why-not-ray-serve).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import gc
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import ray
import uvicorn

from prerender_ray import logs, metrics, native
from prerender_ray.actors.client import MEMBERSHIP_DEADLINE_S, ActorClient
from prerender_ray.actors.common import (
    controller_membership,
    follow_membership,
    follow_overrides,
    read_overrides,
    untraced,
)
from prerender_ray.api.admin.bots import replica_report
from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.replica import apply_overrides, close_replica, open_replica, opened
from prerender_ray.api.context import NodeContext
from prerender_ray.api.server import server_config
from prerender_ray.config.loading import findings
from prerender_ray.config.model import Config
from prerender_ray.identity.membership import Membership, MembershipView
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.identity.routes import compile_routes
from prerender_ray.processes import pid_alive
from prerender_ray.rpc import call
from prerender_ray.storage.rocks import node_dir

PROBE_ATTEMPTS = 10
STOP_DEADLINE_S = 15.0  # uvicorn's graceful stop is bounded by 10 s
MEMBERSHIP_READ_S = 3.0  # at start, before serving: the controller answers from memory


def bind_socket(host: str, port: int, *, probe: bool) -> socket.socket:
    """Bind the shared listening socket. ``probe`` first checks that nobody else holds the port: with
    SO_REUSEPORT alone a second deployment on the same port would silently share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if probe:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    # TCP named (asyncio sets TCP_NODELAY only on sockets whose proto says TCP) and TCP_NODELAY on the
    # listener (Linux hands it to each accepted connection): with Nagle on, a keep-alive answer's
    # second write waited for the client's delayed ACK, 40 ms a request (uvloop sets it itself)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def bind_shared(host: str, port: int, *, lock_dir: Path, group: str) -> socket.socket:
    """Bind the port for one of a node's sibling replicas. The first sibling to bind probes that the
    port is free; later ones must not probe (the probe has no SO_REUSEPORT, so it collides with a
    sibling already listening: the false "already in use" of about one start in three). A lock file
    serializes the siblings and a record names who of ``group`` (this deployment on this node) holds
    the port, so a replica of an older deployment that is still exiting is probed against, not joined."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    record = lock_dir / f"ingress-{port}.json"
    with open(lock_dir / f"ingress-{port}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for a bind: microseconds
        try:
            held = json.loads(record.read_text())
        except (OSError, ValueError):
            held = {}
        pids = [p for p in held.get("pids", []) if isinstance(p, int) and pid_alive(p)] \
            if held.get("group") == group else []
        sock = bind_socket(host, port, probe=not pids)
        record.write_text(json.dumps({"group": group, "pids": pids + [os.getpid()]}))
        return sock


def describe_bind_error(e: OSError, host: str, port: int) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use"
    if e.errno == errno.EACCES:
        return f"no permission to bind {host}:{port}"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"address {host} is not available on this machine"
    return f"cannot bind {host}:{port}: {e.strerror or e}"


class IngressClient(ActorClient):
    """Typed calls to another ingress replica, each under the caller's deadline."""

    def __init__(self, handle: Any, deadline_s: float):
        self.handle = handle
        self.deadline_s = deadline_s

    async def bots_report(self) -> dict:
        return await call(self.handle.bots_report.remote(), self.deadline_s)

    async def set_membership(self, wire: dict) -> None:
        await call(self.handle.set_membership.remote(wire), MEMBERSHIP_DEADLINE_S)

    async def stop(self) -> None:
        """Stop accepting and finish what is in flight (``IngressReplica.stop``)."""
        await call(self.handle.stop.remote(), STOP_DEADLINE_S)


class IngressReplica:
    """The shell, plain: ``IngressReplicaActor`` below is what Ray places. ``membership`` answers for
    the controller (``controller_membership``), ``lookup`` finds other nodes' actors (Ray's named actors
    unless given: ``NodeContext``); the LocalNode harness passes single-node ones."""

    def __init__(self, config: dict, node: dict, index: int, data_dir: str, keeper, leases, store,
                 membership: Any = controller_membership, lookup: Any = None):
        untraced(self)
        self._membership = membership
        cfg = Config.model_validate(config)
        info = NodeInfo(**node)
        logs.setup(info.name, level=cfg.logging.level, json_lines=cfg.logging.json_lines,
                   process=f"ingress-{index}")
        self.log = logs.get("ingress")
        self.index = index
        self.info = info
        self.error: str | None = None
        self.ctx = NodeContext(cfg=cfg, node=info, data_dir=data_dir, keeper=keeper, leases=leases,
                               store=store, replica=index,
                               findings=_findings(cfg), lookup=lookup)
        # This replica's one membership: alone until the controller's is read (before serving)
        self.view = MembershipView.alone(info)
        self.view.listen(self._changed)
        # What start-up printed as config warnings, as a gauge an operator can alert on.
        metrics.config_warnings.set(sum(1 for f in self.ctx.findings if f.severity == "warn"))
        metrics.prime()
        self.app = create_asgi(self.ctx)  # the bot path in front of the FastAPI routers
        # The bot path's page reader (a RocksDB secondary, caught up on a timer) and origin client.
        open_replica(self.ctx)
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task | None = None
        # The first sibling to bind probes; the others and restarts share the port. The group is
        # this deployment's epoch on this node (the metrics dir names both).
        group = os.environ.get(metrics.ENV, "") or f"{info.name}:{os.getppid()}"
        sock: socket.socket | None = None
        for attempt in range(PROBE_ATTEMPTS):  # a previous deployment's replica may still be exiting
            try:
                sock = bind_shared(cfg.server.host, info.port, lock_dir=node_dir(data_dir, info.name),
                                   group=group)
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE or attempt == PROBE_ATTEMPTS - 1:
                    self.error = describe_bind_error(e, cfg.server.host, info.port)
                    self.log.error("ingress cannot start", error=self.error)
                    return
                time.sleep(0.5)
        assert sock is not None  # the loop binds or returns
        self.server = uvicorn.Server(server_config(self.app, cfg, self.log))
        self._syncer: asyncio.Task | None = None
        self.task = asyncio.get_running_loop().create_task(self._serve(sock))
        self.log.info("ingress listening", url=info.url, replica=index, native=native.state)

    async def status(self) -> dict:
        up = bool(self.server and self.server.started and self.task and not self.task.done())
        state = opened(self.ctx)
        pages = state.services.pages if state is not None else None
        # its page reader: where it reads (pagelog, or secondary while the node has no page log), the
        # secondary's catch-ups (all, and those reads waited for), the log's polls (none waits)
        catch_ups = ({"all": pages.catch_ups, "waited": pages.waited, "polls": pages.polls, "source": pages.source}
                     if pages is not None else None)
        return {"replica": self.index, "up": up, "error": self.error, "url": self.info.url, "pid": os.getpid(),
                "pageCatchUps": catch_ups, "gcFrozen": gc.get_freeze_count()}

    async def bots_report(self) -> dict:
        """This replica's bot tallies, for the admin ``bots`` view that merges every replica's."""
        return replica_report(self.ctx)

    async def apply_overrides(self, raw: bytes | None) -> bool:
        """Apply the stored live overrides (``o:config``) if they changed; True when they did."""
        return apply_overrides(self.ctx, raw)

    async def _serve(self, sock: socket.socket) -> None:
        # The live overrides first (bounded): a restarted replica never serves with the file's routes.
        await read_overrides(self.ctx.store, self.apply_overrides, self.log)
        await self._read_membership()
        self._syncer = asyncio.get_running_loop().create_task(
            follow_overrides(self.ctx.store, self.apply_overrides, self.log))
        self._members = asyncio.get_running_loop().create_task(
            follow_membership(lambda: self.view.epoch, self._offer, self.log,
                              fetch=self._membership))
        assert self.server is not None
        # What start-up built (the app, the config compiled, Ray's worker) lives as long as the
        # process: out of the collector's full passes, which walked all of it and stalled the loop
        # for 20-25 ms (row (e)'s p99 24-31 ms against 8-10 ms frozen, bench_serving), as the keeper
        # freezes its loaded rows; the LocalNode harness undoes both at its stop.
        gc.freeze()
        await self.server.serve(sockets=[sock])

    async def _read_membership(self) -> None:
        """The controller's membership before the first request (bounded): a restarted replica knows
        only its own node, so without it every URL owned elsewhere went to the origin until the next
        check (seen: 9 s of origin answers after a kill)."""
        try:
            self.view.offer(await self._membership(MEMBERSHIP_READ_S))
        except Exception as e:  # never in the way of serving
            self.log.warning("membership not read at start; the pushes and checks will bring it", error=repr(e))

    async def set_membership(self, wire: dict) -> bool:
        """A push from the controller (``Membership.to_wire``): applied if its epoch is newer."""
        return self.view.offer(Membership.from_wire(wire))

    async def _offer(self, m: Membership) -> bool:
        return self.view.offer(m)

    def _changed(self, before: Membership, after: Membership) -> None:
        self.ctx.ownership.update(list(after.names))
        self.ctx.peers = {n.name: n for n in after.nodes}  # a node that came back may have a new port
        self.ctx.forget_remote()  # and new actors

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests (bounded by uvicorn's graceful timeout)."""
        for task in (getattr(self, "_syncer", None), getattr(self, "_members", None)):
            if task is not None:
                task.cancel()
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 10)
            except (asyncio.TimeoutError, Exception):
                self.task.cancel()
        await close_replica(self.ctx)


IngressReplicaActor = ray.remote(IngressReplica)


def _findings(cfg: Config) -> list:
    return findings(cfg, compile_routes(cfg).prerender_count)
