"""Registry records: the Target row's stored form, junk coercion (absent is not zero) and the key
helpers (docs/queue.md#targets)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.storage.keys import (
    QUEUE_CONTROL,
    QUEUE_STATUS,
    SITEMAP,
    SITEMAP_RUN,
    TARGET,
    TARGET_BY_SITEMAP,
)
from prerender_ray.storage.registry import (
    SUPPRESSED,
    RecordError,
    Target,
    by_sitemap_key,
    decode_json,
    encode_json,
    target_key,
)

URL = "https://shop.test/a"
SITEMAP_URL = "https://shop.test/sitemap.xml"

texts = st.one_of(st.none(), st.text(max_size=40))
positive_ms = st.one_of(st.none(), st.integers(min_value=1, max_value=2**62))
targets = st.builds(
    Target,
    url=st.text(min_size=1, max_size=60),
    sitemap_url=texts,
    scheduler_node=texts,
    render_interval=positive_ms,
    state=st.sampled_from([None, SUPPRESSED]),
    suppressed_reason=texts,
    suppressed_at=st.one_of(st.none(), st.integers(min_value=0, max_value=2**62)),
    strikes=st.integers(min_value=0, max_value=1000),
    discovered=st.booleans(),
)


# ------------------------------------------------------------------------------------- encoding


@given(targets)
def test_a_target_survives_encode_and_decode(t: Target) -> None:
    assert Target.decode(t.url, t.encode()) == t


def test_the_url_is_the_key_not_part_of_the_value() -> None:
    data = Target(URL, SITEMAP_URL).encode()
    assert URL.encode() not in data
    assert Target.decode("https://shop.test/other", data).url == "https://shop.test/other"


def test_absent_fields_and_zero_strikes_are_not_stored() -> None:
    assert json.loads(Target(URL).encode()) == {}
    assert json.loads(Target(URL, strikes=0).encode()) == {}
    assert json.loads(Target(URL, strikes=2).encode()) == {"strikes": 2}


def test_a_zero_suppression_time_is_kept_apart_from_an_absent_one() -> None:
    assert Target.decode(URL, Target(URL, suppressed_at=0).encode()).suppressed_at == 0
    assert Target.decode(URL, Target(URL).encode()).suppressed_at is None


def test_an_empty_record_is_a_plain_target() -> None:
    t = Target.decode(URL, b"{}")
    assert t == Target(URL) and t.render_interval is None and t.strikes == 0 and not t.suppressed
    assert not t.discovered  # a record from before the flag: listed and submitted as it was


def test_a_discovered_target_is_marked_by_one_short_field_after_the_others() -> None:
    data = Target(URL, None, "node-a", 60_000, discovered=True).encode()
    assert data == b'{"scheduler_node":"node-a","render_interval":60000,"discovered":1}'
    assert Target.decode(URL, data).discovered
    assert b"discovered" not in Target(URL, None, "node-a", 60_000).encode()  # absent when not


@pytest.mark.parametrize("stored, expected", [(1, True), (True, True), (0, False), (False, False), ("1", False),
                                              (None, False), ([1], False), (2, False)])
def test_a_junk_discovered_flag_reads_as_not_discovered(stored: Any, expected: bool) -> None:
    assert Target.decode(URL, json.dumps({"discovered": stored}).encode()).discovered is expected


def test_old_records_decode_as_before() -> None:
    """Records written before the flag existed (every field but it) read back the same target."""
    old = b'{"sitemap_url":"https://shop.test/sitemap.xml","scheduler_node":"node-a","render_interval":60000,' \
          b'"state":"suppressed","suppressed_reason":"noindex","suppressed_at":5,"strikes":1,"struck_at":4}'
    t = Target.decode(URL, old)
    assert t == Target(URL, SITEMAP_URL, "node-a", 60_000, SUPPRESSED, "noindex", 5, 1, 4) and not t.discovered
    assert t.encode() == old  # and a rewrite stores the same bytes


def test_the_stored_form_is_compact_json() -> None:
    data = Target(URL, SITEMAP_URL, "node-a", 3_600_000, SUPPRESSED, "noindex", 5, 1).encode()
    assert b" " not in data
    assert json.loads(data) == {
        "sitemap_url": SITEMAP_URL,
        "scheduler_node": "node-a",
        "render_interval": 3_600_000,
        "state": SUPPRESSED,
        "suppressed_reason": "noindex",
        "suppressed_at": 5,
        "strikes": 1,
    }


# -------------------------------------------------------------------------------- junk coercion


@pytest.mark.parametrize(
    "stored, expected",
    [
        (3_600_000, 3_600_000),
        ("3600000", 3_600_000),
        (3_600_000.0, 3_600_000),
        (1.5, 1),
        (0, None),
        (-1, None),
        ("nonsense", None),
        (True, None),
        (None, None),
        ([1], None),
        ({"ms": 1}, None),
        ("NaN", None),
        ("Infinity", None),
    ],
)
def test_a_junk_stored_render_interval_reads_as_absent(stored: Any, expected: int | None) -> None:
    t = Target.decode(URL, json.dumps({"render_interval": stored}).encode())
    assert t.render_interval == expected
    assert t.render_interval is None or type(t.render_interval) is int


@pytest.mark.parametrize(
    "stored, expected",
    [
        (3, 3),
        ("2", 2),
        (2.0, 2),
        (0, 0),
        (-3, 0),
        (None, 0),
        ("x", 0),
        (True, 0),
        ([2], 0),
    ],
)
def test_stored_strikes_are_coerced_to_a_count(stored: Any, expected: int) -> None:
    t = Target.decode(URL, json.dumps({"strikes": stored}).encode())
    assert t.strikes == expected and type(t.strikes) is int


def test_an_absent_render_interval_is_not_zero_and_an_absent_strike_count_is_zero() -> None:
    t = Target.decode(URL, b'{"sitemap_url": "https://shop.test/s.xml"}')
    assert t.render_interval is None and t.strikes == 0


def test_unknown_stored_fields_are_ignored() -> None:
    t = Target.decode(
        URL, b'{"demand_interval": 5, "url": "https://evil.test/", "strikes": 1, "sitemapUrl": "x"}'
    )
    assert t == Target(URL, strikes=1)


@pytest.mark.parametrize("data", [b"", b"not json", b"\xff\xfe", b"[1, 2]", b"5", b'"text"', b"null"])
def test_a_record_that_is_not_a_json_object_is_a_record_error(data: bytes) -> None:
    with pytest.raises(RecordError, match=URL):
        Target.decode(URL, data)


def test_a_record_error_is_a_value_error() -> None:
    assert issubclass(RecordError, ValueError)


# ----------------------------------------------------------------------------------- the record


def test_suppressed_is_the_state_and_nothing_else() -> None:
    assert Target(URL, state=SUPPRESSED).suppressed
    assert not Target(URL, state=None).suppressed
    assert not Target(URL, suppressed_reason="noindex").suppressed


def test_patched_returns_a_new_row_and_leaves_the_old_one() -> None:
    t = Target(URL, SITEMAP_URL, strikes=1)
    p = t.patched(strikes=2, sitemap_url=None)
    assert p == Target(URL, None, strikes=2) and t == Target(URL, SITEMAP_URL, strikes=1)
    with pytest.raises(AttributeError):
        t.strikes = 5  # type: ignore[misc]


def test_the_json_form_uses_the_reference_field_names() -> None:
    t = Target(URL, SITEMAP_URL, "node-a", 60_000, SUPPRESSED, "http-gone", 7, 2)
    assert t.as_json() == {
        "url": URL,
        "sitemapUrl": SITEMAP_URL,
        "schedulerNode": "node-a",
        "renderInterval": 60_000,
        "state": SUPPRESSED,
        "suppressedReason": "http-gone",
        "suppressedAt": 7,
        "strikes": 2,
    }
    assert Target(URL).as_json()["renderInterval"] is None and Target(URL).as_json()["strikes"] == 0
    assert "discovered" not in t.as_json()  # the reference's shape unless a bot's miss made the target
    assert Target(URL, discovered=True).as_json()["discovered"] is True


# ---------------------------------------------------------------------------------- key helpers


def test_every_kind_has_its_own_prefix() -> None:
    prefixes = [TARGET, QUEUE_CONTROL, QUEUE_STATUS, SITEMAP, SITEMAP_RUN, TARGET_BY_SITEMAP]
    assert len(set(prefixes)) == len(prefixes)
    assert not any(a != b and b.startswith(a) for a in prefixes for b in prefixes)


def test_a_target_key_is_the_prefix_and_the_utf8_url() -> None:
    assert target_key(URL) == b"t:" + URL.encode()
    assert target_key("https://shop.test/ü") == b"t:https://shop.test/\xc3\xbc"
    assert target_key(URL).startswith(TARGET)


def test_the_sitemap_index_key_separates_sitemap_and_url() -> None:
    key = by_sitemap_key(SITEMAP_URL, URL)
    assert key == b"i:" + SITEMAP_URL.encode() + b"\x00" + URL.encode()
    assert key.startswith(TARGET_BY_SITEMAP + SITEMAP_URL.encode() + b"\x00")


def test_a_sitemap_whose_url_extends_another_never_shares_its_index_prefix() -> None:
    prefix = TARGET_BY_SITEMAP + b"https://shop.test/s.xml" + b"\x00"
    assert not by_sitemap_key("https://shop.test/s.xml.gz", URL).startswith(prefix)
    assert by_sitemap_key("https://shop.test/s.xml", URL).startswith(prefix)


def test_index_keys_of_one_sitemap_sort_by_url() -> None:
    urls = ["https://shop.test/b", "https://shop.test/a", "https://shop.test/a/1"]
    assert sorted(by_sitemap_key(SITEMAP_URL, u) for u in urls) == [
        by_sitemap_key(SITEMAP_URL, u) for u in sorted(urls)
    ]


def test_generic_records_round_trip_compactly_without_absent_values() -> None:
    data = encode_json({"paused": True, "updatedBy": "ops", "note": None})
    assert data == b'{"paused":true,"updatedBy":"ops"}'
    assert decode_json(data) == {"paused": True, "updatedBy": "ops"}
    with pytest.raises(RecordError, match="queue control"):
        decode_json(b"[]", "queue control")


# ------------------------------------------------------------------------------ the sitemap index


@given(targets)
def test_the_sitemap_of_a_record_is_read_without_decoding_it_and_agrees_with_decode(t: Target) -> None:
    from prerender_ray.storage.registry import sitemap_of_record

    assert sitemap_of_record(t.encode()) == (Target.decode(t.url, t.encode()).sitemap_url or None)


@pytest.mark.parametrize("data, expected", [
    (None, None), (b"", None), (b"{}", None), (b"junk", None), (b"[1]", None),
    (b'{"sitemap_url":"https://s.test/a.xml","strikes":1}', "https://s.test/a.xml"),
    (b'{"strikes":1,"sitemap_url":"https://s.test/b.xml"}', "https://s.test/b.xml"),  # another order
    (b'{"sitemap_url":"https://s.test/\\u00e9.xml"}', "https://s.test/\u00e9.xml"),  # an escape
    (b'{"sitemap_url":"https://s.test/\\"q.xml"}', 'https://s.test/"q.xml'),
    (b'{"sitemap_url":""}', None), (b'{"sitemap_url":7}', None), (b'{"sitemap_url":"unterminated', None),
])
def test_the_sitemap_reader_handles_every_shape(data: bytes | None, expected: str | None) -> None:
    from prerender_ray.storage.registry import sitemap_of_record

    assert sitemap_of_record(data) == expected


_SITEMAP_URLS = st.sampled_from([None, "", "https://s.test/a.xml", "https://s.test/a.xml2", "https://s.test/a",
                                 'https://s.test/"q.xml', "https://s.test/\\x.xml", "https://s.test/\u00e9.xml"])
_RECORDS = st.one_of(
    _SITEMAP_URLS.map(lambda u: Target("https://shop.test/p", sitemap_url=u, strikes=1).encode()),
    st.sampled_from([None, b"", b"junk", b'{"sitemap_url":"https://s.test/a.xml"}', b'{"sitemap_url":"https://s.test/a.x',
                     b'{"sitemap_url":"https://s.test/a.xml","x":1}', b'{"sitemap_url":"https://s.test/\\"q.xml"}',
                     # not what Target.encode writes, but each opens with the raw head of a sitemap above
                     b'{"sitemap_url":"https://s.test/"q.xml"}', b'{"sitemap_url":"https://s.test/\\x.xml"}']),
)


@given(st.lists(_RECORDS, max_size=12))
def test_the_sitemap_reader_remembers_a_head_without_ever_answering_differently(records: list) -> None:
    """What a store write reads for its by-sitemap index: the last sitemap's record head is tried first,
    and every answer is still sitemap_of_record's, with that sitemap's prefix."""
    from prerender_ray.storage.registry import SitemapReader, by_sitemap_prefix, sitemap_of_record

    reader = SitemapReader()
    for data in records:
        sitemap = sitemap_of_record(data)
        assert reader(data) == (sitemap, by_sitemap_prefix(sitemap) if sitemap else None)


@given(targets)
def test_the_hand_built_encoding_is_exactly_the_compact_json_of_the_set_fields(t: Target) -> None:
    fields = {"sitemap_url": t.sitemap_url, "scheduler_node": t.scheduler_node,
              "render_interval": t.render_interval, "state": t.state, "suppressed_reason": t.suppressed_reason,
              "suppressed_at": t.suppressed_at, "strikes": t.strikes or None, "discovered": 1 if t.discovered else None}
    expected = json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":")).encode()
    assert t.encode() == expected
