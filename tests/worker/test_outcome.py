"""Jobs, verdicts and the job_result wire format (docs/fleet-protocol.md#claim, #job-result, #verdicts,
#shared-cache-key-knobs), without a browser."""

from __future__ import annotations

import gzip
import json
import math

import brotli
import pytest

from prerender_ray.worker import outcome as oc

RULES = oc.UrlRules()
URL = "https://shop.example/p/1"


def job(url: str = URL, **kw) -> oc.Job:
    return oc.Job.parse(
        {
            "id": f"{url}|desktop",
            "url": url,
            "deviceType": "desktop",
            "expiresAt": 2e12,
            "callbackOrigin": "http://127.0.0.1:9926",
            "isFromSitemap": False,
            **kw,
        }
    )


def hop(url: str, status: int, **headers: str) -> oc.Hop:
    return oc.Hop(url, status, headers)


# ------------------------------------------------------------------------------------------ jobs


def test_a_claimed_job_parses_with_optional_fields_and_lower_cased_headers() -> None:
    j = job(headers={"X-Extra": "1"}, renderBudget=5000, isFromSitemap=True)
    assert j.headers == {"x-extra": "1"} and j.render_budget_ms == 5000 and j.is_from_sitemap
    assert j.held(2e12 - 1) and not j.held(2e12)
    assert j.lease_left_ms(2e12 - 40_000) == 40_000


def test_a_job_without_a_numeric_expires_at_is_never_skipped_and_always_held() -> None:
    j = job(expiresAt="soon")
    assert math.isnan(j.expires_at) and j.held(1e15) and j.lease_left_ms(1e15) == math.inf


@pytest.mark.parametrize(
    "bad, problem",
    [
        ({"id": ""}, "job.id"),
        ({"url": "ftp://x/y"}, "absolute http"),
        ({"url": None}, "job.url"),
        ({"callbackOrigin": "http://h:1/path"}, "bare http"),
        ({"callbackOrigin": "h:1"}, "bare http"),
    ],
)
def test_unusable_jobs_are_reported_and_the_rest_of_the_batch_is_kept(bad: dict, problem: str) -> None:
    good = {
        "id": "a|desktop",
        "url": URL,
        "deviceType": "desktop",
        "expiresAt": 2e12,
        "callbackOrigin": "http://127.0.0.1:9926",
        "isFromSitemap": False,
    }
    jobs, problems = oc.parse_jobs([{**good, **bad}, good, "junk"])
    assert [j.id for j in jobs] == ["a|desktop"]
    assert problem in problems[0] and "JSON object" in problems[1]


# ------------------------------------------------------------------------------------------ URLs


def test_redirect_comparisons_use_the_shared_canonical_form() -> None:
    assert RULES.same_page("https://Shop.example:443/p/1/?utm=1#x", URL)  # C0
    assert not RULES.same_page("https://shop.example/p/2", URL)
    assert not RULES.same_url(URL + "?a=1", URL) and RULES.same_url(URL + "?b=2&a=1", URL + "?a=1&b=2")  # C*
    assert not oc.UrlRules(trailing_slash="preserve").same_page(URL + "/", URL)


@pytest.mark.parametrize(
    "canonical, current, verdict",
    [
        (None, URL, "self"),
        ("https://shop.example/p/1/", URL, "self"),
        ("https://shop.example/p/1?utm_source=x", URL, "self"),  # only the current URL's own params count
        ("https://shop.example/p/1?b=2&a=1", URL + "?a=1&b=2", "self"),
        ("https://shop.example/p/2", URL, "elsewhere"),
        ("https://other.example/p/1", URL, "elsewhere"),
        ("https://shop.example/p/%31?a=1+2", URL + "?a=1%202", "variant"),
        ("javascript:alert(1)", URL, "self"),  # malformed counts as self
    ],
)
def test_the_canonical_verdict(canonical: str | None, current: str, verdict: str) -> None:
    assert RULES.canonical_verdict(canonical, current) == verdict


# -------------------------------------------------------------------------------------- verdicts


def test_a_plain_200_goes_on_to_settle() -> None:
    assert oc.navigation_verdict(job(), RULES, [hop(URL, 200)]) is None


def test_an_http_redirect_to_another_path_bails_with_the_first_hops_status_and_headers() -> None:
    v = oc.navigation_verdict(
        job(),
        RULES,
        [
            hop(URL, 301, location="/p/9", **{"cache-control": "max-age=60", "set-cookie": "a=b"}),
            hop("https://shop.example/p/8", 302),
            hop("https://shop.example/p/9", 200),
        ],
    )
    assert v.status_code == 301 and v.headers == {"cache-control": "max-age=60"}
    assert v.redirected_to == "https://shop.example/p/9" and v.is_indexable is None and v.reason == "redirect"
    assert (
        oc.navigation_verdict(job(), RULES, [hop(URL, 200), hop("https://x.example/", 200)]).status_code
        == 302
    )


def test_a_redirect_that_only_changes_the_query_renders_the_landed_page_with_redirected_to() -> None:
    hops = [hop(URL + "?utm=1", 302), hop(URL + "?utm=2", 200)]
    assert oc.navigation_verdict(job(URL + "?utm=1"), RULES, hops) is None
    v = oc.document_verdict(job(URL + "?utm=1"), RULES, hops[-1], oc.Document(url=URL + "?utm=2"))
    assert v.keep_content and v.redirected_to == URL + "?utm=2" and v.status_code == 200


@pytest.mark.parametrize("status", [404, 410, 500, 503, 203, 206])
def test_a_final_status_other_than_200_is_a_non_indexable_http_error(status: int) -> None:
    v = oc.navigation_verdict(job(), RULES, [hop(URL, status, **{"x-robots-tag": "noindex", "server": "x"})])
    assert (v.status_code, v.is_indexable, v.reason, v.keep_content) == (status, False, "http-error", False)
    assert v.headers == {"x-robots-tag": "noindex"}


def test_navigation_errors_are_errors_and_a_redirect_loop_is_non_indexable() -> None:
    loop = oc.navigation_error_verdict("Error", "net::ERR_TOO_MANY_REDIRECTS at https://x/")
    assert loop.is_indexable is False and loop.reason == "redirect-loop" and loop.status_code is None
    assert loop.error == {
        "name": "Error",
        "message": "net::ERR_TOO_MANY_REDIRECTS at https://x/",
        "phase": "navigation",
    }
    err = oc.navigation_error_verdict("TimeoutError", "Timeout 20000ms exceeded")
    assert err.is_indexable is None and err.reason == "error" and err.error["phase"] == "navigation"


@pytest.mark.parametrize(
    "robots", [("noindex",), ("NoIndex, follow",), ("index", "none"), ("nofollow,noindex",)]
)
def test_noindex_is_non_indexable_without_content_unless_the_page_is_in_a_sitemap(robots: tuple) -> None:
    doc = oc.Document(url=URL, robots=robots)
    v = oc.document_verdict(job(), RULES, hop(URL, 200), doc)
    assert (v.is_indexable, v.reason, v.keep_content) == (False, "noindex", False)
    s = oc.document_verdict(job(isFromSitemap=True), RULES, hop(URL, 200), doc)
    assert (s.is_indexable, s.reason, s.keep_content) == (False, None, True)


def test_indexable_pages_keep_their_content() -> None:
    v = oc.document_verdict(
        job(),
        RULES,
        hop(URL, 200, etag='"1"'),
        oc.Document(url=URL, robots=("index, follow",), canonical=URL + "/"),
    )
    assert (v.is_indexable, v.keep_content, v.redirected_to, v.headers) == (True, True, None, {"etag": '"1"'})


def test_a_canonical_elsewhere_is_a_mismatch_and_a_variant_only_counts_when_strict() -> None:
    elsewhere = oc.document_verdict(
        job(), RULES, hop(URL, 200), oc.Document(url=URL, canonical="https://shop.example/x")
    )
    assert elsewhere.reason == "canonical-mismatch" and not elsewhere.keep_content
    variant = oc.Document(url=URL + "?a=1%202", canonical=URL + "?a=1+2")
    assert oc.document_verdict(job(URL + "?a=1%202"), RULES, hop(URL, 200), variant).keep_content
    strict = oc.UrlRules(canonical_strict=True)
    assert (
        oc.document_verdict(job(URL + "?a=1%202"), strict, hop(URL, 200), variant).reason
        == "canonical-variant"
    )


def test_a_client_side_redirect_renders_the_landed_page_with_redirected_to() -> None:
    v = oc.document_verdict(job(), RULES, hop(URL, 200), oc.Document(url="https://shop.example/landed"))
    assert v.keep_content and v.redirected_to == "https://shop.example/landed" and v.status_code == 200


def test_the_prerender_status_code_meta_tag() -> None:
    gone = oc.document_verdict(job(), RULES, hop(URL, 200), oc.Document(url=URL, status_meta="410"))
    assert (gone.status_code, gone.reason, gone.is_indexable) == (410, "http-error", False)
    assert gone.keep_content  # the page's own not-found view is what bots get with the 410
    meta = oc.build_metadata(job(), gone, 12.0, "gzip")
    assert (meta["outcome"], meta["reason"], meta["statusCode"]) == ("non-indexable", "http-error", 410)
    for bad in ("99", "600", "abc", "", "4o4", "²", "४०४", "9" * 5000):  # a page writes it: any text
        v = oc.document_verdict(job(), RULES, hop(URL, 200), oc.Document(url=URL, status_meta=bad))
        assert (v.status_code, v.is_indexable, v.keep_content) == (200, True, True), bad
    moved = oc.document_verdict(
        job(),
        RULES,
        hop(URL, 200),
        oc.Document(url=URL, status_meta="301", location_meta="https://shop.example/new"),
    )
    assert (moved.status_code, moved.redirected_to, moved.reason) == (
        301,
        "https://shop.example/new",
        "redirect",
    )
    for junk in ("abc", "99", "200", "301"):  # 301 without a location is ignored
        assert oc.document_verdict(
            job(), RULES, hop(URL, 200), oc.Document(url=URL, status_meta=junk)
        ).keep_content
    off = oc.document_verdict(
        job(), RULES, hop(URL, 200), oc.Document(url=URL, status_meta="410"), honour_status_meta=False
    )
    assert off.keep_content


# ----------------------------------------------------------------------------------- wire format


@pytest.mark.parametrize(
    "content, redirected, indexable, outcome",
    [
        (True, "x", False, "rendered"),
        (False, "x", None, "redirected"),
        (False, None, False, "non-indexable"),
        (False, None, None, "error"),
        (False, None, True, "error"),
    ],
)
def test_outcome_precedence(
    content: bool, redirected: str | None, indexable: bool | None, outcome: str
) -> None:
    assert oc.resolve_outcome(content, redirected, indexable) == outcome


def test_rendered_metadata_has_exactly_the_wire_fields_and_announces_the_encoding() -> None:
    v = oc.document_verdict(
        job(),
        RULES,
        hop(URL, 200, etag='"e"', **{"content-type": "text/html; charset=latin-1"}),
        oc.Document(url=URL),
    )
    meta = oc.build_metadata(job(), v, 812.6, "gzip")
    assert meta == {
        "id": f"{URL}|desktop",
        "url": URL,
        "statusCode": 200,
        "headers": {"etag": '"e"', "content-type": "text/html; charset=utf-8", "content-encoding": "gzip"},
        "renderTime": 813,
        "isIndexable": True,
        "outcome": "rendered",
    }


def test_metadata_without_content_carries_a_reason_and_no_content_encoding() -> None:
    redirect = oc.navigation_verdict(job(), RULES, [hop(URL, 308), hop("https://shop.example/new", 200)])
    assert oc.build_metadata(job(), redirect, 5, None) == {
        "id": f"{URL}|desktop",
        "url": URL,
        "statusCode": 308,
        "headers": {},
        "renderTime": 5,
        "redirectedTo": "https://shop.example/new",
        "outcome": "redirected",
        "reason": "redirect",
    }
    err = oc.error_verdict("SettleTimeout", "never settled")
    assert oc.build_metadata(job(), err, 20_000, None) == {
        "id": f"{URL}|desktop",
        "url": URL,
        "headers": {},
        "renderTime": 20000,
        "outcome": "error",
        "reason": "error",
        "error": {"name": "SettleTimeout", "message": "never settled"},
    }


def test_the_result_body_is_the_metadata_then_the_encoded_html() -> None:
    html = "<!DOCTYPE html><html><body>héllo ✓</body></html>"
    for enc, decode in (("gzip", gzip.decompress), ("br", brotli.decompress)):
        content = oc.encode_html(html, enc)
        meta = oc.build_metadata(
            job(), oc.Verdict(status_code=200, is_indexable=True, keep_content=True), 1, enc
        )
        body, headers = oc.result_body(meta, content)
        size = int(headers["x-metadata-size"])
        assert headers["content-type"] == "application/octet-stream" and "content-encoding" not in headers
        assert json.loads(body[:size].decode()) == meta
        assert decode(body[size:]).decode() == html
    body, headers = oc.result_body({"id": "é"}, None)
    assert int(headers["x-metadata-size"]) == len(body) == len('{"id":"é"}'.encode())
