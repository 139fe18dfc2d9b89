"""The cluster's membership as one immutable value with an epoch, and the one place a process holds it.

The controller assigns every change of the node list a higher epoch. A process holds exactly one
``Membership`` (in a ``MembershipView``) and replaces it only with a higher epoch, whatever delivered
it: a push, the read at start, a periodic check. Pushes are not ordered, so without the epoch a late
push could put back an older node list (seen in CI: a restarted node kept a two-node view for minutes).

Work that moves or writes owned or held data captures one ``Membership`` (its ``ownership`` is fixed
for that epoch), does its work against it, and checks ``view.epoch`` again before it commits; a call
between nodes carries the caller's epoch, and a receiver on a newer epoch refuses it with
``StaleEpoch`` so the caller refreshes and retries.

A node leaves the membership only once it can no longer grant (``Confirmations``): a keeper grants
only while the controller confirmed its membership lately, so a node the controller cannot reach but
that still runs (the controller's side of a partition is the smaller one) has stopped granting before
its keys are given to others, who grant them at once as a departed node's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prerender_ray.identity.nodes import NodeInfo, Ownership, valid_name

MAX_NODES = 1024  # a wire membership with more is refused: no deployment comes near it
NOBODY = -1  # the epoch of a view that has not heard from the controller: any real epoch replaces it
# A keeper grants only while a membership check it sent within this long was answered listing its
# node; the controller drops a node only this long after it last answered it. Four of a keeper's
# checks (2.5 s each), and below Ray's own time to declare a node dead (about 30 s by default), so a
# crashed node leaves no later than Ray says so.
MEMBERSHIP_TRUST_MS = 10_000


def next_epoch(last: int, now_ms: int) -> int:
    """The controller's epoch for its next change: above its last, and at least the wall clock in
    ms, so a controller placed again (which remembers nothing) still starts above every epoch a
    running process holds, unless the clock stepped back further than the time since the last change."""
    return max(last + 1, now_ms)


class StaleEpoch(RuntimeError):
    """A call made under an older membership than the receiver's: the caller refreshes and retries.
    Carries both epochs, so a log line says which side lagged and by how much."""

    def __init__(self, caller: int, receiver: int, what: str = ""):
        super().__init__(f"stale membership epoch {caller} (receiver is at {receiver})" + (f": {what}" if what else ""))
        self.caller = caller
        self.receiver = receiver

    def __reduce__(self) -> tuple[Any, ...]:  # raised across Ray and the simulated network: keep both epochs
        return (StaleEpoch, (self.caller, self.receiver))


@dataclass(frozen=True)
class Membership:
    """Node list and addresses at one epoch. ``ownership`` is computed once and never changes: a
    decision made against it stays a decision about this epoch."""

    epoch: int
    nodes: tuple[NodeInfo, ...]  # sorted by name, names unique
    ownership: Ownership = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.nodes, key=lambda n: n.name))
        names = [n.name for n in ordered]
        if len(set(names)) != len(names):
            raise ValueError(f"membership names a node twice: {names}")
        if self.epoch < NOBODY:
            raise ValueError("a membership epoch is never negative")
        object.__setattr__(self, "nodes", ordered)
        object.__setattr__(self, "ownership", Ownership(names))

    @classmethod
    def of(cls, epoch: int, nodes: Iterable[NodeInfo | str]) -> Membership:
        """From infos or bare names (a name alone gets no address: tests and the keeper's own view)."""
        infos = [n if isinstance(n, NodeInfo) else NodeInfo(name=n, host="", port=0) for n in nodes]
        return cls(epoch, tuple(infos))

    @property
    def names(self) -> tuple[str, ...]:
        return self.ownership.names

    def owner(self, url: str) -> str:
        return self.ownership.owner(url)

    def holders(self, url: str, replicas: int) -> tuple[str, ...]:
        return self.ownership.holders(url, replicas)

    def to_wire(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "nodes": [dataclasses.asdict(n) for n in self.nodes]}

    @functools.cached_property
    def wire(self) -> dict[str, Any]:
        """``to_wire`` made once: calls between stores carry it (read only, never changed)."""
        return self.to_wire()

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> Membership:
        """Parse what a push or a read carries; anything malformed is a ValueError, never a half value."""
        if not isinstance(doc, Mapping):
            raise ValueError("a membership is an object")
        epoch, nodes = doc.get("epoch"), doc.get("nodes")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"membership epoch must be a non-negative integer, not {epoch!r}")
        if not isinstance(nodes, list) or not nodes or len(nodes) > MAX_NODES:
            raise ValueError(f"membership nodes must be a list of 1 to {MAX_NODES}")
        infos = []
        for raw in nodes:
            if not isinstance(raw, Mapping):
                raise ValueError("a membership node is an object")
            known = {f.name for f in dataclasses.fields(NodeInfo)}
            try:
                info = NodeInfo(**{k: v for k, v in raw.items() if k in known})
            except TypeError as e:
                raise ValueError(f"membership node: {e}") from None
            if not isinstance(info.name, str) or not valid_name(info.name):
                raise ValueError(f"membership node name is not usable: {info.name!r}")
            infos.append(info)
        return cls(epoch, tuple(infos))


class Confirmations:
    """The controller's side of ``MEMBERSHIP_TRUST_MS``: when it last confirmed to each node that it is
    a member, and so when a node that Ray no longer lists may leave the membership. Until then the node
    stays in it (its keys stay its own), and its checks are not answered (``confirm`` is False), so
    the trust it holds runs out. A controller that starts takes every node as confirmed as late as a
    trust after its start: one placed before it may have answered them until then (one cut off from
    Ray's head answers no longer than a trust after its last listing, which came before Ray placed
    this one).

    It confirms only while it reads Ray's node list (``held``, each pass): a controller cut off from
    Ray's head with a minority of the nodes cannot see Ray declare them dead, and Ray places another
    controller on the head's side, which gives their keys to the others. Unanswered, the minority's
    trust runs out as if it were cut off from the controller itself, within a trust after its last
    listing (no later than Ray's death declaration, which is what the others' fences count from)."""

    def __init__(self, now_ms: int, trust_ms: int = MEMBERSHIP_TRUST_MS):
        self.started = now_ms
        self.trust_ms = trust_ms
        self.listed_at = now_ms  # it reads Ray's list within its first pass
        self._answered: dict[str, int] = {}
        self._leaving: set[str] = set()

    def listed(self, now_ms: int) -> None:
        """Ray's node list was read at ``now_ms``."""
        self.listed_at = max(self.listed_at, now_ms)

    def listed_lately(self, now_ms: int) -> bool:
        return now_ms - self.listed_at < self.trust_ms

    def confirm(self, node: str, now_ms: int) -> bool:
        """A check from ``node`` is answered (True) unless the node is leaving, or Ray's node list
        was not read lately (``listed_lately``)."""
        if node in self._leaving or not self.listed_lately(now_ms):
            return False
        self._answered[node] = max(now_ms, self._answered.get(node, 0))
        if len(self._answered) > 4 * MAX_NODES:  # names the controller never placed: bounded
            self._answered = dict(sorted(self._answered.items(), key=lambda kv: -kv[1])[:MAX_NODES])
        return True

    def leaves_at(self, node: str) -> int:
        """When ``node`` may leave: its trust, from the last answer it may have had, has run out."""
        return max(self._answered.get(node, 0), self.started + self.trust_ms) + self.trust_ms

    def held(self, members: Iterable[str], alive: Iterable[str], now_ms: int) -> list[str]:
        """Members Ray no longer lists that must stay in the membership for now (each stops being
        answered); a member listed again, or one gone from the membership, is no longer leaving.
        ``alive``: Ray's node list, read at ``now_ms``."""
        self.listed(now_ms)
        alive = set(alive)
        gone = [n for n in members if n not in alive]
        self._leaving = set(gone)
        return [n for n in gone if now_ms < self.leaves_at(n)]


class MembershipView:
    """A process's one current membership. ``offer`` is the only way it changes: a higher epoch
    replaces it and the listeners run (in order, synchronously, before ``offer`` returns, so no
    await can see the value half-applied); an equal or lower one is ignored."""

    def __init__(self, initial: Membership):
        self._current = initial
        self._listeners: list[Callable[[Membership, Membership], None]] = []

    @classmethod
    def alone(cls, node: NodeInfo | str) -> MembershipView:
        """A process that knows only itself (before its first read): epoch ``NOBODY``."""
        return cls(Membership.of(NOBODY, [node]))

    @property
    def current(self) -> Membership:
        return self._current

    @property
    def epoch(self) -> int:
        return self._current.epoch

    def listen(self, fn: Callable[[Membership, Membership], None]) -> None:
        """``fn(before, after)`` on every change."""
        self._listeners.append(fn)

    def offer(self, m: Membership) -> bool:
        """Adopt ``m`` if it is newer than the current value; True when it was."""
        if m.epoch <= self._current.epoch:
            return False
        before, self._current = self._current, m
        for fn in self._listeners:
            fn(before, m)
        return True

    def check(self, caller_epoch: int, what: str = "") -> None:
        """Refuse a call made under an older epoch than ours (``StaleEpoch``). A caller on a newer
        epoch is not refused: the receiver refreshes (the caller's side of the protocol)."""
        if caller_epoch < self._current.epoch:
            raise StaleEpoch(caller_epoch, self._current.epoch, what)


async def unchecked(epoch: int, what: str) -> None:
    """The epoch gate of a part wired without a membership protocol (a lone keeper in a test)."""


async def never_moved(epoch: int) -> bool:
    """The refresh of a part wired without a controller to ask: its membership never moves on."""
    return False
