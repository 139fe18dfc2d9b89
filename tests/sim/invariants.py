"""What the simulation checks, and the observers that feed it.

The observers watch the real lease tables and stores (a subclass that records what a call did, then
lets it stand); the checks compare with what clients were told. During the run: no key granted to
two holders at once; a result applied at most once per grant. At quiescence (faults off, partitions
healed, time to settle): every node on the controller's epoch; schedule rows only on their owner;
every acknowledged target's record on exactly its R holders with a row for each device on its
owner; every acknowledged result's page on its R holders.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prerender_ray.actors.leasetable import DurableLeases
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.storage.keys import KEEPER_META
from prerender_ray.storage.registry import target_key
from prerender_ray.storage.replication import payload_of

if TYPE_CHECKING:
    from tests.sim.cluster import Cluster


class Violation(AssertionError):
    """An invariant broke; ``name`` says which (a broken twin's test asserts on it)."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"{name}: {detail}")
        self.name = name


@dataclass
class Grant:
    key: str
    node: str
    granted_at: int
    expires: int
    worker: str | None
    closed: bool = False  # its result finished, or it died with its node


class Oracle:
    def __init__(self) -> None:
        self.grants: dict[str, list[Grant]] = {}
        self.finished: Counter[tuple[str, int]] = Counter()
        self.targets: set[str] = set()  # URLs whose put was acknowledged
        self.results: set[str] = set()  # keys whose result was acknowledged as applied
        self.violations: list[Violation] = []

    def fail(self, name: str, detail: str) -> None:
        v = Violation(name, detail)
        self.violations.append(v)
        raise v

    # ------------------------------------------------------------------- what the tables did

    def granted(self, node: str, key: str, now: int, expires: int, worker: str | None) -> None:
        for g in self.grants.get(key, ()):
            if not g.closed and g.expires > now:
                self.fail("double-grant", f"{key} granted by {node} at {now} to {worker} while {g.node}'s grant "
                          f"of {g.granted_at} to {g.worker} runs until {g.expires}")
        self.grants.setdefault(key, []).append(Grant(key, node, now, expires, worker))

    def moved(self, key: str, node: str) -> None:
        for g in self.grants.get(key, ()):
            if not g.closed:
                g.node = node

    def answered(self, key: str, granted_at: int) -> None:
        self.finished[(key, granted_at)] += 1
        if self.finished[(key, granted_at)] > 1:
            self.fail("applied-twice", f"a result for {key}'s grant of {granted_at} was applied "
                      f"{self.finished[(key, granted_at)]} times")
        for g in self.grants.get(key, ()):
            if g.granted_at == granted_at:
                g.closed = True

    def node_left(self, node: str) -> None:
        """A dead node's leases died with it (by design its slice is rebuilt and granted again)."""
        for gs in self.grants.values():
            for g in gs:
                if g.node == node:
                    g.closed = True

    # ------------------------------------------------------------------------ at quiescence

    def check_settled(self, cluster: Cluster, strays: bool = True) -> None:
        """``strays``: also fail on a record kept by a node that does not hold it (see
        ``tests/sim/test_sim.py::test_a_node_back_under_another_membership_drops_what_it_no_longer_holds``)."""
        m = cluster.controller.membership
        live = {n.name: n for n in cluster.live()}
        if set(live) != set(m.names):
            self.fail("membership", f"members {m.names} but running {sorted(live)}")
        for name, node in live.items():
            assert node.keeper is not None and node.store is not None
            if node.keeper.view.epoch != m.epoch:
                self.fail("one-epoch", f"{name}'s keeper is at epoch {node.keeper.view.epoch}, the controller at {m.epoch}")
            if node.store.members.view.epoch != m.epoch:
                self.fail("one-epoch", f"{name}'s store is at epoch {node.store.members.view.epoch}, the controller at {m.epoch}")
            if tuple(node.store.members.placement.ownership.names) != m.names:
                self.fail("one-epoch", f"{name}'s store places under {node.store.members.placement.ownership.names}, not {m.names}")
        rules = cluster.cfg and next(iter(live.values())).keeper.conf.rules  # type: ignore[union-attr]
        replicas = cluster.cfg.cluster.replicas
        for name, node in live.items():
            assert node.keeper is not None
            for k, v in node.keeper.rows.db.items():
                if k[:1] == KEEPER_META:  # the keeper's own records
                    continue
                key = k.decode()
                owner = m.owner(rules.url_of(key))
                if owner != name:
                    self.fail("rows-on-owner", f"{name} stores the row of {key}, owned by {owner}")
                ScheduleRow.decode(key, v)
            for h in node.keeper.rows.ranking.rows():
                if m.owner(rules.url_of(h.key)) != name:
                    self.fail("rows-on-owner", f"{name} ranks {h.key}, owned by {m.owner(rules.url_of(h.key))}")
        for url in sorted(self.targets):
            holders = set(m.holders(url, replicas))
            have = {name for name, node in live.items()
                    if payload_of(node.store.registry.get(target_key(url))) is not None}  # type: ignore[union-attr]
            if not holders <= have:
                self.fail("records-on-holders", f"target {url} held by {sorted(have)}, its holders are {sorted(holders)}")
            if strays and have != holders:
                self.fail("no-strays", f"target {url} held by {sorted(have)}, its holders are {sorted(holders)}")
            owner = live[m.owner(url)]
            for key in rules.keys_of(url):
                if owner.keeper.rows.db.get(key.encode()) is None:  # type: ignore[union-attr]
                    self.fail("target-lost", f"{key} (acknowledged) has no schedule row on its owner {owner.name}")
        for key in sorted(self.results):
            url = rules.url_of(key)
            holders = set(m.holders(url, replicas))
            have = {name for name, node in live.items()
                    if payload_of(node.store.pages.get(key.encode())) is not None}  # type: ignore[union-attr]
            if not holders <= have:
                self.fail("result-lost", f"the page of {key} (acknowledged) is on {sorted(have)}, not on all of "
                          f"{sorted(holders)}")


class ObservedLeases(DurableLeases):
    """The real lease table; what it granted, moved and finished is told to the oracle."""

    oracle: Oracle
    node: str

    async def grant_many(self, items: list[list]) -> list[list]:
        now = self.clock.now_ms()
        out = await super().grant_many(items)
        for (key, _, _, *worker), (_, expires, _) in zip(items, out):
            if expires is not None:
                self.oracle.granted(self.node, key, now, expires, worker[0] if worker else None)
        return out

    async def finish_results(self, items: list[list]) -> list[bool]:
        out = await super().finish_results(items)
        for key, _, granted_at in items:
            self.oracle.answered(key, granted_at)
        return out

    async def adopt(self, leases: list[tuple[str, list]]) -> int:
        n = await super().adopt(leases)
        for key, _ in leases:
            if self.table.export(key) is not None:
                self.oracle.moved(key, self.node)
        return n


def observed(base: type[DurableLeases], oracle: Oracle) -> Any:
    """A factory of ``base`` lease tables that report to ``oracle``."""

    def make(cfg: Any, db: Any, log: Any, clock: Any) -> DurableLeases:
        leases = base(cfg, db, log, clock)
        leases.oracle = oracle  # type: ignore[attr-defined]
        leases.node = log.node  # type: ignore[attr-defined]
        return leases

    return make
