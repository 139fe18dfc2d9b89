"""The serve decision as one pure function: freshness verdicts, negotiation, 304s, debug headers,
origin relays (docs/serving.md#what-is-served-when)."""

from __future__ import annotations

import gzip

import brotli
import pytest

from prerender_ray.serving.answer import (
    asgi_headers,
    error_reply,
    origin_reply,
    page_reply,
    prepare,
    prepared_reply,
    route_label,
    verdict,
)
from prerender_ray.serving.negotiation import EncodingError
from prerender_ray.storage.pages import PageMeta

NOW = 1_780_000_000_000
HTML = b"<html><body>" + b"<p>hello</p>" * 50 + b"</body></html>"
LM = "Wed, 01 Jan 2025 00:00:00 GMT"


def page(**kw) -> PageMeta:
    fields = {"cache_key": "https://x.com/a|desktop", "status_code": 200, "last_cached": NOW - 5_000,
              "expires_at": NOW + 60_000,
              "headers": {"content-type": "text/html", "content-encoding": "gzip", "etag": '"v1"',
                          "last-modified": LM, "link": "</a.js>; rel=preload", "x-harper-rendered": "1",
                          "cache-control": "max-age=60"}}
    fields.update(kw)
    return PageMeta(**fields)


GZ = gzip.compress(HTML)


@pytest.mark.parametrize("expires, swr, expected", [
    (NOW + 1, 100, "hit"),
    (NOW, 100, "swr"),  # the expiry instant is already swr
    (NOW - 99, 100, "swr"),
    (NOW - 100, 100, "stale"),  # the upper edge is exclusive
    (NOW - 1, 0, "stale"),  # swrTtl 0 disables the window
    (None, 100, "stale"),  # no expiry: never served
])
def test_verdicts(expires, swr, expected) -> None:
    assert verdict(page(expires_at=expires), NOW, swr) == expected


def test_verdict_without_a_page_or_when_skipping() -> None:
    assert verdict(None, NOW, 100) == "miss"
    assert verdict(page(), NOW, 100, skip=True) == "skip"


def test_a_hit_keeps_the_stored_coding_drops_link_and_adds_age_and_vary() -> None:
    r = page_reply(page(), GZ, now=NOW, request_headers={"accept-encoding": "gzip, br"})
    h = dict(r.headers)
    for name, value in r.encoded:
        h[name.decode()] = value.decode()
    assert r.status == 200 and r.body == GZ
    assert h["content-encoding"] == "gzip" and h["content-length"] == str(len(GZ)) and h["age"] == "5"
    assert h["vary"] == "Accept-Encoding" and "link" not in h and h["etag"] == '"v1"'


@pytest.mark.parametrize("accept, coding", [
    (None, None), ("identity", None), ("gzip;q=0", None), ("br", "br"), ("GZIP", "gzip"),
    ("br;q=0.2, gzip;q=0.8", "gzip"), ("*;q=0, identity", None), ("&&&, ;;", None),
])
def test_negotiation_honours_q_values(accept, coding) -> None:
    r = page_reply(page(), GZ, now=NOW, request_headers={"accept-encoding": accept} if accept else {})
    headers = {k.decode(): v.decode() for k, v in r.asgi_headers()}
    assert headers.get("content-encoding") == coding
    decoded = {"gzip": gzip.decompress, "br": brotli.decompress, None: bytes}[coding](r.body)
    assert decoded == HTML and headers["content-length"] == str(len(r.body))
    assert headers["etag"] == ('"v1"' if coding == "gzip" else 'W/"v1"')  # re-coded bytes: weak


@pytest.mark.parametrize("request_headers, status", [
    ({"if-none-match": '"v1"'}, 304),
    ({"if-none-match": 'W/"v1"'}, 304),
    ({"if-none-match": '"x", "v1"'}, 304),
    ({"if-none-match": "*"}, 304),
    ({"if-none-match": '"x"', "if-modified-since": LM}, 200),  # INM decides alone
    ({"if-none-match": 'garbage"'}, 200),
    ({"if-modified-since": LM}, 304),
    ({"if-modified-since": "Tue, 31 Dec 2024 00:00:00 GMT"}, 200),
    ({"if-modified-since": "yesterday"}, 200),
])
def test_conditional_requests(request_headers, status) -> None:
    r = page_reply(page(), GZ, now=NOW, request_headers={"accept-encoding": "gzip", **request_headers},
                   debug={"x-harper-cache": "hit"})
    assert r.status == status
    if status == 304:
        names = {k.decode() for k, _ in r.asgi_headers()}
        assert r.body == b"" and names == {"etag", "last-modified", "cache-control", "vary", "age", "x-harper-cache"}


def test_a_non_200_page_is_never_downgraded_and_has_no_age() -> None:
    r = page_reply(page(status_code=404), GZ, now=NOW, request_headers={"if-none-match": "*"})
    assert r.status == 404 and "age" not in r.headers


@pytest.mark.parametrize("status", [204, 205, 304])
def test_a_stored_page_whose_status_carries_no_content_is_sent_without_a_body_or_length(status) -> None:
    """A client reads the bytes after a 204/304 as the next response (RFC 9112 section 6.3): a stored
    one (from a result before the ingress refused content with such a status) sends none."""
    for head in (False, True):
        r = page_reply(page(status_code=status), GZ, now=NOW, request_headers={"accept-encoding": "gzip"},
                       head=head)
        names = {k.decode() for k, _ in r.asgi_headers()}
        assert r.status == status and r.body == b""
        assert "content-length" not in names and "content-encoding" not in names


@pytest.mark.parametrize("status", [100, 103])
def test_a_stored_informational_page_is_never_answered(status) -> None:
    """A 1xx is no final answer: whatever follows it is read as the response."""
    with pytest.raises(EncodingError, match=str(status)):
        prepare(page(status_code=status), GZ, "gzip")


def test_head_gets_the_get_headers_without_a_body() -> None:
    get = page_reply(page(), GZ, now=NOW, request_headers={"accept-encoding": "br"})
    head = page_reply(page(), GZ, now=NOW, request_headers={"accept-encoding": "br"}, head=True)
    assert head.body == b"" and head.asgi_headers() == get.asgi_headers()


def test_a_prepared_page_is_reused_with_a_fresh_age() -> None:
    p = prepare(page(), GZ, "gzip")
    one = prepared_reply(p, last_cached=NOW - 5_000, now=NOW, request_headers={})
    two = prepared_reply(p, last_cached=NOW - 5_000, now=NOW + 3_000, request_headers={})
    assert one.headers["age"] == "5" and two.headers["age"] == "8" and one.body is two.body


def test_origin_answers_are_relayed_with_the_allowlist_and_location_on_redirects() -> None:
    r = origin_reply(301, [("Location", "/b"), ("Set-Cookie", "a=1"), ("Content-Length", "0")], b"",
                     request_headers={})
    assert r.status == 301 and r.headers["location"] == "/b" and "set-cookie" not in r.headers
    r = origin_reply(200, [("Content-Type", "text/html"), ("Content-Encoding", "gzip"), ("Via", "cdn"),
                           ("ETag", '"o"')], GZ, request_headers={"accept-encoding": "identity"})
    assert r.body == HTML and "content-encoding" not in r.headers and "via" not in r.headers
    assert r.headers["content-length"] == str(len(HTML))
    r = origin_reply(200, [("ETag", '"o"'), ("content-type", "text/html")], HTML,
                     request_headers={"if-none-match": '"o"'})
    assert r.status == 304 and r.body == b""
    r = origin_reply(200, [("ETag", '"o"')], HTML, request_headers={"if-none-match": '"o"'}, conditional=False)
    assert r.status == 200


def test_an_origin_coding_we_cannot_decode_is_relayed_as_sent() -> None:
    r = origin_reply(200, [("content-encoding", "zstd")], b"\x28\xb5\x2f\xfd", request_headers={})
    assert r.headers["content-encoding"] == "zstd" and r.body == b"\x28\xb5\x2f\xfd"
    assert r.headers["content-length"] == "4"


def test_an_origin_bomb_is_relayed_as_coded_never_decoded_past_the_cap() -> None:
    bomb = brotli.compress(bytes(4 * 1024 * 1024), quality=3)
    r = origin_reply(200, [("content-encoding", "br"), ("content-type", "text/html")], bomb,
                     request_headers={}, max_bytes=1024 * 1024)
    assert r.headers["content-encoding"] == "br" and r.body == bomb
    r = origin_reply(200, [("content-encoding", "br")], brotli.compress(HTML), request_headers={},
                     max_bytes=len(HTML))
    assert "content-encoding" not in r.headers and r.body == HTML  # under the cap: decoded as before


def test_a_stored_page_past_the_cap_is_not_prepared() -> None:
    from prerender_ray.serving.negotiation import EncodingError

    with pytest.raises(EncodingError, match="more than"):
        prepare(page(), gzip.compress(HTML), None, len(HTML) - 1)
    assert prepare(page(), gzip.compress(HTML), None, len(HTML)).body == HTML


def test_a_stored_body_that_is_not_what_its_coding_says_raises() -> None:
    from prerender_ray.serving.negotiation import EncodingError

    with pytest.raises(EncodingError):
        prepare(page(), b"not gzip at all", "identity")


def test_headers_that_could_split_a_response_are_never_sent() -> None:
    assert asgi_headers({"x-ok": "1", "x-bad": "a\r\nset-cookie: x", "x-nul": "a\x00", "x-ctl": "a\x01",
                         "bad name": "1", "": "1", "x-tab": "a\tb"}) == [(b"x-ok", b"1"), (b"x-tab", b"a\tb")]
    assert asgi_headers({"x-utf8": "caf\u00e9 \u2713"}) == [(b"x-utf8", "caf\u00e9 \u2713".encode())]


def test_error_replies_are_json_and_route_labels_fall_back() -> None:
    r = error_reply(504, "too slow", reason="origin-timeout")
    assert r.status == 504 and r.headers["content-type"] == "application/json"
    assert b'"reason":"origin-timeout"' in r.body
    assert route_label("/catalog/", "prerender") == "/catalog/"
    assert route_label(None, "prerender") == "prerender"
    assert route_label(None, None) == "unrouted"
