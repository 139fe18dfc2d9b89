"""Typed calls to the Controller actor (``actors/controller.py``), each under a deadline.

Two kinds of caller: the driver (``prerender-ray up/status/down``, ``actors/deploy.py``), which
blocks, and the node actors, which ask for the membership from their event loop. Ray is imported
only when a call is made: the CLI starts without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prerender_ray.identity.membership import Membership
from prerender_ray.identity.nodes import CONTROLLER, NAMESPACE
from prerender_ray.rpc import DeadlineExceeded, call

STATUS_DEADLINE_S = 45.0  # one status call: it asks every node's actors (deploy's wait_ready asks again)
NODES_DEADLINE_S = 10.0  # answered from memory
STOP_DEADLINE_S = 60.0


class ControllerClient:
    def __init__(self, handle: Any):
        self.handle = handle

    @classmethod
    def find(cls) -> ControllerClient | None:
        """The running controller, or None: a blocking GCS round trip (the driver's, or in a thread)."""
        import ray

        try:
            return cls(ray.get_actor(CONTROLLER, namespace=NAMESPACE))
        except ValueError:
            return None

    @classmethod
    def place(cls, config: dict, data_dir: Path, epoch: str) -> ControllerClient:
        """Start the detached controller (it places every node's actors)."""
        from prerender_ray.actors.client import spawn
        from prerender_ray.actors.common import TASK_EVENTS
        from prerender_ray.actors.controller import Controller
        from prerender_ray.logs import LOG_DIR_ENV

        options = dict(name=CONTROLLER, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=-1,
                       max_concurrency=100, enable_task_events=TASK_EVENTS,
                       runtime_env={"env_vars": {LOG_DIR_ENV: str(Path(data_dir) / "logs")}})
        return cls(spawn(Controller, options, config, str(data_dir), epoch))

    # ------------------------------------------------------------------- the driver's (blocking)

    def status(self, timeout: float = STATUS_DEADLINE_S) -> dict:
        """Every node's health (``Controller.status``); ``DeadlineExceeded`` past ``timeout``, a
        ``RayActorError`` when the controller is gone."""
        return self._get(self.handle.status.remote(), timeout)

    def drain(self, aborted: Callable[[], bool] = lambda: False) -> dict | None:
        """Every node says paused and accepts its leases' results (``Controller.drain``), for the
        budget the controller names; None when ``aborted()`` turned true first (a second Ctrl-C),
        ``DeadlineExceeded`` past the budget."""
        import ray

        budget = self._get(self.handle.drain_budget_s.remote(), STATUS_DEADLINE_S)
        ref = self.handle.drain.remote()
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            ready, _ = ray.wait([ref], timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            if ready:
                report: dict = ray.get(ref)
                return report
            if aborted():
                return None
        raise DeadlineExceeded(f"no answer within {budget:g}s")

    def stop(self, timeout: float = STOP_DEADLINE_S) -> dict:
        """Stop every node's actors (``Controller.stop``)."""
        return self._get(self.handle.stop.remote(), timeout)

    def kill(self) -> None:
        """End the controller itself, for good (after ``stop``); one already gone is fine."""
        import ray

        try:
            ray.kill(self.handle, no_restart=True)
        except Exception:
            pass

    @staticmethod
    def _get(ref: Any, timeout: float) -> Any:
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise DeadlineExceeded(f"the controller did not answer within {timeout:g}s") from None

    # ------------------------------------------------------------------- the actors' (async)

    async def membership(self, node: str | None = None) -> Membership | None:
        """The controller's current membership (None before it saw a node); a malformed answer is a
        ValueError, never a half value. ``node``: a keeper's check, which confirms it is a member
        (refused while it leaves: ``Confirmations``)."""
        wire = await call(self.handle.membership_wire.remote(node), NODES_DEADLINE_S)
        return None if wire is None else Membership.from_wire(wire)
