"""The lease table: which keys are in flight, and the crash-loop hold. One actor owns one table.

A lease says "this key is being rendered; do not grant it again until T". Grants are exclusive: a
key with a live lease is refused, never renewed, so two claimers racing on one key get one grant.
A lease is live while ``expires > now`` (strictly): at exactly its expiry it is gone. Release stops
counting a lease as in flight at once but keeps the key unclaimable for a short grace, so the key is
not re-granted before its reschedule lands; release never lengthens a lease.

The crash-loop hold bounds a render that never reports: when a key's last ``fast_retries + 2``
leases all expired with no result, the key is held back for 2, 4, 8 ... lease times (each capped
at its cadence) instead of being granted. Its first result, of any outcome, clears the hold.

Results are bound to their grant. The table remembers each key's latest grant (when, to which
worker: the ``x-worker-id`` of the claim) for ``remember_ms`` past its lease, so a late result is still
recognised. ``begin_result`` checks and marks that grant in one step (two replays of one result cannot
both pass): a grant is answered at most once, a result from another worker than the latest grant's
(the key was re-granted) is turned away, and ``finish_result`` only ever releases the lease of the
grant it answered. The fleet echoes only ``id`` and ``url``, so a grant is known by key + worker +
grant time; a worker re-granted the same key cannot be told apart from its own late result.

A grant is answered by one table at a time. ``hand_over`` gives a key's lease and grant to the node
the key moves to and marks the grant here ``moved``: from then on only the adopter may answer it,
though the key stays here until the adopter's answer comes (lost, it may stay for good, and the key
may come back). Its result here is turned away (``moved``, not acknowledged: the fleet retries,
and reaches the owner); a grant being answered here as it moves goes as answered. A grant that
comes back (adopted from the node it went to) is answered here again. An answer is never undone: a
grant answered here stays answered whatever record of it arrives (a retried hand-off's is stale).

Time is always passed in (``now``, epoch ms), so tests move it. Expired leases are retired lazily,
in expiry order, by whichever call comes next.
"""

from __future__ import annotations

import heapq
import itertools
import json
from typing import Literal, NamedTuple

from prerender_ray.config.render import Queue, Render
from prerender_ray.queue.grants import (
    ANSWERED,
    ANSWERING,
    OPEN,
    GrantRecord,
    ResultCheck,
    grant_from,
)
from prerender_ray.timeutil import DAY_MS

RELEASE_GRACE_MS = 5_000
# A key's miss history outlives its last lease this long, then it is forgotten (keys that stopped
# being claimed, e.g. deleted rows, must not accumulate forever).
MISS_MEMORY_MS = DAY_MS
REMEMBER_MS = 10 * 60_000  # a grant is recognised this long after its lease ends (late results)
_SNAPSHOT_VERSION = 2  # v2: leases carry their grant time; each key's latest grant (worker, answered)


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
    forgotten: tuple[str, ...] = ()  # keys whose latest grant is no longer remembered


class _Lease:
    __slots__ = ("answered", "at", "cadence", "due", "expires", "released")

    def __init__(self, expires: int, due: int | None, cadence: int | None,
                 released: bool = False, answered: bool = False, at: int = 0):
        self.expires = expires
        self.due = due
        self.cadence = cadence  # caps a hold that starts when this lease expires unanswered
        self.released = released  # released: in grace, no longer in flight
        self.answered = answered  # a result arrived but the lease is held (fast retry lane)
        self.at = at  # grant time: ties the lease to its grant record


class _Misses:
    __slots__ = ("count", "hold_until", "last")

    def __init__(self, count: int = 0, hold_until: int = 0, last: int = 0):
        self.count = count
        self.hold_until = hold_until
        self.last = last  # expiry of the latest missed lease


class Leases:
    def __init__(self, *, lease_time: int, max_leases: int, fast_retries: int, default_cadence: int,
                 grace_ms: int = RELEASE_GRACE_MS, remember_ms: int = REMEMBER_MS):
        if lease_time <= 0 or max_leases <= 0 or default_cadence <= 0:
            raise ValueError("lease_time, max_leases and default_cadence must be positive")
        self.lease_time = lease_time
        self.max_leases = max_leases
        self.hold_after = fast_retries + 2
        self.default_cadence = default_cadence
        self.grace_ms = grace_ms
        self.remember_ms = remember_ms
        self._leases: dict[str, _Lease] = {}  # live leases, released ones in grace included
        self._grants: dict[str, GrantRecord] = {}  # each key's latest grant, until remember_ms past its end
        self._misses: dict[str, _Misses] = {}
        self._expiry: list[tuple[int, int, str, _Lease]] = []  # heap; entries go stale on release
        self._seq = itertools.count()
        self._in_flight = 0  # live and unreleased: exact, kept on every transition
        self._expired = self._missed = 0
        self._holds: list[HoldStart] = []

    @classmethod
    def from_config(cls, queue: Queue, render: Render) -> Leases:
        return cls(lease_time=queue.job_lease_time, max_leases=queue.max_leases,
                   fast_retries=render.failure_retry.fast_retries, default_cadence=render.default_interval,
                   remember_ms=queue.job_lease_time + REMEMBER_MS)

    # ------------------------------------------------------------------------------- grant / release

    def grant(self, key: str, now: int, *, due: int | None = None, cadence: int | None = None,
              worker: str | None = None) -> Grant:
        """Lease ``key`` until ``now + lease_time`` to ``worker``; refused while it is leased (or in its
        release grace), held, or the table is full. ``cadence`` caps a crash-loop hold of this key."""
        self._retire(now)
        if key in self._leases:
            return Grant(False, None, "leased")
        misses = self._misses.get(key)
        if misses is not None and misses.hold_until > now:
            return Grant(False, None, "held")
        if len(self._leases) >= self.max_leases:
            return Grant(False, None, "full")
        lease = self._leases[key] = _Lease(now + self.lease_time, due, cadence, at=now)
        self._grants[key] = GrantRecord(now, worker, lease.expires)
        self._arm(key, lease)
        self._in_flight += 1
        return Grant(True, lease.expires, None)

    def release(self, key: str, now: int, *, granted_at: int | None = None) -> bool:
        """A result for ``key`` was processed: clear its misses, stop counting its lease as in flight
        and shorten it to the grace. False when there was no live, unreleased lease to release, or
        (``granted_at`` given) the live lease belongs to a later grant: that one is left alone."""
        self._retire(now)
        lease = self._leases.get(key)
        if granted_at is not None and lease is not None and lease.at != granted_at:
            return False
        self._misses.pop(key, None)
        if lease is None or lease.released:
            return False
        lease.released = True
        self._in_flight -= 1
        grace_end = now + self.grace_ms
        if grace_end < lease.expires:
            lease.expires = grace_end
            self._arm(key, lease)
        return True

    def note_result(self, key: str, now: int, *, granted_at: int | None = None) -> None:
        """A result arrived but the lease stays (fast retry lane): not a miss, and it clears a hold.
        With ``granted_at``, a live lease of a later grant is left alone."""
        self._retire(now)
        lease = self._leases.get(key)
        if granted_at is not None and lease is not None and lease.at != granted_at:
            return
        self._misses.pop(key, None)
        if lease is not None:
            lease.answered = True

    # ------------------------------------------------------------------------- results and grants

    def begin_result(self, key: str, worker: str | None, now: int) -> ResultCheck:
        """Check a posted result against ``key``'s latest grant and, when it may apply, mark the grant
        as being answered, in one step: a replay, or a result racing it, is then a ``duplicate``."""
        self._retire(now)
        g = self._grants.get(key)
        if g is None or g.ends + self.remember_ms < now:
            return ResultCheck("unknown", None)
        if not g.any_worker and g.worker != worker:
            return ResultCheck("superseded", g.at)
        if g.state == ANSWERING:
            return ResultCheck("answering", g.at)
        if g.state != OPEN:
            return ResultCheck("duplicate", g.at)
        if g.moved:
            return ResultCheck("moved", g.at)
        g.state = ANSWERING
        return ResultCheck("apply", g.at)

    def finish_result(self, key: str, granted_at: int, now: int, *, hold: bool) -> bool:
        """The result that ``begin_result`` let through was applied: its grant is answered, and its
        lease released (or, ``hold``, kept but no longer a miss). A lease granted since is untouched.
        True when a lease was released."""
        g = self._grants.get(key)
        if g is not None and g.at == granted_at:
            g.state = ANSWERED
        if hold:
            self.note_result(key, now, granted_at=granted_at)
            return False
        return self.release(key, now, granted_at=granted_at)

    def abandon_result(self, key: str, granted_at: int) -> None:
        """Applying the result failed: its grant may be answered again (the fleet retries)."""
        g = self._grants.get(key)
        if g is not None and g.at == granted_at and g.state == ANSWERING:
            g.state = OPEN

    def reopen_answering(self) -> int:
        """A restarted keeper applies nothing yet: the results its predecessor was applying when it
        died never finished, so their grants open again for the fleet's retry. Answers how many."""
        reopened = 0
        for g in self._grants.values():
            if g.state == ANSWERING:
                g.state = OPEN
                reopened += 1
        return reopened

    def known(self, key: str, now: int) -> bool:
        """Is a grant of ``key`` remembered (a result for it expected or recognised)?"""
        g = self._grants.get(key)
        return g is not None and g.ends + self.remember_ms >= now

    def grant_of(self, key: str) -> list | None:
        """``key``'s latest grant as [granted_at, worker, any_worker, ends, answered] (a sixth, True,
        when it moved), or None."""
        g = self._grants.get(key)
        return None if g is None else g.record()

    def forget(self, key: str, now: int) -> None:
        """``key`` moved to another node: release its lease here and drop its grant."""
        self.release(key, now)
        self._grants.pop(key, None)

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

    def awaiting(self, now: int) -> int:
        """Leases in flight that no result has answered yet: what a stopping node waits for (a lease
        kept after its result, the fast retry lane, expects nothing more)."""
        self._retire(now)
        return sum(1 for lease in self._leases.values() if not lease.released and not lease.answered)

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
        forgotten = tuple(key for key, g in self._grants.items()
                          if g.ends + self.remember_ms < now and key not in self._leases)
        for key in forgotten:
            del self._grants[key]
        report = Sweep(self._expired, self._missed, self._holds, forgotten)
        self._expired = self._missed = 0
        self._holds = []
        stale = [key for key, m in self._misses.items()
                 if key not in self._leases and m.hold_until <= now and now - m.last >= MISS_MEMORY_MS]
        for key in stale:
            del self._misses[key]
        return report

    # -------------------------------------------------------------------------------- persistence

    def export(self, key: str) -> list | None:
        """``key``'s lease as [expires, due, cadence, released, answered, granted_at, grant] (``grant``:
        ``grant_of``'s list or None), or None when it holds none (a per-key durable record)."""
        lease = self._leases.get(key)
        if lease is None:
            return None
        return [lease.expires, lease.due, lease.cadence, lease.released, lease.answered, lease.at,
                self.grant_of(key)]

    def hand_over(self, key: str) -> list | None:
        """``export``'s record of ``key``, to go with its row to the node it moves to, or None (no
        lease: its grant, if any, stays answerable here alone). The grant goes to the adopter and is
        ``moved`` here from now on, whether or not the adopter's answer comes back (the adopt may have
        happened): two tables answering one grant apply its result twice (simulation seed 1106). One
        being answered here goes as answered: its result may yet apply here."""
        record = self.export(key)
        g = self._grants.get(key)
        if record is None or g is None:
            return record
        g.moved = True
        record[6] = [g.at, g.worker, g.any_worker, g.ends, g.state != OPEN]
        return record

    def adopt(self, key: str, record: list, now: int) -> bool:
        """Take over a lease exported by another table (ownership moved): the key stays unclaimable
        until the lease it comes with ends. Of two grants the later one is the key's (its worker's
        result applies), and the lease ends at the later expiry of the two. A record of a grant this
        table holds already never reopens it: answered here, the record (and its lease) is ignored.
        A record of the old five-field form takes any worker's result."""
        expires, due, cadence, released, answered, *rest = record
        grant = rest[1][:5] if len(rest) > 1 and rest[1] is not None else None  # never moved on arrival
        mine = self._grants.get(key)
        same = mine is not None and grant is not None and int(grant[0]) == mine.at
        if mine is not None and same:  # (mine tested again for the type checker)
            # The grant was here before: handed back (this table answers it again), or sent again by
            # a hand-off retried after this table answered it. An answer is never undone: the
            # sender's record, stale, reopened it and its result was applied twice (seed 6153).
            mine.moved = False
            if mine.state == ANSWERED:
                return False  # its lease was released (or kept, answered) here when it was answered
            if grant is not None and grant[4] and mine.state == OPEN:
                mine.state = ANSWERED
        if int(expires) <= now:
            return False
        held = self._leases.get(key)
        at = int(rest[0]) if rest and rest[0] is not None else int(expires) - self.lease_time
        # The later grant is the key's: a lease this table still holds from when it owned the key
        # before (it left and came back) must not hide the live one the key comes back with, nor a
        # released one here (its key moved away, and back): either was kept, and the key granted
        # again while the later grant's worker still rendered (seen in the simulation). Whichever
        # wins, the key stays blocked until the later of the two expiries (never shortened).
        if held is not None and not held.released and held.at >= at:
            if int(expires) > held.expires:
                held.expires = int(expires)
                self._arm(key, held)
            return False
        if held is not None and bool(released) and int(expires) <= held.expires:
            return False
        if held is not None and not held.released:
            expires = max(int(expires), held.expires)
            self._in_flight -= 1  # counted again below
        lease = self._leases[key] = _Lease(int(expires), _opt_int(due), _opt_int(cadence), bool(released),
                                           bool(answered), at)
        self._arm(key, lease)
        if not lease.released:
            self._in_flight += 1
        self._grants[key] = (grant_from(grant) if grant is not None else
                             GrantRecord(at, None, int(expires), ANSWERED if released or answered else OPEN, True))
        if mine is not None and same:
            self._grants[key].state = max(self._grants[key].state, mine.state)  # one being answered here
        return True

    def restore_grant(self, key: str, record: list) -> None:
        """A grant record (``grant_of``'s list) read back from durable storage."""
        self._grants[key] = grant_from(record)

    def export_misses(self) -> list[list[int | str]]:
        """The miss histories in the snapshot format."""
        return [[k, m.count, m.hold_until, m.last] for k, m in self._misses.items()]

    def snapshot(self) -> bytes:
        """Live leases, latest grants and miss histories as JSON, so a restart does not re-grant work
        in flight nor apply a result twice."""
        return json.dumps({
            "v": _SNAPSHOT_VERSION,
            "leases": [[k, v.expires, v.due, v.cadence, v.released, v.answered, v.at]
                       for k, v in self._leases.items()],
            "grants": [[k, *g.record()] for k, g in self._grants.items()],
            "misses": [[k, m.count, m.hold_until, m.last] for k, m in self._misses.items()],
        }, separators=(",", ":")).encode()

    def restore(self, data: bytes) -> int:
        """Replace this table's state with a snapshot; returns how many leases it holds. Leases that
        expired meanwhile retire on the next call, as misses if nothing answered them. Raises
        ``ValueError`` on a snapshot this code did not write (the table is then left unchanged).

        A version 1 snapshot (no grant times, no workers) still loads: each lease's grant is taken
        to be ``lease_time`` before its expiry, answered if the lease was, from any worker."""
        try:
            doc = json.loads(data)
            version = doc.get("v")
            if version not in (1, _SNAPSHOT_VERSION):
                raise ValueError(f"unknown lease snapshot version {version!r}")
            leases: dict[str, _Lease] = {}
            grants: dict[str, GrantRecord] = {}
            for row in doc["leases"]:
                k, e, d, c, r, a = row[:6]
                if version == 1 and len(row) != 6:
                    raise ValueError("a version 1 lease has six fields")
                at = int(row[6]) if version > 1 else int(e) - self.lease_time
                leases[str(k)] = _Lease(int(e), _opt_int(d), _opt_int(c), bool(r), bool(a), at)
                if version == 1:
                    grants[str(k)] = GrantRecord(at, None, int(e), ANSWERED if r or a else OPEN, True)
            for k, *record in doc.get("grants", []) if version > 1 else []:
                grants[str(k)] = grant_from(record)
            misses = {str(k): _Misses(int(n), int(h), int(last)) for k, n, h, last in doc["misses"]}
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
            raise ValueError(f"unreadable lease snapshot: {e}") from e
        self._leases, self._misses, self._grants = leases, misses, grants
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
