"""The lease table: which keys are in flight, and the crash-loop hold. One actor owns one table.

A lease says "this key is being rendered; do not grant it again until T". Grants are exclusive: a
key with a live lease is refused, never renewed, so two claimers racing on one key get one grant.
A lease is live while ``expires > now`` (strictly): at exactly its expiry it is gone. Release stops
counting a lease as in flight at once but keeps the key unclaimable for a short grace, so the key is
not re-granted before its reschedule lands; release never lengthens a lease.

The crash-loop hold bounds a render that never reports: when a key's last ``fast_retries + 2``
leases all expired with no result, the key is held back for 2, 4, 8 ... lease times (each capped
at its cadence) instead of being granted. Its first result, of any outcome, clears the hold.

Time is always passed in (``now``, epoch ms), so tests move it. Expired leases are retired lazily,
in expiry order, by whichever call comes next.
"""

from __future__ import annotations

import heapq
import itertools
import json
from typing import Literal, NamedTuple

from .config import Queue, Render
from .timeutil import DAY_MS

RELEASE_GRACE_MS = 5_000
# A key's miss history outlives its last lease this long, then it is forgotten (keys that stopped
# being claimed, e.g. deleted rows, must not accumulate forever).
MISS_MEMORY_MS = DAY_MS
_SNAPSHOT_VERSION = 1


class LeaseInfo(NamedTuple):
    key: str
    expires_at: int
    due: int | None


class Grant(NamedTuple):
    ok: bool
    expires_at: int | None  # the job's expiresAt when granted
    refused: Literal["leased", "held", "full"] | None


class HoldStart(NamedTuple):
    """A key just put on crash-loop hold: log it, count ``claim_wedged`` once."""

    key: str
    misses: int  # consecutive leases that expired with no result
    leases: int  # hold length in lease times, before the cadence cap
    until: int  # epoch ms


class Sweep(NamedTuple):
    """What happened since the previous sweep."""

    expired: int  # in-flight leases that ran out (no release)
    missed: int  # of those, the ones no result ever answered
    holds: list[HoldStart]


class _Lease:
    __slots__ = ("answered", "cadence", "due", "expires", "released")

    def __init__(self, expires: int, due: int | None, cadence: int | None,
                 released: bool = False, answered: bool = False):
        self.expires = expires
        self.due = due
        self.cadence = cadence  # caps a hold that starts when this lease expires unanswered
        self.released = released  # released: in grace, no longer in flight
        self.answered = answered  # a result arrived but the lease is held (fast retry lane)


class _Misses:
    __slots__ = ("count", "hold_until", "last")

    def __init__(self, count: int = 0, hold_until: int = 0, last: int = 0):
        self.count = count
        self.hold_until = hold_until
        self.last = last  # expiry of the latest missed lease


class LeaseTable:
    def __init__(self, *, lease_time: int, max_leases: int, fast_retries: int, default_cadence: int,
                 grace_ms: int = RELEASE_GRACE_MS):
        if lease_time <= 0 or max_leases <= 0 or default_cadence <= 0:
            raise ValueError("lease_time, max_leases and default_cadence must be positive")
        self.lease_time = lease_time
        self.max_leases = max_leases
        self.hold_after = fast_retries + 2
        self.default_cadence = default_cadence
        self.grace_ms = grace_ms
        self._leases: dict[str, _Lease] = {}  # live leases, released ones in grace included
        self._misses: dict[str, _Misses] = {}
        self._expiry: list[tuple[int, int, str, _Lease]] = []  # heap; entries go stale on release
        self._seq = itertools.count()
        self._in_flight = 0  # live and unreleased: exact, kept on every transition
        self._expired = self._missed = 0
        self._holds: list[HoldStart] = []

    @classmethod
    def from_config(cls, queue: Queue, render: Render) -> LeaseTable:
        return cls(lease_time=queue.job_lease_time, max_leases=queue.max_leases,
                   fast_retries=render.failure_retry.fast_retries, default_cadence=render.default_interval)

    # ------------------------------------------------------------------------------- grant / release

    def grant(self, key: str, now: int, *, due: int | None = None, cadence: int | None = None) -> Grant:
        """Lease ``key`` until ``now + lease_time``; refused while it is leased (or in its release
        grace), held, or the table is full. ``cadence`` caps a crash-loop hold of this key."""
        self._retire(now)
        if key in self._leases:
            return Grant(False, None, "leased")
        misses = self._misses.get(key)
        if misses is not None and misses.hold_until > now:
            return Grant(False, None, "held")
        if len(self._leases) >= self.max_leases:
            return Grant(False, None, "full")
        lease = self._leases[key] = _Lease(now + self.lease_time, due, cadence)
        self._arm(key, lease)
        self._in_flight += 1
        return Grant(True, lease.expires, None)

    def release(self, key: str, now: int) -> bool:
        """A result for ``key`` was processed: clear its misses, stop counting its lease as in flight
        and shorten it to the grace. False when there was no live, unreleased lease to release."""
        self._retire(now)
        self._misses.pop(key, None)
        lease = self._leases.get(key)
        if lease is None or lease.released:
            return False
        lease.released = True
        self._in_flight -= 1
        grace_end = now + self.grace_ms
        if grace_end < lease.expires:
            lease.expires = grace_end
            self._arm(key, lease)
        return True

    def note_result(self, key: str, now: int) -> None:
        """A result arrived but the lease stays (fast retry lane): not a miss, and it clears a hold."""
        self._retire(now)
        self._misses.pop(key, None)
        lease = self._leases.get(key)
        if lease is not None:
            lease.answered = True

    # ------------------------------------------------------------------------------------ queries

    def is_leased(self, key: str, now: int) -> bool:
        """Not claimable because of a lease: live, or released and still in its grace."""
        self._retire(now)
        return key in self._leases

    def is_held(self, key: str, now: int) -> bool:
        return self.hold_of(key, now) is not None

    def hold_of(self, key: str, now: int) -> int | None:
        """When the crash-loop hold on ``key`` ends, if it is held."""
        self._retire(now)
        misses = self._misses.get(key)
        return misses.hold_until if misses is not None and misses.hold_until > now else None

    def lease_of(self, key: str, now: int) -> LeaseInfo | None:
        """The in-flight lease of ``key`` (live and unreleased), else None."""
        self._retire(now)
        lease = self._leases.get(key)
        if lease is None or lease.released:
            return None
        return LeaseInfo(key, lease.expires, lease.due)

    def misses_of(self, key: str) -> int:
        misses = self._misses.get(key)
        return misses.count if misses is not None else 0

    def occupancy(self, now: int) -> int:
        """Exact count of leases in flight (live, unreleased)."""
        self._retire(now)
        return self._in_flight

    def oldest(self, now: int) -> LeaseInfo | None:
        """The in-flight lease that expires first."""
        self._retire(now)
        live = [(lease.expires, key, lease.due) for key, lease in self._leases.items() if not lease.released]
        if not live:
            return None
        expires, key, due = min(live)
        return LeaseInfo(key, expires, due)

    def blocked(self, now: int) -> set[str]:
        """Keys a claim would be refused for right now (leased, in grace, or held): the set the
        keeper skips when it publishes."""
        self._retire(now)
        out = set(self._leases)
        out.update(key for key, misses in self._misses.items() if misses.hold_until > now)
        return out

    def in_flight(self, now: int) -> list[LeaseInfo]:
        """Every in-flight lease (live, unreleased)."""
        self._retire(now)
        return [LeaseInfo(k, v.expires, v.due) for k, v in self._leases.items() if not v.released]

    def sweep(self, now: int) -> Sweep:
        """Retire expired leases and report what expired, what was missed and which holds started
        since the last sweep; forget miss histories nobody has touched for ``MISS_MEMORY_MS``."""
        self._retire(now)
        report = Sweep(self._expired, self._missed, self._holds)
        self._expired = self._missed = 0
        self._holds = []
        stale = [key for key, m in self._misses.items()
                 if key not in self._leases and m.hold_until <= now and now - m.last >= MISS_MEMORY_MS]
        for key in stale:
            del self._misses[key]
        return report

    # -------------------------------------------------------------------------------- persistence

    def export(self, key: str) -> list | None:
        """``key``'s lease as [expires, due, cadence, released, answered] (a per-key durable record),
        or None when it holds none (the snapshot format, one row at a time)."""
        lease = self._leases.get(key)
        if lease is None:
            return None
        return [lease.expires, lease.due, lease.cadence, lease.released, lease.answered]

    def adopt(self, key: str, record: list, now: int) -> bool:
        """Take over a lease exported by another table (ownership moved): the key stays unclaimable
        until the lease it already has ends. A live lease here is kept (never shortened)."""
        expires, due, cadence, released, answered = record
        if int(expires) <= now or key in self._leases:
            return False
        lease = self._leases[key] = _Lease(int(expires), _opt_int(due), _opt_int(cadence), bool(released), bool(answered))
        self._arm(key, lease)
        if not lease.released:
            self._in_flight += 1
        return True

    def export_misses(self) -> list[list[int | str]]:
        """The miss histories in the snapshot format."""
        return [[k, m.count, m.hold_until, m.last] for k, m in self._misses.items()]

    def snapshot(self) -> bytes:
        """Live leases and miss histories as JSON, so a restart does not re-grant work in flight."""
        return json.dumps({
            "v": _SNAPSHOT_VERSION,
            "leases": [[k, v.expires, v.due, v.cadence, v.released, v.answered]
                       for k, v in self._leases.items()],
            "misses": [[k, m.count, m.hold_until, m.last] for k, m in self._misses.items()],
        }, separators=(",", ":")).encode()

    def restore(self, data: bytes) -> int:
        """Replace this table's state with a snapshot; returns how many leases it holds. Leases that
        expired meanwhile retire on the next call, as misses if nothing answered them. Raises
        ``ValueError`` on a snapshot this code did not write (the table is then left unchanged)."""
        try:
            doc = json.loads(data)
            if doc.get("v") != _SNAPSHOT_VERSION:
                raise ValueError(f"unknown lease snapshot version {doc.get('v')!r}")
            leases = {str(k): _Lease(int(e), _opt_int(d), _opt_int(c), bool(r), bool(a))
                      for k, e, d, c, r, a in doc["leases"]}
            misses = {str(k): _Misses(int(n), int(h), int(last)) for k, n, h, last in doc["misses"]}
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise ValueError(f"unreadable lease snapshot: {e}") from e
        self._leases, self._misses = leases, misses
        self._expiry = []
        for key, lease in leases.items():
            self._arm(key, lease)
        self._in_flight = sum(1 for lease in leases.values() if not lease.released)
        return len(leases)

    # ---------------------------------------------------------------------------------- internals

    def _arm(self, key: str, lease: _Lease) -> None:
        heapq.heappush(self._expiry, (lease.expires, next(self._seq), key, lease))

    def _retire(self, now: int) -> None:
        """Drop every lease whose expiry is <= now; an unanswered, unreleased one is a miss."""
        heap = self._expiry
        while heap and heap[0][0] <= now:
            expires, _, key, lease = heapq.heappop(heap)
            if self._leases.get(key) is not lease or lease.expires != expires:
                continue  # released since (re-armed earlier) or replaced
            del self._leases[key]
            if lease.released:
                continue
            self._in_flight -= 1
            self._expired += 1
            if not lease.answered:
                self._miss(key, lease)

    def _miss(self, key: str, lease: _Lease) -> None:
        misses = self._misses.get(key)
        if misses is None:
            misses = self._misses[key] = _Misses()
        misses.count += 1
        misses.last = lease.expires
        self._missed += 1
        over = misses.count - self.hold_after
        if over >= 0:
            leases = 2 ** min(over + 1, 40)  # 2, 4, 8 ... (the exponent cap only avoids huge ints)
            cap = lease.cadence if lease.cadence and lease.cadence > 0 else self.default_cadence
            misses.hold_until = lease.expires + min(self.lease_time * leases, cap)
            self._holds.append(HoldStart(key, misses.count, leases, misses.hold_until))


def _opt_int(value: int | None) -> int | None:
    return None if value is None else int(value)
