"""A key's latest grant, as the lease table remembers it (``queue/leases.py``): when, to which worker,
how the lease was to end, whether a result answered it, and whether it moved with its key to another
node's table (``Leases.hand_over``). Also its durable form (a list in the key's record, written by
``actors/leasetable.py``) and what ``Leases.begin_result`` says of a result against it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Verdict = Literal["apply", "unknown", "duplicate", "answering", "superseded", "moved"]


class ResultCheck(NamedTuple):
    """``begin_result``'s answer. ``apply``: this result answers the grant of ``granted_at`` (finish or
    abandon it with that time); ``unknown``: no grant is remembered; ``duplicate``: the grant was
    answered already; ``answering``: a result for it is being applied (a racing replay: ask again
    later, it may yet fail); ``superseded``: the latest grant went to another worker; ``moved``: the
    grant was handed over with its key (``hand_over``): the adopter answers it, not this table."""

    verdict: Verdict
    granted_at: int | None


OPEN, ANSWERING, ANSWERED = 0, 1, 2


class GrantRecord:
    """A key's latest grant, remembered past its lease so its late result is recognised once."""

    __slots__ = ("any_worker", "at", "ends", "moved", "state", "worker")

    def __init__(self, at: int, worker: str | None, ends: int, state: int = OPEN, any_worker: bool = False,
                 moved: bool = False):
        self.at = at
        self.worker = worker  # the claim's x-worker-id (None: the claim sent none)
        self.any_worker = any_worker  # restored from a record that did not name the worker
        self.ends = ends  # the lease's end as granted
        self.state = state  # OPEN, ANSWERING (a result is being applied), ANSWERED
        self.moved = moved  # handed over with its key: the adopter answers it (``Leases.hand_over``)

    def record(self) -> list:
        """[granted_at, worker, any_worker, ends, answered], and True sixth when it moved."""
        out = [self.at, self.worker, self.any_worker, self.ends, self.state == ANSWERED]
        return [*out, True] if self.moved else out


def read_record(fields: list, lease_time: int) -> tuple[list, list]:
    """A per-key durable record (see ``actors/leasetable.py``) as (``restore``'s lease row without the
    key: [expires, due, cadence, released, answered, granted_at], its grant record). A record of the
    six-field form predates grants: its grant is taken to be ``lease_time`` before its expiry, from any
    worker, answered if its lease was. Raises ``ValueError`` / ``TypeError`` / ``IndexError``."""
    expires, due, cadence, released, answered = fields[:5]
    rest = fields[6:]  # fields[5]: when the record was written
    at = int(rest[0]) if rest and rest[0] is not None else int(expires) - lease_time
    grant = rest[1] if len(rest) > 1 and rest[1] is not None else \
        [at, None, True, int(expires), bool(released or answered)]
    grant_from(grant)  # validate
    return [int(expires), due, cadence, released, answered, at], list(grant)


def grant_from(record: list) -> GrantRecord:
    """A grant from ``GrantRecord.record``'s list: [granted_at, worker, any_worker, ends, answered(, moved)]."""
    at, worker, any_worker, ends, answered, *moved = record
    if worker is not None and not isinstance(worker, str):
        raise ValueError(f"a grant's worker must be text, not {worker!r}")
    if len(moved) > 1:
        raise ValueError(f"a grant has five or six fields, not {len(record)}")
    return GrantRecord(int(at), worker, int(ends), ANSWERED if answered else OPEN, bool(any_worker),
                       bool(moved and moved[0]))
