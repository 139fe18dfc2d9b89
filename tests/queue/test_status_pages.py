"""Status pages: a 404/410 verdict or a redirect stored as what bots receive (queue/status_pages.py),
planned by the suppression and redirect lanes without changing their scheduling."""

from __future__ import annotations

import gzip
from typing import Any

import pytest

from prerender_ray.queue.metadata import Result
from prerender_ray.queue.results import Plan
from prerender_ray.queue.status_pages import location_of, resolved
from prerender_ray.storage.pages import Page
from prerender_ray.timeutil import DAY_MS
from tests.queue.test_results import DST, KEY, NOW, SHOP_ONLY, SRC, M, plan, planner, target

KEEP = 30 * DAY_MS
BODY = gzip.compress(b"<html><body><h1>Not found</h1><p>No such product.</p></body></html>")


def gone(status: int = 404, content: bytes | None = BODY, **kw: Any) -> Result:
    meta = {"id": KEY, "url": SRC, "outcome": "non-indexable", "statusCode": status, "reason": "http-error",
            "isIndexable": False, "headers": {"content-encoding": "gzip", "content-type": "text/html",
                                              "etag": '"shell"', "cache-control": "max-age=60"}, **kw}
    return Result.parse(meta, content)


def redirected(status: int = 301, to: str = DST, **kw: Any) -> Result:
    return Result.parse({"id": KEY, "url": SRC, "outcome": "redirected", "statusCode": status,
                         "redirectedTo": to, "reason": "redirect", "headers": {"cache-control": "max-age=9"},
                         **kw}, None)


def pages(p: Plan) -> dict[str, Page]:
    return {page.cache_key: page for page in p.status_pages}


def test_a_404_verdict_stores_the_rendered_body_with_its_status_on_every_device_key() -> None:
    p = plan(gone(), target())
    assert p.outcome == "suppressed" and p.targets[SRC] is not None  # scheduling as before
    stored = pages(p)
    assert set(stored) == {KEY, f"{SRC}|mobile"}
    page = stored[KEY]
    assert (page.status_code, page.content, page.is_indexable) == (404, BODY, False)
    assert page.headers == {"content-encoding": "gzip", "content-type": "text/html", "cache-control": "max-age=60",
                            "x-harper-rendered": "1"}  # the shell's validators are not the page's
    # served until keepFor past the recheck the lane scheduled (a standing verdict never lapses)
    recheck = M + 14 * DAY_MS
    assert {row.next_render_time for row in p.rows} == {recheck} and page.expires_at == recheck + KEEP
    assert set(p.page_deletes) == {f"{SRC}|tablet"}  # a device no longer served loses its page


def test_a_verdict_from_a_fleet_that_sends_no_body_gets_a_small_page_naming_the_status() -> None:
    page = pages(plan(gone(410, None), target()))[KEY]
    assert page.status_code == 410 and b"<title>410</title>" in page.content
    assert page.headers["content-type"] == "text/html; charset=utf-8" and "content-encoding" not in page.headers


def test_a_retired_target_keeps_its_status_page_as_a_tombstone() -> None:
    p = plan(gone(410), target(strikes=1))
    assert p.detail == "deleted" and p.targets == {SRC: None} and p.rows == []
    assert pages(p)[KEY].expires_at == NOW + KEEP and pages(p)[KEY].status_code == 410


@pytest.mark.parametrize("status", [400, 404, 410, 451])
def test_client_error_verdicts_become_status_pages(status: int) -> None:
    assert pages(plan(gone(status), target()))[KEY].status_code == status


@pytest.mark.parametrize("status", [401, 403, 408, 429, 500, 503])
def test_auth_and_transient_verdicts_store_nothing(status: int) -> None:
    p = plan(gone(status), target())
    assert p.status_pages == [] and p.page_deletes == []


def test_a_noindex_verdict_is_no_status_page() -> None:
    p = plan(gone(200, None, reason="noindex"), target())
    assert p.status_pages == [] and KEY in p.page_deletes


def test_status_pages_can_be_turned_off() -> None:
    off = planner({"render": {"statusPages": {"enabled": False}}})
    assert plan(gone(), target(), p=off).status_pages == []
    assert plan(redirected(), target(), p=off).status_pages == []


@pytest.mark.parametrize("status", [301, 308])
def test_a_permanent_redirect_leaves_a_redirect_tombstone(status: int) -> None:
    p = plan(redirected(status), target())
    assert p.detail == "permanent" and p.targets == {SRC: None} and p.adopt is not None
    page = pages(p)[KEY]
    assert (page.status_code, page.content, page.expires_at) == (status, b"", NOW + KEEP)
    assert page.headers == {"location": DST, "cache-control": "max-age=9", "x-harper-rendered": "1"}


@pytest.mark.parametrize("status", [302, 307])
def test_a_temporary_redirect_is_served_until_past_its_next_render(status: int) -> None:
    p = plan(redirected(status), target(render_interval=2 * DAY_MS))
    assert p.detail == "strike" and p.rows and pages(p)[KEY].status_code == status
    assert pages(p)[KEY].expires_at == M + 2 * DAY_MS + KEEP


@pytest.mark.parametrize("status", [200, 303, None])
def test_a_redirect_verdict_with_another_status_stores_nothing(status: int | None) -> None:
    assert plan(redirected(status), target()).status_pages == []


def test_a_relative_location_is_resolved_against_the_page() -> None:
    assert pages(plan(redirected(301, "../new?x=1"), target()))[KEY].headers["location"] == \
        "https://shop.test/new?x=1"


def test_a_location_off_the_sites_hosts_is_never_stored() -> None:
    p = plan(redirected(301, "https://elsewhere.test/x"), target(), p=planner(SHOP_ONLY))
    assert p.status_pages == [] and p.targets == {SRC: None}  # the lane still retires the source
    # with no domains configured: the page's own host and port only
    assert plan(redirected(301, "https://elsewhere.test/x"), target()).status_pages == []
    assert plan(redirected(301, "https://shop.test:8443/x"), target()).status_pages == []


@pytest.mark.parametrize("ref, expected", [
    ("/a", "https://shop.test/a"), ("b", "https://shop.test/b"), ("https://shop.test/c#f", "https://shop.test/c#f"),
    ("", None), ("  ", None), ("a b", None), ("/a\r\nSet-Cookie: x", None), ("javascript:alert(1)", None),
    ("ftp://shop.test/x", None), ("https://shop.test:99999/x", None), ("/" + "x" * 9000, None), (None, None),
])
def test_a_redirect_target_is_resolved_or_refused(ref: str | None, expected: str | None) -> None:
    assert resolved(SRC, ref) == expected


def test_a_location_is_checked_by_the_origin_policy_with_its_port() -> None:
    assert location_of(SRC, "https://shop.test/x", ["shop.test"]) == "https://shop.test/x"
    assert location_of(SRC, "https://shop.test:8443/x", ["shop.test"]) is None
    assert location_of(SRC, "https://shop.test:8443/x", ["shop.test:8443"]) == "https://shop.test:8443/x"
    assert location_of("http://127.0.0.1:8080/a", "/b", []) == "http://127.0.0.1:8080/b"


@pytest.mark.parametrize("domains", [[], ["shop.test"]])
def test_a_location_is_read_as_a_browser_reads_it_with_or_without_domains(domains: list[str]) -> None:
    """urlsplit reads the host after the last '@'; a browser takes '\\' for '/' in an http(s) URL, so
    the host is evil.test and the rest is its path: never stored, domains or none."""
    for ref in ("https://evil.test\\@shop.test/x", "https://evil.test\\x@shop.test:443/", "//evil.test\\@shop.test/"):
        assert location_of(SRC, ref, domains) is None, ref
        p = plan(redirected(301, ref), target(), p=planner({"domains": domains} if domains else {}))
        assert p.status_pages == [], ref
    assert location_of(SRC, "https://shop.test:443/a\\b", domains) == "https://shop.test:443/a\\b"
