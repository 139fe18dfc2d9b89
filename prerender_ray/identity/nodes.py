"""Node identity and ownership: stable operator-given names, ingress ports, rendezvous hashing.

Ray node IDs change on every start, so nothing durable is keyed on them: a node is its name (the
``prerender-node`` label, else ``server.node_name``, else the host name) and its ingress port (the
``prerender-port`` label, else ``server.port``).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any

import xxhash

NAMESPACE = "prerender"
CONTROLLER = "controller"
LABEL_NAME = "prerender-node"
LABEL_PORT = "prerender-port"
LABEL_HOST = "prerender-host"
# Ray's head-node system config (``ray start --head --system-config``; Ray hands it to every node).
# Arguments and returns up to this size travel inline in the call instead of through the object store:
# a sitemap ingest's batches are 0.2-1 MB, and at Ray's default of 100 KB each one cost a plasma put
# and get plus raylet work (measured: 2.5 -> 0.2 us per URL in the raylet, 50.4 against 56.8 us of
# CPU per URL in all, first walk 30,600 -> 34,300 URLs/s).
# No prestarted workers: Ray starts one idle worker per CPU for the first driver, and none of our
# actors can use it (each has its own runtime env), so each sat idle: 0.4 s of CPU and ~100 MB a CPU.
RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 4 * 1024 * 1024, "prestart_worker_first_driver": False}
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def actor_name(kind: str, node: str, index: int | None = None) -> str:
    return f"{kind}:{node}" if index is None else f"{kind}:{node}:{index}"


def valid_name(name: str) -> bool:
    return bool(_NAME_OK.match(name))


@dataclass(frozen=True)
class NodeInfo:
    name: str
    host: str  # advertised to the fleet and to peers
    port: int
    ray_node_id: str = ""
    tls: bool = False

    @property
    def url(self) -> str:
        """The callbackOrigin form; https when the ingress serves TLS."""
        scheme = "https" if self.tls else "http"
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{scheme}://{host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "port": self.port, "url": self.url,
                "rayNodeId": self.ray_node_id}


def describe_ray_node(node: dict, *, default_name: str, default_port: int, advertise_host: str,
                      tls: bool) -> NodeInfo:
    """Name, host and port of a node from Ray's node table entry (labels override config)."""
    labels = node.get("Labels") or {}
    name = labels.get(LABEL_NAME) or default_name or node.get("NodeManagerHostname") or socket.gethostname()
    port_label = labels.get(LABEL_PORT)
    port = int(port_label) if port_label and str(port_label).isdigit() else default_port
    host = labels.get(LABEL_HOST) or advertise_host or node.get("NodeManagerAddress") or "127.0.0.1"
    return NodeInfo(name=name, host=host, port=port, ray_node_id=node.get("NodeID", ""), tls=tls)


class Ownership:
    """Rendezvous hashing over sorted node names: xxh64 of the url half, seeded per node; highest wins,
    ties to the first name. An empty node list never replaces a good one."""

    def __init__(self, names: list[str] | tuple[str, ...] = ()):
        self._names: tuple[str, ...] = ()
        self._seeds: tuple[tuple[int, str], ...] = ()
        self.update(names)

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def update(self, names: list[str] | tuple[str, ...]) -> bool:
        """Adopt a new membership; returns True when it changed. Empty or nameless lists are ignored."""
        clean = tuple(sorted({n for n in names if isinstance(n, str) and n}))
        if not clean or clean == self._names:
            return False
        self._names = clean
        self._seeds = tuple((xxhash.xxh64_intdigest(n.encode()), n) for n in clean)
        return True

    def owner(self, url: str) -> str:
        if not self._seeds:
            raise LookupError("no nodes known yet")
        if len(self._seeds) == 1:
            return self._seeds[0][1]
        key = url.encode()
        best_score, best = -1, ""
        for seed, name in self._seeds:
            score = xxhash.xxh64_intdigest(key, seed=seed)
            if score > best_score:  # strictly greater: ties keep the first (sorted) name
                best_score, best = score, name
        return best

    def holders(self, url: str, replicas: int) -> tuple[str, ...]:
        """The first ``replicas`` nodes of ``url``'s rendezvous order (all when there are fewer): where
        its target and pages live. The owner is first, so when it leaves, the next owner already
        holds the URL; a node that leaves or joins moves only the URLs whose top set it is in."""
        if not self._seeds:
            raise LookupError("no nodes known yet")
        if replicas >= len(self._seeds):
            owner = self.owner(url)
            return (owner, *(n for _, n in self._seeds if n != owner))
        key = url.encode()
        # highest score first, ties to the first (sorted) name, as owner() decides
        ranked = sorted(((-xxhash.xxh64_intdigest(key, seed=seed), i, name)
                         for i, (seed, name) in enumerate(self._seeds)))
        return tuple(name for _, _, name in ranked[:max(1, replicas)])

