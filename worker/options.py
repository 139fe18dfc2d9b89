"""The render worker's options: one dataclass, the command-line flags that fill it, and the defaults
of the reference render fleet (docs/fleet-protocol.md#connection-options) where it has one."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from prerender_ray.worker.egress import PROXY_SWITCHES, host_key

DEFAULT_BYPASS_HEADER = "x-harper-renderer-bypass"
CHROMIUM_CANDIDATES = (
    "/usr/bin/chromium",
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)


def default_concurrency() -> int:
    """The reference fleet's default: max(1, floor((cpus - 3) / 2)), so 1 on a 2-core machine."""
    return max(1, ((os.cpu_count() or 1) - 3) // 2)


def find_chromium() -> str | None:
    """Debian's ``/usr/bin/chromium`` first, then a Chromium or Chrome on PATH (never a download)."""
    for name in CHROMIUM_CANDIDATES:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


@dataclass
class WorkerOptions:
    queues: list[str]
    concurrency: int = field(default_factory=default_concurrency)
    claim_limit: int | None = None  # None: = concurrency (the reference's jobClaimLimit)
    user: str = ""
    password: str = ""
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    bypass_header: str = DEFAULT_BYPASS_HEADER
    bypass_token: str = ""
    chromium: str | None = None
    chromium_args: tuple[str, ...] = ()
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # rendering
    render_budget_ms: int = 20_000
    settle_quiet_ms: int = 50
    content_encoding: str = "gzip"  # or br
    max_html_bytes: int = 20 * 1024 * 1024
    plus_is_space: bool = False  # must match the server's cacheKey.plusIsSpace
    trailing_slash: str = "strip"  # must match the server's cacheKey.trailingSlash
    canonical_strict: bool = False
    honour_status_meta: bool = True  # <meta name="prerender-status-code">
    block_hosts: tuple[str, ...] = ()  # added to the blocklist (worker/blocklist.py)
    block_defaults: bool = True  # start from DEFAULT_BLOCKED_HOSTS
    public_only: bool = False  # every connection through the egress guard (worker/egress.py)
    private_hosts: tuple[str, ...] = ()  # hosts the guard lets resolve to any address
    # browser lifecycle
    page_reuse: int = 50  # renders per tab before it is replaced
    recycle_pages: int = 500  # renders per browser before it is replaced
    recycle_minutes: float = 30.0
    close_grace_s: float = 5.0  # a closing browser gets this long before SIGKILL
    # the queue
    idle_ms: int = 15_000
    min_backoff_ms: int = 1_000
    max_backoff_ms: int = 30_000
    paused_ms: int = 30_000
    max_idle_ms: int = 60_000
    result_retries: int = 3
    min_lease_left_ms: int = 30_000
    claim_timeout_s: float = 30.0
    result_timeout_s: float = 30.0
    status_interval_s: float = 2.0  # GET /queue_status poll (0 = never): `queued` wakes the claim loop
    discover: bool = True  # claim from every node listed in /queue_status too
    max_rps: float = 0.0  # minimum spacing between render starts (0 = none)
    # operations
    drain_s: float = 12.0
    stats_interval_s: float = 60.0
    exit_with_parent: bool = False
    subreaper: bool = False  # adopt orphaned Chromium processes and reap them (the CLI turns it on)

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValueError("at least one --queue URL is required")
        self.queues = [q.rstrip("/") for q in self.queues]
        for q in self.queues:
            if not q.startswith(("http://", "https://")):
                raise ValueError(f"--queue must be an http(s) URL, not {q!r}")
        if self.concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        if self.content_encoding not in ("gzip", "br"):
            raise ValueError("--content-encoding must be gzip or br")
        if self.trailing_slash not in ("strip", "preserve"):
            raise ValueError("--trailing-slash must be strip or preserve")
        if self.render_budget_ms < 1000:
            raise ValueError("--render-budget must be at least 1000 ms")
        if self.private_hosts and not self.public_only:
            raise ValueError("--private-host only makes sense with --public-only")
        for host in self.private_hosts:
            try:
                host_key(host)
            except ValueError:
                raise ValueError(f"--private-host {host!r} is neither a host name nor an address") from None
        if self.public_only:
            for arg in self.chromium_args:
                if arg.split("=", 1)[0] in PROXY_SWITCHES:
                    raise ValueError(f"--public-only sets Chromium's proxy and resolver itself: drop --chromium-arg {arg}")

    @property
    def limit(self) -> int:
        return self.claim_limit or self.concurrency


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``prerender-ray render`` flags."""
    p.add_argument(
        "--queue",
        action="append",
        required=True,
        metavar="URL",
        help="a prerender-ray node (or any fleet-protocol queue) to claim from; repeat for several",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=default_concurrency(),
        help="pages rendered at once (default max(1, (cpus-3)/2))",
    )
    p.add_argument("--claim-limit", type=int, help="jobs asked for per claim (default = concurrency)")
    p.add_argument("--user", default=os.environ.get("PRERENDER_WORKER_USER", ""), help="HTTP Basic user")
    p.add_argument("--password-env", metavar="VAR", help="environment variable holding the Basic password")
    p.add_argument("--worker-id", help="x-worker-id header (default <hostname>-<pid>)")
    p.add_argument(
        "--bypass-header",
        default=DEFAULT_BYPASS_HEADER,
        help="header carrying the bypass token to the origin only",
    )
    p.add_argument("--bypass-token-env", metavar="VAR", help="environment variable holding the bypass token")
    p.add_argument("--chromium", help="Chromium executable (default /usr/bin/chromium or chromium on PATH)")
    p.add_argument("--chromium-arg", action="append", default=[], metavar="ARG", help="extra Chromium switch")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics endpoint")
    p.add_argument(
        "--render-budget",
        type=int,
        default=20_000,
        metavar="MS",
        help="per-page budget for navigation + settle (default 20000)",
    )
    p.add_argument(
        "--settle-quiet",
        type=int,
        default=50,
        metavar="MS",
        help="network quiet time that counts as settled (default 50)",
    )
    p.add_argument("--content-encoding", choices=("gzip", "br"), default="gzip")
    p.add_argument("--plus-is-space", action="store_true", help="mirror the server's cacheKey.plusIsSpace")
    p.add_argument(
        "--trailing-slash",
        choices=("strip", "preserve"),
        default="strip",
        help="mirror the server's cacheKey.trailingSlash",
    )
    p.add_argument(
        "--canonical-strict",
        action="store_true",
        help="a canonical naming a re-spelling of the same page is non-indexable",
    )
    p.add_argument(
        "--block-host",
        action="append",
        default=[],
        metavar="HOST",
        help="never load requests to HOST or its subdomains (repeatable; added to the default list of "
        "analytics, tag-manager, ad, consent and chat hosts)",
    )
    p.add_argument(
        "--no-default-blocklist",
        action="store_true",
        help="block only the --block-host hosts, not the default list",
    )
    p.add_argument(
        "--public-only",
        action="store_true",
        help="connect only to public addresses: every connection Chromium makes goes through a guard that "
        "resolves the host and refuses loopback, private, link-local and reserved addresses (for nodes with "
        "allowAnyDomain)",
    )
    p.add_argument(
        "--private-host",
        action="append",
        default=[],
        metavar="HOST",
        help="with --public-only: a host (exact name or address) that may resolve to any address, such as "
        "the site's own origin on a private network (repeatable)",
    )
    p.add_argument("--page-reuse", type=int, default=50, help="renders per tab before it is replaced")
    p.add_argument("--recycle-pages", type=int, default=500, help="renders per browser before it is replaced")
    p.add_argument("--recycle-minutes", type=float, default=30.0, help="browser age before it is replaced")
    p.add_argument(
        "--drain",
        type=float,
        default=12.0,
        metavar="S",
        help="on SIGINT/SIGTERM, how long in-flight renders may finish",
    )
    p.add_argument("--max-rps", type=float, default=0.0, help="cap on render starts per second (0 = none)")
    p.add_argument(
        "--status-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="how often queue status is polled (`queued` wakes the worker; 0 = never)",
    )
    p.add_argument(
        "--no-discover",
        action="store_true",
        help="claim only from the given queues, not from other nodes they list",
    )
    p.add_argument("--stats-interval", type=float, default=60.0, metavar="S", help="stats log line period")
    p.add_argument("--exit-with-parent", action="store_true", help="shut down when the parent process exits")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> WorkerOptions:
    env = dict(os.environ if env is None else env)

    def secret(var: str | None, what: str) -> str:
        if not var:
            return ""
        if not env.get(var):
            raise ValueError(f"{what}: environment variable {var} is not set")
        return env[var]

    chromium = args.chromium or find_chromium()
    if chromium is None:
        raise ValueError("no Chromium found: install Debian's chromium or pass --chromium PATH")
    if not Path(chromium).exists() and shutil.which(chromium) is None:
        raise ValueError(f"--chromium {chromium!r} does not exist")
    kw = dict(
        queues=args.queue,
        concurrency=args.concurrency,
        claim_limit=args.claim_limit,
        user=args.user or "",
        password=secret(args.password_env, "--password-env"),
        bypass_header=args.bypass_header.lower(),
        bypass_token=secret(args.bypass_token_env, "--bypass-token-env"),
        chromium=chromium,
        chromium_args=tuple(args.chromium_arg),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        render_budget_ms=args.render_budget,
        settle_quiet_ms=args.settle_quiet,
        content_encoding=args.content_encoding,
        plus_is_space=args.plus_is_space,
        trailing_slash=args.trailing_slash,
        canonical_strict=args.canonical_strict,
        block_hosts=tuple(args.block_host),
        block_defaults=not args.no_default_blocklist,
        public_only=args.public_only,
        private_hosts=tuple(args.private_host),
        page_reuse=args.page_reuse,
        recycle_pages=args.recycle_pages,
        recycle_minutes=args.recycle_minutes,
        drain_s=args.drain,
        max_rps=args.max_rps,
        status_interval_s=args.status_interval,
        discover=not args.no_discover,
        stats_interval_s=args.stats_interval,
        exit_with_parent=args.exit_with_parent,
        subreaper=True,
    )
    if args.worker_id:
        kw["worker_id"] = args.worker_id
    return WorkerOptions(**kw)
