"""A render whose stored record would not change but for its times plans a freshness record, not a
page write (docs/serving.md#validators-and-unchanged-renders)."""

from __future__ import annotations

from typing import Any

import pytest

from prerender_ray.config.loading import parse
from prerender_ray.queue.metadata import Result
from prerender_ray.queue.results import Plan, Planner
from prerender_ray.queue.targets import Rules
from prerender_ray.storage.pages import Page
from prerender_ray.storage.registry import Target
from prerender_ray.storage.touches import Touch
from prerender_ray.timeutil import DAY_MS, minute

NOW = 1_780_000_123_456
LATER = NOW + DAY_MS + 7_000
URL = "https://shop.test/p"
KEY = f"{URL}|desktop"
HTML = b"<html><head><script nonce=\"r4nd0m1\">boot()</script></head><body>the page</body></html>"


def result(content: bytes | None = HTML, **meta: Any) -> Result:
    doc = {"id": KEY, "url": URL, "outcome": "rendered", "statusCode": 200,
           "headers": {"content-type": "text/html", "x-robots-tag": "all"}, **meta}
    return Result.parse(doc, content)


def plan(r: Result, stored: Page | None, now: int = LATER, *, pages: bool = True) -> Plan:
    held = {KEY: stored} if stored is not None else {}
    return Planner(Rules(parse({}, {}).config)).plan(
        r, Target(url=URL), None, now, stored={k: p.headers for k, p in held.items()},
        stored_pages=held if pages else None)


def first() -> Page:
    p = plan(result(), None, NOW)
    assert p.page is not None and p.touch is None and p.content_change == "new"
    return p.page


def test_an_identical_render_plans_a_touch_with_the_new_times_and_no_page_write() -> None:
    stored = first()
    p = plan(result(), stored)
    assert p.page is None and p.content_change == "unchanged"
    assert p.touch == Touch(KEY, stored.headers["etag"], LATER, minute(LATER) + DAY_MS)
    assert p.outcome == "rendered" and p.rows and p.rows[0].next_render_time == minute(LATER) + DAY_MS  # rescheduled as ever


def test_a_render_differing_only_in_its_nonce_is_unchanged() -> None:
    stored = first()
    p = plan(result(HTML.replace(b"r4nd0m1", b"0th3rn0nc3")), stored)
    assert p.page is None and p.touch is not None and p.touch.etag == stored.headers["etag"]


@pytest.mark.parametrize("change", [
    {"statusCode": 203},  # another status
    {"isIndexable": True},  # another verdict
    {"headers": {"content-type": "text/html", "x-robots-tag": "noindex"}},  # the origin's header changed
    {"headers": {"content-type": "text/html"}},  # a stored header went away
])
def test_the_same_bytes_with_another_stored_record_are_a_full_write(change: dict) -> None:
    stored = first()
    p = plan(result(**change), stored)
    assert p.content_change == "unchanged"  # the bytes are the same: counted so
    assert p.touch is None and p.page is not None and p.page.last_cached == LATER
    assert p.page.headers["etag"] == stored.headers["etag"]
    assert p.page.headers["last-modified"] == stored.headers["last-modified"]


def test_the_same_bytes_in_another_coding_are_a_full_write() -> None:
    import gzip

    stored = first()
    p = plan(result(gzip.compress(HTML), headers={"content-type": "text/html", "x-robots-tag": "all",
                                                   "content-encoding": "gzip"}), stored)
    assert p.content_change == "unchanged" and p.touch is None and p.page is not None


def test_a_changed_render_is_a_full_write_with_new_validators() -> None:
    stored = first()
    p = plan(result(HTML.replace(b"the page", b"the new page")), stored)
    assert p.content_change == "changed" and p.touch is None and p.page is not None
    assert p.page.headers["etag"] != stored.headers["etag"]
    assert p.page.headers["last-modified"] != stored.headers["last-modified"]


def test_without_the_stored_record_the_planner_writes_the_page() -> None:
    # headers alone cannot tell a changed status or verdict: no touch without the stored metadata
    p = plan(result(), first(), pages=False)
    assert p.content_change == "unchanged" and p.touch is None and p.page is not None
