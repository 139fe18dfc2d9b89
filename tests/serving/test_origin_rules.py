"""Origin fetch rules: headers out and back, staging, candidacy, render-now (docs/serving.md#origin-fetch,
#discovery, #render-now)."""

from __future__ import annotations

import hmac

import pytest

from prerender_ray.config.origin import Origin, SecurityToken, Staging, UserAgents
from prerender_ray.config.render import RenderNow
from prerender_ray.serving import origin_rules
from prerender_ray.serving.origin_rules import (
    bucket_for_unrouted,
    ignored_request_headers,
    is_prerender_candidate,
    origin_request_headers,
    relay_headers,
    serving_policy,
    staging_ip,
)

DEBUG = "x-harper-prerender-debug"
DEFAULT_RENDER_NOW = RenderNow()
TOKEN_ORIGIN = Origin(security_token=SecurityToken(header="X-Harper-Renderer-Bypass", value="origin-secret"))


def _out(
    request: dict[str, str],
    *,
    origin: Origin = TOKEN_ORIGIN,
    debug: str = DEBUG,
    render_now: RenderNow = DEFAULT_RENDER_NOW,
    device: str = "desktop",
    strip_validators: bool = False,
    client: str | None = None,
) -> list[tuple[str, str]]:
    return origin_request_headers(
        request.items(),
        device_type=device,
        origin=origin,
        debug_key=debug,
        render_now=render_now,
        strip_validators=strip_validators,
        client=client,
    )


def _names(pairs: list[tuple[str, str]]) -> list[str]:
    return [name.lower() for name, _ in pairs]


# ------------------------------------------------------------------------------------ request headers


def test_our_own_headers_come_first() -> None:
    out = _out({})
    assert out == [
        ("user-agent", UserAgents().desktop),
        ("X-Harper-Renderer-Bypass", "origin-secret"),
        ("accept-encoding", "identity"),
    ]


@pytest.mark.parametrize(("accept", "asked"), [
    (None, "identity"), ("gzip", "gzip"), ("br, gzip;q=0.5", "gzip"), ("*", "gzip"), ("x-gzip", "gzip"),
    ("br", "identity"), ("gzip;q=0", "identity"), ("identity", "identity"), ("*;q=0", "identity"),
])
def test_the_origin_is_asked_for_gzip_only_when_the_bot_accepts_it(accept: str | None, asked: str) -> None:
    """So the origin's answer is passed through, never decoded for the bot (a few KB of gzip were
    up to 20 MB of decoding and reply)."""
    out = _out({} if accept is None else {"Accept-Encoding": accept})
    assert [pair for pair in out if pair[0] == "accept-encoding"] == [("accept-encoding", asked)]


def test_the_user_agent_is_per_device_with_a_desktop_fallback() -> None:
    assert dict(_out({}, device="mobile"))["user-agent"] == UserAgents().mobile
    assert dict(_out({}, device="watch"))["user-agent"] == UserAgents().desktop


def test_the_token_header_is_sent_even_when_empty() -> None:
    assert ("x-harper-renderer-bypass", "") in _out({}, origin=Origin())


def test_arbitrary_headers_are_forwarded() -> None:
    out = _out({"x-custom": "1", "referer": "https://r/", "accept-language": "fr"})
    assert ("x-custom", "1") in out and ("referer", "https://r/") in out and ("accept-language", "fr") in out


SPOOFED = {"X-Forwarded-For": "1.2.3.4", "x-real-ip": "1.2.3.5", "true-client-ip": "1.2.3.6",
           "cf-connecting-ip": "1.2.3.7", "forwarded": "for=1.2.3.8", "x-client-ip": "1.2.3.9"}


def test_a_clients_claims_of_its_address_are_never_forwarded() -> None:
    """The origin's rate limits and allowlists must not take a bot's word for who it is: its claims
    are dropped, and the address we know is sent when given (none on a shared miss)."""
    assert _names(_out(SPOOFED)) == ["user-agent", "x-harper-renderer-bypass", "accept-encoding"]
    out = _out(SPOOFED, client="198.51.100.7")
    claims = {name.lower() for name in SPOOFED}
    assert [pair for pair in out if pair[0] in claims] == [("x-forwarded-for", "198.51.100.7")]


def test_credentials_host_and_debug_are_not_forwarded() -> None:
    out = _out(
        {"host": "evil", "cookie": "s=1", "authorization": "Basic x", DEBUG: "1", "user-agent": "Googlebot"}
    )
    assert _names(out) == ["user-agent", "x-harper-renderer-bypass", "accept-encoding"]
    assert dict(out)["user-agent"] == UserAgents().desktop


def test_hop_by_hop_headers_and_those_named_by_connection_are_not_forwarded() -> None:
    out = _out(
        {"connection": "keep-alive, X-Secret-Hop", "keep-alive": "5", "te": "trailers", "x-secret-hop": "1"}
    )
    assert _names(out) == ["user-agent", "x-harper-renderer-bypass", "accept-encoding"]


def test_a_spoofed_token_header_is_replaced_by_the_configured_value() -> None:
    out = _out({"x-harper-renderer-bypass": "spoof"})
    assert [v for n, v in out if n.lower() == "x-harper-renderer-bypass"] == ["origin-secret"]


def test_mixed_case_configured_names_still_block_a_lowercase_spoof() -> None:
    out = _out({"x-harper-renderer-bypass": "spoof", "x-my-debug": "1"}, debug="X-My-Debug")
    assert ("x-harper-renderer-bypass", "spoof") not in out
    assert "x-my-debug" not in _names(out)
    assert ("X-Harper-Renderer-Bypass", "origin-secret") in out


def test_ignored_headers_are_dropped_case_insensitively() -> None:
    origin = Origin(ignored_headers=["X-Tenant", " referer "])
    out = _out({"x-tenant": "a", "referer": "r", "x-kept": "k"}, origin=origin)
    assert "x-tenant" not in _names(out) and "referer" not in _names(out)
    assert ("x-kept", "k") in out


def test_the_ignored_set_follows_a_config_change() -> None:
    before = ignored_request_headers(Origin(ignored_headers=["x-a"]), DEBUG, RenderNow())
    after = ignored_request_headers(Origin(ignored_headers=["x-b"]), DEBUG, RenderNow())
    assert "x-a" in before and "x-b" not in before
    assert "x-b" in after and "x-a" not in after


def test_render_now_headers_never_reach_the_origin() -> None:
    render_now = RenderNow(
        enabled=True, token="rn-secret", header="X-Render-Now", miss_header="X-Render-Miss"
    )
    out = _out({"x-render-now": "rn-secret", "x-render-miss": "origin"}, render_now=render_now)
    assert "x-render-now" not in _names(out) and "x-render-miss" not in _names(out)
    default = _out({"x-harper-render-now": "t", "x-harper-render-miss": "origin"})
    assert "x-harper-render-now" not in _names(default) and "x-harper-render-miss" not in _names(default)


@pytest.mark.parametrize("strip", [True, False])
def test_a_range_is_never_forwarded(strip: bool) -> None:
    """A miss relays the whole page to every bot sharing its fetch; the bypass has no ranges to ask."""
    out = _out({"range": "bytes=0-0", "Range": "bytes=1-1"}, strip_validators=strip)
    assert _names(out) == ["user-agent", "x-harper-renderer-bypass", "accept-encoding"]


def test_max_forwards_is_never_forwarded() -> None:
    """With it a proxy before the origin answers the request itself (a TRACE it reflects, token in it)."""
    out = _out({"max-forwards": "0", "Max-Forwards": "1"})
    assert _names(out) == ["user-agent", "x-harper-renderer-bypass", "accept-encoding"]


def test_validators_are_forwarded_unless_stripping_is_asked() -> None:
    request = {
        "if-none-match": '"v1"',
        "if-modified-since": "Wed, 01 May 2024 12:00:00 GMT",
        "cache-control": "no-cache",
    }
    assert {"if-none-match", "if-modified-since", "cache-control"} <= set(_names(_out(request)))
    stripped = _names(_out(request, strip_validators=True))
    assert "if-none-match" not in stripped and "if-modified-since" not in stripped
    assert "cache-control" in stripped


def test_headers_that_could_split_a_request_are_dropped() -> None:
    out = _out({"x-evil": "a\r\nx-injected: 1", "bad name": "v", "x-nul": "a\x00b", "x-fine": "ok"})
    assert _names(out)[3:] == ["x-fine"]


def test_repeated_downstream_headers_are_all_forwarded() -> None:
    out = origin_request_headers(
        [("X-Multi", "a"), ("x-multi", "b")],
        device_type="desktop",
        origin=Origin(),
        debug_key=DEBUG,
        render_now=RenderNow(),
    )
    assert [v for n, v in out if n == "x-multi"] == ["a", "b"]


# ----------------------------------------------------------------------------------- response headers


ORIGIN_RESPONSE = {
    "Content-Type": "text/html",
    "content-encoding": "gzip",
    "content-length": "10",
    "cache-control": "max-age=60",
    "expires": "0",
    "ETag": '"v1"',
    "last-modified": "Wed, 01 May 2024 12:00:00 GMT",
    "vary": "Accept-Encoding",
    "x-robots-tag": "noindex",
    "retry-after": "",
    "set-cookie": "s=1",
    "cf-ray": "abc",
    "server-timing": "cdn;dur=1",
    "connection": "keep-alive",
    "x-empty": "",
    "link": "</a.js>; rel=preload",
    "location": "https://x.com/elsewhere",
}


def test_the_response_allowlist_keeps_genuine_headers_only() -> None:
    assert relay_headers(200, ORIGIN_RESPONSE) == {
        "content-type": "text/html",
        "content-encoding": "gzip",
        "content-length": "10",
        "cache-control": "max-age=60",
        "expires": "0",
        "etag": '"v1"',
        "last-modified": "Wed, 01 May 2024 12:00:00 GMT",
        "vary": "Accept-Encoding",
        "x-robots-tag": "noindex",
        "retry-after": "",
    }


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_keeps_its_location_but_not_its_cookies(status: int) -> None:
    headers = relay_headers(status, ORIGIN_RESPONSE)
    assert headers["location"] == "https://x.com/elsewhere"
    assert "set-cookie" not in headers


def test_no_headers_relay_as_nothing() -> None:
    assert relay_headers(200, None) == {}


def test_repeated_response_fields_are_joined() -> None:
    headers = relay_headers(200, [("Vary", "Accept-Encoding"), ("vary", "User-Agent"), ("Set-Cookie", "a=1")])
    assert headers == {"vary": "Accept-Encoding, User-Agent"}


# --------------------------------------------------------------------------------------------- staging


def test_staging_is_off_by_default() -> None:
    assert staging_ip(Staging(), {"x-harper-staging": "1"}) is None


def test_staging_needs_a_valid_ip_and_the_request_header() -> None:
    staging = Staging(ip="10.0.0.5")
    assert staging_ip(staging, {"x-harper-staging": "1"}) == "10.0.0.5"
    assert staging_ip(staging, {}) is None
    assert staging_ip(staging, {"x-harper-staging": ""}) is None


def test_a_custom_staging_header_name_works() -> None:
    staging = Staging(ip="10.0.0.5", header="X-Use-Staging")
    assert staging_ip(staging, {"x-use-staging": "yes"}) == "10.0.0.5"
    assert staging_ip(staging, {"x-harper-staging": "1"}) is None


def test_an_invalid_ip_or_an_empty_header_name_disables_staging() -> None:
    assert (
        staging_ip(
            Staging.model_construct(ip="not-an-ip", header="x-harper-staging"), {"x-harper-staging": "1"}
        )
        is None
    )
    assert staging_ip(Staging(ip="10.0.0.5", header=""), {"": "1"}) is None


def test_staging_works_with_ipv6() -> None:
    assert staging_ip(Staging(ip="::1"), {"x-harper-staging": "true"}) == "::1"


# -------------------------------------------------------------------------------------------- candidacy


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "text/html"},
        {"content-type": "TEXT/HTML; charset=utf-8"},
        {"content-type": "application/xhtml+xml"},
        {"content-type": "text/html", "x-robots-tag": "nofollow, noarchive"},
        {"content-type": "text/html", "x-robots-tag": "unavailable_after: 25 Jun 2030 15:00:00 PST"},
    ],
)
def test_a_200_html_page_without_noindex_is_a_candidate(headers: dict[str, str]) -> None:
    assert is_prerender_candidate(200, headers)


@pytest.mark.parametrize(
    ("status", "headers"),
    [
        (404, {"content-type": "text/html"}),
        (301, {"content-type": "text/html"}),
        (200, {"content-type": "application/json"}),
        (200, {}),
        (200, {"content-type": "text/html", "x-robots-tag": "noindex"}),
        (200, {"content-type": "text/html", "x-robots-tag": "nofollow, NOINDEX"}),
        (200, {"content-type": "text/html", "x-robots-tag": "googlebot: noindex"}),
        (200, {"content-type": "text/html", "x-robots-tag": "none"}),
    ],
)
def test_other_responses_are_not_candidates(status: int, headers: dict[str, str]) -> None:
    assert not is_prerender_candidate(status, headers)


# ------------------------------------------------------------------------------------------ render-now

RENDER_NOW = RenderNow(enabled=True, token="rn-secret")


def _policy(
    request: dict[str, str],
    *,
    render_now: RenderNow = RENDER_NOW,
    route_class: str = "prerender",
    method: str = "GET",
) -> origin_rules.ServingPolicy:
    return serving_policy(render_now, route_class=route_class, method=method, request_headers=request)


def test_without_the_token_the_policy_is_plain_origin() -> None:
    policy = _policy({})
    assert (policy.authorized, policy.skip_cache, policy.miss_mode, policy.miss_mode_explicit) == (
        False,
        False,
        "origin",
        False,
    )


def test_the_right_token_authorizes_with_the_default_miss_mode() -> None:
    policy = _policy({"x-harper-render-now": "rn-secret"})
    assert policy.authorized and policy.miss_mode == "prerender" and not policy.miss_mode_explicit


@pytest.mark.parametrize("presented", ["rn-secreT", "rn-secret ", "", "x", "rn-secret-and-then-some", "é"])
def test_a_wrong_token_of_any_length_is_refused(presented: str) -> None:
    assert not _policy({"x-harper-render-now": presented}).authorized


def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(origin_rules.hmac, "compare_digest", spy)
    assert _policy({"x-harper-render-now": "rn-secret"}).authorized
    assert compared == [(b"rn-secret", b"rn-secret")]


@pytest.mark.parametrize(
    ("render_now", "route_class", "method"),
    [
        (RENDER_NOW, "prerender", "HEAD"),
        (RENDER_NOW, "passthrough", "GET"),
        (RENDER_NOW, "unclassified", "GET"),
        (RenderNow(enabled=False, token="rn-secret"), "prerender", "GET"),
        (RenderNow(enabled=True, token=""), "prerender", "GET"),
        (RenderNow(enabled=True, token="rn-secret", header=""), "prerender", "GET"),
    ],
    ids=["head", "passthrough", "unclassified", "disabled", "empty-token", "empty-header"],
)
def test_render_now_fails_closed(render_now: RenderNow, route_class: str, method: str) -> None:
    request = {"x-harper-render-now": "rn-secret", "": "rn-secret"}
    assert not _policy(request, render_now=render_now, route_class=route_class, method=method).authorized


@pytest.mark.parametrize(
    ("cache_control", "skip"),
    [
        ("no-cache", True),
        ("max-age=0, No-Store", True),
        ('no-cache="x"', True),
        ("max-age=0", False),
        ("", False),
    ],
)
def test_no_cache_or_no_store_skips_the_cache_only_when_authorized(cache_control: str, skip: bool) -> None:
    assert _policy({"x-harper-render-now": "rn-secret", "cache-control": cache_control}).skip_cache is skip
    assert not _policy({"cache-control": cache_control}).skip_cache


@pytest.mark.parametrize(
    ("asked", "mode", "explicit"),
    [(" ORIGIN ", "origin", True), ("prerender", "prerender", True), ("bogus", "prerender", False)],
)
def test_the_miss_header_picks_the_miss_mode(asked: str, mode: str, explicit: bool) -> None:
    policy = _policy({"x-harper-render-now": "rn-secret", "x-harper-render-miss": asked})
    assert (policy.miss_mode, policy.miss_mode_explicit) == (mode, explicit)


def test_the_default_miss_mode_is_configurable() -> None:
    render_now = RenderNow(enabled=True, token="t", default_miss_mode="origin")
    assert _policy({"x-harper-render-now": "t"}, render_now=render_now).miss_mode == "origin"


# ------------------------------------------------------------------------------------------- unrouted


@pytest.mark.parametrize(
    ("path", "bucket"),
    [
        ("/help/contact", "/help/*"),
        ("/help/", "/help/*"),
        ("/foo", "/foo"),
        ("/%7Eu~!$&'()*+,;=:@[]-_.", "/%7Eu~!$&'()*+,;=:@[]-_."),
        ("/" + "s" * 64 + "/x", "/" + "s" * 64 + "/*"),
        ("/" + "s" * 65, None),  # a client's text, not a site's section
        ("/a b", None),
        ("/caf\u00e9", None),
        ("/", "/"),
        ("", "/"),
        (None, "/"),
        (42, "/"),
    ],
)
def test_unrouted_paths_bucket_by_first_segment(path: object, bucket: str | None) -> None:
    assert bucket_for_unrouted(path) == bucket


def test_a_non_cdn_source_suffixes_the_bucket() -> None:
    assert bucket_for_unrouted("/a/b", source="redirect") == "/a/* (redirect)"
