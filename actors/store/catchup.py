"""A node's catch-up of its share from its peers, one sender per record (docs/architecture.md#replication).

A node that joins (or comes back under another membership) holds a share of the per-URL records;
every record of it is held by up to R peers. It asks every peer at once for what it holds, and each
peer sends only the records it is the designated sender of (``storage/placement.share_sender``), so
each record travels once. A peer that does not answer, or that is catching up itself (it may lack
records it is designated for), is replaced: the others send the records it was designated for, each
by the next holder in rank order; a peer that did not answer is also asked again later, for
everything of the share it holds (``Replication._catch_up_later``).

Then a second pass asks each peer only for what reached it since the first began: a peer keeps the
lowest version it accepted between the marks it gives out (``Arrivals``), and sends from there. Records that arrive at a
peer while its scan runs may be versioned behind the scan's position; before, the second pass went
back a fixed 10 minutes, which re-sent the whole share of a cluster loaded just before the join.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prerender_ray.identity.membership import StaleEpoch
from prerender_ray.storage.keys import PULL_OWED
from prerender_ray.storage.placement import NEVER

if TYPE_CHECKING:
    from prerender_ray.actors.store.replication import Replication

ARRIVALS_KEPT = 20_000  # spans between marks remembered; an older mark falls back to the margin
_BIRTHS = itertools.count()  # tells apart two stores of one process (the simulation, the tests)


class Arrivals:
    """The lowest version a store accepted from its peers between one mark it gave out and the next:
    "what reached it since" a mark, for a second pass that sends only that."""

    def __init__(self, now: float):
        self.born = [now, next(_BIRTHS)]  # a mark of another process (the store restarted) is not ours
        self.spans: deque[list[int]] = deque()  # [index, lowest version accepted in it]
        self.next = 0  # the index of the next span
        self.sealed = True  # a mark was given since the last span opened: arrivals open a new one
        self.kept_from = 0

    def accepted(self, low: int) -> None:
        if self.spans and not self.sealed:
            self.spans[-1][1] = min(self.spans[-1][1], low)
            return
        if len(self.spans) >= ARRIVALS_KEPT:
            self.kept_from = self.spans.popleft()[0] + 1
        self.spans.append([self.next, low])
        self.next += 1
        self.sealed = False

    def mark(self) -> list:
        self.sealed = True
        return [*self.born, self.next]

    def lowest_since(self, mark: Any) -> int | None:
        """The lowest version accepted since ``mark`` was given (``NEVER``: nothing arrived); None when
        the mark is not one of this store's, or older than what it remembers."""
        if not (isinstance(mark, list) and len(mark) == 3 and mark[:2] == self.born and isinstance(mark[2], int)
                and self.kept_from <= mark[2] <= self.next):
            return None
        return min((low for index, low in self.spans if index >= mark[2]), default=NEVER)


OWED_KEPT = 64  # peers a store keeps owing a pull from (the oldest debts beyond are forgotten)


class Owed:
    """The peers a store still owes a pull of its share from, each from a version, kept on disk.

    A peer that lists this store in a membership counts its share as delivered (it records its
    records as placed under that membership and its walks push this store nothing of it): the pull
    is the only way those records arrive. So the debt outlives a failed pull, the peer leaving the
    membership and this store's restarts, and is paid only when that peer answered a pull (or, with
    every node holding everything, any one peer did). Before, it lived in a retry task that gave up
    when the peer left the membership or the store died: a joiner cut off during its catch-up never
    pulled what the peer alone held, and the peer, back later, took it for delivered (simulation
    seeds 5000 and 6057)."""

    def __init__(self, db: Any):
        self.db = db

    def load(self) -> dict[str, int]:
        raw = self.db.get(PULL_OWED)
        try:
            doc = json.loads(raw) if raw is not None else {}
        except ValueError:
            return {}
        if not isinstance(doc, dict):
            return {}
        return {p: v for p, v in doc.items() if isinstance(p, str) and isinstance(v, int) and v >= 0}

    def add(self, peers: list[str], since: int) -> None:
        owed = self.load()
        for peer in peers:
            owed[peer] = min(since, owed.get(peer, since))
        self._save(dict(list(owed.items())[-OWED_KEPT:]))

    def paid(self, peers: list[str], since: int) -> None:
        """A pull from ``since`` pays the debts from that version on (not an older one)."""
        owed = self.load()
        left = {p: v for p, v in owed.items() if not (p in peers and v >= since)}
        if left != owed:
            self._save(left)

    def _save(self, owed: dict[str, int]) -> None:
        if owed:
            self.db.put(PULL_OWED, json.dumps(owed).encode())
        else:
            self.db.delete(PULL_OWED)


@dataclass
class Pulled:
    """What one pull from a peer brought: records accepted and received, the peer's arrivals mark
    at its start, and whether the peer had caught up itself (on every page)."""

    accepted: int = 0
    received: int = 0
    mark: Any = None
    complete: bool = True

    def page(self, answer: dict, accepted: int) -> None:
        self.accepted += accepted
        self.received += len(answer["records"])
        if self.mark is None:
            self.mark = answer.get("arrivals")
        self.complete = self.complete and bool(answer.get("synced", True))

    def add(self, other: Pulled) -> None:
        self.accepted += other.accepted
        self.received += other.received


async def pull_share(store: Replication, since: int, margin: int) -> tuple[Pulled, list[str], list[str]]:
    """The share of ``store`` from every peer, one sender per record (see the module): what came,
    the peers that answered every pass, and those that did not (asked again later by the caller).
    ``margin`` (an HLC span): a peer that lost our mark sends the second pass from this long before
    the first began."""
    peers = sorted(store.peers)
    began = store.clock.now().hlc
    done: dict[str, Pulled] = {}
    failed: list[str] = []

    async def each(asked: list[str], start: int, second: bool = False, **kw: Any) -> dict[str, Pulled]:
        """One pull from each of ``asked`` at once (``second``: from its arrivals mark); those that fail
        go to ``failed`` and out of ``done``."""
        got = await asyncio.gather(*(store._pull(p, start, True, arrived=done[p].mark if second else None, **kw)
                                     for p in asked), return_exceptions=True)
        out = {}
        for peer, res in zip(asked, got):
            if isinstance(res, Pulled):
                out[peer] = res
                continue
            if not isinstance(res, Exception):
                raise res  # cancelled: the store is closing
            failed.append(peer)
            done.pop(peer, None)
            if isinstance(res, StaleEpoch):  # asked again later, under the membership it is on
                await store.refused(peer, res)
            else:
                store.log.warning("catch-up from a peer failed", peer=peer, error=repr(res)[:300])
        return out

    done.update(await each(peers, since, senders=peers))
    sure = [p for p in peers if p in done and done[p].complete]
    missing = [p for p in peers if p not in sure]
    if missing and done:
        # what the missing ones were designated for, from the others (everything, when none is sure)
        asked = sure or list(done)
        for peer, res in (await each(asked, since, senders=sure or None,
                                     instead_of=missing if sure else None)).items():
            done[peer].add(res)
    asked = [p for p in (sure or peers) if p in done]
    for peer, res in (await each(asked, max(0, began - margin), True, senders=sure or None)).items():
        done[peer].add(res)
    total = Pulled()
    for each_peer in done.values():
        total.add(each_peer)
    return total, [p for p in peers if p in done], sorted(set(failed))
