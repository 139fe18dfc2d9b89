"""What every actor client shares: the handle, its deadline, and the calls every actor answers.

The typed clients (``KeeperClient``, ``LeaseClient``, ``StoreClient``, ``IngressClient``,
``WalkerClient``, ``ControllerClient``) are the only code that writes ``.remote(``: a caller names a
method tools can follow and cannot forget the deadline. A handle is a Ray actor handle or an
``rpc.Local`` (the same clients run without Ray in the test harness and the simulated cluster).
"""

from __future__ import annotations

import copy
from typing import Any, Self

from prerender_ray.rpc import call

CLOSE_DEADLINE_S = 10.0  # an actor flushes and closes its stores
MEMBERSHIP_DEADLINE_S = 3.0  # answered from memory (a push, a check)


class ActorClient:
    def __init__(self, handle: Any, deadline_s: float):
        self.handle = handle
        self.deadline_s = deadline_s

    def within(self, deadline_s: float) -> Self:
        """This client with every call under ``deadline_s`` (each ``*deadline_s`` attribute): for a
        call that must answer sooner, or may take longer, than the client's own deadline."""
        twin = copy.copy(self)
        for name in vars(twin):
            if name.endswith("deadline_s"):
                setattr(twin, name, deadline_s)
        return twin

    async def status(self) -> dict:
        return await call(self.handle.status.remote(), self.deadline_s)

    async def ready(self, timeout: float) -> None:
        """Until the actor is up (its ``__init__`` done), under ``timeout``; Ray's own probe, so a
        dead actor raises ``ray.exceptions.ActorDiedError`` (not for an ``rpc.Local`` handle)."""
        await call(self.handle.__ray_ready__.remote(), timeout)


class NodeActorClient(ActorClient):
    """A node actor the controller closes when it stops the node (the keeper, the store, the lease
    table, the sitemap walker; an ingress replica is stopped instead: ``IngressClient.stop``)."""

    async def close(self) -> None:
        await call(self.handle.close.remote(), CLOSE_DEADLINE_S)


def spawn(actor: Any, options: dict[str, Any], *args: Any) -> Any:
    """Create a Ray actor (or find it: ``get_if_exists``) and return its handle: ``actor`` is its Ray
    shell (``ray.remote(Cls)``), ``options`` Ray's (``actors.common.placement``)."""
    return actor.options(**options).remote(*args)
