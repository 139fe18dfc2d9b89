"""What every actor module shares: names, placement options and calls with deadlines."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from prerender_ray import metrics
from prerender_ray.nodes import NAMESPACE, actor_name
from prerender_ray.stores import node_dir

__all__ = ["NAMESPACE", "actor_name", "placement", "call", "lookup", "DeadlineExceeded"]


class DeadlineExceeded(TimeoutError):
    """An actor call that did not answer within its deadline."""


def placement(node_id: str, name: str, *, data_dir: str, node: str, epoch: str,
              max_concurrency: int = 1000, restarts: int = -1) -> dict[str, Any]:
    """Options for a named, detached actor pinned to one node, with the node's metrics directory."""
    env = {
        metrics.ENV: str(node_dir(data_dir, node) / "metrics" / epoch),
        "PRERENDER_NODE": node,
    }
    return dict(
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=restarts,
        max_concurrency=max_concurrency,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        runtime_env={"env_vars": env},
    )


async def call(ref: Any, timeout: float) -> Any:
    """Await an ObjectRef with a deadline; the caller decides what a timeout means."""
    try:
        return await asyncio.wait_for(ref, timeout)
    except asyncio.TimeoutError:
        raise DeadlineExceeded(f"no answer within {timeout:g}s") from None


def lookup(kind: str, node: str, index: int | None = None) -> Any:
    return ray.get_actor(actor_name(kind, node, index), namespace=NAMESPACE)


def process_env_node() -> str:
    return os.environ.get("PRERENDER_NODE", "")
