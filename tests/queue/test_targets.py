"""Scheduling rules for targets: put, restore, due-now, revalidate, suppress, reactivate, identity
(docs/queue.md#targets, #first-render, #cadence, #who-writes-a-schedule-row,
#suppression-and-recheck)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.config.loading import parse
from prerender_ray.identity.urls import UrlError, url_path
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.queue.targets import Rules, Suppression
from prerender_ray.storage.registry import SUPPRESSED, Target
from prerender_ray.timeutil import DAY_MS, HOUR_MS, MINUTE_MS, minute

NOW = 1_780_000_123_456  # not on a minute
M = minute(NOW)
URL = "https://shop.test/a"
SITEMAP = "https://shop.test/sitemap.xml"
ROUTES = {
    "ingress": {
        "routes": [
            {"match": "prefix", "path": "/hourly/", "renderInterval": 6 * HOUR_MS},
            {"match": "prefix", "path": "/m/", "deviceTypes": ["mobile"]},
            {
                "match": "prefix",
                "path": "/all/",
                "deviceTypes": ["desktop", "mobile", "tablet"],
                "renderInterval": 2 * HOUR_MS,
            },
        ]
    }
}


def rules(raw: dict | None = None) -> Rules:
    return Rules(parse(raw if raw is not None else ROUTES, {}).config)


R = rules()
STAGGERED = {"render": {"firstRender": "staggered"}}
S = rules({**ROUTES, **STAGGERED})  # the reference's first render, jittered over the cadence


# ------------------------------------------------------------------------------------- identity


def test_keys_of_a_url_follow_the_default_devices() -> None:
    assert R.devices(URL) == ("desktop", "mobile")
    assert R.keys_of(URL) == [f"{URL}|desktop", f"{URL}|mobile"]


def test_a_route_with_device_types_schedules_only_those() -> None:
    assert R.keys_of("https://shop.test/m/1") == ["https://shop.test/m/1|mobile"]
    assert R.devices("https://shop.test/all/1") == ("desktop", "mobile", "tablet")


def test_a_passthrough_route_never_narrows_the_devices() -> None:
    r = rules({"ingress": {"routes": [{"match": "prefix", "path": "/p/", "mode": "passthrough"}]}})
    assert r.devices("https://shop.test/p/1") == ("desktop", "mobile")


def test_all_keys_cover_every_supported_device_for_deletes() -> None:
    assert R.all_keys("https://shop.test/m/1") == [
        f"https://shop.test/m/1|{d}" for d in ("desktop", "mobile", "tablet")
    ]


def test_default_devices_are_read_from_the_config() -> None:
    r = rules({"deviceTypes": {"default": ["tablet"]}})
    assert r.keys_of(URL) == [f"{URL}|tablet"]


def test_url_and_device_of_a_key() -> None:
    assert R.url_of(f"{URL}?page=2|mobile") == f"{URL}?page=2"
    assert R.device_of(f"{URL}|mobile") == "mobile"
    assert R.device_of(f"{URL}|") == ""


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("https://Shop.Test/a/", URL),
        ("https://shop.test/a#frag", URL),
        ("https://shop.test/a?utm_source=x&page=2", f"{URL}?page=2"),
        ("https://shop.test:443/a", URL),
    ],
)
def test_canonical_keys_every_spelling_of_a_url_alike(raw: str, expected: str) -> None:
    assert R.canonical(raw) == expected


def test_canonical_uses_the_route_allowlist_in_forwarded_mode() -> None:
    r = rules(
        {
            "ingress": {
                "mode": "forwarded",
                "routes": [
                    {"match": "prefix", "path": "/product/", "queryParams": ["CN"]},
                    {"match": "prefix", "path": "/"},
                ],
            }
        }
    )
    assert r.canonical("https://shop.test/product/1?CN=5&page=2&b=1") == "https://shop.test/product/1?CN=5"
    assert r.canonical("https://shop.test/other?CN=5&page=2") == "https://shop.test/other"


@pytest.mark.parametrize("bad", ["not a url", "/relative", "ftp://shop.test/a", ""])
def test_canonical_refuses_what_is_not_a_url(bad: str) -> None:
    with pytest.raises(UrlError):
        R.canonical(bad)


def test_route_classes_of_canonical_urls() -> None:
    assert R.route_class(URL) == "prerender"
    assert R.route_class("https://shop.test/search/q") == "passthrough"  # the default exclude
    fwd = rules({"ingress": {"mode": "forwarded", "routes": [{"match": "prefix", "path": "/p/"}]}})
    assert fwd.route_class("https://shop.test/p/1") == "prerender"
    assert fwd.route_class("https://shop.test/q") == "unclassified"


# -------------------------------------------------------------------------------------- cadence


def test_cadence_is_route_over_stored_over_default() -> None:
    assert R.cadence("https://shop.test/hourly/x", 7 * DAY_MS) == 6 * HOUR_MS
    assert R.cadence("https://shop.test/all/x", None) == 2 * HOUR_MS
    assert R.cadence(URL, 7 * DAY_MS) == 7 * DAY_MS
    assert R.cadence(URL, None) == DAY_MS
    assert rules({"render": {"defaultInterval": "3h"}}).cadence(URL) == 3 * HOUR_MS


@pytest.mark.parametrize("junk", [0, -1, float("nan"), float("inf"), "nonsense", True, None])
def test_junk_stored_cadences_fall_through_to_the_default(junk: Any) -> None:
    assert R.cadence(URL, junk) == DAY_MS


def test_a_numeric_string_stored_cadence_counts() -> None:
    assert R.cadence(URL, "7200000") == 2 * HOUR_MS


def test_the_route_cadence_never_reads_the_stored_one() -> None:
    assert R.route_cadence(URL) == DAY_MS
    assert R.route_cadence("https://shop.test/hourly/x") == 6 * HOUR_MS


# ------------------------------------------------------------------------------------------ put


def test_a_put_is_a_fresh_row_that_clears_suppression_and_strikes() -> None:
    target, _ = R.put(URL, now=NOW, sitemap_url=SITEMAP, render_interval=7 * DAY_MS, node="node-a")
    assert target == Target(URL, SITEMAP, "node-a", 7 * DAY_MS)
    assert target.state is None and target.suppressed_reason is None and target.suppressed_at is None
    assert target.strikes == 0


def test_every_device_of_a_put_shares_one_jittered_slot() -> None:
    _, rows = S.put("https://shop.test/all/1", now=NOW)
    assert len(rows) == 3 and len({row.next_render_time for row in rows}) == 1
    assert [row.cache_key for row in rows] == [
        f"https://shop.test/all/1|{d}" for d in ("desktop", "mobile", "tablet")
    ]


def test_a_put_without_a_time_is_jittered_within_one_cadence_on_a_minute() -> None:
    for i in range(50):
        _, rows = S.put(f"https://shop.test/p/{i}", now=NOW)
        due = rows[0].next_render_time
        assert due % MINUTE_MS == 0 and M <= due < NOW + DAY_MS


def test_the_jitter_is_stable_per_url_and_spreads_distinct_urls() -> None:
    first = S.put(URL, now=NOW)[1]
    assert first == S.put(URL, now=NOW)[1]
    slots = {S.put(f"https://shop.test/p/{i}", now=NOW)[1][0].next_render_time for i in range(200)}
    assert len(slots) > 100


def test_the_jitter_matches_the_reference_vector() -> None:
    # xxh64("https://x.test/a") x 1 day >> 64 = 1275 min
    _, rows = S.put("https://x.test/a", now=0)
    assert {row.next_render_time for row in rows} == {1275 * MINUTE_MS}


def test_the_jitter_spans_the_resolved_cadence() -> None:
    for i in range(50):
        _, rows = S.put(f"https://shop.test/hourly/{i}", now=NOW, render_interval=7 * DAY_MS)
        assert M <= rows[0].next_render_time < NOW + 6 * HOUR_MS  # the route's 6 h, not the stored week
        assert rows[0].effective_interval == 6 * HOUR_MS


@pytest.mark.parametrize("junk", [0, -5, float("nan"), "x", None])
def test_a_put_with_a_junk_interval_stores_none_and_jitters_over_the_default(junk: Any) -> None:
    target, rows = S.put(URL, now=NOW, render_interval=junk)
    assert target.render_interval is None
    assert rows[0].effective_interval == DAY_MS and M <= rows[0].next_render_time < NOW + DAY_MS


@pytest.mark.parametrize("due", [1, NOW + 5, M, 2**40])
def test_an_explicit_positive_next_render_time_is_used_as_given(due: int) -> None:
    _, rows = S.put(URL, now=NOW, next_render_time=due)
    assert {row.next_render_time for row in rows} == {due}


def test_an_explicit_fractional_time_is_filed_as_whole_ms() -> None:
    _, rows = S.put(URL, now=NOW, next_render_time=1.5)
    assert rows[0].next_render_time == 1 and type(rows[0].next_render_time) is int


@pytest.mark.parametrize("junk", [0, -1, None, float("nan"), float("inf"), "soon", True])
def test_a_junk_next_render_time_falls_back_to_the_jitter(junk: Any) -> None:
    assert S.put(URL, now=NOW, next_render_time=junk)[1] == S.put(URL, now=NOW)[1]


def test_a_put_files_the_sitemap_flag_and_the_resolved_cadence() -> None:
    _, rows = S.put(URL, now=NOW, sitemap_url=SITEMAP, render_interval=3 * DAY_MS)
    assert all(row.from_sitemap is True and row.effective_interval == 3 * DAY_MS for row in rows)
    target, rows = S.put(URL, now=NOW, sitemap_url="")
    assert target.sitemap_url is None and all(row.from_sitemap is False for row in rows)


def test_a_put_of_a_route_with_devices_files_only_those_rows() -> None:
    _, rows = S.put("https://shop.test/m/1", now=NOW)
    assert [row.cache_key for row in rows] == ["https://shop.test/m/1|mobile"]


def test_device_variants_share_a_slot_whatever_the_key_shape() -> None:
    r = rules({"cacheKey": {"attributes": ["deviceType", "url"]}, **STAGGERED})
    _, rows = r.put(URL, now=NOW)
    assert [row.cache_key for row in rows] == [f"desktop|{URL}", f"mobile|{URL}"]
    assert len({row.next_render_time for row in rows}) == 1
    # the device first in the key must not seed every URL onto one minute
    slots = {r.put(f"https://shop.test/p/{i}", now=NOW)[1][0].next_render_time for i in range(100)}
    assert len(slots) > 50
    assert slots == {S.put(f"https://shop.test/p/{i}", now=NOW)[1][0].next_render_time for i in range(100)}


def test_a_delimiter_that_occurs_in_urls_does_not_collapse_the_jitter() -> None:
    r = rules({"cacheKey": {"delimiter": "::"}, **STAGGERED})
    slots = {r.put(f"http://[::1]:8080/p/{i}", now=NOW)[1][0].next_render_time for i in range(100)}
    assert len(slots) > 50


# ------------------------------------------------------------------------------ restore, due now


def test_a_restored_row_is_jittered_over_the_cadence_with_the_target_flag() -> None:
    target = Target(URL, sitemap_url=SITEMAP, render_interval=3 * DAY_MS)
    row = R.restore_row(target, f"{URL}|mobile", NOW)
    assert (
        row.cache_key == f"{URL}|mobile" and row.from_sitemap is True and row.effective_interval == 3 * DAY_MS
    )
    assert row.next_render_time % MINUTE_MS == 0 and M <= row.next_render_time < NOW + 3 * DAY_MS
    # the slot a staggered put at that moment would have chosen (whatever firstRender says: a mass
    # repair must not be a herd): devices restored apart still line up
    assert row.next_render_time == S.put(URL, now=NOW, render_interval=3 * DAY_MS)[1][0].next_render_time


def test_restored_rows_are_spread_not_all_equal() -> None:
    dues = {
        R.restore_row(
            Target(f"https://shop.test/p/{i}"), f"https://shop.test/p/{i}|desktop", NOW
        ).next_render_time
        for i in range(100)
    }
    assert len(dues) > 50


@pytest.mark.parametrize("stored", [3_600_000.0, "3600000", 3_600_000])
def test_restoring_a_target_with_a_non_int_interval_still_yields_a_whole_ms_time(stored: Any) -> None:
    row = R.restore_row(Target(URL, render_interval=stored), f"{URL}|desktop", NOW)
    assert type(row.next_render_time) is int and type(row.effective_interval) is int
    assert row.effective_interval == HOUR_MS and M <= row.next_render_time < NOW + HOUR_MS
    assert ScheduleRow.decode(row.cache_key, row.encode()) == row


def test_due_now_files_one_key_this_minute_with_the_target_cadence() -> None:
    target = Target(URL, sitemap_url=SITEMAP, render_interval=3 * DAY_MS)
    assert R.due_now(target, f"{URL}|desktop", NOW) == ScheduleRow(f"{URL}|desktop", M, True, 3 * DAY_MS)
    assert R.due_now(target, f"{URL}|desktop", NOW, carry_cadence=False) == ScheduleRow(
        f"{URL}|desktop", M, True, None
    )


def test_due_now_without_a_target_is_a_one_off() -> None:
    assert R.due_now(None, f"{URL}|mobile", NOW) == ScheduleRow(f"{URL}|mobile", M, False, None)


def test_revalidate_makes_every_device_due_now_and_leaves_the_cadence_to_config() -> None:
    rows = R.revalidate(Target(URL, sitemap_url=SITEMAP, render_interval=3 * DAY_MS), NOW)
    assert rows == [ScheduleRow(f"{URL}|{d}", M, True, None) for d in ("desktop", "mobile")]
    rows = R.revalidate(Target("https://shop.test/m/1"), NOW + MINUTE_MS)
    assert rows == [ScheduleRow("https://shop.test/m/1|mobile", M + MINUTE_MS, False, None)]


# ----------------------------------------------------------------------------------- suppression


def suppress(
    existing: Target | None,
    reason: str | None = "noindex",
    status: int | None = 200,
    r: Rules = R,
    url: str = URL,
) -> Suppression:
    return r.suppress(existing, url, reason=reason, status_code=status, now=NOW)


def test_a_first_verdict_suppresses_and_rechecks_every_device_in_a_week() -> None:
    existing = Target(URL, SITEMAP, "node-a", 3 * DAY_MS)
    s = suppress(existing)
    assert not s.deleted
    assert s.target == Target(URL, SITEMAP, "node-a", 3 * DAY_MS, SUPPRESSED, "noindex", NOW, 1, NOW)
    # the cadence is filed, not the recheck gap
    assert s.rows == [
        ScheduleRow(f"{URL}|{d}", M + 7 * DAY_MS, True, 3 * DAY_MS) for d in ("desktop", "mobile")
    ]


def test_a_suppression_keeps_a_discovered_target_discovered() -> None:
    s = suppress(Target(URL, None, "node-a", discovered=True))
    assert s.target is not None and s.target.suppressed and s.target.discovered
    assert not suppress(Target(URL, SITEMAP)).target.discovered  # type: ignore[union-attr]


def test_a_suppressed_row_files_the_route_cadence() -> None:
    s = suppress(
        Target("https://shop.test/hourly/1", render_interval=3 * DAY_MS), url="https://shop.test/hourly/1"
    )
    assert {row.effective_interval for row in s.rows} == {6 * HOUR_MS}


@pytest.mark.parametrize("status", [404, 410])
def test_a_gone_verdict_is_http_gone_with_a_14_day_recheck(status: int) -> None:
    s = suppress(Target(URL), "http-error", status)
    assert s.target is not None and s.target.suppressed_reason == "http-gone"
    assert {row.next_render_time for row in s.rows} == {M + 14 * DAY_MS}


@pytest.mark.parametrize(
    "reason, status",
    [("http-error", 500), ("http-error", None), ("noindex", 404), ("canonical-mismatch", 410)],
)
def test_only_http_error_404_and_410_are_gone(reason: str, status: int | None) -> None:
    s = suppress(Target(URL), reason, status)
    assert s.target is not None and s.target.suppressed_reason == reason
    assert {row.next_render_time for row in s.rows} == {M + 7 * DAY_MS}


def test_a_verdict_without_a_reason_stores_none() -> None:
    for reason in (None, ""):
        s = suppress(Target(URL), reason, 200)
        assert s.target is not None and s.target.suppressed_reason is None


def test_a_gone_target_is_deleted_at_two_strikes() -> None:
    first = suppress(Target(URL), "http-error", 404)
    assert first.target is not None and first.target.strikes == 1
    assert suppress(first.target, "http-error", 404) == Suppression(None, [], deleted=True)


def test_four_consecutive_verdicts_delete_the_target() -> None:
    t = Target(URL)
    for expected in (1, 2, 3):
        s = suppress(t)
        assert s.target is not None and s.target.strikes == expected
        t = s.target
    s = suppress(t)
    assert s.deleted and s.target is None and s.rows == []


def test_strikes_are_one_counter_across_verdict_classes() -> None:
    # a target with one strike (from a failure, a redirect or a noindex) dies on its first gone verdict
    assert suppress(Target(URL, strikes=1), "http-error", 410).deleted
    assert not suppress(Target(URL, strikes=1), "noindex", 200).deleted
    assert suppress(Target(URL, strikes=3), "noindex", 200).deleted


@pytest.mark.parametrize(
    "stored, expected", [("2", 3), (2.0, 3), (None, 1), (-4, 1), ("junk", 1), (float("nan"), 1)]
)
def test_stored_strikes_are_coerced_before_counting(stored: Any, expected: int) -> None:
    s = suppress(Target(URL, strikes=stored))
    assert s.target is not None and s.target.strikes == expected


def test_a_verdict_for_an_untargeted_url_creates_a_suppressed_row() -> None:
    s = suppress(None)
    assert s.target == Target(
        URL, state=SUPPRESSED, suppressed_reason="noindex", suppressed_at=NOW, strikes=1, struck_at=NOW
    )
    assert [row.cache_key for row in s.rows] == [f"{URL}|desktop", f"{URL}|mobile"]
    assert {row.from_sitemap for row in s.rows} == {False} and {row.effective_interval for row in s.rows} == {
        DAY_MS
    }


def test_the_creating_verdict_never_deletes_even_when_one_strike_is_the_maximum() -> None:
    r = rules({"render": {"suppression": {"maxStrikes": 1, "gone": {"maxStrikes": 1}}}})
    for reason, status in (("noindex", 200), ("http-error", 404)):
        s = suppress(None, reason, status, r)
        assert not s.deleted and s.target is not None and s.target.strikes == 1
        assert suppress(Target(URL), reason, status, r).deleted


def test_the_recheck_and_strike_knobs_come_from_the_config() -> None:
    r = rules(
        {
            "render": {
                "suppression": {
                    "recheckInterval": "2d",
                    "maxStrikes": 9,
                    "gone": {"recheckInterval": "30d", "maxStrikes": 3},
                }
            }
        }
    )
    assert {row.next_render_time for row in suppress(Target(URL), r=r).rows} == {M + 2 * DAY_MS}
    assert {row.next_render_time for row in suppress(Target(URL), "http-error", 404, r).rows} == {
        M + 30 * DAY_MS
    }
    assert not suppress(Target(URL, strikes=1), "http-error", 404, r).deleted
    assert suppress(Target(URL, strikes=2), "http-error", 404, r).deleted
    assert not suppress(Target(URL, strikes=7), r=r).deleted


def test_a_suppression_rechecks_only_the_route_devices() -> None:
    s = suppress(Target("https://shop.test/m/1"), url="https://shop.test/m/1")
    assert [row.cache_key for row in s.rows] == ["https://shop.test/m/1|mobile"]


def test_a_repeat_suppression_moves_the_verdict_time_and_reason() -> None:
    first = suppress(Target(URL))
    assert first.target is not None
    later = R.suppress(first.target, URL, reason="canonical-mismatch", status_code=200, now=NOW + DAY_MS)
    assert later.target is not None and later.target.suppressed_at == NOW + DAY_MS
    assert later.target.suppressed_reason == "canonical-mismatch" and later.target.strikes == 2
    assert {row.next_render_time for row in later.rows} == {minute(NOW + DAY_MS) + 7 * DAY_MS}


def test_reactivation_clears_the_verdict_and_the_strikes_and_keeps_the_rest() -> None:
    t = Target(URL, SITEMAP, "node-a", 3 * DAY_MS, SUPPRESSED, "noindex", NOW, 3)
    assert R.reactivated(t) == Target(URL, SITEMAP, "node-a", 3 * DAY_MS)
    assert not R.reactivated(t).suppressed


@given(strikes=st.integers(min_value=0, max_value=10), gone=st.booleans(), exists=st.booleans())
def test_a_suppression_either_deletes_an_existing_target_or_rechecks_every_device(
    strikes: int, gone: bool, exists: bool
) -> None:
    existing = Target(URL, strikes=strikes) if exists else None
    s = R.suppress(existing, URL, reason="http-error" if gone else "noindex", status_code=404, now=NOW)
    limit = 2 if gone else 4
    if exists and strikes + 1 >= limit:
        assert s.deleted and s.target is None and s.rows == []
    else:
        assert not s.deleted and s.target is not None and s.target.suppressed
        assert s.target.strikes == (strikes if exists else 0) + 1
        assert len(s.rows) == 2 and all(row.next_render_time > NOW for row in s.rows)


# -------------------------------------------------------------------------------------- put_many

_URLS = st.sampled_from(["https://shop.test/a", "https://shop.test/hourly/x", "https://shop.test/m/p?q=1",
                         "https://shop.test/all/z", 'https://shop.test/"quoted"\\path', "https://shop.test/é"])
_SITEMAPS = st.sampled_from([None, "", SITEMAP, 'https://shop.test/"odd".xml', "https://shop.test/ü.xml"])
_VALUES = st.one_of(st.none(), st.integers(-5, 10 * DAY_MS), st.floats(allow_nan=True),
                    st.sampled_from(["3600000", "junk", True]))


@given(st.lists(st.tuples(_URLS, _SITEMAPS, _VALUES, _VALUES, st.booleans()), max_size=8),
       st.sampled_from([None, "node-a", 'n"1']))
def test_put_many_writes_what_put_writes_byte_for_byte(items: list[tuple], node: str | None) -> None:
    """The batch path (a sitemap ingest): each record is ``Target.encode``'s bytes (built without a
    Target), and a batch writes what its URLs put one by one would (nothing leaks between items)."""
    urls, sitemaps, intervals, dues, discovered = ([it[i] for it in items] for i in range(5))
    registry, rows = R.put_many(urls, sitemaps, intervals, dues, now=NOW, node=node, discovered=discovered)
    expected_registry, expected_rows = [], []
    for url, sitemap, interval, due, found in items:
        target, rs = R.put(url, now=NOW, sitemap_url=sitemap, render_interval=interval, next_render_time=due,
                           node=node, discovered=found)
        assert target.discovered is found
        expected_registry.append((b"t:" + url.encode(), target.encode()))
        expected_rows += rs
    assert [tuple(r) for r in registry] == expected_registry
    assert [ScheduleRow(*r) for r in rows] == expected_rows


@given(st.lists(st.tuples(_URLS, _VALUES), max_size=8), st.sampled_from([NOW, float(NOW)]))
def test_put_many_jitters_first_renders_as_the_seeded_rule_does(items: list[tuple], now: Any) -> None:
    """Its inline jitter is ``_jittered`` (``initial_render_time`` seeded by the whole URL), and an
    explicit positive due is kept; ``put`` runs through ``put_many``, so this is pinned on its own."""
    urls, intervals = [u for u, _ in items], [iv for _, iv in items]
    _, rows = S.put_many(urls, [SITEMAP] * len(urls), intervals, [None] * len(urls), now=now, node=None)
    assert [due for _, due, _, _ in rows] == [S._jittered(key.rpartition("|")[0], cadence, now)
                                               for key, _, _, cadence in rows]
    _, rows = R.put_many(urls, [None] * len(urls), intervals, [M + 7] * len(urls), now=now, node=None)
    assert all(due == M + 7 for _, due, _, _ in rows)


def test_put_many_keys_its_rows_as_keys_of_does_whatever_the_key_shape() -> None:
    urls = ["https://shop.test/a", "https://shop.test/m/p", "https://shop.test/all/z"]
    for r in (R, rules({**ROUTES, "cacheKey": {"attributes": ["deviceType", "url"], "delimiter": "::"}})):
        _, rows = r.put_many(urls, [None] * 3, [None] * 3, [None] * 3, now=NOW, node=None)
        assert [key for key, *_ in rows] == [k for u in urls for k in r.keys_of(u)]


def test_put_many_reports_each_urls_route_under_its_first_rows_key() -> None:
    urls = ["https://shop.test/a", "https://shop.test/m/p", "https://shop.test/all/z", "https://shop.test/hourly/x"]
    routes: dict[str, Any] = {}
    _, rows = R.put_many(urls, [None] * 4, [None] * 4, [None] * 4, now=NOW, node=None, routes=routes)
    assert list(routes) == [R.keys_of(u)[0] for u in urls]
    assert routes == {R.keys_of(u)[0]: R.router.first_match(url_path(u)) for u in urls}
    assert routes[R.keys_of(urls[1])[0]] is not None and routes[R.keys_of(urls[0])[0]] is None


# ------------------------------------------------------------------------- paced revalidation


def test_paced_due_times_are_flat_over_the_window_and_stable_per_key() -> None:
    from prerender_ray.queue.targets import paced_due

    now, within = 1_780_000_123_456, 2 * 3_600_000
    keys = [f"https://shop.test/p/{i}|desktop" for i in range(12_000)]
    dues = [paced_due(k, now, within) for k in keys]
    assert all(minute(now) <= d < now + within for d in dues)
    buckets = [0] * 12  # ten minutes each
    for d in dues:
        buckets[min(11, (d - minute(now)) // 600_000)] += 1
    assert max(buckets) < 1.15 * 1000 and min(buckets) > 0.85 * 1000  # no herd: ~1,000 in each
    assert dues == [paced_due(k, now, within) for k in keys]  # the same minute on every node
    assert paced_due(keys[0], now, 0) == minute(now)


def test_a_paced_revalidation_never_delays_a_row_already_due_sooner() -> None:
    r = rules()
    t = Target(url="https://shop.test/a")
    now = 1_780_000_000_000
    soon = {k: minute(now) for k in r.keys_of(t.url)}
    assert r.revalidate_paced(t, now, 3_600_000, soon.get) == []
    rows = r.revalidate_paced(t, now, 3_600_000, lambda key: None)
    assert {row.cache_key for row in rows} == set(r.keys_of(t.url)) and all(row.effective_interval is None for row in rows)


# --------------------------------------------------------------------- new pages first (firstRender)


def test_a_new_put_is_due_this_minute_on_every_device_whatever_its_cadence() -> None:
    for url, interval in (("https://shop.test/all/1", None), (URL, 365 * DAY_MS), ("https://shop.test/hourly/x", 7)):
        _, rows = R.put(url, now=NOW, render_interval=interval, sitemap_url=SITEMAP)
        assert rows and {row.next_render_time for row in rows} == {M}
    assert S.put(URL, now=NOW)[1][0].next_render_time > M  # staggered: within the cadence (the reference)


def test_an_explicit_next_render_time_still_wins_over_now() -> None:
    _, rows = R.put(URL, now=NOW, next_render_time=NOW + 5 * DAY_MS, held=lambda key: None)
    assert {row.next_render_time for row in rows} == {NOW + 5 * DAY_MS}


def test_a_re_put_is_never_made_due_again() -> None:
    staggered = S.put(URL, now=NOW)[1][0].next_render_time
    later = {k: NOW + 30 * DAY_MS for k in R.keys_of(URL)}  # e.g. a suppression's recheck
    assert {row.next_render_time for row in R.put(URL, now=NOW, held=later.get)[1]} == {staggered}
    sooner = {k: M + MINUTE_MS for k in R.keys_of(URL)}  # a new page still waiting: keeps its turn
    assert {row.next_render_time for row in R.put(URL, now=NOW, held=sooner.get)[1]} == {M + MINUTE_MS}
    assert {row.next_render_time for row in R.put(URL, now=NOW, held=lambda key: None)[1]} == {M}  # not held: new
    assert S.put(URL, now=NOW, held=sooner.get)[1][0].next_render_time == staggered  # the reference re-jitters


def test_put_many_makes_only_the_urls_without_a_held_row_due_now() -> None:
    urls = [f"https://shop.test/p/{i}" for i in range(6)]
    held = {R.keys_of(u)[0]: NOW + 40 * DAY_MS for u in urls[::2]}
    _, rows = R.put_many(urls, [SITEMAP] * 6, [None] * 6, [None] * 6, now=NOW, node=None, held=held.get)
    dues = {key.rpartition("|")[0]: due for key, due, _, _ in rows}
    assert [dues[u] == M for u in urls] == [False, True] * 3
    assert all(M < dues[u] < NOW + DAY_MS for u in urls[::2])


def test_after_a_first_render_the_next_lands_on_the_urls_slot() -> None:
    cadence = DAY_MS
    slots = []
    for i in range(2_000):
        url = f"https://shop.test/p/{i}"
        due = R.after_first_render(url, cadence, NOW)
        assert due % MINUTE_MS == 0 and M < due <= M + MINUTE_MS + cadence
        # the slot is the URL's, not the first render's: any first render within the day lands on it
        later = R.after_first_render(url, cadence, NOW + (due - NOW) // 2)
        assert later == due
        assert R.after_first_render(url, cadence, due) == due + cadence  # rendered on its slot: a cadence on
        slots.append(due)
    tenths = [0] * 10
    for due in slots:
        tenths[min(9, (due - M) * 10 // cadence)] += 1
    assert min(tenths) > 150 and max(tenths) < 250  # flat over the cadence: ~200 each, no herd
    assert S.after_first_render(URL, cadence, NOW) == M + cadence  # staggered: the reference's


def test_a_lastmod_newer_than_a_page_makes_that_device_due_paced() -> None:
    from prerender_ray.queue.targets import paced_due

    t = Target(url=URL, sitemap_url=SITEMAP)
    desktop, mobile = R.keys_of(URL)
    lastmod, within = NOW - HOUR_MS, HOUR_MS
    rows = R.lastmod_due(t, lastmod, [lastmod - 1, lastmod], NOW, within, lambda key: None)
    assert rows == [ScheduleRow(desktop, paced_due(desktop, NOW, within), True, None)]  # mobile is newer
    assert R.lastmod_due(t, lastmod, [None, None], NOW, within, lambda key: None) == []  # never rendered
    assert R.lastmod_due(t, lastmod, [1, 1], NOW, within, {desktop: M, mobile: M}.get) == []  # due sooner
    gone = Target(url=URL, state=SUPPRESSED, suppressed_reason="noindex")
    assert R.lastmod_due(gone, lastmod, [1, 1], NOW, within, lambda key: None) == []  # keeps its recheck
    assert {r.next_render_time for r in R.lastmod_due(t, lastmod, [1, 1], NOW, 0, lambda key: None)} == {M}
