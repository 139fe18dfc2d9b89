"""Test helpers: the shared Ray cluster, deployments on it, free ports."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prerender_ray.config import loading

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


# Below the kernel's ephemeral range (32768-60999) and above Ray's worker ports (10002-19999): a port
# picked here and bound seconds later (a node's ingress) cannot meanwhile be handed to an outgoing
# connection or to a Ray process, as a kernel-assigned free port could (a bench run lost a deploy so).
PORTS = (20000, 32767)


class Recorded:
    """A part's logger, every line kept (level, message, fields), each passed on to it."""

    def __init__(self, log: Any):
        self.log = log
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, level: str) -> Any:
        emit = getattr(self.log, level)

        def record(msg: str, *args: Any, **kw: Any) -> Any:
            self.lines.append((level, msg, kw))
            return emit(msg, *args, **kw)

        return record


def free_port() -> int:
    rnd = random.SystemRandom()
    for _ in range(100):
        port = rnd.randint(*PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS}")


# No log monitor on a test node: it streams worker output to the driver, which does not take it
# (``log_to_driver=False``); every process of ours logs to its node's files.
LEAN = {"include_log_monitor": False}


@dataclass
class RayCluster:
    cluster: Any
    nodes: dict[str, Any] = field(default_factory=dict)  # name -> ray node
    ports: dict[str, int] = field(default_factory=dict)
    changes: int = 0  # nodes added or removed so far

    @classmethod
    def start(cls) -> RayCluster:
        import ray
        from ray.cluster_utils import Cluster

        from prerender_ray.identity.nodes import LABEL_NAME, LABEL_PORT, NAMESPACE, RAY_SYSTEM_CONFIG

        port = free_port()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False, **LEAN,
            "no_monitor": True,  # the autoscaler's: nothing to scale here
            "labels": {LABEL_NAME: "node-a", LABEL_PORT: str(port)},
            "_system_config": dict(RAY_SYSTEM_CONFIG),  # a copy: Ray adds its own keys to the dict
        })
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        self = cls(cluster)
        self.nodes["node-a"] = cluster.head_node
        self.ports["node-a"] = port
        return self

    def add_node(self, name: str, env: dict[str, str] | None = None) -> Any:
        """A simulated node; ``env`` goes to its raylet and so to every process it starts."""
        from prerender_ray.identity.nodes import LABEL_NAME, LABEL_PORT

        port = free_port()
        node = self.cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024, **LEAN,
                                     labels={LABEL_NAME: name, LABEL_PORT: str(port)}, env_vars=env)
        self.nodes[name] = node
        self.ports[name] = port
        self.changes += 1
        return node

    def remove_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        self.ports.pop(name, None)
        self.changes += 1
        self.cluster.remove_node(node)

    @contextmanager
    def added(self, *names: str) -> Iterator[RayCluster]:
        """``names`` added for a module; on the way out, even after a failed deploy, every node but
        the head is removed (a node left behind would turn the next module's single node into two)."""
        try:
            for name in names:
                self.add_node(name)
            yield self
        finally:
            for name in [n for n in self.nodes if n != "node-a"]:
                self.remove_node(name)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


@dataclass
class Deployment:
    controller: Any
    data_dir: Path
    config: dict
    status: dict

    @property
    def urls(self) -> dict[str, str]:
        return {n["name"]: n["url"] for n in self.status["nodes"]}

    @property
    def url(self) -> str:
        return self.urls["node-a"]

    def refresh(self) -> dict:
        from prerender_ray.actors import deploy

        self.status = deploy.controller_status(self.controller)
        return self.status

    def stop(self, *, drain: bool = True) -> dict:
        """What `down` does: drain (``fleet.drainPeriod``; deploy_on makes it 0 unless asked), stop."""
        from prerender_ray.actors import deploy

        return deploy.stop_deployment(self.controller, drain=drain)


def node_config(data_dir: Path, config: dict | None = None, *, replicas: int = 1) -> dict:
    """``config`` (camelCase or snake_case) as a node's actors get it (``deploy.actor_config``), with
    ``data_dir``, ``replicas`` ingress replicas and no drain unless asked (``deploy_on``, LocalNode)."""
    from prerender_ray.actors import deploy

    raw = dict(config or {})
    server = dict(raw.get("server", {}))
    server.setdefault("replicas", replicas)
    server.pop("dataDir", None)
    server["data_dir"] = str(data_dir)
    raw["server"] = server
    fleet = dict(raw.get("fleet", {}))
    if "drain_period" not in fleet and "drainPeriod" not in fleet:
        # a test that leaves a lease unanswered would wait out the whole drain at every stop: tests
        # that are about the drain ask for one
        fleet["drain_period"] = 0
    raw["fleet"] = fleet
    return deploy.actor_config(loading.parse(raw).config, data_dir)


def deploy_on(cluster: RayCluster, data_dir: Path, config: dict | None = None, *, timeout: float = 120.0,
              replicas: int = 1) -> Deployment:
    """Place a deployment with ``config`` (camelCase or snake_case) on every node of the shared cluster."""
    from prerender_ray.actors import deploy

    cfg = node_config(data_dir, config, replicas=replicas)
    old = deploy.find_controller()
    if old is not None:
        deploy.stop_deployment(old)
    controller = deploy.place_controller(cfg, data_dir, time.strftime("%Y%m%dT%H%M%S"))
    status = deploy.wait_ready(controller, timeout, expect_nodes=len(cluster.nodes))
    return Deployment(controller, data_dir, cfg, status)


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def ready(base: str) -> bool:
    """The node at ``base`` answers /readyz with 200 (False while it starts or is away)."""
    try:
        return httpx.get(f"{base}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def get(url: str, **kw: Any) -> httpx.Response:
    return httpx.get(url, timeout=10.0, **kw)


# ------------------------------------------------------------------------------------- the fleet


def claim(base: str, limit: int | None = 20, **kw: Any) -> list[dict]:
    r = httpx.post(f"{base}/render_queue/claim", json={} if limit is None else {"limit": limit}, timeout=15, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def claim_until(base: str, want: int = 1, limit: int = 20, timeout: float = 15) -> list[dict]:
    """Claim until at least ``want`` jobs came back (the ready set is published every second)."""
    got: list[dict] = []

    def step() -> bool:
        got.extend(claim(base, limit))
        return len(got) >= want

    wait_for(step, timeout=timeout, interval=0.3, what=f"{want} claimable job(s)")
    return got


def result_body(job: dict, *, outcome: str | None = "rendered", status: int | None = 200,
                html: bytes | None = b"<html><body>rendered</body></html>", encoding: str = "gzip",
                **meta: Any) -> tuple[bytes, dict]:
    import gzip as _gzip

    import brotli as _brotli

    headers = {"content-type": "text/html; charset=utf-8"}
    content = b""
    if html is not None:
        content = {"gzip": _gzip.compress, "br": _brotli.compress, "identity": bytes}[encoding](html)
        headers["content-encoding"] = encoding
    doc = {"id": job["id"], "url": job["url"], "headers": headers, "renderTime": 800, **meta}
    if status is not None:
        doc["statusCode"] = status
    if outcome is not None:
        doc["outcome"] = outcome
    raw = __import__("json").dumps(doc).encode()
    return raw + content, {"x-metadata-size": str(len(raw)), "content-type": "application/octet-stream"}


def take(base: str, keys: list[str], timeout: float = 20, **kw: Any) -> dict[str, dict]:
    """Claim until every key in ``keys`` was granted; other jobs are returned too."""
    got: dict[str, dict] = {}

    def step() -> bool:
        for job in claim(base, 25, **kw):
            got[job["id"]] = job
        return all(k in got for k in keys)

    wait_for(step, timeout=timeout, interval=0.3, what=f"grants of {keys}")
    return got


def post_result(job: dict, *, worker: str | None = None, retry_503: bool = True, **kw: Any) -> httpx.Response:
    """``worker``: the x-worker-id the reference fleet sends (none when None). A 503 is posted again
    after its Retry-After, a few times, as the fleet does (a node starved of CPU while the suite runs
    beside it answered one: its store did not answer the result within 10 s), unless ``retry_503``
    is False (a test of what is acknowledged); any other answer is the caller's."""
    body, headers = result_body(job, **kw)
    if worker is not None:
        headers["x-worker-id"] = worker
    tries = 3 if retry_503 else 1
    for attempt in range(tries):
        r = httpx.post(f"{job['callbackOrigin']}/render_queue/job_result", content=body, headers=headers, timeout=30)
        if r.status_code != 503 or attempt == tries - 1:
            break
        time.sleep(min(5.0, float(r.headers.get("retry-after") or 1)))
    return r


def brotli_bomb(mib: int) -> bytes:
    """``mib`` MiB of zeros as brotli (1 GiB is 1.6 KB), compressed a MiB at a time: never held whole."""
    import brotli as _brotli

    c, chunk = _brotli.Compressor(quality=3), bytes(1 << 20)
    return b"".join([c.process(chunk) for _ in range(mib)] + [c.finish()])


def ingress_peak_rss_mb(node: Any = "node-a", replica: int = 0, *, reset: bool = False) -> float:
    """The ingress replica's peak RSS so far (VmHWM: the kernel's high-water mark). ``node``: a node
    name of the shared Ray cluster, or a ``tests.localnode.LocalNode``, whose replica runs in this
    process: ``reset`` first lowers the mark to the current RSS (``clear_refs``), so that the growth
    from here on is the replica's, not whatever this process did before."""
    if isinstance(node, str):
        import ray

        from prerender_ray.actors.common import lookup

        pid = ray.get(lookup("ingress", node, replica).status.remote(), timeout=30)["pid"]
    else:
        pid = os.getpid()
        if reset:
            Path("/proc/self/clear_refs").write_text("5")
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM:")) / 1024


def put_target(base: str, url: str, **fields: Any) -> dict:
    r = httpx.put(f"{base}/render_targets", json={"url": url, **fields}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def schedule(base: str, key: str) -> dict | None:
    r = httpx.post(f"{base}/prerender_admin/schedule", json={"cacheKey": key}, timeout=15)
    assert r.status_code == 200, r.text
    return r.json()["renderSchedule"]


def rocksdb_options(path: Path) -> str:
    """The options a RocksDB directory actually runs with (its newest OPTIONS file), not what we meant
    to set."""
    return max(path.glob("OPTIONS-*")).read_text()


# ------------------------------------------------------------------------------------ sitemaps


def walk(base: str, url: str | None = None, **body: object) -> list[dict]:
    """A blocking walk (one root, or every root without ``url``): the result documents."""
    r = httpx.post(f"{base}/sitemaps", json={**({"url": url} if url else {}), "background": False, **body},
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _found(base: str, path: str, **params: str) -> dict | None:
    r = httpx.get(f"{base}{path}", params=params, timeout=10)
    return None if r.status_code == 404 else r.json()


def progress(base: str, root: str) -> dict | None:
    return _found(base, "/sitemap_refresh", root=root)


def target(base: str, url: str) -> dict | None:
    return _found(base, "/render_targets", url=url)


def sitemap_row(base: str, url: str) -> dict | None:
    return _found(base, "/sitemaps", url=url)


def write_page(node: Any, key: str, html: bytes, *, expires_in: int = 3_600_000) -> None:
    """A gzip page stored under ``key`` by that node's store, as a result would store it. ``node``: a
    node name of the shared Ray cluster, or a ``tests.localnode.LocalNode``."""
    import gzip as _gzip

    from prerender_ray.serving.framing import encode_page
    from prerender_ray.storage.pages import Page

    now = int(time.time() * 1000)
    page = Page(cache_key=key, status_code=200, headers={"content-type": "text/html", "content-encoding": "gzip"},
                last_cached=now, expires_at=now + expires_in, is_indexable=True, content=_gzip.compress(html))
    ops = [(key.encode(), encode_page(page))]
    if not isinstance(node, str):
        node.ask("store", "apply", [], ops)
        return
    import ray

    from prerender_ray.actors.common import lookup

    ray.get(lookup("store", node).apply.remote([], ops), timeout=30)


# ------------------------------------------------------------------------------ the Grafana dashboard

# What only a node of a cluster emits: reads from a URL's holders, a backlog per peer.
CLUSTER_SERIES = {"prerender_holder_reads_total", "prerender_holder_read_seconds_bucket", "prerender_replication_pending"}
# What only a feature the running-node test leaves off emits (Web Bot Auth, bots.verify): the catalog
# test (tests/test_metrics.py) checks that their names and labels exist.
FEATURE_SERIES = {"prerender_bot_signatures_total", "prerender_bot_verifications_total"}


def dashboard_series() -> set[str]:
    """Every series docs/grafana-dashboard.json queries."""
    import json
    import re

    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    return {name for p in dashboard["panels"] for t in p["targets"] for name in re.findall(r"\bprerender_[a-z_]+", t["expr"])}


def exposed_series(base: str) -> set[str]:
    """The sample names a node's /metrics exposes."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def metric_value(base: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples with ``labels`` on a node's /metrics (0 when none). A LocalNode
    shares its process's registry with every node before it: compare a value with an earlier one."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def parse_python(source: str) -> Any:
    """``ast.parse`` with the collector off: CPython 3.11.7 counts the AST builder's recursion in state
    shared with any Python code a collection runs meanwhile (a finalizer of another test's leftovers),
    and then fails the parse ("AST constructor recursion depth mismatch", gh-106905; seen once in CI)."""
    import ast
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


class FakeTransport(asyncio.Transport):
    """A transport for a protocol fed in process: it never pauses and closes when told; a subclass
    says what a write does. ``peer_port``: the client's port it reports."""

    def __init__(self, peer_port: int = 5555) -> None:
        super().__init__()
        self.closing = False
        self.peer_port = peer_port

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", self.peer_port), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False
