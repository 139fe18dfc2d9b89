"""A sitemap entry's lastmod: the W3C datetime forms, bad input, and which entries of a refresh say their
page changed (docs/sitemaps.md#lastmod)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from prerender_ray.sitemaps.lastmod import changed_entries, lastmod_ms
from prerender_ray.sitemaps.parser import SitemapEntry


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize("text, expected", [
    ("2024", ms("2024-01-01T00:00")),  # the start of the period named
    ("2024-05", ms("2024-05-01T00:00")),
    ("2024-05-20", ms("2024-05-20T00:00")),  # a date: midnight UTC
    ("2024-05-20T10:30Z", ms("2024-05-20T10:30")),
    ("2024-05-20T10:30:15+02:00", ms("2024-05-20T08:30:15")),
    ("2024-05-20T10:30:15.5-05:00", ms("2024-05-20T15:30:15.5")),
    ("2024-05-20T10:30:15.123456789Z", ms("2024-05-20T10:30:15.123")),  # nanoseconds: cut to micro
    ("2024-05-20T10:30:15", ms("2024-05-20T10:30:15")),  # no zone: UTC
    (" 2024-05-20 ", ms("2024-05-20T00:00")),
])
def test_w3c_datetimes_name_the_start_of_their_period_in_utc(text: str, expected: int) -> None:
    assert lastmod_ms(text) == expected


@pytest.mark.parametrize("text", [None, "", "yesterday", "2024-13", "2024-02-30", "2024-05-20T25:00Z",
                                  "Mon, 20 May 2024 10:00:00 GMT", "2024-05-20" + " " * 80, "1" * 500,
                                  "2024-05-20T10:00+25:00"])
def test_what_is_no_datetime_is_none(text: str | None) -> None:
    assert lastmod_ms(text) is None


def entries(**lastmods: str | None) -> dict[str, SitemapEntry]:
    return {f"https://shop.test/{name}": SitemapEntry(f"https://shop.test/{name}", lastmod)
            for name, lastmod in lastmods.items()}


def test_a_refresh_weighs_the_lastmods_newer_than_its_last_walk_and_counts_bad_ones() -> None:
    since, now = ms("2024-05-20T12:00"), ms("2024-05-21T12:00")
    found = changed_entries(entries(old="2024-05-19", new="2024-05-21T08:00Z", same="2024-05-20T12:00Z",
                                    dated="2024-05-21", none=None, junk="soon", ahead="2024-05-22",
                                    edge="2024-05-21T12:00Z"), since, now)
    assert found.changed == {"https://shop.test/new": ms("2024-05-21T08:00"),
                             "https://shop.test/dated": ms("2024-05-21T00:00"),
                             "https://shop.test/edge": now}
    assert found.invalid == 1 and found.future == 1  # both ignored; the future one is seen after it passed
    later = changed_entries(entries(ahead="2024-05-22"), now, ms("2024-05-22T12:00"))
    assert later.changed == {"https://shop.test/ahead": ms("2024-05-22T00:00")} and later.future == 0


def test_a_documents_first_walk_weighs_every_past_lastmod() -> None:
    found = changed_entries(entries(a="1999-01-01", b="2024-05-21"), None, ms("2024-05-22T00:00"))
    assert set(found.changed) == {"https://shop.test/a", "https://shop.test/b"}
