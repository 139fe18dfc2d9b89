"""A sitemap refresh as a whole: the result document a walk reports, the advisory claim on a running
refresh, and when the daily refresh fires (docs/sitemaps.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from prerender_ray.config.model import Config
from prerender_ray.config.origin import Sitemap
from prerender_ray.identity.routes import Router
from prerender_ray.sitemaps.parser import SitemapEntry, SitemapError
from prerender_ray.sitemaps.refresh import (
    RefreshResult,
    check_refresh_claim,
    daily_refresh_key,
    next_daily_refresh,
)
from prerender_ray.sitemaps.rules import SAMPLE_TEXT, Action, InvalidEntry, canonicalizer, partition_entries

NOW = 1_700_000_000_123
S1 = "https://x.com/s1.xml"


def _cfg(mode: str = "prefix", routes: list[dict[str, Any]] | None = None, **ingress: Any) -> Config:
    return Config.model_validate({"ingress": {"mode": mode, "routes": routes or [], **ingress}})


def _partition(locs: list[str | None], cfg: Config, changefreq: str | None = None) -> Any:
    entries = [SitemapEntry(loc, None, changefreq) for loc in locs]
    return partition_entries(entries, Router(cfg).classify, canonicalizer(cfg))


def _ms(text: str, zone: str = "UTC") -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp() * 1000)


# ------------------------------------------------------------------------------- result document


def test_removed_is_exact_while_the_sample_is_capped_across_children() -> None:
    result = RefreshResult(removed_sample_cap=3)
    result.add_removed([f"k{i}" for i in range(2)])
    result.add_removed([f"k{i}" for i in range(2, 500)])
    assert result.removed == 500 and result.removed_sample == ["k0", "k1", "k2"]


def test_failed_is_capped_with_the_overflow_counted_and_any_rejection_is_readable() -> None:
    result = RefreshResult(failed_cap=2)
    result.add_failed(
        "https://x.com/a.xml", SitemapError("document is larger than 1 bytes", "SITEMAP_TOO_LARGE")
    )
    result.add_failed("https://x.com/b.xml", "a bare string")
    result.add_failed("https://x.com/c.xml", None)
    result.add_failed("https://x.com/d.xml", 42)
    assert result.failed == [
        {"url": "https://x.com/a.xml", "error": "document is larger than 1 bytes (SITEMAP_TOO_LARGE)"},
        {"url": "https://x.com/b.xml", "error": "a bare string"},
    ]
    assert result.failed_overflow == 2


def test_a_healthy_result_has_empty_arrays_and_zeros_never_absent_fields() -> None:
    doc = RefreshResult().as_dict()
    assert doc == {
        "created": 0,
        "updated": 0,
        "skipped": 0,
        "duplicates": 0,
        "deferred": 0,
        "removed": 0,
        "invalid": 0,
        "unknownChangefreq": 0,
        "sitemapsProcessed": 0,
        "sitemapsDiscovered": 0,
        "repeatedChildren": 0,
        "sitemapsSkipped": 0,
        "filtered": {"passthrough": 0, "unclassified": 0},
        "removedSample": [],
        "invalidSample": [],
        "failed": [],
        "failedOverflow": 0,
        "truncatedScans": [],
        "lastmodDue": 0,
        "lastmodInvalid": 0,
        "lastmodFuture": 0,
    }


def test_a_snapshot_is_not_changed_by_later_counting() -> None:
    result = RefreshResult()
    result.count(Action.CREATE)
    result.add_failed("https://x.com/a.xml", "boom")
    result.add_removed(["k0"])
    result.filtered["passthrough"] = 1
    snap = result.snapshot()
    before = snap.as_dict()
    result.count(Action.CREATE, 5)
    result.add_failed("https://x.com/b.xml", "boom")
    result.add_removed(["k1"])
    result.filtered["passthrough"] = 9
    result.failed[0]["error"] = "mutated"
    assert snap.as_dict() == before and snap.created == 1


def test_actions_count_into_the_reference_fields() -> None:
    result = RefreshResult()
    for action in (
        Action.RENDER,
        Action.CREATE,
        Action.SKIP,
        Action.DUPLICATE,
        Action.REATTACH,
        Action.REATTACH,
    ):
        result.count(action)
    assert (result.created, result.skipped, result.duplicates, result.updated) == (2, 1, 1, 2)


def test_invalid_entries_are_counted_exactly_with_a_capped_sample() -> None:
    result = RefreshResult(removed_sample_cap=2)
    p = _partition(["bad1", "bad2", "bad3", "https://x.com/ok"], _cfg(), changefreq="often")
    result.add_partition(S1, p)
    assert result.invalid == 3 and result.unknown_changefreq == 1
    assert result.invalid_sample == [
        {"sitemapUrl": S1, "loc": "bad1", "error": "not a valid absolute http(s) URL"},
        {"sitemapUrl": S1, "loc": "bad2", "error": "not a valid absolute http(s) URL"},
    ]


def test_a_sampled_invalid_loc_and_its_error_are_clipped_with_their_length() -> None:
    loc, error = "https://x.com/" + "a" * 9_000_000, "refused: " + "h" * 20_000
    result = RefreshResult()
    result.add_invalid(S1, [InvalidEntry(loc, error), InvalidEntry(None, "missing <loc>")])
    assert result.invalid == 2
    assert result.invalid_sample == [
        {"sitemapUrl": S1, "loc": loc[:SAMPLE_TEXT] + "… (9000014 characters)",
         "error": error[:SAMPLE_TEXT] + "… (20009 characters)"},
        {"sitemapUrl": S1, "loc": None, "error": "missing <loc>"},
    ]


def test_the_result_caps_follow_the_config() -> None:
    result = RefreshResult.from_config(Sitemap(removed_sample_cap=3, failed_cap=7))
    assert (result.removed_sample_cap, result.failed_cap) == (3, 7)


# ----------------------------------------------------------------------------------- claim check

STALE = 10 * 60_000


def test_a_running_refresh_younger_than_the_stale_window_refuses_with_a_reason() -> None:
    row = {"state": "running", "node": "node-b", "updatedAt": NOW - 42_400}
    check = check_refresh_claim(S1, row, now_ms=NOW, stale_run_ms=STALE)
    assert not check.allowed
    assert check.reason == "a refresh on node-b is already running (last progress 42s ago)"


def test_a_running_row_without_a_node_names_another_node() -> None:
    check = check_refresh_claim(S1, {"state": "running", "updatedAt": NOW}, now_ms=NOW, stale_run_ms=STALE)
    assert check.reason == "a refresh on another node is already running (last progress 0s ago)"


@pytest.mark.parametrize(
    "updated_at",
    [NOW - STALE, NOW - STALE - 1, None, "yesterday", float("nan"), True, {}, NOW + STALE + 60_000],
)
def test_a_stale_or_unreadable_progress_time_is_taken_over(updated_at: Any) -> None:
    row = {"state": "running", "node": "node-b", "updatedAt": updated_at}
    check = check_refresh_claim(S1, row, now_ms=NOW, stale_run_ms=STALE)
    assert check.allowed and check.warning is not None and check.warning.startswith("Taking over")


def test_progress_times_are_read_as_epoch_ms_or_iso_text() -> None:
    recent = datetime.fromtimestamp((NOW - 5_000) / 1000, UTC)
    naive = recent.replace(tzinfo=None).isoformat()
    for value in (NOW - 5_000, float(NOW - 5_000), recent.isoformat(), naive, f"{naive}Z"):
        row = {"state": "running", "updatedAt": value}
        assert not check_refresh_claim(S1, row, now_ms=NOW, stale_run_ms=STALE).allowed


@pytest.mark.parametrize("row", [None, {}, {"state": "completed", "updatedAt": NOW}, {"state": "failed"}])
def test_a_missing_or_finished_row_allows_a_refresh(row: Any) -> None:
    check = check_refresh_claim(S1, row, now_ms=NOW, stale_run_ms=STALE)
    assert check.allowed and check.warning is None


def test_an_unreadable_progress_row_does_not_block() -> None:
    check = check_refresh_claim(S1, OSError("store closed"), now_ms=NOW, stale_run_ms=STALE)
    assert check.allowed and check.warning is not None and "store closed" in check.warning


# ---------------------------------------------------------------------------------- daily refresh


def test_the_daily_refresh_is_armed_only_on_the_pinned_node() -> None:
    assert daily_refresh_key(Sitemap(), "node-a") is None
    assert daily_refresh_key(Sitemap(node="node-a"), "node-a") == "12:00|America/New_York"
    assert (
        daily_refresh_key(Sitemap(node="node-a", refresh_time="03:30", timezone="UTC"), "node-a")
        == "03:30|UTC"
    )
    assert daily_refresh_key(Sitemap(node="node-b"), "node-a") is None


def test_the_next_fire_is_today_when_the_time_is_ahead_and_tomorrow_when_passed() -> None:
    zone = "America/New_York"
    assert next_daily_refresh("12:00", zone, _ms("2024-06-01T09:15:27", zone)) == _ms(
        "2024-06-01T12:00", zone
    )
    assert next_daily_refresh("12:00", zone, _ms("2024-06-01T12:00:00.001", zone)) == _ms(
        "2024-06-02T12:00", zone
    )
    assert next_daily_refresh("12:00", zone, _ms("2024-06-01T12:00", zone)) == _ms("2024-06-02T12:00", zone)


def test_the_next_fire_uses_the_offset_at_the_fire_instant_across_dst() -> None:
    zone = "America/New_York"
    # Spring forward on 2024-03-10: the day before is EST (UTC-5), noon on the day is EDT (UTC-4).
    assert next_daily_refresh("12:00", zone, _ms("2024-03-09T13:00", zone)) == _ms("2024-03-10T16:00")
    # Fall back on 2024-11-03: noon that day is EST again.
    assert next_daily_refresh("12:00", zone, _ms("2024-11-02T13:00", zone)) == _ms("2024-11-03T17:00")


def test_a_time_in_the_spring_forward_gap_fires_at_the_pre_gap_offset() -> None:
    fire = next_daily_refresh("02:30", "America/New_York", _ms("2024-03-10T00:00", "America/New_York"))
    assert fire == _ms("2024-03-10T07:30")  # 03:30 EDT
    assert fire % 60_000 == 0


def test_the_zone_may_be_given_as_a_tzinfo_and_bad_time_parts_become_zero() -> None:
    now = _ms("2024-06-01T10:00")
    assert next_daily_refresh("03:30", ZoneInfo("UTC"), now) == _ms("2024-06-02T03:30")
    assert next_daily_refresh("xx:45", "UTC", now) == _ms("2024-06-02T00:45")
    assert next_daily_refresh("25:99", "UTC", now) == _ms("2024-06-02T00:00")
    assert next_daily_refresh("7", "UTC", now) == _ms("2024-06-02T07:00")
