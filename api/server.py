"""An ingress replica's uvicorn server: its config (``server_config``), the guarded protocol class made
for it (``guarded_protocol``: ``api/connections.py``'s ``GuardedHttp`` with the server's deadlines, cap
and turn), and the connection cap its process's open-file limit allows (``connection_budget``;
docs/serving.md#slow-clients-and-connection-budgets).
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Any

import uvicorn

from prerender_ray.api.connections import GuardedHttp, Turn
from prerender_ray.config.model import Config


def guarded_protocol(*, header_timeout_s: float, max_connections: int,
                     write_timeout_s: float = GuardedHttp.write_timeout_s) -> type[GuardedHttp]:
    """A protocol class for one uvicorn server (``uvicorn.Config(http=...)``)."""
    timeout, cap, write_timeout = header_timeout_s, max_connections, write_timeout_s

    class Guarded(GuardedHttp):
        header_timeout_s = timeout
        write_timeout_s = write_timeout
        max_connections = cap
        waiting: OrderedDict[GuardedHttp, None] = OrderedDict()
        turn = Turn()

    return Guarded


def connection_budget(wanted: int) -> int:
    """The connection cap this process can keep: at most half its open files (it raises its soft limit
    toward twice ``wanted`` first, up to the hard limit). The other half is for what the cap does not
    see: asyncio accepts up to the listen backlog (2,048) at a time before any of them is counted, an
    evicted connection's socket closes a turn of the loop later, and the stores and the origin and peer
    pools need theirs. Measured: with a reserve of 4,096 under 20,000 reconnecting slow clients, the
    replica still hit EMFILE (asyncio then stops accepting for a second)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * wanted
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft // 2))


def server_config(app: Any, cfg: Config, log: Any = None) -> uvicorn.Config:
    """uvicorn's config for a replica: the guarded protocol and the keep-alive timeout, from
    ``server``."""
    srv = cfg.server
    cap = connection_budget(srv.max_connections)
    if cap < srv.max_connections and log is not None:
        log.warning("server.maxConnections lowered to what the open-file limit allows",
                    configured=srv.max_connections, cap=cap)
    tls = srv.tls
    return uvicorn.Config(
        app, loop="none", lifespan="on", log_level="warning", access_log=False,
        # No route is a WebSocket: an upgrade would hand the connection to uvicorn's WebSocket
        # protocol, outside this one's cap, deadlines and head bounds. Without it, it is plain HTTP.
        ws="none",
        # uvicorn's own logging config gives its loggers a stderr handler and cuts them off from the
        # root: its lines then missed the node's JSON log files (logs.setup), and in one test process
        # every later logger test (LocalNode serves in-process)
        log_config=None,
        http=guarded_protocol(header_timeout_s=srv.header_timeout / 1000, max_connections=cap,
                              write_timeout_s=srv.write_timeout / 1000),
        timeout_keep_alive=srv.keep_alive_timeout / 1000,  # type: ignore[arg-type]  # call_later takes it
        timeout_graceful_shutdown=5, server_header=False,
        date_header=False,  # ours, with Last-Modified held to it: prerender_ray.serving.dates
        # Its default believes X-Forwarded-For from any loopback peer; api.auth resolves the client
        # itself, trusting only server.trustedProxies.
        proxy_headers=False,
        ssl_certfile=tls.cert_file or None, ssl_keyfile=tls.key_file or None,
    )
