"""A bad render never replaces a good page: the measure, the judge, and the planner's use of them."""

from __future__ import annotations

import gzip
from typing import Any

import pytest
from pydantic import ValidationError

from prerender_ray.config.loading import parse
from prerender_ray.config.model import Config
from prerender_ray.config.render import Guard
from prerender_ray.identity.routes import compile_route_list
from prerender_ray.queue.guard import (
    MAX_TOKENS,
    MEASURE_HEADER,
    Measure,
    Rule,
    Scan,
    describe_refusal,
    judge,
    measure_header,
    parse_measure,
    scan,
)
from prerender_ray.queue.metadata import Result
from prerender_ray.queue.results import Planner
from prerender_ray.queue.targets import Rules
from prerender_ray.serving.responses import cached_headers
from prerender_ray.storage.pages import PageMeta
from prerender_ray.storage.registry import Target
from prerender_ray.timeutil import MINUTE_MS, minute

NOW = 1_780_000_123_456
URL = "https://shop.test/p/1"
KEY = f"{URL}|desktop"


def article(words: int, links: int = 0) -> bytes:
    body = " ".join(f"word{i}" for i in range(words)) + "".join(f' <a href="/l{i}">l{i}</a>' for i in range(links))
    return (b"<html><head><title>Shop</title><script>var app = '" + b"x" * 5000 + b"';</script></head><body><main>"
            + body.encode() + b"</main></body></html>")


SHELL = b'<html><head><script src="/app.js"></script></head><body><div id="root"></div>' \
        b"<noscript>You need to enable JavaScript to run this app.</noscript></body></html>"
GOOD = article(400, 40)  # about 2,700 visible characters and 40 links


# ----------------------------------------------------------------------------------- measure


def test_visible_text_leaves_out_tags_scripts_styles_comments_and_the_title() -> None:
    html = (b"<html><head><title>A title</title><style>p { color: red }</style></head><body>"
            b"<!-- a comment --><p>Hello <b>world</b></p><script>document.write('<p>no</p>')</script>"
            b"<template><p>hidden</p></template><svg><title>icon</title></svg></body></html>")
    assert scan(html).measure == Measure(text=len("Helloworld"), links=0, size=len(html))


def test_declarative_shadow_dom_is_a_web_components_visible_content() -> None:
    html = (b'<x-card><template shadowrootmode="open"><style>p{}</style><p>Shadow text</p></template>light</x-card>'
            b'<template id=t><p>inert</p></template>')
    assert scan(html).measure.text == len("Shadowtextlight")


def test_an_app_shell_has_no_visible_text() -> None:
    assert scan(SHELL).measure.text == 0


def test_links_are_anchors_with_an_href_in_any_case() -> None:
    html = b'<a href="/a">a</a><A HREF=/b>b</A><a name="x">c</a><a class=y\nhref="/d">d</a>'
    assert scan(html).measure.links == 3


def test_text_counts_characters_not_bytes_and_not_whitespace() -> None:
    assert scan("<p>café  \n naïve</p>".encode()).measure.text == len("cafénaïve")


def test_an_element_whose_name_only_starts_like_a_hidden_one_is_visible() -> None:
    assert scan(b"<scripts>shown</scripts><title-bar>too</title-bar>").measure.text == len("showntoo")


def test_a_script_ends_only_at_its_own_end_tag() -> None:
    assert scan(b"<script>a</scripts> b</script>after").measure.text == len("after")


@pytest.mark.parametrize("html", [
    b"", b"no markup at all", b"<div class=\"x\"", b"<<<<>>>>", b"\xff\xfe\x00\x01", b"<script>never closed",
    b"<!-- never closed", b"<title>never closed", b"<div>" * 100_000, b"<!--" * 100_000, b"<script>" * 100_000,
    b"<a " * 100_000, b"</script>" * 1000, b"<body>" + b"word " * 200_000,
])
def test_hostile_and_broken_markup_is_measured_without_an_error(html: bytes) -> None:
    m = scan(html, Rule(Guard(not_found_markers=("not found", "re:<main class=nf")))).measure
    assert m.size == len(html) and m.text >= 0 and m.links >= 0


def test_past_the_token_budget_the_rest_of_the_page_counts_as_visible() -> None:
    """A pathological page is never made to look empty (which would block it) by the walk's bound."""
    html = b"<style></style>" * (MAX_TOKENS + 10) + b"<p>tail text</p>"
    assert scan(html).measure.text == len("tailtext")


# ----------------------------------------------------------------------------------- markers


@pytest.mark.parametrize("html", [
    b"<body><h1>Page not found</h1></body>",
    b"<body><h1>PAGE   NOT\n found</h1></body>",
    b"<title>Page Not Found - Shop</title><body>Browse our products</body>",
])
def test_a_text_marker_matches_the_visible_text_or_the_title_in_any_case_and_spacing(html: bytes) -> None:
    assert scan(html, Rule(Guard(not_found_markers=("Page not found",)))).not_found


def test_a_text_marker_in_a_script_or_an_attribute_is_no_match() -> None:
    html = b"<body><script>var t = {nf: 'Page not found'}</script><img alt='Page not found'>Hello</body>"
    assert not scan(html, Rule(Guard(not_found_markers=("Page not found",)))).not_found


def test_a_regex_marker_searches_the_markup_outside_scripts() -> None:
    rule = Rule(Guard(not_found_markers=('re:<main[^>]*class="[^"]*\\bnot-found\\b',)))
    assert scan(b'<main class="page not-found"><h1>Oops</h1></main>', rule).not_found
    assert not scan(b'<script>"<main class=\\"not-found\\">"</script><main class="page">', rule).not_found


def test_no_markers_never_match() -> None:
    assert not scan(b"<h1>Page not found</h1>", Rule(Guard())).not_found


def test_a_marker_that_is_no_regex_is_a_config_error() -> None:
    with pytest.raises(ValidationError, match="not a regular expression"):
        Config.model_validate({"render": {"guard": {"notFoundMarkers": ["re:(unclosed"]}}})


# -------------------------------------------------------------------------------- stored header


def test_the_measure_header_round_trips_and_junk_reads_as_unknown() -> None:
    m = Measure(text=12, links=3, size=400)
    assert parse_measure(measure_header(m)) == (m, None)
    assert parse_measure(measure_header(m, "empty-shell")) == (m, "empty-shell")
    for junk in (None, "", "text=1", "text=a; links=1; bytes=2", "text=-1; links=1; bytes=2", "x" * 500):
        assert parse_measure(junk) == (None, None)
    assert parse_measure("text=1; links=1; bytes=2; suspect=<script>") == (Measure(1, 1, 2), None)


def test_the_measure_header_is_never_served_to_a_bot() -> None:
    meta = PageMeta(cache_key=KEY, status_code=200, last_cached=NOW,
                    headers={"content-type": "text/html", MEASURE_HEADER: measure_header(Measure(1, 2, 3))})
    assert MEASURE_HEADER not in cached_headers(meta, NOW)


def test_a_corrupt_refusal_record_is_not_shown() -> None:
    for junk in (None, [], {"why": "bogus"}, "text"):
        assert describe_refusal(junk) is None
    shown = describe_refusal({"why": "empty-shell", "cacheKey": KEY, "at": 5, "count": "x", "new": {"bytes": "9"}})
    assert shown == {"cacheKey": KEY, "why": "empty-shell", "at": 5, "count": 0, "new": {}, "stored": None}


# ------------------------------------------------------------------------------------ judge


def stored_of(html: bytes, suspect: str | None = None) -> dict[str, str]:
    return {"etag": '"x"', MEASURE_HEADER: measure_header(scan(html).measure, suspect)}


def verdict_of(html: bytes, stored: dict | None, repeats: int = 0, **cfg: Any) -> tuple[str, str] | None:
    v = judge(Rule(Guard(**cfg)), scan(html, Rule(Guard(**cfg))), stored, repeats)
    return None if v is None else (v.why, v.action)


def test_a_shell_over_a_good_page_is_refused() -> None:
    assert verdict_of(SHELL, stored_of(GOOD)) == ("empty-shell", "refused")


def test_a_shell_with_no_stored_page_is_stored_as_nothing_better_exists() -> None:
    assert verdict_of(SHELL, None) == ("empty-shell", "stored")


def test_a_shell_over_a_stored_shell_is_no_worse_and_is_stored() -> None:
    """So a page that is really that small is never blocked: its first render marks it suspect."""
    assert verdict_of(SHELL, stored_of(SHELL, "empty-shell")) == ("empty-shell", "stored")


def test_a_page_stored_before_pages_were_measured_is_a_good_page_of_unknown_size() -> None:
    legacy = {"etag": '"x"', "x-harper-rendered": "1"}
    assert verdict_of(SHELL, legacy) == ("empty-shell", "refused")
    assert verdict_of(article(10), legacy) is None  # a loss cannot be measured against it


@pytest.mark.parametrize("new", [article(400, 40), article(300, 40), article(200, 20), article(140, 13),
                                 article(600, 80), article(5000, 0)[:-2000]])
def test_a_normal_content_change_is_never_refused(new: bytes) -> None:
    """Keeping 30 % or more of the text and the links is a content change, however large; so is
    the stored page's growth, or a page cut off mid-tag."""
    old = article(400, 40)
    m_new, m_old = scan(new).measure, scan(old).measure
    assert m_new.text >= 0.3 * m_old.text and (m_new.links >= 0.3 * m_old.links or m_new.text > m_old.text)
    if m_new.links >= 0.3 * m_old.links:
        assert verdict_of(new, stored_of(old)) is None


def test_losing_most_of_the_text_of_a_substantial_page_is_refused() -> None:
    assert verdict_of(article(40, 40), stored_of(GOOD)) == ("lost-text", "refused")


def test_losing_most_of_the_links_is_refused() -> None:
    assert verdict_of(article(400, 5), stored_of(GOOD)) == ("lost-links", "refused")


def test_a_small_stored_page_can_shrink_freely() -> None:
    small = article(60, 5)  # below minStoredChars and minStoredLinks
    assert verdict_of(article(5, 0), stored_of(small)) is None


def test_a_loss_that_holds_for_accept_after_renders_is_accepted() -> None:
    stored = stored_of(GOOD)
    assert verdict_of(article(40, 40), stored, repeats=2) == ("lost-text", "refused")
    assert verdict_of(article(40, 40), stored, repeats=3) == ("lost-text", "accepted")
    assert verdict_of(article(40, 40), stored, repeats=99, accept_after=0) == ("lost-text", "refused")


def test_a_shell_or_a_not_found_view_is_never_accepted_over_a_good_page() -> None:
    assert verdict_of(SHELL, stored_of(GOOD), repeats=50) == ("empty-shell", "refused")
    nf = b"<body><h1>Page not found</h1><p>" + b"Try our search or browse categories. " * 20 + b"</p></body>"
    assert verdict_of(nf, stored_of(GOOD), repeats=50, not_found_markers=("page not found",)) == \
        ("not-found", "refused")


def test_each_check_can_be_turned_off() -> None:
    assert verdict_of(SHELL, stored_of(GOOD), min_text_chars=0) == ("lost-text", "refused")
    assert verdict_of(SHELL, stored_of(GOOD), min_text_chars=0, keep_fraction=0) is None
    assert verdict_of(article(40, 4), stored_of(GOOD), keep_fraction=0) is None


def test_judge_works_on_a_measure_alone() -> None:
    v = judge(Rule(Guard()), Scan(Measure(0, 0, 10), False), None)
    assert v is not None and v.stored is None


# ---------------------------------------------------------------------------------- planner


def planner(raw: dict | None = None) -> Planner:
    return Planner(Rules(parse(raw or {}, {}).config))


def result(html: bytes, coding: str = "identity") -> Result:
    body = gzip.compress(html) if coding == "gzip" else html
    return Result.parse({"id": KEY, "url": URL, "outcome": "rendered", "statusCode": 200,
                         "headers": {"content-type": "text/html", "content-encoding": coding}}, body)


def stored_page(p: Planner, html: bytes = GOOD) -> dict[str, str]:
    first = p.plan(result(html), Target(URL), None, NOW - 86_400_000)
    assert first.page is not None and first.guard is None
    return first.page.headers


def test_a_stored_render_carries_its_measure_from_the_same_decode_as_its_etag() -> None:
    headers = stored_page(planner(), GOOD)
    coded = planner().plan(result(GOOD, "gzip"), Target(URL), None, NOW).page
    assert coded is not None and coded.headers[MEASURE_HEADER] == headers[MEASURE_HEADER]
    assert coded.headers["etag"] == headers["etag"]
    assert parse_measure(headers[MEASURE_HEADER]) == (scan(GOOD).measure, None)


def test_a_shell_over_a_good_page_keeps_it_and_takes_the_failure_lane() -> None:
    p = planner()
    stored = stored_page(p)
    plan = p.plan(result(SHELL), Target(URL), None, NOW, stored={KEY: stored})
    assert plan.page is None and plan.page_deletes == []  # the good page stays
    assert (plan.outcome, plan.detail, plan.release) == ("bad-render", "fast", False)
    assert plan.guard is not None and (plan.guard.why, plan.guard.action) == ("empty-shell", "refused")
    assert plan.route == "prerender"  # no route matches: the class
    t = plan.targets[URL]
    assert t is not None and t.strikes == 1 and t.struck_at == NOW
    assert t.refused == {"cacheKey": KEY, "why": "empty-shell", "at": NOW, "count": 1,
                         "new": scan(SHELL).measure.as_json(), "stored": scan(GOOD).measure.as_json()}
    # the record survives the registry
    assert Target.decode(URL, t.encode()).refused == t.refused


def test_refusals_strike_like_failures_and_then_back_off() -> None:
    p = planner()
    stored = {KEY: stored_page(p)}
    t = Target(URL)
    details = []
    for i in range(4):
        plan = p.plan(result(SHELL), t, None, NOW + i * MINUTE_MS, granted_at=NOW + i * MINUTE_MS, stored=stored)
        details.append(plan.detail)
        t = plan.targets[URL]  # type: ignore[assignment]
    assert details == ["fast", "fast", "slow", "slow"] and t.strikes == 4 and t.refused["count"] == 4
    assert plan.rows and (plan.rows[0].next_render_time or 0) >= minute(NOW) + 86_400_000


def test_a_good_render_after_a_refusal_is_stored_and_clears_the_strikes() -> None:
    p = planner()
    stored = {KEY: stored_page(p)}
    refused = p.plan(result(SHELL), Target(URL), None, NOW, stored=stored).targets[URL]
    ok = p.plan(result(article(390, 40)), refused, None, NOW + MINUTE_MS, stored=stored)
    assert ok.outcome == "rendered" and ok.page is not None and ok.guard is None
    after = ok.targets[URL]
    assert after is not None and after.strikes == 0 and after.refused == refused.refused  # the last one, shown


def test_a_persistent_loss_is_accepted_on_the_render_after_accept_after_refusals() -> None:
    p = planner()
    stored = {KEY: stored_page(p)}
    t = Target(URL)
    for i in range(3):
        plan = p.plan(result(article(40, 40)), t, None, NOW + i, granted_at=NOW + i, stored=stored)
        assert plan.outcome == "bad-render"
        t = plan.targets[URL]  # type: ignore[assignment]
    plan = p.plan(result(article(40, 40)), t, None, NOW + 3, granted_at=NOW + 3, stored=stored)
    assert plan.outcome == "rendered" and plan.page is not None
    assert plan.guard is not None and plan.guard.action == "accepted"


def test_a_shell_first_render_is_stored_marked_suspect_and_the_next_shell_replaces_it() -> None:
    p = planner()
    first = p.plan(result(SHELL), Target(URL), None, NOW)
    assert first.outcome == "rendered" and first.page is not None
    assert first.guard is not None and first.guard.action == "stored"
    assert first.page.headers[MEASURE_HEADER].endswith("suspect=empty-shell")
    again = p.plan(result(SHELL), Target(URL), None, NOW + MINUTE_MS, stored={KEY: first.page.headers})
    assert again.outcome == "rendered" and again.page is not None


def test_a_not_found_view_over_a_good_page_is_refused() -> None:
    p = planner({"render": {"guard": {"notFoundMarkers": ["Sorry, this page does not exist"]}}})
    stored = stored_page(p)
    nf = b"<body><h1>Sorry, this page does not exist</h1>" + b"<p>Browse our shop instead.</p>" * 30 + b"</body>"
    plan = p.plan(result(nf), Target(URL), None, NOW, stored={KEY: stored})
    assert plan.outcome == "bad-render" and plan.guard is not None and plan.guard.why == "not-found"


def test_a_one_off_render_that_is_bad_is_dropped_and_the_page_kept() -> None:
    p = planner()
    plan = p.plan(result(SHELL), None, None, NOW, stored={KEY: stored_page(p)})
    assert plan.outcome == "dropped" and plan.page is None and plan.row_deletes == [KEY]


def test_a_route_can_turn_the_guard_off_or_change_it() -> None:
    routes = [{"match": "prefix", "path": "/p/", "guard": False},
              {"match": "prefix", "path": "/q/", "guard": {"keepFraction": 0}}]
    p = planner({"ingress": {"routes": routes}})
    stored = {KEY: stored_page(p)}
    assert p.plan(result(SHELL), Target(URL), None, NOW, stored=stored).outcome == "rendered"
    q_key = "https://shop.test/q/1|desktop"
    q_stored = p.plan(Result.parse({"id": q_key, "outcome": "rendered", "statusCode": 200}, GOOD),
                      Target("https://shop.test/q/1"), None, NOW).page
    assert q_stored is not None
    lost = Result.parse({"id": q_key, "outcome": "rendered", "statusCode": 200}, article(40, 4))
    assert p.plan(lost, Target("https://shop.test/q/1"), None, NOW,
                  stored={q_key: q_stored.headers}).outcome == "rendered"  # no loss check on /q/
    shell = Result.parse({"id": q_key, "outcome": "rendered", "statusCode": 200}, SHELL)
    assert p.plan(shell, Target("https://shop.test/q/1"), None, NOW,
                  stored={q_key: q_stored.headers}).outcome == "bad-render"  # the rest of render.guard holds


def test_with_the_guard_off_nothing_is_measured_or_refused() -> None:
    p = planner({"render": {"guard": {"enabled": False}}})
    stored = stored_page(p)
    assert MEASURE_HEADER not in stored
    assert p.plan(result(SHELL), Target(URL), None, NOW, stored={KEY: stored}).outcome == "rendered"


def test_a_bad_route_guard_is_dropped_with_a_warning() -> None:
    compiled = compile_route_list([{"match": "prefix", "path": "/a", "guard": {"keepFraction": 2}},
                                   {"match": "prefix", "path": "/b", "guard": "off"},
                                   {"match": "prefix", "path": "/c", "guard": {"minTextChars": 5}}], [])
    a, b, c = compiled.routes
    assert a.guard is None and b.guard is None and c.guard == (("min_text_chars", 5),)
    assert any("/a" in w and "keep_fraction" in w for w in compiled.warnings)
    assert any("/b" in w and "guard must be" in w for w in compiled.warnings)
    assert c.as_dict()["guard"] == {"min_text_chars": 5}
