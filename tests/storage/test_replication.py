"""The replicated tier's versions: the hybrid logical clock, the record envelope with tombstones, and
last-writer-wins with a node-name tie-break (docs/architecture.md#replication)."""

from __future__ import annotations

import itertools
import struct
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.storage.replication import (
    LOGICAL_BITS,
    Clock,
    EnvelopeError,
    Version,
    hlc_bytes,
    is_stub,
    payload_of,
    stub,
    unwrap,
    version_of,
    wins,
    wrap,
    wrap_many,
    writer_bytes,
)

T0 = 1_780_000_000_000


class Wall:
    """A hand-moved wall clock (epoch ms)."""

    def __init__(self, ms: int = T0):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def hlc(ms: int, logical: int = 0) -> int:
    return (ms << LOGICAL_BITS) | logical


nodes = st.text(min_size=0, max_size=30)
hlcs = st.integers(min_value=0, max_value=2**64 - 1)
versions = st.builds(Version, hlcs, nodes)
payloads = st.one_of(st.none(), st.binary(max_size=200))


# ---------------------------------------------------------------------------------------- clock


def test_a_version_carries_the_wall_time_in_its_high_bits() -> None:
    v = Clock("a", Wall()).now()
    assert v.wall_ms == T0 and v.node == "a" and v.hlc == hlc(T0)


def test_versions_within_one_millisecond_count_up() -> None:
    c = Clock("a", Wall())
    got = [c.now().hlc for _ in range(5)]
    assert got == [hlc(T0, i) for i in range(5)]


def test_a_later_millisecond_resets_the_counter() -> None:
    wall = Wall()
    c = Clock("a", wall)
    c.now(), c.now()
    wall.ms += 1
    assert c.now().hlc == hlc(T0 + 1)


def test_the_clock_never_goes_backwards_when_the_wall_clock_does() -> None:
    wall = Wall()
    c = Clock("a", wall)
    first = c.now()
    wall.ms -= 60_000  # NTP step back
    second = c.now()
    assert second.hlc > first.hlc and second.wall_ms == T0


def test_observing_a_version_from_a_skewed_peer_moves_past_it() -> None:
    wall = Wall()
    c = Clock("b", wall)
    ahead = Version(hlc(T0 + 5_000, 3), "a")  # a peer whose clock is 5 s ahead
    c.observe(ahead)
    mine = c.now()
    assert mine.hlc > ahead.hlc and mine.newer_than(ahead)
    assert mine.wall_ms == T0 + 5_000  # carried, not the local wall time


def test_observing_an_older_version_changes_nothing() -> None:
    wall = Wall()
    c = Clock("a", wall)
    c.now()
    c.observe(Version(hlc(T0 - 10_000), "b"))
    assert c.now().hlc == hlc(T0, 1)


def test_a_causally_later_write_wins_despite_a_slow_local_clock() -> None:
    fast, slow = Clock("a", Wall(T0 + 3_000)), Clock("z", Wall(T0))
    first = fast.now()
    slow.observe(first)
    second = slow.now()
    assert wins(wrap(second, b"new"), wrap(first, b"old"))
    assert not wins(wrap(first, b"old"), wrap(second, b"new"))


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("now"), st.integers(-10_000, 10_000)),
            st.tuples(st.just("observe"), st.integers(-10_000, 10_000), st.integers(0, 50)),
        ),
        max_size=60,
    )
)
def test_the_clock_is_strictly_monotonic_and_past_everything_it_observed(steps: list) -> None:
    wall = Wall()
    c = Clock("n", wall)
    last = -1
    seen = -1
    for step in steps:
        if step[0] == "now":
            wall.ms = T0 + step[1]
            v = c.now()
            assert v.hlc > last and v.hlc > seen
            last = v.hlc
        else:
            observed = hlc(T0 + step[1], step[2])
            c.observe(Version(observed, "peer"))
            seen = max(seen, observed)


def test_the_clock_is_safe_across_threads() -> None:
    c = Clock("a", Wall())
    got: list[int] = []

    def work() -> None:
        got.extend(c.now().hlc for _ in range(500))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 2000


def test_the_default_clock_reads_the_wall_clock() -> None:
    v = Clock("a").now()
    assert v.wall_ms > T0 - 10 * 365 * 86_400_000  # sanity: a real epoch, not zero


# ------------------------------------------------------------------------------------- envelope


@given(versions, payloads)
def test_an_envelope_round_trips_version_and_payload(v: Version, payload: bytes | None) -> None:
    data = wrap(v, payload)
    assert unwrap(data) == (v, payload)
    assert unwrap(memoryview(data)) == (v, payload)
    assert payload_of(data) == payload and version_of(data) == v


def test_an_empty_payload_is_not_a_tombstone() -> None:
    v = Version(hlc(T0), "a")
    assert unwrap(wrap(v, b"")) == (v, b"")
    assert unwrap(wrap(v, None)) == (v, None)
    assert wrap(v, b"") != wrap(v, None)


def test_a_tombstone_keeps_its_version() -> None:
    v = Version(hlc(T0, 7), "node-b")
    assert version_of(wrap(v, None)) == v and payload_of(wrap(v, None)) is None


def test_absent_bytes_have_no_payload_and_no_version() -> None:
    assert payload_of(None) is None and version_of(None) is None


def test_node_names_are_utf8() -> None:
    v = Version(hlc(T0), "nœud-ü")
    assert unwrap(wrap(v, b"x"))[0].node == "nœud-ü"


def test_a_payload_that_looks_like_an_envelope_is_still_just_payload() -> None:
    inner = wrap(Version(1, "x"), b"inner")
    assert unwrap(wrap(Version(2, "y"), inner)) == (Version(2, "y"), inner)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xa7",
        b'{"strikes": 1}',  # a bare record from before the envelope
        struct.pack(">BBQH", 0x00, 0, 1, 0),  # wrong magic
        struct.pack(">BBQH", 0xA7, 0x04, 1, 0),  # unknown flag
        struct.pack(">BBQH", 0xA7, 0x03, 1, 0),  # a tombstone that says it is in the page log
        struct.pack(">BBQH", 0xA7, 0x81, 1, 0),  # tombstone plus an unknown flag
        struct.pack(">BBQH", 0xA7, 0, 1, 10) + b"abc",  # truncated inside the node name
    ],
)
def test_junk_is_an_envelope_error(data: bytes) -> None:
    with pytest.raises(EnvelopeError):
        unwrap(data)
    with pytest.raises(EnvelopeError):
        payload_of(data)
    assert version_of(data) is None


def test_a_stub_keeps_its_records_version_and_writer_and_liveness_but_no_payload() -> None:
    record = wrap(Version(7 << LOGICAL_BITS, "node-b"), b"PG" + b"x" * 30_000)
    s = stub(record)
    assert len(s) == 12 + len("node-b") and is_stub(s) and not is_stub(record)
    assert hlc_bytes(s) == hlc_bytes(record) and writer_bytes(s) == writer_bytes(record) == b"node-b"
    assert version_of(s) == version_of(record)
    assert payload_of(s) == b""  # live (a liveness check counts it), and no page decodes from it
    assert not wins(s, record) and not wins(record, s)  # the same version: neither replaces the other
    assert not is_stub(None) and not is_stub(b"\xa7\x02")


def test_an_envelope_error_is_a_value_error() -> None:
    assert issubclass(EnvelopeError, ValueError)


# ---------------------------------------------------------------------------- last writer wins


def test_a_higher_clock_wins() -> None:
    old, new = wrap(Version(hlc(T0), "z"), b"old"), wrap(Version(hlc(T0, 1), "a"), b"new")
    assert wins(new, old) and not wins(old, new)


def test_equal_clocks_break_the_tie_by_node_name_the_same_way_everywhere() -> None:
    a, b = wrap(Version(hlc(T0), "node-a"), b"a"), wrap(Version(hlc(T0), "node-b"), b"b")
    assert wins(b, a) and not wins(a, b)


def test_a_replay_of_the_same_version_does_not_win() -> None:
    rec = wrap(Version(hlc(T0), "a"), b"x")
    assert not wins(rec, rec)


def test_anything_wins_over_nothing_or_unreadable_bytes() -> None:
    rec = wrap(Version(1, "a"), b"x")
    assert wins(rec, None)
    assert wins(rec, b"junk from before the envelope")


def test_a_tombstone_beats_an_older_write_and_loses_to_a_newer_one() -> None:
    write, delete, rewrite = (wrap(Version(hlc(T0, i), "a"), p) for i, p in enumerate([b"v1", None, b"v2"]))
    assert wins(delete, write) and not wins(write, delete)  # a late older write cannot resurrect it
    assert wins(rewrite, delete)


def test_unreadable_incoming_bytes_are_refused() -> None:
    with pytest.raises(EnvelopeError):
        wins(b"junk", wrap(Version(1, "a"), b"x"))


@given(versions, versions)
def test_exactly_one_of_two_different_versions_wins(a: Version, b: Version) -> None:
    ra, rb = wrap(a, b"a"), wrap(b, None)
    if a == b:
        assert not wins(ra, rb) and not wins(rb, ra)
    else:
        assert wins(ra, rb) != wins(rb, ra)


@given(st.lists(st.tuples(versions, payloads), min_size=1, max_size=8, unique_by=lambda t: t[0]))
def test_every_delivery_order_converges_on_the_newest_record(writes: list) -> None:
    records = [wrap(v, p) for v, p in writes]
    expected = max(records, key=lambda r: (unwrap(r)[0].hlc, unwrap(r)[0].node))
    for order in itertools.islice(itertools.permutations(records), 24):
        stored: bytes | None = None
        for rec in order:
            if wins(rec, stored):
                stored = rec
        assert stored == expected


def test_newer_than_nothing_is_always_true() -> None:
    assert Version(0, "").newer_than(None)


def test_a_reserved_range_is_consecutive_fresh_versions_and_the_clock_moves_past_it() -> None:
    wall = Wall()
    clock = Clock("n1", wall)
    before = clock.now().hlc
    first = clock.reserve(3)
    assert first == before + 1
    assert clock.now().hlc == first + 3
    wall.ms += 5
    assert clock.reserve(2) == (wall.ms << LOGICAL_BITS)


def test_wrap_many_is_wrap_with_consecutive_versions() -> None:
    payloads = [b"a", None, b"", b"\xff" * 3]
    records = wrap_many("n\u00e9", 1000, payloads)
    assert records == [wrap(Version(1000 + i, "n\u00e9"), p) for i, p in enumerate(payloads)]
    assert [hlc_bytes(r) for r in records] == [struct.pack(">Q", 1000 + i) for i in range(4)]
    assert hlc_bytes(None) is None and hlc_bytes(b"junk") is None and hlc_bytes(b"\x00" * 20) is None
