"""Deliberately broken twins of the real parts, one per invariant: each must make the simulation
fail with that invariant within the CI seeds, or the harness could not see the bug it stands for.
They are installed in the simulated cluster only (``Cluster.make_*``), never in the product."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prerender_ray.actors.keeper.keeper import Keeper
from tests.sim.cluster import Cluster
from tests.sim.invariants import ObservedLeases, observed


class GrantsWithoutChecking(ObservedLeases):
    """A lease table that forgets the lease it holds before each grant: every grant succeeds."""

    async def grant_many(self, items: list[list]) -> list[list]:
        now = self.clock.now_ms()
        for key, *_ in items:
            self.table.forget(key, now)
        return await super().grant_many(items)


class AppliesEveryResult(ObservedLeases):
    """A lease table that lets every result apply to the key's latest grant, replays included."""

    async def begin_results(self, items: list[list]) -> list[list]:
        out = await super().begin_results(items)
        return [["apply", granted_at] if verdict in ("duplicate", "answering") else [verdict, granted_at]
                for verdict, granted_at in out]


def double_grant(cluster: Cluster) -> None:
    cluster.make_leases = observed(GrantsWithoutChecking, cluster_oracle(cluster))

    def keeper(*args: Any, **kwargs: Any) -> Keeper:
        k = Keeper(*args, **kwargs)
        k.claims.blocked = lambda key: False  # type: ignore[method-assign]  # and no mirror to skip leased keys
        return k

    cluster.make_keeper = keeper


def applied_twice(cluster: Cluster) -> None:
    cluster.make_leases = observed(AppliesEveryResult, cluster_oracle(cluster))


def forgets_handoff(cluster: Cluster) -> None:
    """A keeper whose hand-off never forwards the rows it no longer owns."""

    def keeper(*args: Any, **kwargs: Any) -> Keeper:
        k = Keeper(*args, **kwargs)
        k.handoff.kick = k.rows.on_unowned = lambda: None  # type: ignore[method-assign]
        return k

    cluster.make_keeper = keeper


def stale_epoch(cluster: Cluster) -> None:
    """A keeper that never takes a membership after its first: pushes and checks are ignored."""

    def keeper(*args: Any, **kwargs: Any) -> Keeper:
        k = Keeper(*args, **kwargs)

        async def ignored(*_: Any) -> dict:
            return {"changed": False}

        async def unasked() -> bool:
            return False

        k.handoff.set_membership = ignored  # type: ignore[method-assign]
        k.handoff.fetch_membership = unasked  # type: ignore[method-assign]
        return k

    cluster.make_keeper = keeper


def grants_cut_off(cluster: Cluster) -> None:
    """A keeper that grants whether or not the controller confirmed its membership lately: cut off on
    the far side of a partition from the controller, it goes on granting keys given to others."""

    def keeper(*args: Any, **kwargs: Any) -> Keeper:
        k = Keeper(*args, **kwargs)
        k.claims.trusted = lambda now: True
        return k

    cluster.make_keeper = keeper


def confirms_cut_off(cluster: Cluster) -> None:
    """A controller that confirms its nodes though it cannot read Ray's node list: cut off with a
    minority (``controller_on_the_minority``), it keeps them granting while the controller Ray placed
    on the other side gives their keys to others."""
    cluster.controller.confirmations.listed_lately = lambda now_ms: True  # type: ignore[method-assign]


def forgets_membership(cluster: Cluster) -> None:
    """A controller placed again that starts from the nodes Ray lists, not from the last membership:
    it drops a minority cut off with the old controller at once, while their trust still runs."""
    cluster.recalls_membership = False


def never_ships(cluster: Cluster) -> None:
    """A node store whose writes never leave the node."""
    make = cluster.make_store

    def store(*args: Any, **kwargs: Any) -> Any:
        s = make(*args, **kwargs)
        s.shipping.enqueue = lambda peer, records: None  # type: ignore[method-assign]
        return s

    cluster.make_store = store


def keeps_strays(cluster: Cluster) -> None:
    """A node store whose rebalance pushes what it no longer holds to the holders but never drops it."""
    make = cluster.make_store

    def store(*args: Any, **kwargs: Any) -> Any:
        s = make(*args, **kwargs)
        s.records.drop_local = lambda name, items: 0  # type: ignore[method-assign]
        return s

    cluster.make_store = store


def cluster_oracle(cluster: Cluster) -> Any:
    return cluster.oracle


# twin -> (its installer, the invariants that may catch it first)
TWINS: dict[str, tuple[Callable[[Cluster], None], tuple[str, ...]]] = {
    "double-grant": (double_grant, ("double-grant",)),
    "applied-twice": (applied_twice, ("applied-twice",)),
    "forgets-handoff": (forgets_handoff, ("rows-on-owner",)),
    # a keeper left on an old membership also grants keys it no longer owns
    "stale-epoch": (stale_epoch, ("one-epoch", "double-grant")),
    "never-ships": (never_ships, ("records-on-holders", "result-lost")),
    "keeps-strays": (keeps_strays, ("no-strays",)),
    "grants-cut-off": (grants_cut_off, ("double-grant",)),
}
