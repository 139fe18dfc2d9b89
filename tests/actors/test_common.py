"""What every actor module shares (``actors/common.py``)."""

from __future__ import annotations

import pytest
import ray

from prerender_ray.actors.common import ActorNotPlaced, lookup, lookup_async


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """A process without Ray (a test harness, a tool): Ray reads as not started, and starting it is
    recorded and refused, as Ray's own start on first use (``ray.get_actor``'s auto-init) would do it."""
    started: list[tuple] = []

    def init(*args: object, **kwargs: object) -> None:
        started.append((args, kwargs))
        raise AssertionError("a lookup started Ray")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    return started


def test_a_lookup_without_ray_is_refused_and_starts_nothing(no_ray: list[tuple]) -> None:
    """A lookup off Ray (a bot miss asking another node's actor under a harness without a lookup of
    its own) is an actor not placed, as a route expects. Before, Ray's auto-init started (or joined) a
    Ray instance from the lookup's thread: seconds later, and after the test had ended, a test process
    that then started its own cluster found itself connected already ("ray.init twice")."""
    with pytest.raises(ActorNotPlaced, match="Ray is not running"):
        lookup("ingress", "node-b", 0)
    assert no_ray == []


async def test_an_async_lookup_without_ray_is_refused_at_once(no_ray: list[tuple]) -> None:
    with pytest.raises(ActorNotPlaced, match="Ray is not running"):
        await lookup_async("keeper", "node-b")
    assert no_ray == []
