"""Where a replicated record lives (docs/architecture.md#tiers): per-URL records on the first R nodes of their
URL's rendezvous order, everything else on every node.

Per-URL: a target (``t:<url>``), a page (``<cache key>``), its freshness record (``\\x00f<cache key>``)
and its render history (``\\x00r<cache key>\\x00...``). Cluster-wide: sitemaps, their entries and runs,
queue control and status, config overrides, revoked sessions. The replication bookkeeping
(``\\x00v``, ``\\x00h``, ``\\x00c``, ``\\x00s``) and the derived by-sitemap index are node-local and never
shipped, so they have no place here.
"""

from __future__ import annotations

from collections.abc import Callable

from prerender_ray.identity.nodes import Ownership
from prerender_ray.storage.keys import FRESHNESS, RENDER_HISTORY, TARGET

EVERY = None  # the placement of a cluster-wide record


class Placement:
    """``holders(db, key)``: the nodes that hold a record (None: every node), under one membership."""

    def __init__(self, ownership: Ownership, replicas: int, url_of_key: Callable[[str], str]):
        self.ownership = ownership
        self.replicas = replicas
        self.url_of_key = url_of_key  # a cache key's URL half (the key layout is config)

    @property
    def partial(self) -> bool:
        """Some node holds less than everything (R is below the node count)."""
        return self.replicas < len(self.ownership.names)

    def url_of(self, db: str, key: bytes) -> str | None:
        """The URL a record belongs to; None for a cluster-wide record."""
        if db == "registry":
            return key[len(TARGET):].decode("utf-8", "surrogateescape") if key.startswith(TARGET) else None
        if key.startswith(FRESHNESS):
            key = key[len(FRESHNESS):]
        elif key.startswith(RENDER_HISTORY):
            key = key[len(RENDER_HISTORY):].split(b"\x00", 1)[0]
        return self.url_of_key(key.decode("utf-8", "surrogateescape"))

    def holders(self, db: str, key: bytes) -> tuple[str, ...] | None:
        url = self.url_of(db, key)
        if url is None:
            return EVERY
        return self.ownership.holders(url, self.replicas)

    def holds(self, node: str, db: str, key: bytes) -> bool:
        if not self.partial:
            return True
        held = self.holders(db, key)
        return held is EVERY or node in held

    def url_holders(self, url: str) -> tuple[str, ...]:
        return self.ownership.holders(url, self.replicas)

    def under(self, members: list[str] | tuple[str, ...]) -> Placement:
        """The same rule under another membership (a caller's view)."""
        return Placement(Ownership(list(members)), self.replicas, self.url_of_key)

    def split(self, peers: list[str], db: str, keys: list[bytes]) -> dict[str, list[int]]:
        """For each of ``peers``, the indexes of ``keys`` it holds (a batch's shipping plan). Device
        variants of a URL come together: its holders are found once per URL."""
        plan: dict[str, list[int]] = {p: [] for p in peers}
        last: object = object()
        held: tuple[str, ...] | None = None
        for i, key in enumerate(keys):
            url = self.url_of(db, key)
            if url != last:
                last, held = url, None if url is None else self.ownership.holders(url, self.replicas)
            for p in (peers if held is None else held):
                if p in plan:
                    plan[p].append(i)
        return plan


def of_members(members: list[str] | tuple[str, ...], replicas: int,
               url_of_key: Callable[[str], str]) -> Placement:
    return Placement(Ownership(list(members)), replicas, url_of_key)


NEVER = (1 << 64) - 1  # a version above every real one


def share_sender(placement: Placement, before: Placement | None, holder: str, me: str, senders: list[str],
                 instead_of: list[str] | None = None, unshipped: dict[str, int] | None = None
                 ) -> Callable[[str, bytes, int], bool]:
    """Whether ``me`` sends a record (db, key, version) to ``holder``'s pull of its share under
    ``placement``: one sender per record among the peers that answer (``senders``).

    A record's designated sender is the first of ``senders`` in its URL's rendezvous order among its
    holders under ``placement`` (a joiner's other holders: the ones that held it before and keep it),
    and also among its holders under ``before`` (the membership this peer's records were placed
    under while its walk from it runs: after a leave with the join, the holders of the record that
    keep it may rank below one that never had it). Every peer that answers one pull computes the same
    first holders; a cluster-wide record's sender is the first of ``senders`` by name. A record with
    no designated sender among ``senders`` is sent by every peer holding it. ``me`` also sends a
    record versioned at or after ``unshipped[d]`` (the oldest of ``me``'s writes that may not have
    reached the designated ``d``): the writer sends what the designated one may not have yet.

    ``instead_of``: peers designated in a first pull that did not answer it (or were catching up
    themselves): only the records one of them was designated for, each by the first of ``senders``
    that would be designated without them."""
    among = frozenset(senders)
    missing = frozenset(instead_of or ())
    everyone = among | missing
    unshipped = unshipped or {}

    def firsts(held: tuple[str, ...] | None, was: tuple[str, ...] | None, pool: frozenset[str]) -> set[str]:
        if held is None:  # cluster-wide
            return {min(pool)} if pool else set()
        out = {next((n for n in held if n in pool), "")}
        if was is not None:
            out.add(next((n for n in was if n in pool), ""))
        out.discard("")
        return out

    def keep(db: str, key: bytes, hlc: int) -> bool:
        url = placement.url_of(db, key)
        held = was = None
        if url is not None:
            held = placement.url_holders(url)
            if holder not in held:
                return False
            was = before.url_holders(url) if before is not None else None
        if missing and not firsts(held, was, everyone) & missing:
            return False  # its designated sender answered the first pull
        designated = firsts(held, was, among)
        if not designated or me in designated:
            return True
        return any(hlc >= unshipped.get(d, NEVER) for d in designated)

    return keep
