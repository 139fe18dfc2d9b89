"""The lease table and the crash-loop hold (docs/queue.md#leases)."""

from __future__ import annotations

import json

import pytest

from prerender_ray.config.render import Queue, Render
from prerender_ray.queue.grants import ResultCheck
from prerender_ray.queue.leases import (
    MISS_MEMORY_MS,
    RELEASE_GRACE_MS,
    Grant,
    HoldStart,
    LeaseInfo,
    Leases,
)
from prerender_ray.timeutil import DAY_MS, HOUR_MS, MINUTE_MS

LEASE = 10 * MINUTE_MS
T0 = 1_780_000_000_123  # not second-aligned: expiries are exact ms
K = "https://shop.test/p|desktop"


def table(**kw: int) -> Leases:
    args = {"lease_time": LEASE, "max_leases": 64, "fast_retries": 2, "default_cadence": DAY_MS, **kw}
    return Leases(**args)


def test_a_fresh_table_holds_no_leases() -> None:
    t = table()
    assert t.occupancy(T0) == 0
    assert not t.is_leased(K, T0) and not t.is_held(K, T0)
    assert t.lease_of(K, T0) is None and t.oldest(T0) is None
    assert t.blocked(T0) == set() and t.in_flight(T0) == []


def test_from_config_takes_the_queue_and_render_settings() -> None:
    t = Leases.from_config(Queue(job_lease_time=3 * MINUTE_MS, max_leases=7), Render())
    assert (t.lease_time, t.max_leases, t.hold_after, t.default_cadence) == (3 * MINUTE_MS, 7, 4, DAY_MS)


def test_a_grant_expires_exactly_one_lease_time_later() -> None:
    t = table()
    grant = t.grant(K, T0, due=T0 - MINUTE_MS)
    assert grant == Grant(True, T0 + LEASE, None)
    assert t.lease_of(K, T0) == LeaseInfo(K, T0 + LEASE, T0 - MINUTE_MS)
    assert t.occupancy(T0) == 1


def test_a_lease_is_held_one_ms_before_its_expiry_and_gone_at_it() -> None:
    t = table()
    t.grant(K, T0)
    assert t.is_leased(K, T0 + LEASE - 1)
    assert not t.is_leased(K, T0 + LEASE)
    assert t.occupancy(T0 + LEASE) == 0


def test_expiries_past_2038_work() -> None:
    t = table()
    late = 4_102_444_800_000  # 2100-01-01
    assert t.grant(K, late).expires_at == late + LEASE
    assert t.is_leased(K, late + LEASE - 1) and not t.is_leased(K, late + LEASE)


def test_a_live_lease_is_refused_never_renewed() -> None:
    t = table()
    t.grant(K, T0)
    assert t.grant(K, T0 + MINUTE_MS) == Grant(False, None, "leased")
    assert t.lease_of(K, T0 + MINUTE_MS) == LeaseInfo(K, T0 + LEASE, None)  # expiry unchanged
    assert t.occupancy(T0 + MINUTE_MS) == 1


def test_two_claimers_racing_on_one_key_get_one_grant() -> None:
    t = table()
    results = [t.grant(K, T0), t.grant(K, T0)]
    assert [g.ok for g in results] == [True, False]
    assert t.occupancy(T0) == 1


def test_release_stops_counting_at_once_but_keeps_the_key_for_the_grace() -> None:
    t = table()
    t.grant(K, T0)
    assert t.release(K, T0 + MINUTE_MS) is True
    now = T0 + MINUTE_MS
    assert t.lease_of(K, now) is None and t.occupancy(now) == 0
    assert t.is_leased(K, now) and K in t.blocked(now)
    assert t.grant(K, now + RELEASE_GRACE_MS - 1) == Grant(False, None, "leased")
    assert t.grant(K, now + RELEASE_GRACE_MS).ok
    assert t.occupancy(now + RELEASE_GRACE_MS) == 1  # counted once


def test_double_release_is_a_no_op() -> None:
    t = table()
    t.grant(K, T0)
    assert t.release(K, T0) is True
    assert t.release(K, T0 + 1) is False
    assert t.occupancy(T0 + 1) == 0


def test_releasing_a_never_granted_key_returns_false() -> None:
    t = table()
    t.grant(K, T0)
    assert t.release("https://shop.test/other|desktop", T0) is False
    assert t.lease_of(K, T0) is not None and t.occupancy(T0) == 1


def test_releasing_an_expired_lease_never_resurrects_it() -> None:
    t = table()
    t.grant(K, T0)
    assert t.release(K, T0 + LEASE + 1) is False
    assert not t.is_leased(K, T0 + LEASE + 1)
    assert t.occupancy(T0 + LEASE + 1) == 0
    assert t.grant(K, T0 + LEASE + 2).ok


def test_release_never_lengthens_a_lease() -> None:
    t = table()
    t.grant(K, T0)
    t.release(K, T0 + LEASE - 1_000)  # the grace would end 4 s after the lease
    assert t.is_leased(K, T0 + LEASE - 1)
    assert not t.is_leased(K, T0 + LEASE)


def test_a_full_table_refuses_grants_and_keeps_what_it_has() -> None:
    t = table(max_leases=2)
    assert t.grant("a", T0).ok and t.grant("b", T0).ok
    assert t.grant("c", T0) == Grant(False, None, "full")
    assert not t.is_leased("c", T0)
    assert t.is_leased("a", T0) and t.is_leased("b", T0)
    t.release("a", T0)
    assert t.grant("c", T0 + 1) == Grant(False, None, "full")  # a released lease keeps its place in grace
    assert t.grant("c", T0 + RELEASE_GRACE_MS).ok  # and the refused key is grantable once there is room


def test_occupancy_is_exact_through_grants_releases_and_expiries() -> None:
    t = table()
    for i in range(10):
        t.grant(f"k{i}", T0 + i * MINUTE_MS)
    assert t.occupancy(T0 + 9 * MINUTE_MS) == 10
    t.release("k9", T0 + 9 * MINUTE_MS)
    assert t.occupancy(T0 + 9 * MINUTE_MS) == 9
    assert t.occupancy(T0 + LEASE + MINUTE_MS) == 7  # k0 and k1 expired
    t.release("k0", T0 + LEASE + MINUTE_MS)  # a late release of an expired lease
    assert t.occupancy(T0 + LEASE + MINUTE_MS) == 7
    assert t.occupancy(T0 + 2 * LEASE) == 0


def test_the_oldest_lease_is_the_in_flight_one_that_expires_first() -> None:
    t = table()
    t.grant("a", T0, due=5)
    t.grant("b", T0 + 1, due=6)
    assert t.oldest(T0 + 1) == LeaseInfo("a", T0 + LEASE, 5)
    t.release("a", T0 + 2)
    assert t.oldest(T0 + 2) == LeaseInfo("b", T0 + 1 + LEASE, 6)
    assert [lease.key for lease in t.in_flight(T0 + 2)] == ["b"]


def expire_unanswered(t: Leases, key: str, now: int, *, cadence: int | None = None) -> int:
    """Grant ``key`` as soon as it may be granted at or after ``now`` and let the lease run out
    with no result; returns the time it expired."""
    grant = t.grant(key, t.hold_of(key, now) or now, cadence=cadence)
    assert grant.ok and grant.expires_at is not None, grant
    return grant.expires_at


def test_a_key_is_held_after_fast_retries_plus_two_unanswered_leases() -> None:
    t = table()
    now = T0
    for _ in range(3):
        now = expire_unanswered(t, K, now)
    assert t.sweep(now).missed == 3 and t.misses_of(K) == 3
    now = expire_unanswered(t, K, now)
    report = t.sweep(now)
    assert report.expired == 1 and report.missed == 1
    assert report.holds == [HoldStart(K, 4, 2, now + 2 * LEASE)]
    assert t.grant(K, now + 2 * LEASE - 1) == Grant(False, None, "held")
    assert t.hold_of(K, now) == now + 2 * LEASE
    assert t.is_held(K, now) and K in t.blocked(now) and not t.is_leased(K, now)
    assert t.sweep(now + 1).holds == []  # a hold is reported once
    assert t.grant(K, now + 2 * LEASE).ok


def test_the_hold_doubles_two_four_eight_leases() -> None:
    t = table()
    now = T0
    lengths = []
    for _ in range(8):
        now = expire_unanswered(t, K, now, cadence=30 * DAY_MS)
        hold = t.hold_of(K, now)
        lengths.append(None if hold is None else (hold - now) // LEASE)
    assert lengths == [None, None, None, 2, 4, 8, 16, 32]
    assert [h.leases for h in t.sweep(now).holds] == [2, 4, 8, 16, 32]


def test_the_hold_is_capped_at_the_keys_cadence() -> None:
    t = table()
    now = T0
    for _ in range(6):
        now = expire_unanswered(t, K, now, cadence=3 * LEASE)
    assert t.hold_of(K, now) == now + 3 * LEASE  # 8 lease times, capped at the cadence


def test_without_a_cadence_the_hold_is_capped_at_the_default() -> None:
    t = table(default_cadence=3 * LEASE)
    now = T0
    for _ in range(5):
        now = expire_unanswered(t, K, now)
    assert t.hold_of(K, now) == now + 3 * LEASE


def test_the_first_result_clears_the_misses_and_the_hold() -> None:
    t = table()
    now = T0
    for _ in range(4):
        now = expire_unanswered(t, K, now)
    assert t.is_held(K, now)
    assert t.release(K, now) is False  # a late result: nothing to release, but it answers the key
    assert not t.is_held(K, now) and t.misses_of(K) == 0
    assert t.grant(K, now).ok


def test_a_held_fast_retry_lease_is_not_a_miss() -> None:
    t = table()
    now = T0
    for _ in range(6):
        t.grant(K, now)
        t.note_result(K, now + MINUTE_MS)  # fast lane: the result arrived, the lease stays until it expires
        assert t.lease_of(K, now + MINUTE_MS) is not None
        now += LEASE
    report = t.sweep(now)
    assert (report.expired, report.missed, report.holds) == (6, 0, [])
    assert t.misses_of(K) == 0 and t.grant(K, now).ok


def test_a_result_resets_the_ladder_to_its_first_rung() -> None:
    t = table()
    now = T0
    for _ in range(5):
        now = expire_unanswered(t, K, now)
    assert t.sweep(now).holds[-1].leases == 4
    t.release(K, now)
    for _ in range(4):
        now = expire_unanswered(t, K, now)
    assert t.sweep(now).holds == [HoldStart(K, 4, 2, now + 2 * LEASE)]


def test_miss_histories_are_forgotten_after_a_day_without_leases() -> None:
    t = table()
    now = expire_unanswered(t, K, T0)
    t.sweep(now)
    assert t.misses_of(K) == 1
    t.sweep(now + MISS_MEMORY_MS - 1)
    assert t.misses_of(K) == 1
    t.sweep(now + MISS_MEMORY_MS)
    assert t.misses_of(K) == 0


def test_live_leases_and_holds_survive_a_snapshot_and_restore() -> None:
    t = table()
    now = T0
    for _ in range(4):
        now = expire_unanswered(t, K, now)
    t.grant("a", now, due=1, cadence=HOUR_MS)
    t.grant("b", now)
    t.release("b", now + 1)
    data = t.snapshot()
    assert json.loads(data)["v"] == 2
    restored = table()
    assert restored.restore(data) == 2
    later = now + 2
    assert restored.grant("a", later) == Grant(False, None, "leased")  # in flight before the restart
    assert restored.lease_of("a", later) == LeaseInfo("a", now + LEASE, 1)
    assert restored.is_leased("b", later) and restored.lease_of("b", later) is None  # still in its grace
    assert restored.occupancy(later) == 1
    assert restored.hold_of(K, later) == now + 2 * LEASE and restored.misses_of(K) == 4


def test_a_restored_lease_that_expired_meanwhile_counts_as_a_miss() -> None:
    t = table()
    t.grant(K, T0)
    restored = table()
    restored.restore(t.snapshot())
    report = restored.sweep(T0 + LEASE)
    assert (report.expired, report.missed) == (1, 1)
    assert restored.grant(K, T0 + LEASE).ok


@pytest.mark.parametrize("junk", [b"", b"[]", b"{}", b'{"v": 3, "leases": [], "misses": []}',
                                  b'{"v": 2, "leases": [["a", 1, null, null, false, false]], "misses": []}',
                                  b'{"v": 2, "leases": [], "grants": [["a", 1, 5, 0, 9, 0]], "misses": []}',
                                  b'{"v": 1, "leases": [["a", 1, null, null, 0, 0, 1]], "misses": []}',
                                  b'{"v": 1, "leases": [["a", "x", null, null, false, false]], "misses": []}',
                                  b'{"v": 1, "leases": [["a"]], "misses": []}', b"\xff"])
def test_restoring_a_junk_snapshot_raises_and_changes_nothing(junk: bytes) -> None:
    t = table()
    t.grant(K, T0)
    with pytest.raises(ValueError):
        t.restore(junk)
    assert t.lease_of(K, T0) is not None and t.occupancy(T0) == 1


def test_a_table_refuses_nonsense_sizes() -> None:
    with pytest.raises(ValueError):
        table(max_leases=0)
    with pytest.raises(ValueError):
        table(lease_time=0)


# ------------------------------------------------------------------ results bound to their grant


def test_a_result_answers_its_grant_once_and_a_replay_is_a_duplicate() -> None:
    t = table()
    t.grant(K, T0, worker="w1")
    assert t.begin_result(K, "w1", T0 + 1) == ResultCheck("apply", T0)
    assert t.begin_result(K, "w1", T0 + 2) == ResultCheck("answering", T0)  # racing the first: not yet
    assert t.finish_result(K, T0, T0 + 3, hold=False)
    for later in (T0 + 4, T0 + RELEASE_GRACE_MS + 10, T0 + LEASE + 5 * MINUTE_MS):  # replayed for minutes
        assert t.begin_result(K, "w1", later) == ResultCheck("duplicate", T0)


def test_an_abandoned_result_may_answer_its_grant_again() -> None:
    t = table()
    t.grant(K, T0, worker="w1")
    assert t.begin_result(K, "w1", T0 + 1).verdict == "apply"
    t.abandon_result(K, T0)  # applying it failed: the fleet retries
    assert t.begin_result(K, "w1", T0 + 2).verdict == "apply"


def test_a_late_result_of_a_previous_holder_never_touches_the_new_lease() -> None:
    t = table()
    t.grant(K, T0, worker="A")
    regrant = T0 + LEASE  # A's lease expired unanswered; B gets the key
    assert t.grant(K, regrant, worker="B").ok
    assert t.begin_result(K, "A", regrant + 1) == ResultCheck("superseded", regrant)
    assert t.lease_of(K, regrant + 2) is not None and t.occupancy(regrant + 2) == 1  # B's still live
    assert t.begin_result(K, "B", regrant + 3) == ResultCheck("apply", regrant)
    assert t.finish_result(K, regrant, regrant + 4, hold=False)
    assert t.lease_of(K, regrant + 4) is None


def test_finishing_an_older_grant_leaves_the_lease_of_a_later_one_alone() -> None:
    t = table()
    t.grant(K, T0, worker="A")
    assert t.begin_result(K, "A", T0 + LEASE - 1).verdict == "apply"  # applying while the lease runs out
    assert t.grant(K, T0 + LEASE, worker="B").ok
    assert not t.finish_result(K, T0, T0 + LEASE + 1, hold=False)
    assert t.lease_of(K, T0 + LEASE + 1) is not None
    t.finish_result(K, T0, T0 + LEASE + 1, hold=True)
    assert t.begin_result(K, "B", T0 + LEASE + 2).verdict == "apply"  # B's grant still open


def test_a_late_result_of_the_same_holder_still_applies_once_until_it_is_forgotten() -> None:
    t = table(remember_ms=10 * MINUTE_MS)
    t.grant(K, T0)
    assert t.known(K, T0 + LEASE + 10 * MINUTE_MS)
    assert t.begin_result(K, None, T0 + LEASE + MINUTE_MS).verdict == "apply"  # after its expiry
    report = t.sweep(T0 + LEASE + 10 * MINUTE_MS + 1)
    assert report.forgotten == (K,) and not t.known(K, T0 + LEASE + 10 * MINUTE_MS + 1)
    assert t.begin_result(K, None, T0 + LEASE + 10 * MINUTE_MS + 2).verdict == "unknown"


def test_a_key_never_granted_is_unknown() -> None:
    assert table().begin_result(K, None, T0) == ResultCheck("unknown", None)


def test_a_result_being_answered_when_its_keeper_died_may_answer_its_grant_again() -> None:
    t = table()
    t.grant(K, T0, worker="w1")
    t.grant("b", T0, worker="w1")
    assert t.begin_result(K, "w1", T0 + 1).verdict == "apply"
    assert t.begin_result("b", "w1", T0 + 1).verdict == "apply"
    t.finish_result("b", T0, T0 + 2, hold=False)
    assert t.reopen_answering() == 1  # the restarted keeper: K's apply never finished, b's did
    assert t.begin_result(K, "w1", T0 + 3).verdict == "apply"
    assert t.begin_result("b", "w1", T0 + 3).verdict == "duplicate"


def test_grants_survive_a_snapshot_and_a_version_1_snapshot_still_loads() -> None:
    t = table()
    t.grant(K, T0, worker="w1")
    t.grant("b", T0, worker="w2")
    t.begin_result("b", "w2", T0 + 1)
    t.finish_result("b", T0, T0 + 2, hold=False)
    restored = table()
    restored.restore(t.snapshot())
    assert restored.begin_result("b", "w2", T0 + 3).verdict == "duplicate"
    assert restored.begin_result(K, "other", T0 + 3).verdict == "superseded"
    assert restored.begin_result(K, "w1", T0 + 3) == ResultCheck("apply", T0)

    old = json.dumps({"v": 1, "leases": [[K, T0 + LEASE, None, None, False, False],
                                         ["b", T0 + 5000, None, None, True, False]], "misses": []}).encode()
    legacy = table()
    assert legacy.restore(old) == 2
    assert legacy.lease_of(K, T0 + 1) == LeaseInfo(K, T0 + LEASE, None)
    assert legacy.begin_result("b", "anyone", T0 + 1).verdict == "duplicate"  # released: answered
    # any worker, the grant time derived from the expiry
    assert legacy.begin_result(K, "anyone", T0 + 1) == ResultCheck("apply", T0)


def test_an_exported_lease_carries_its_grant_and_the_old_five_field_form_is_adopted() -> None:
    t = table()
    t.grant(K, T0, worker="w1")
    moved = table()
    assert moved.adopt(K, t.export(K), T0 + 1)
    assert moved.begin_result(K, "w2", T0 + 2).verdict == "superseded"
    assert moved.begin_result(K, "w1", T0 + 2) == ResultCheck("apply", T0)
    old = table()
    assert old.adopt(K, [T0 + LEASE, None, None, False, False], T0 + 1)
    assert old.begin_result(K, "w9", T0 + 2) == ResultCheck("apply", T0)


def test_a_key_that_moved_away_and_back_takes_the_live_lease_it_comes_back_with() -> None:
    """Node A granted K and handed it to B (its lease released here, in grace); B hands it back with
    the live lease. The released one here must not hide it: it was kept, and K was granted again
    once the grace ended while its worker still rendered (seen in the simulation)."""
    a = table()
    a.grant(K, T0, worker="w1")
    b = table()
    assert b.adopt(K, a.export(K), T0 + 1)
    a.forget(K, T0 + 1)
    assert a.adopt(K, b.export(K), T0 + 2)
    assert a.lease_of(K, T0 + 3) == LeaseInfo(K, T0 + LEASE, None)
    assert a.is_leased(K, T0 + LEASE - 1)
    assert a.begin_result(K, "w1", T0 + 4) == ResultCheck("apply", T0)
    held = table()
    held.grant(K, T0 + 10, worker="w2")  # a later grant here stays the key's
    assert not held.adopt(K, a.export(K), T0 + 11)
    assert held.begin_result(K, "w2", T0 + 12) == ResultCheck("apply", T0 + 10)


def test_a_grant_handed_over_is_answered_only_where_it_went_until_it_comes_back() -> None:
    """Node A hands K to B; B's answer is lost, so A keeps K (simulation seed 1106: both answered
    the grant, the result was applied twice). From the hand-over on only B answers it, durably; a
    grant being answered as it moves goes as answered; handed back, A answers it again."""
    a, b = table(), table()
    a.grant(K, T0, worker="w1")
    assert b.adopt(K, a.hand_over(K), T0 + 1)
    assert a.begin_result(K, "w1", T0 + 2) == ResultCheck("moved", T0)
    restored = table()
    restored.restore(a.snapshot())
    assert restored.begin_result(K, "w1", T0 + 2).verdict == "moved"
    assert a.is_leased(K, T0 + 2)  # the key stays blocked here while its lease runs
    assert b.begin_result(K, "w1", T0 + 3) == ResultCheck("apply", T0)
    b.finish_result(K, T0, T0 + 4, hold=True)
    assert a.adopt(K, b.hand_over(K), T0 + 5) is False  # its own lease here is kept...
    assert a.begin_result(K, "w1", T0 + 6).verdict == "duplicate"  # ...and answers again, as answered

    c, d = table(), table()
    c.grant(K, T0, worker="w1")
    assert c.begin_result(K, "w1", T0 + 1).verdict == "apply"
    assert d.adopt(K, c.hand_over(K), T0 + 2)
    assert d.begin_result(K, "w1", T0 + 3).verdict == "duplicate"  # it may yet apply on c
    c.finish_result(K, T0, T0 + 4, hold=False)
    assert c.begin_result(K, "w1", T0 + 5).verdict == "duplicate"


def test_a_grant_answered_by_its_adopter_stays_answered_when_the_hand_off_is_sent_again() -> None:
    """Simulation seed 6153: A hands K to B, the hand-off does not finish and A retries it with its
    own record of the grant (moved there, still open); B had answered it meanwhile. B took the stale
    record over its answer and applied the result's retry a second time. An answer is never undone."""
    a, b = table(), table()
    a.grant(K, T0, worker="w1")
    assert b.adopt(K, a.hand_over(K), T0 + 1)
    assert b.begin_result(K, "w1", T0 + 2) == ResultCheck("apply", T0)
    b.finish_result(K, T0, T0 + 3, hold=False)
    assert not b.adopt(K, a.hand_over(K), T0 + 4)  # in the release grace here
    assert b.begin_result(K, "w1", T0 + 5).verdict == "duplicate"
    later = T0 + RELEASE_GRACE_MS + 10  # the lease here is gone, the sender's still runs
    assert not b.adopt(K, a.hand_over(K), later)
    assert b.begin_result(K, "w1", later + 1).verdict == "duplicate"
    assert not b.is_leased(K, later + 1)
    c, d = table(), table()  # one being answered on the adopter as the record comes again
    c.grant(K, T0, worker="w1")
    assert d.adopt(K, c.hand_over(K), T0 + 1)
    assert d.begin_result(K, "w1", T0 + 2) == ResultCheck("apply", T0)
    d.adopt(K, c.hand_over(K), T0 + 3)
    assert d.begin_result(K, "w1", T0 + 4).verdict == "answering"


def test_a_lease_left_from_an_earlier_ownership_gives_way_to_the_later_grant_it_meets() -> None:
    """Node C owned K and granted it (to w4), left, and came back with that lease on disk; K was
    granted meanwhile by its next owner (to w2) and comes back to C with that lease. C kept its own
    (it expired first) and granted K again while w2 still rendered (seen in the simulation)."""
    c = table()
    c.grant(K, T0, worker="w4")
    b = table()
    b.grant(K, T0 + 100, worker="w2")
    assert c.adopt(K, b.export(K), T0 + 200)
    assert c.begin_result(K, "w4", T0 + 201).verdict == "superseded"
    assert c.is_leased(K, T0 + 100 + LEASE - 1)  # until the later grant's lease ends
    assert c.lease_of(K, T0 + 202) == LeaseInfo(K, T0 + 100 + LEASE, None)


def test_a_durable_record_of_the_old_six_field_form_still_reads() -> None:
    from prerender_ray.queue.grants import read_record

    lease, grant = read_record([T0 + LEASE, 5, HOUR_MS, False, False, T0], LEASE)
    assert lease == [T0 + LEASE, 5, HOUR_MS, False, False, T0]  # granted lease_time before its expiry
    assert grant == [T0, None, True, T0 + LEASE, False]  # any worker, not answered
    _, released = read_record([T0 + 5000, None, None, True, True, T0 + 1], LEASE)
    assert released[4] is True  # its result was processed: a replay stays a duplicate
    t = table()
    t.restore(json.dumps({"v": 2, "leases": [[K, *lease]], "grants": [[K, *grant]], "misses": []}).encode())
    assert t.begin_result(K, "w1", T0 + 1) == ResultCheck("apply", T0)
    new = [T0 + LEASE, None, None, False, False, T0 + 9, T0, [T0, "w1", False, T0 + LEASE, True]]
    assert read_record(new, LEASE) == ([T0 + LEASE, None, None, False, False, T0],
                                       [T0, "w1", False, T0 + LEASE, True])
    for junk in ([], ["x", 1, 2, 3, 4, 5], [1, None, None, False, False, 0, 1, [1, 5, False, 2, False]]):
        with pytest.raises((ValueError, TypeError, IndexError)):
            read_record(junk, LEASE)


def test_awaiting_counts_only_grants_no_result_has_answered_yet() -> None:
    """What a stopping node waits for: a released lease (a result came) and a lease kept after its
    result (the fast retry lane) await nothing; an expired one is no longer in flight."""
    t = table()
    for key in ("a", "b", "c", "d"):
        assert t.grant(key, T0).ok
    assert t.awaiting(T0) == 4
    for key in ("a", "b"):
        check = t.begin_result(key, None, T0 + 1)
        assert t.awaiting(T0 + 1) == 4 - (key == "b")  # being answered: still awaited until finished
        t.finish_result(key, check.granted_at, T0 + 2, hold=key == "b")
    assert t.awaiting(T0 + 2) == 2 and t.occupancy(T0 + 2) == 3  # "b" is kept, but answered
    t.abandon_result("c", t.begin_result("c", None, T0 + 3).granted_at)
    assert t.awaiting(T0 + 3) == 2  # a failed apply: the fleet's retry is still expected
    restored = table()  # a restart: the persisted leases are awaited as before
    restored.restore(t.snapshot())
    assert restored.awaiting(T0 + 3) == 2
    assert t.awaiting(T0 + LEASE) == 0  # the rest expired unanswered
