"""What a node store's catch-up keeps about its pulls (``catchup.py``): the arrivals a peer's second
pass is sent from (``Arrivals``), the pulls a store still owes (``Owed``, on disk), and what one pull
brought (``Pulled``)."""

from __future__ import annotations

import itertools
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from prerender_ray.storage.keys import PULL_OWED
from prerender_ray.storage.placement import NEVER

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
    every node holding everything, a peer that had caught up itself did, and that peer answered for
    its own writes the other may lack: ``CatchUp._pull_twice``). Before, it lived in a retry task
    that gave up when the peer left the membership or the store died: a joiner cut off during its catch-up never
    pulled what the peer alone held, and the peer, back later, took it for delivered (simulation
    seeds 5000 and 6057)."""

    def __init__(self, db: Any):
        self.db = db
        # what the record holds, read once: this is its only writer, and every ``since`` page asks
        self._owed: dict[str, int] | None = None

    def load(self) -> dict[str, int]:
        if self._owed is None:
            self._owed = self._read()
        return dict(self._owed)

    def _read(self) -> dict[str, int]:
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
        self._owed = dict(owed)


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
