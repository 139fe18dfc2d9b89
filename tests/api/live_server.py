"""An ASGI app served by uvicorn in the test's own loop, on an ephemeral 127.0.0.1 port, with the
uvicorn config an ingress replica uses (``prerender_ray.api.server.server_config``): the real
protocol class, deadlines and connection cap, no Ray. Raw-socket helpers for clients that misbehave.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn

from prerender_ray.api.server import server_config
from prerender_ray.config.model import Config

WAIT_S = 15.0  # bound on any wait for the server's doing; the deadlines under test are far shorter


@contextmanager
def uvicorn_logging_kept() -> Iterator[None]:
    """uvicorn.Config sets its loggers up (its own handler, no propagation): put them back after, or a
    later test in the same process that expects uvicorn's lines in the root logger fails."""
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    kept = {n: (lg.handlers[:], lg.propagate, lg.level) for n in names for lg in [logging.getLogger(n)]}
    try:
        yield
    finally:
        for n, (handlers, propagate, level) in kept.items():
            lg = logging.getLogger(n)
            lg.handlers[:], lg.propagate = handlers, propagate
            lg.setLevel(level)


@asynccontextmanager
async def serving(app: Any, cfg: Config, sndbuf: int | None = None) -> AsyncIterator[int]:
    """Serve ``app``; yields the port. The socket listens before uvicorn starts, so a client may
    connect at once (the kernel holds it until uvicorn accepts). ``sndbuf``: the kernel's send buffer
    of each accepted connection (they inherit the listener's), so that what a client does not read
    stays in the server's transport instead of the kernel's (which grows to megabytes on its own)."""
    with uvicorn_logging_kept():
        async with _serving(app, cfg, sndbuf) as port:
            yield port


@asynccontextmanager
async def _serving(app: Any, cfg: Config, sndbuf: int | None) -> AsyncIterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sndbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    server = uvicorn.Server(server_config(app, cfg))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S)
        sock.close()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded by ``WAIT_S``)."""
    got = b""
    try:
        async with asyncio.timeout(WAIT_S):
            while chunk := await reader.read(65536):
                got += chunk
    except ConnectionResetError:
        pass
    return got


async def response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response with a Content-Length: (status, body)."""
    async with asyncio.timeout(WAIT_S):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next((int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                       if k.strip().lower() == "content-length"), 0)
        return int(lines[0].split(" ")[1]), await reader.readexactly(length)


def request(path: str = "/", method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: t\r\n{extra}\r\n".encode()
