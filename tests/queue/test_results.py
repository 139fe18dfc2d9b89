"""What a posted render result does, as a pure plan: the decision table, the failure lane and its
backoff, suppression, the redirect pre-step and the redirect lane (docs/queue.md#result-outcomes)."""

from __future__ import annotations

from email.utils import formatdate
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.config.loading import parse
from prerender_ray.decoding import decoded_digest
from prerender_ray.queue.metadata import Result
from prerender_ray.queue.results import Plan, Planner
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.queue.targets import Rules
from prerender_ray.storage.registry import SUPPRESSED, Target
from prerender_ray.timeutil import DAY_MS, HOUR_MS, MINUTE_MS, minute

NOW = 1_780_000_123_456  # deliberately not on a minute
M = minute(NOW)
SRC = "https://shop.test/old"
KEY = f"{SRC}|desktop"
DST = "https://shop.test/new"
DKEY = f"{DST}|desktop"
HOURLY = "https://shop.test/hourly/p1"
ROUTES = {"ingress": {"routes": [{"match": "prefix", "path": "/hourly/", "renderInterval": 6 * HOUR_MS}]}}


def planner(raw: dict | None = None) -> Planner:
    return Planner(Rules(parse(raw if raw is not None else ROUTES, {}).config))


def result(content: bytes | None = None, **meta: Any) -> Result:
    return Result.parse({"id": KEY, "url": SRC, **meta}, content)


def target(url: str = SRC, **kw: Any) -> Target:
    return Target(url=url, **kw)


def plan(
    r: Result,
    t: Target | None = None,
    dest: Target | None = None,
    *,
    p: Planner | None = None,
    now: int = NOW,
) -> Plan:
    return (p or planner()).plan(r, t, dest, now)


def page_ok(**kw: Any) -> Result:
    return result(b"<html>ok</html>", outcome="rendered", statusCode=200, **kw)


# ---------------------------------------------------------------------------------- destination


@pytest.mark.parametrize(
    "landed",
    [
        SRC,
        SRC + "/",
        SRC + "#top",
        SRC + "?utm_source=x",
        "HTTPS://SHOP.TEST/old",
        "https://shop.test:443/old",
    ],
)
def test_a_landed_url_that_canonicalizes_to_the_same_key_is_not_a_redirect(landed: str) -> None:
    assert planner().destination(result(redirectedTo=landed)) is None


def test_the_destination_key_keeps_the_device_of_the_job() -> None:
    p = planner()
    assert p.destination(result(redirectedTo=DST + "/?utm_source=x")) == DKEY
    mobile = Result.parse({"id": f"{SRC}|mobile", "redirectedTo": DST}, None)
    assert p.destination(mobile) == f"{DST}|mobile"
    assert p.destination(result(redirectedTo=DST + "?page=2&b=1")) == f"{DST}?page=2|desktop"


@pytest.mark.parametrize("landed", ["not a url", "ftp://shop.test/x", "http://", "https://shop.test:port/x", " "])
def test_an_unparseable_landed_url_is_no_destination(landed: str) -> None:
    assert planner().destination(result(redirectedTo=landed)) is None


@pytest.mark.parametrize("landed", ["/new", "new", "./new", "../new", "//shop.test/new"])
def test_a_relative_landed_url_is_relative_to_the_page(landed: str) -> None:
    assert planner().destination(result(redirectedTo=landed)) == DKEY


def test_no_redirect_is_no_destination() -> None:
    assert planner().destination(result()) is None


# -------------------------------------------------------------------------------------- rendered


def test_a_rendered_result_stores_the_page_and_reschedules_relative_to_completion() -> None:
    r = page_ok(
        headers={"Content-Type": "text/html", "ETag": '"e"', "Set-Cookie": "a=b", "Content-Encoding": "gzip"},
        isIndexable=True,
    )
    p = plan(r, target(sitemap_url="https://shop.test/sitemap.xml"))
    assert p.outcome == "rendered" and p.release is True
    assert p.rows == [ScheduleRow(KEY, M + DAY_MS, True, DAY_MS)]
    assert p.page is not None and p.page.cache_key == KEY and p.page.content == b"<html>ok</html>"
    assert p.page.status_code == 200 and p.page.last_cached == NOW and p.page.expires_at == M + DAY_MS
    assert p.page.is_indexable is True
    assert p.page.headers == {
        "content-type": "text/html",
        "etag": f'"{decoded_digest(b"<html>ok</html>", "identity", None)}"',  # the rendered page's, not the shell's
        "last-modified": formatdate(NOW / 1000, usegmt=True),
        "content-encoding": "gzip",
        "x-harper-rendered": "1",
    }  # never set-cookie
    assert p.targets == {} and p.row_deletes == [] and p.page_deletes == []
    assert p.adopt is None and p.suppress_dest is None


def test_identity_content_is_stored_without_a_content_encoding_header() -> None:
    p = plan(page_ok(headers={"content-type": "text/html"}), target())
    assert p.page is not None and "content-encoding" not in p.page.headers
    assert p.page.is_indexable is None


def test_a_rendered_result_reschedules_at_the_route_cadence_over_the_stored_one() -> None:
    hourly = f"{HOURLY}|desktop"
    r = Result.parse({"id": hourly, "url": HOURLY, "outcome": "rendered", "statusCode": 200}, b"<html/>")
    p = plan(r, target(HOURLY, render_interval=7 * DAY_MS))
    assert p.rows == [ScheduleRow(hourly, M + 6 * HOUR_MS, False, 6 * HOUR_MS)]
    assert p.page is not None and p.page.expires_at == M + 6 * HOUR_MS


def test_a_rendered_result_keeps_the_stored_cadence_when_the_route_sets_none() -> None:
    p = plan(page_ok(), target(render_interval=7 * DAY_MS))
    assert p.rows == [ScheduleRow(KEY, M + 7 * DAY_MS, False, 7 * DAY_MS)]


@pytest.mark.parametrize("junk", [None, 0, -5])
def test_a_rendered_result_falls_back_to_the_default_cadence(junk: Any) -> None:
    p = plan(page_ok(), target(render_interval=junk))
    assert p.rows == [ScheduleRow(KEY, M + DAY_MS, False, DAY_MS)]


def test_a_rendered_result_without_a_target_stores_the_page_and_drops_the_one_off_row() -> None:
    p = plan(page_ok(), None)
    assert p.outcome == "rendered" and p.release is True
    assert p.page is not None and p.page.cache_key == KEY
    assert p.rows == [] and p.row_deletes == [KEY] and p.targets == {}


def test_a_rendered_result_without_content_still_reschedules() -> None:
    p = plan(result(None, outcome="rendered", statusCode=200, isIndexable=True), target())
    assert p.page is None and p.rows == [ScheduleRow(KEY, M + DAY_MS, False, DAY_MS)]


def test_a_successful_render_resets_the_strike_counter() -> None:
    p = plan(page_ok(), target(strikes=3))
    assert p.targets == {SRC: target(strikes=0)}


def test_a_successful_render_of_a_target_without_strikes_writes_no_target() -> None:
    assert plan(page_ok(), target(strikes=0)).targets == {}


def test_strike_counts_stored_as_text_still_count() -> None:
    assert plan(page_ok(), target(strikes="2")).targets == {SRC: target(strikes=0)}  # type: ignore[arg-type]


def test_an_indexable_render_of_a_suppressed_target_reactivates_it() -> None:
    t = target(
        state=SUPPRESSED,
        suppressed_reason="noindex",
        suppressed_at=NOW - DAY_MS,
        strikes=2,
        render_interval=7 * DAY_MS,
        sitemap_url="https://shop.test/s.xml",
    )
    p = plan(page_ok(isIndexable=True), t)
    assert p.targets == {SRC: target(render_interval=7 * DAY_MS, sitemap_url="https://shop.test/s.xml")}
    assert p.page is not None  # and the content is cached
    assert p.rows == [ScheduleRow(KEY, M + 7 * DAY_MS, True, 7 * DAY_MS)]  # only this device moves


def test_a_render_of_a_suppressed_target_without_an_indexable_verdict_keeps_it_suppressed() -> None:
    t = target(state=SUPPRESSED, suppressed_reason="noindex", strikes=2)
    p = plan(page_ok(), t)
    assert p.targets == {}  # neither lifted nor reset
    assert p.rows == [ScheduleRow(KEY, M + DAY_MS, False, DAY_MS)]


def test_a_legacy_rendered_result_lands_in_the_rendered_branch() -> None:
    p = plan(result(b"<html/>", statusCode=200), target(strikes=1))
    assert p.outcome == "rendered" and p.page is not None and p.targets == {SRC: target()}


def test_the_rendered_page_is_filed_with_the_time_the_result_completed() -> None:
    later = NOW + 3 * HOUR_MS + 17
    p = plan(page_ok(), target(), now=later)
    assert p.rows[0].next_render_time == minute(later) + DAY_MS and p.page.last_cached == later  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ the failure lane


def test_an_error_on_a_target_backed_key_holds_the_lease_and_leaves_the_row() -> None:
    r = result(
        None, outcome="error", error={"name": "TimeoutError", "message": "settle", "phase": "navigation"}
    )
    p = plan(r, target())
    assert p.outcome == "failed" and p.detail == "fast" and p.release is False
    assert p.targets == {SRC: target(strikes=1, struck_at=NOW)}  # target kept, strike counted
    assert p.rows == [] and p.row_deletes == [] and p.page is None and p.page_deletes == []


@pytest.mark.parametrize(
    "status, label",
    [
        (401, "auth-failure"),
        (403, "auth-failure"),
        (408, "transient"),
        (429, "transient"),
        (500, "transient"),
        (503, "transient"),
        (599, "transient"),
    ],
)
def test_auth_and_transient_verdicts_never_suppress_and_take_the_fast_lane(status: int, label: str) -> None:
    r = result(None, outcome="non-indexable", statusCode=status, reason="http-error", isIndexable=False)
    p = plan(r, target(strikes=1))
    assert p.outcome == label and p.detail == "fast" and p.release is False
    assert p.targets == {SRC: target(strikes=2, struck_at=NOW)}
    assert p.rows == [] and p.page_deletes == [] and p.row_deletes == []  # the cached page is kept


@pytest.mark.parametrize("status", [401, 503])
def test_past_the_fast_retries_the_slow_lane_reschedules_near_the_cadence_and_releases(status: int) -> None:
    r = result(None, outcome="non-indexable", statusCode=status, isIndexable=False)
    p = plan(r, target(strikes=2))
    assert p.detail == "slow" and p.release is True
    [row] = p.rows
    assert NOW < row.next_render_time < NOW + 2 * DAY_MS
    assert row == ScheduleRow(KEY, M + DAY_MS, False, DAY_MS)  # first slow retry = one cadence
    assert p.targets == {SRC: target(strikes=3, struck_at=NOW)}
    assert p.page is None and p.page_deletes == []  # the page and its expiresAt are not touched


def test_a_failure_on_a_targetless_key_drops_its_row_and_releases() -> None:
    for r in (result(None, outcome="error"), result(None, outcome="non-indexable", statusCode=503)):
        p = plan(r, None)
        assert p.outcome == "dropped" and p.release is True
        assert p.row_deletes == [KEY] and p.rows == [] and p.targets == {} and p.page_deletes == []


def test_a_legacy_result_with_nothing_to_show_is_an_error() -> None:
    p = plan(result(None, statusCode=500), target())
    assert p.outcome == "failed" and p.release is False


def test_a_failing_sitemap_page_files_its_cadence_not_the_backoff() -> None:
    t = target(sitemap_url="https://shop.test/s.xml", strikes=5)
    [row] = plan(result(None, outcome="error"), t).rows
    assert row.effective_interval == DAY_MS and row.from_sitemap is True
    assert row.next_render_time == M + 7 * DAY_MS  # strikes 6 -> capped at maxBackoff


def failing_wait(
    strikes_before: int, *, sitemap: bool, interval: int = DAY_MS, raw: dict | None = None
) -> int | None:
    """The wait the failure lane files for a target that already had ``strikes_before`` strikes."""
    t = target(
        render_interval=interval,
        sitemap_url="https://shop.test/s.xml" if sitemap else None,
        strikes=strikes_before,
    )
    p = plan(result(None, outcome="error"), t, p=planner(raw or {}))
    return p.rows[0].next_render_time - M if p.rows else None


@pytest.mark.parametrize(
    "interval, sitemap, waits",
    [
        (24 * HOUR_MS, True, [None, None, 24, 48, 96, 168, 168]),
        (24 * HOUR_MS, False, [None, None, 24, 168, 168]),
        (6 * HOUR_MS, False, [None, None, 6, 48, 96, 168, 168]),
        (6 * HOUR_MS, True, [None, None, 6, 12, 24, 48, 96, 168, 168]),
    ],
)
def test_the_backoff_ladder_matches_the_reference_table(interval: int, sitemap: bool, waits: list) -> None:
    got = [failing_wait(s, sitemap=sitemap, interval=interval) for s in range(len(waits))]
    assert got == [w if w is None else w * HOUR_MS for w in waits]


def test_a_cap_below_the_cadence_never_makes_a_failing_page_come_due_more_often() -> None:
    raw = {"render": {"failureRetry": {"maxBackoff": "24h"}}}
    assert {failing_wait(s, sitemap=False, interval=2 * DAY_MS, raw=raw) for s in range(2, 8)} == {2 * DAY_MS}


def test_with_no_fast_retries_the_first_failure_waits_one_cadence_then_two() -> None:
    raw = {"render": {"failureRetry": {"fastRetries": 0}}}
    assert failing_wait(0, sitemap=True, raw=raw) == DAY_MS
    assert failing_wait(1, sitemap=True, raw=raw) == 2 * DAY_MS
    p = plan(result(None, outcome="error"), target(), p=planner(raw))
    assert p.release is True and p.detail == "slow"


def test_a_backoff_factor_of_one_is_flat() -> None:
    raw = {"render": {"failureRetry": {"backoffFactor": 1}}}
    assert {failing_wait(s, sitemap=True, raw=raw) for s in range(2, 10)} == {DAY_MS}
    # the penalty still applies to a discovered page from the second escalation on
    assert [failing_wait(s, sitemap=False, raw=raw) for s in (2, 3)] == [DAY_MS, 4 * DAY_MS]


def test_float_factors_give_whole_minutes_within_the_cap() -> None:
    raw = {"render": {"failureRetry": {"backoffFactor": 1.7, "nonSitemapPenalty": 2.3}}}
    for s in range(2, 12):
        wait = failing_wait(s, sitemap=False, interval=7 * HOUR_MS, raw=raw)
        assert wait is not None and type(wait) is int and wait % MINUTE_MS == 0 and wait <= 7 * DAY_MS


@given(
    interval=st.integers(min_value=1, max_value=400 * DAY_MS),
    strikes=st.integers(min_value=0, max_value=60),
    sitemap=st.booleans(),
    fast=st.integers(min_value=0, max_value=4),
    factor=st.floats(min_value=1, max_value=10),
    penalty=st.floats(min_value=1, max_value=10),
    cap=st.integers(min_value=1, max_value=30 * DAY_MS),
)
def test_the_backoff_never_comes_due_sooner_than_the_cadence(
    interval: int, strikes: int, sitemap: bool, fast: int, factor: float, penalty: float, cap: int
) -> None:
    raw = {
        "render": {
            "defaultInterval": interval,
            "failureRetry": {
                "fastRetries": fast,
                "backoffFactor": factor,
                "nonSitemapPenalty": penalty,
                "maxBackoff": cap,
            },
        }
    }
    p = planner(raw)
    t = target(sitemap_url="https://shop.test/s.xml" if sitemap else None, strikes=strikes)
    got = p.plan(result(None, outcome="error"), t, None, NOW)
    if strikes + 1 <= fast:
        assert got.rows == [] and got.release is False
        return
    [row] = got.rows
    wait = row.next_render_time - M
    assert wait >= interval  # never sooner than the cadence
    assert wait <= max(interval, cap)
    assert row.effective_interval == interval  # the cadence is filed, not the wait
    # and one more failure never shortens it
    again = p.plan(result(None, outcome="error"), t.patched(strikes=strikes + 1), None, NOW)
    assert again.rows[0].next_render_time >= row.next_render_time


# ---------------------------------------------------------------------------------- suppression


def noindex(**kw: Any) -> Result:
    return result(
        None,
        **{"outcome": "non-indexable", "statusCode": 200, "reason": "noindex", "isIndexable": False, **kw},
    )


def test_a_noindex_verdict_suppresses_every_device_and_deletes_the_cached_pages() -> None:
    t = target(render_interval=3 * DAY_MS, sitemap_url="https://shop.test/s.xml", scheduler_node="node-a")
    p = plan(noindex(), t)
    assert p.outcome == "suppressed" and p.release is True
    assert p.targets == {
        SRC: Target(SRC, "https://shop.test/s.xml", "node-a", 3 * DAY_MS, SUPPRESSED, "noindex", NOW, 1, NOW)
    }
    assert p.rows == [
        ScheduleRow(f"{SRC}|{d}", M + 7 * DAY_MS, True, 3 * DAY_MS) for d in ("desktop", "mobile")
    ]
    assert sorted(p.page_deletes) == sorted(f"{SRC}|{d}" for d in ("desktop", "mobile", "tablet"))
    assert p.row_deletes == [f"{SRC}|tablet"]  # a device no longer configured keeps no row


def test_the_plans_detail_is_a_documented_reason_or_other() -> None:
    # Before: the detail, a metric label (prerender_render_outcomes_total), was the fleet's reason
    # as sent, any text up to 200 characters. The target keeps the text as today.
    p = plan(noindex(reason="x" * 200), target())
    assert p.outcome == "suppressed" and p.detail == "other"
    assert p.targets[SRC].suppressed_reason == "x" * 200  # type: ignore[union-attr]
    for reason in ("noindex", "canonical-mismatch", "canonical-variant", "http-error", "redirect-loop"):
        assert plan(noindex(reason=reason), target()).detail == reason
    assert plan(noindex(reason=None), target()).detail == "non-indexable"


def test_the_documented_reasons_are_the_fleet_protocols() -> None:
    from pathlib import Path

    from prerender_ray.queue.results import REASONS

    doc = (Path(__file__).parents[2] / "docs" / "fleet-protocol.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `reason` |"))
    assert set(REASONS) == set(row.split("only without content:")[1].strip(" |").replace("`", "").split(", "))


def test_a_404_or_410_http_error_is_gone_rechecked_in_14_days() -> None:
    for status in (404, 410):
        p = plan(noindex(statusCode=status, reason="http-error"), target())
        t = p.targets[SRC]
        assert t is not None and t.suppressed_reason == "http-gone" and t.strikes == 1
        assert {row.next_render_time for row in p.rows} == {M + 14 * DAY_MS}


def test_other_http_errors_are_suppressed_for_a_week() -> None:
    p = plan(noindex(statusCode=400, reason="http-error"), target())
    assert p.targets[SRC].suppressed_reason == "http-error"  # type: ignore[union-attr]
    assert {row.next_render_time for row in p.rows} == {M + 7 * DAY_MS}


def test_only_http_error_verdicts_are_classified_by_status() -> None:
    p = plan(noindex(statusCode=404, reason="noindex"), target())
    assert p.targets[SRC].suppressed_reason == "noindex"  # type: ignore[union-attr]
    assert {row.next_render_time for row in p.rows} == {M + 7 * DAY_MS}


def test_a_gone_target_is_deleted_at_two_strikes() -> None:
    p = plan(noindex(statusCode=410, reason="http-error"), target(strikes=1))
    assert p.outcome == "suppressed" and p.detail == "deleted"
    assert p.targets == {SRC: None} and p.rows == []


def test_strikes_are_shared_across_verdict_classes() -> None:
    # one failure strike, then a gone verdict: 2 >= gone.maxStrikes
    after_failure = plan(result(None, outcome="error"), target()).targets[SRC]
    assert after_failure is not None and after_failure.strikes == 1
    p = plan(noindex(statusCode=404, reason="http-error"), after_failure)
    assert p.targets == {SRC: None}


def test_consecutive_non_indexable_verdicts_delete_the_target_at_max_strikes() -> None:
    t: Target | None = target()
    for expected in (1, 2, 3):
        p = plan(noindex(), t)
        t = p.targets[SRC]
        assert t is not None and t.strikes == expected and t.suppressed
    p = plan(noindex(), t)
    assert p.targets == {SRC: None} and p.rows == [] and p.detail == "deleted"


def test_a_verdict_for_an_untargeted_url_creates_a_suppressed_row() -> None:
    p = plan(noindex(), None)
    assert p.targets == {
        SRC: Target(SRC, state=SUPPRESSED, suppressed_reason="noindex", suppressed_at=NOW, strikes=1,
                    struck_at=NOW)
    }
    assert [row.cache_key for row in p.rows] == [KEY, f"{SRC}|mobile"]


def test_the_creating_verdict_never_deletes_even_at_one_max_strike() -> None:
    p = plan(noindex(), None, p=planner({"render": {"suppression": {"maxStrikes": 1}}}))
    assert p.targets[SRC] is not None and p.targets[SRC].strikes == 1  # type: ignore[union-attr]
    p = plan(noindex(), target(), p=planner({"render": {"suppression": {"maxStrikes": 1}}}))
    assert p.targets == {SRC: None}


def test_a_suppression_without_a_reason_stores_none() -> None:
    p = plan(result(None, outcome="non-indexable", statusCode=200), target())
    assert p.targets[SRC].suppressed_reason is None and p.detail == "non-indexable"  # type: ignore[union-attr]


def test_a_suppressed_target_rechecks_only_the_route_devices() -> None:
    raw = {"ingress": {"routes": [{"match": "prefix", "path": "/m/", "deviceTypes": ["mobile"]}]}}
    url = "https://shop.test/m/1"
    r = Result.parse(
        {
            "id": f"{url}|mobile",
            "url": url,
            "outcome": "non-indexable",
            "statusCode": 200,
            "reason": "noindex",
        },
        None,
    )
    p = planner(raw).plan(r, target(url), None, NOW)
    assert [row.cache_key for row in p.rows] == [f"{url}|mobile"]
    assert sorted(p.row_deletes) == [f"{url}|desktop", f"{url}|tablet"]


def test_a_legacy_non_indexable_result_suppresses() -> None:
    p = plan(result(None, statusCode=200, isIndexable=False, reason="canonical-mismatch"), target())
    assert p.outcome == "suppressed" and p.targets[SRC].suppressed_reason == "canonical-mismatch"  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- domain allowlist


SHOP_ONLY = {"domains": ["shop.test"]}


def test_a_host_outside_the_allowlist_is_never_indexable() -> None:
    url = "https://other.test/a"
    r = Result.parse(
        {"id": f"{url}|desktop", "url": url, "outcome": "rendered", "statusCode": 200, "isIndexable": True},
        b"<html/>",
    )
    p = planner(SHOP_ONLY).plan(r, target(url), None, NOW)
    assert p.page is not None and p.page.is_indexable is False
    # and the legacy inference sees the coerced verdict: no content and "not indexable" is a suppression
    legacy_r = Result.parse(
        {"id": f"{url}|desktop", "url": url, "statusCode": 200, "isIndexable": True}, None
    )
    assert planner(SHOP_ONLY).plan(legacy_r, target(url), None, NOW).outcome == "suppressed"


def test_an_allowed_host_keeps_the_posted_verdict() -> None:
    p = plan(page_ok(isIndexable=True), target(), p=planner(SHOP_ONLY))
    assert p.page is not None and p.page.is_indexable is True


def test_the_allowlist_checks_the_landed_url_when_there_is_one() -> None:
    r = page_ok(isIndexable=True, redirectedTo=SRC + "/")  # same key, allowed host
    assert plan(r, target(), p=planner(SHOP_ONLY)).page.is_indexable is True  # type: ignore[union-attr]
    r = result(None, statusCode=200, isIndexable=True, redirectedTo="https://other.test/x")  # no outcome
    assert plan(r, target(), p=planner(SHOP_ONLY)).outcome == "redirect"  # not inferred rendered: coerced


def test_an_ipv6_host_in_the_allowlist_is_allowed() -> None:
    url = "http://[::1]:8080/a"
    r = Result.parse(
        {"id": f"{url}|desktop", "url": url, "outcome": "rendered", "statusCode": 200, "isIndexable": True},
        b"<html/>",
    )
    for entry in ("[::1]:8080", "[::1]:*"):
        p = planner({"domains": [entry]}).plan(r, target(url), None, NOW)
        assert p.page is not None and p.page.is_indexable is True
    p = planner({"domains": ["[::1]"]}).plan(r, target(url), None, NOW)  # port 80 only
    assert p.page is not None and p.page.is_indexable is False


def test_a_port_is_allowed_only_by_an_entry_that_allows_it() -> None:
    url = "https://shop.test:8443/a"
    r = Result.parse(
        {"id": f"{url}|desktop", "url": url, "outcome": "rendered", "statusCode": 200, "isIndexable": True},
        b"<html/>",
    )
    refused = planner(SHOP_ONLY).plan(r, target(url), None, NOW)  # `shop.test` allows port 443 only
    assert refused.page is not None and refused.page.is_indexable is False
    for entry in ("shop.test:8443", "shop.test:*"):
        p = planner({"domains": [entry]}).plan(r, target(url), None, NOW)
        assert p.page.is_indexable is True  # type: ignore[union-attr]


# -------------------------------------------------------------------------- the redirect pre-step


def test_a_rendered_client_side_redirect_makes_the_destination_due_and_stores_nothing() -> None:
    """The grant covered the source's key only: the landed page is rendered by its own grant, never
    stored from this result (one lease could otherwise overwrite any page, leased elsewhere or not)."""
    r = page_ok(redirectedTo=DST + "?utm_source=x", isIndexable=True)
    dest = target(DST, render_interval=2 * DAY_MS)
    p = plan(r, target(), dest)
    assert p.outcome == "redirect" and p.detail == "client-side"
    assert p.page is None and p.touch is None and p.status_pages == [] and p.page_deletes == []
    assert p.rows == [ScheduleRow(DKEY, M, False, 2 * DAY_MS)]  # due now, at the destination's own cadence
    assert p.targets == {SRC: None}  # the source retires with every device
    assert p.adopt is None and p.release is True  # released under metadata.id; no destination lease exists


def test_a_client_side_redirect_never_changes_the_destinations_stored_page() -> None:
    """A stored page under the destination key (and its target, suppressed or not) stays as it is:
    the plan writes no page, touch, tombstone or target of the destination."""
    stored = {DKEY: {"etag": '"abc"', "last-modified": "Mon, 01 Jan 2024 00:00:00 GMT"}}
    r = page_ok(redirectedTo=DST, isIndexable=True)
    for dest in (target(DST), target(DST, state=SUPPRESSED, suppressed_reason="noindex", strikes=1)):
        p = planner().plan(r, target(), dest, NOW, stored=stored)
        assert p.page is None and p.touch is None and p.status_pages == []
        assert DKEY not in p.page_deletes and DST not in p.targets
        assert [row.cache_key for row in p.rows] == [DKEY]  # only made due: its own grant renders it


def test_a_client_side_redirect_onto_a_destination_without_a_target_adopts_it_due_now() -> None:
    p = plan(page_ok(redirectedTo=DST), target(render_interval=2 * DAY_MS, discovered=True), None)
    assert p.page is None and p.rows == [] and p.targets == {SRC: None}
    assert p.adopt == (DST, M, 2 * DAY_MS, True)  # as a permanent redirect adopts its destination


def test_a_stored_page_says_whether_only_a_bots_miss_made_its_target() -> None:
    """``Plan.discovered`` (IndexNow leaves such pages out): the target of the page stored."""
    assert plan(page_ok(), target(discovered=True)).discovered is True
    assert plan(page_ok(), target()).discovered is False  # an operator's or an old record
    assert plan(page_ok(), None).discovered is False  # a render-now one-off: an operator asked


def test_a_client_side_redirect_from_a_targetless_one_off_still_retires_the_source_row() -> None:
    p = plan(page_ok(redirectedTo=DST), None, None)
    assert p.page is None and p.adopt == (DST, M, None, False)
    assert p.targets == {SRC: None}  # the keeper deletes every device's row and page of the source


def test_a_rendered_redirect_to_an_unrouted_class_keeps_the_source_and_discards_the_content() -> None:
    p = plan(page_ok(redirectedTo="https://shop.test/search/shoes"), target(strikes=2))
    assert p.outcome == "rendered" and p.detail == "landed-unrouted" and p.unrouted == "/search/shoes"
    assert p.page is None
    assert p.rows == [ScheduleRow(KEY, M + DAY_MS, False, DAY_MS)]
    assert p.targets == {SRC: target()}  # kept (strikes reset as for any render)


def test_a_rendered_redirect_to_a_host_outside_the_domains_is_an_unrouted_landing() -> None:
    """No page under the foreign key (served to no bot, and kept in the store), and the source, its
    rows and pages kept: treated as a landing on an unrouted path."""
    p = plan(page_ok(redirectedTo="https://evil.example/x"), target(), p=planner(SHOP_ONLY))
    assert p.outcome == "rendered" and p.detail == "landed-unrouted"
    assert p.page is None and p.touch is None and p.targets == {}
    assert p.rows == [ScheduleRow(KEY, M + DAY_MS, False, DAY_MS)] and p.row_deletes == []
    assert not any("evil.example" in key for key in p.page_deletes)


def test_a_rendered_result_landing_on_the_same_key_is_an_ordinary_render() -> None:
    p = plan(page_ok(redirectedTo=SRC + "/?utm_medium=mail"), target())
    assert p.detail == "rendered" and p.page is not None and p.page.cache_key == KEY
    assert SRC not in p.targets


def test_a_redirected_result_landing_on_the_same_key_is_not_a_redirect_and_never_retires_the_target() -> None:
    r = result(None, outcome="redirected", statusCode=301, redirectedTo=SRC + "/")
    p = plan(r, target(strikes=3))  # one more redirect strike would retire it
    assert p.targets == {SRC: target(strikes=4, struck_at=NOW)}  # a failure strike: kept, backed off
    assert p.outcome == "failed" and p.adopt is None
    assert p.rows and p.rows[0].next_render_time > NOW
    fast = plan(r, target())
    assert fast.release is False and fast.targets == {SRC: target(strikes=1, struck_at=NOW)}


def test_a_non_indexable_result_with_a_landed_url_suppresses_the_source() -> None:
    p = plan(noindex(redirectedTo=DST), target())
    assert p.outcome == "suppressed" and p.targets[SRC] is not None and p.suppress_dest is None


# ---------------------------------------------------------------------------- the redirect lane


def redirected(status: int | None = 301, to: str = DST, **kw: Any) -> Result:
    return result(None, outcome="redirected", statusCode=status, redirectedTo=to, reason="redirect", **kw)


@pytest.mark.parametrize("status", [301, 308])
def test_a_permanent_redirect_retires_the_source_and_adopts_the_destination_due_now(status: int) -> None:
    p = plan(redirected(status, DST + "/?utm_source=x"), target(render_interval=3 * DAY_MS, strikes=1))
    assert p.outcome == "redirect" and p.detail == "permanent" and p.release is True
    assert p.targets == {SRC: None}
    assert p.adopt == (DST, M, 3 * DAY_MS, False)  # due this minute, the source's stored cadence inherited
    assert p.rows == [] and p.suppress_dest is None


@pytest.mark.parametrize("stored", [None, 0, -1])
def test_an_adopted_destination_inherits_no_cadence_when_the_source_had_none(stored: Any) -> None:
    p = plan(redirected(), target(render_interval=stored))
    assert p.adopt == (DST, M, None, False)


def test_a_permanent_redirect_from_a_targetless_one_off_retires_its_row_and_adopts() -> None:
    p = plan(redirected(), None)
    assert p.targets == {SRC: None} and p.adopt == (DST, M, None, False)


@pytest.mark.parametrize(
    "existing", [target(DST), target(DST, state=SUPPRESSED, suppressed_reason="noindex")]
)
def test_an_existing_or_suppressed_destination_is_never_resurrected(existing: Target) -> None:
    p = plan(redirected(), target(), existing)
    assert p.targets == {SRC: None} and p.adopt is None and DST not in p.targets


def test_a_discovered_sources_adopted_destination_is_discovered_too() -> None:
    """A bot's miss made the source: the page it redirects to is no more confirmed than it was."""
    assert plan(redirected(), target(discovered=True)).adopt == (DST, M, None, True)
    assert plan(redirected(), target(sitemap_url="https://shop.test/s.xml")).adopt == (DST, M, None, False)


def test_a_foreign_destination_is_not_adopted() -> None:
    p = plan(redirected(to="https://elsewhere.test/x"), target(), p=planner(SHOP_ONLY))
    assert p.targets == {SRC: None} and p.adopt is None


@pytest.mark.parametrize("status", [302, 303, 307, 200, None])
def test_a_temporary_redirect_keeps_the_source_and_costs_a_strike(status: int | None) -> None:
    p = plan(redirected(status), target(strikes=1, render_interval=2 * DAY_MS))
    assert p.outcome == "redirect" and p.detail == "strike" and p.release is True
    assert p.targets == {SRC: target(strikes=2, struck_at=NOW, render_interval=2 * DAY_MS)}
    assert p.rows == [ScheduleRow(KEY, M + 2 * DAY_MS, False, 2 * DAY_MS)]
    assert p.page_deletes == [] and p.adopt is None  # its cached page is kept


def test_a_temporary_redirect_strike_reschedules_at_the_route_cadence() -> None:
    hourly = f"{HOURLY}|desktop"
    r = Result.parse(
        {"id": hourly, "url": HOURLY, "outcome": "redirected", "statusCode": 302, "redirectedTo": DST}, None
    )
    p = planner().plan(r, target(HOURLY, render_interval=DAY_MS), None, NOW)
    assert p.rows == [ScheduleRow(hourly, M + 6 * HOUR_MS, False, 6 * HOUR_MS)]


def test_max_strikes_temporary_redirects_retire_the_source() -> None:
    t: Target | None = target()
    for expected in (1, 2, 3):
        p = plan(redirected(302), t)
        t = p.targets[SRC]
        assert t is not None and t.strikes == expected
    p = plan(redirected(302), t)
    assert p.detail == "retired" and p.targets == {SRC: None} and p.rows == []


def test_a_temporary_redirect_of_a_targetless_key_drops_its_row() -> None:
    p = plan(redirected(307), None)
    assert p.row_deletes == [KEY] and p.targets == {} and p.release is True


def test_a_redirect_to_an_unrouted_class_keeps_the_source_with_a_strike() -> None:
    p = plan(redirected(301, "https://shop.test/search/q"), target())
    assert p.detail == "strike" and p.unrouted == "/search/q"
    assert p.targets == {SRC: target(strikes=1, struck_at=NOW)} and p.adopt is None


def test_a_redirect_to_an_unclassified_path_in_forwarded_mode_keeps_the_source() -> None:
    raw = {
        "ingress": {
            "mode": "forwarded",
            "routes": [
                {"match": "prefix", "path": "/cart", "mode": "passthrough"},
                {"match": "prefix", "path": "/"},
            ],
        }
    }
    # first match wins: "/" serves everything but the passthrough route
    p = plan(redirected(301, "https://shop.test/cart/1"), target(), p=planner(raw))
    assert p.detail == "strike" and p.unrouted == "/cart/1"
    raw = {"ingress": {"mode": "forwarded", "routes": [{"match": "prefix", "path": "/old"}]}}
    p = plan(redirected(301, "https://shop.test/elsewhere"), target(), p=planner(raw))
    assert p.detail == "strike" and p.unrouted == "/elsewhere"


def test_a_non_indexable_landing_retires_the_source_and_suppresses_the_destination() -> None:
    r = redirected(200, isIndexable=False)
    r.reason = "noindex"
    p = plan(r, target())
    assert p.detail == "to-non-indexable" and p.targets == {SRC: None}
    assert p.suppress_dest == (DST, "noindex", 200) and p.adopt is None


def test_a_non_indexable_404_landing_passes_its_status_on_for_the_gone_class() -> None:
    r = result(
        None, outcome="redirected", statusCode=404, redirectedTo=DST, isIndexable=False, reason="http-error"
    )
    assert plan(r, target()).suppress_dest == (DST, "http-error", 404)


def test_a_non_indexable_landing_on_a_tracked_destination_only_makes_it_due() -> None:
    """Another URL's result is no verdict of the destination's own: it is rendered now and judged by
    that render (a strike here, once per source, deleted it past gone.maxStrikes)."""
    r = result(
        None, outcome="redirected", statusCode=404, redirectedTo=DST, isIndexable=False, reason="http-error"
    )
    p = plan(r, target(), target(DST, render_interval=6 * HOUR_MS))
    assert p.detail == "to-non-indexable" and p.targets == {SRC: None} and p.suppress_dest is None
    assert p.rows == [ScheduleRow(DKEY, M, False, 6 * HOUR_MS)] and p.page_deletes == []


def test_a_non_indexable_landing_on_a_suppressed_destination_leaves_it_to_its_recheck() -> None:
    r = redirected(404, isIndexable=False)
    p = plan(r, target(), target(DST, state=SUPPRESSED, strikes=1, struck_at=NOW - DAY_MS))
    assert p.targets == {SRC: None} and p.suppress_dest is None and p.rows == []


def test_a_non_indexable_landing_from_a_targetless_key_retires_its_row() -> None:
    p = plan(redirected(200, isIndexable=False), None)
    assert p.targets == {SRC: None} and p.suppress_dest is not None


def test_a_non_indexable_foreign_landing_suppresses_nothing() -> None:
    r = redirected(200, "https://elsewhere.test/x", isIndexable=False)
    p = plan(r, target(), p=planner(SHOP_ONLY))
    assert p.targets == {SRC: None} and p.suppress_dest is None


def test_a_foreign_landing_that_was_never_inspected_is_not_a_non_indexable_landing() -> None:
    # the domain coercion makes it "not indexable", but only the browser's own verdict counts here
    p = plan(redirected(302, "https://elsewhere.test/x"), target(), p=planner(SHOP_ONLY))
    assert p.detail == "strike" and p.suppress_dest is None


@pytest.mark.parametrize(
    "status, label", [(401, "auth-failure"), (403, "auth-failure"), (503, "transient"), (429, "transient")]
)
def test_an_auth_or_transient_landing_keeps_the_source_and_seeds_nothing(status: int, label: str) -> None:
    p = plan(redirected(status, isIndexable=False), target())
    assert p.outcome == label and p.release is False  # fast lane on the source
    assert p.targets == {SRC: target(strikes=1, struck_at=NOW)}
    assert p.adopt is None and p.suppress_dest is None and p.page_deletes == []


def test_a_legacy_redirect_result_takes_the_redirect_lane() -> None:
    p = plan(result(None, statusCode=301, redirectedTo=DST), target())
    assert p.detail == "permanent" and p.adopt == (DST, M, None, False)


def test_a_redirect_never_touches_pages_through_the_plan_itself() -> None:
    for r in (redirected(301), redirected(302), redirected(200, isIndexable=False)):
        p = plan(r, target())
        assert p.page is None


# ------------------------------------------------------------- one strike per URL per render cycle


def gone(device: str = "desktop") -> Result:
    return Result.parse({"id": f"{SRC}|{device}", "url": SRC, "outcome": "non-indexable", "statusCode": 404,
                         "reason": "http-error", "isIndexable": False}, None)


def test_two_devices_claimed_in_one_cycle_reporting_404_cost_one_strike_not_a_deletion() -> None:
    granted = NOW - MINUTE_MS  # both devices were claimed before either result
    p1 = planner().plan(gone("desktop"), target(), None, NOW, granted_at=granted)
    struck = p1.targets[SRC]
    assert struck is not None and struck.strikes == 1 and struck.struck_at == NOW  # gone: max 2 strikes
    p2 = planner().plan(gone("mobile"), struck, None, NOW + 5, granted_at=granted)
    assert p2.detail != "deleted" and p2.targets[SRC] is not None
    assert p2.targets[SRC].strikes == 1 and p2.targets[SRC].suppressed  # type: ignore[union-attr]
    # the recheck a cycle later is granted after the strike: it counts, and deletes at two
    p3 = planner().plan(gone(), p2.targets[SRC], None, NOW + 14 * DAY_MS, granted_at=NOW + 14 * DAY_MS - 1)
    assert p3.targets == {SRC: None} and p3.detail == "deleted"


def test_failures_and_redirect_strikes_of_one_cycle_count_once() -> None:
    granted = NOW - MINUTE_MS
    failed = result(None, outcome="error", error={"name": "TimeoutError"})
    t = target(strikes=2, struck_at=NOW - 2 * MINUTE_MS)  # struck before this grant: counts
    p = planner().plan(failed, t, None, NOW, granted_at=granted)
    assert p.targets[SRC] == target(strikes=3, struck_at=NOW)
    again = planner().plan(failed, p.targets[SRC], None, NOW + 1, granted_at=granted)
    assert again.targets[SRC] == target(strikes=3, struck_at=NOW)
    temporary = result(None, outcome="redirected", statusCode=302, redirectedTo=DST)
    t = target(strikes=3, struck_at=NOW)  # max redirect strikes is 4: one more would retire it
    kept = planner().plan(temporary, t, None, NOW + 1, granted_at=granted)
    assert kept.targets == {SRC: t} and kept.detail == "strike"
    retired = planner().plan(temporary, t, None, NOW + 2, granted_at=NOW + 1)
    assert retired.targets == {SRC: None} and retired.detail == "retired"


def test_a_stored_strike_time_round_trips_and_a_render_clears_it() -> None:
    t = target(strikes=2, struck_at=NOW)
    assert Target.decode(SRC, t.encode()) == t
    assert Target.decode(SRC, b'{"strikes": 2, "struck_at": "junk"}').struck_at is None
    p = planner().plan(page_ok(), t, None, NOW + 1, granted_at=NOW)
    assert p.targets[SRC] == target(strikes=0, struck_at=None)


# ------------------------------------------------------------------------------- validators


def rendered_as(content: bytes, coding: str = "identity") -> Result:
    headers = {"content-type": "text/html", "etag": '"shell"', "last-modified": "Mon, 01 Jan 2024 00:00:00 GMT"}
    if coding != "identity":
        headers["content-encoding"] = coding
    return result(content, outcome="rendered", statusCode=200, headers=headers)


def test_the_etag_is_the_rendered_pages_own_the_same_in_any_coding() -> None:
    import gzip

    import brotli

    html = b"<html><body>the rendered page</body></html>"
    tags = {plan(rendered_as(c, coding), target()).page.headers["etag"]  # type: ignore[union-attr]
            for c, coding in ((html, "identity"), (gzip.compress(html), "gzip"), (brotli.compress(html), "br"))}
    assert len(tags) == 1 and tags != {'"shell"'}
    other = plan(rendered_as(html + b" "), target()).page.headers["etag"]  # type: ignore[union-attr]
    assert other not in tags


def test_last_modified_stays_while_the_rendered_bytes_stay_and_moves_when_they_change() -> None:
    html = b"<html><body>v1</body></html>"
    first = plan(rendered_as(html), target()).page
    assert first is not None and first.headers["last-modified"] == formatdate(NOW / 1000, usegmt=True)
    later = NOW + DAY_MS
    same = planner().plan(rendered_as(html), target(), None, later, stored={KEY: first.headers}).page
    assert same is not None and same.headers["etag"] == first.headers["etag"]
    assert same.headers["last-modified"] == first.headers["last-modified"]  # a 304 stays honest
    changed = planner().plan(rendered_as(b"<html><body>v2</body></html>"), target(), None, later,
                             stored={KEY: first.headers}).page
    assert changed is not None and changed.headers["etag"] != first.headers["etag"]
    assert changed.headers["last-modified"] == formatdate(later / 1000, usegmt=True)


def test_a_stored_render_says_whether_its_bytes_changed_and_on_which_route() -> None:
    html = b"<html><body>v1</body></html>"
    assert plan(rendered_as(html), target()).route == "prerender"  # no route of its own: the class
    hourly_key = f"{HOURLY}|desktop"
    r = Result.parse({"id": hourly_key, "url": HOURLY, "outcome": "rendered", "statusCode": 200,
                      "headers": {"content-type": "text/html"}}, html)
    p1 = planner().plan(r, target(HOURLY), None, NOW)
    assert p1.page is not None and p1.content_change == "new" and p1.route == "/hourly/"
    p2 = planner().plan(r, target(HOURLY), None, NOW + DAY_MS, stored={hourly_key: p1.page.headers})
    assert p2.content_change == "unchanged" and p2.route == "/hourly/"
    r3 = Result.parse({"id": hourly_key, "url": HOURLY, "outcome": "rendered", "statusCode": 200}, html + b"!")
    assert planner().plan(r3, target(HOURLY), None, NOW, stored={hourly_key: p1.page.headers}).content_change == "changed"
    failed = plan(result(None, outcome="error"), target())
    assert failed.content_change is None  # nothing stored, nothing counted


def test_the_render_after_a_pages_first_lands_on_its_slot_not_a_cadence_later() -> None:
    """firstRender now: a new page renders at once, so a cadence from its first render would put a new
    sitemap's re-renders in one herd; the render after the first is due on the URL's slot."""
    p = planner()
    first = p.plan(page_ok(), target(), None, NOW, stored={KEY: None})  # no page stored: its first
    [row] = first.rows
    assert row.next_render_time == p.rules.after_first_render(SRC, DAY_MS, NOW) != M + DAY_MS
    assert first.page is not None and first.page.expires_at == row.next_render_time
    stored = first.page.headers
    [again] = p.plan(page_ok(), target(), None, NOW, stored={KEY: stored}).rows
    assert again.next_render_time == M + DAY_MS  # any later render: a cadence on, as before
    [unknown] = p.plan(page_ok(), target(), None, NOW).rows  # stored pages not read: nothing to say
    assert unknown.next_render_time == M + DAY_MS
    staggered = planner({**ROUTES, "render": {"firstRender": "staggered"}})
    [ref] = staggered.plan(page_ok(), target(), None, NOW, stored={KEY: None}).rows
    assert ref.next_render_time == M + DAY_MS  # the reference's first render was on its slot already
