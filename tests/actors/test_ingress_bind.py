"""Sibling replicas of one node share the ingress port; only a foreign holder is "in use"."""

from __future__ import annotations

import errno
import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest

from prerender_ray.actors.ingress import bind_shared
from tests.support import free_port

_fork = multiprocessing.get_context("fork")


def _sibling(port: int, lock_dir: str, group: str, delay: float, ready, release, results) -> None:
    time.sleep(delay)
    try:
        sock = bind_shared("127.0.0.1", port, lock_dir=Path(lock_dir), group=group)
    except OSError as e:
        results.put(("error", e.errno))
        return
    results.put(("ok", os.getpid()))
    ready.set()
    release.wait(10)
    sock.close()


def test_siblings_never_collide_in_twenty_starts(tmp_path) -> None:
    """The old probe ran only in replica 0 and collided with a sibling that was already listening
    (3 starts in 10). Here, in every round, the siblings start in a different order."""
    for round_ in range(20):
        port = free_port()
        results, release = _fork.Queue(), _fork.Event()
        procs = []
        for i in range(3):
            delay = ((i + round_) % 3) * 0.005
            p = _fork.Process(target=_sibling, args=(port, str(tmp_path), f"epoch-{round_}", delay,
                                                     _fork.Event(), release, results))
            p.start()
            procs.append(p)
        outcomes = [results.get(timeout=10) for _ in procs]
        release.set()
        for p in procs:
            p.join(10)
        assert [o[0] for o in outcomes] == ["ok"] * 3, f"round {round_}: {outcomes}"


def test_a_port_held_by_another_process_is_in_use(tmp_path) -> None:
    port = free_port()
    with socket.socket() as other:  # another deployment that also sets SO_REUSEPORT
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        with pytest.raises(OSError) as e:
            bind_shared("127.0.0.1", port, lock_dir=tmp_path, group="ours")
        assert e.value.errno == errno.EADDRINUSE


def test_an_exiting_replica_of_an_older_deployment_is_probed_against(tmp_path) -> None:
    port = free_port()
    old = bind_shared("127.0.0.1", port, lock_dir=tmp_path, group="epoch-1")
    try:  # same node, same port, still alive: a new deployment must not silently share it
        with pytest.raises(OSError) as e:
            bind_shared("127.0.0.1", port, lock_dir=tmp_path, group="epoch-2")
        assert e.value.errno == errno.EADDRINUSE
    finally:
        old.close()
    bind_shared("127.0.0.1", port, lock_dir=tmp_path, group="epoch-2").close()


async def test_an_answer_on_a_kept_connection_does_not_wait_for_the_clients_ack(tmp_path: Path) -> None:
    """Nagle off on every accepted connection: with it on, a keep-alive answer's second write (the
    body after the head) waited for the client's delayed ACK, 40 ms a request on asyncio's loop."""
    import asyncio

    sock = bind_shared("127.0.0.1", free_port(), lock_dir=tmp_path, group="nodelay")
    accepted: list[socket.socket] = []

    def made() -> asyncio.Protocol:
        class Keep(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.append(transport.get_extra_info("socket"))

        return Keep()

    server = await asyncio.get_running_loop().create_server(made, sock=sock)
    try:
        with socket.create_connection(sock.getsockname()[:2]):
            for _ in range(100):
                if accepted:
                    break
                await asyncio.sleep(0.01)
            assert accepted and accepted[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        server.close()
        await server.wait_closed()
