"""URL canonicalization: the shared vectors, the reference's pinned edge cases, our deliberate
differences, and properties (idempotence, one key per URL, fast path == ada path)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import ada_url
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prerender_ray.identity.urls import (
    MAX_URL_LENGTH,
    UrlError,
    _ada_parts,
    _fast_parts,
    canonicalize_url,
    url_host,
    url_path,
    whatwg_path,
)

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors/canonicalize-url.json").read_text())
OPTION_NAMES = {
    "plusIsSpace": "plus_is_space", "trailingSlash": "trailing_slash", "decodeReserved": "decode_reserved"
}
PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def canon(url: str, allowlist: tuple[str, ...] = ("*",), **options: object) -> str:
    return canonicalize_url(url, allowlist, **options)  # type: ignore[arg-type]


def _options(vector: dict) -> dict:
    return {OPTION_NAMES[k]: v for k, v in vector.get("options", {}).items()}


# ------------------------------------------------------------------------------------- vectors


def test_there_are_26_shared_vectors() -> None:
    assert len(VECTORS) == 26


@pytest.mark.parametrize("vector", VECTORS, ids=[v["url"][:70] for v in VECTORS])
def test_each_shared_vector_canonicalizes_to_its_expected_output(vector: dict) -> None:
    assert canonicalize_url(vector["url"], vector["allowlist"], **_options(vector)) == vector["expected"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["url"][:70] for v in VECTORS])
def test_each_expected_output_canonicalizes_to_itself(vector: dict) -> None:
    expected = vector["expected"]
    assert canonicalize_url(expected, vector["allowlist"], **_options(vector)) == expected
    assert ada_url.URL(expected).href == expected  # and a WHATWG parser reads it back unchanged


# ----------------------------------------------------------------------- reference edge cases


def test_the_default_allowlist_keeps_only_page_and_drops_the_fragment() -> None:
    assert canon("https://x.com/a?foo=1&page=2&bar=3#frag", ("page",)) == "https://x.com/a?page=2"


def test_an_empty_allowlist_drops_every_param_and_a_star_keeps_all_sorted() -> None:
    assert canon("https://x.com/a?foo=1&bar=2", ()) == "https://x.com/a"
    assert canon("https://x.com/a?foo=1&bar=2", ("*",)) == "https://x.com/a?bar=2&foo=1"


def test_a_custom_allowlist_keeps_each_listed_param_sorted() -> None:
    assert canon("https://x.com/a?page=2&x=1&ref=home", ("ref", "page")) == "https://x.com/a?page=2&ref=home"


def test_a_facet_value_is_not_form_decoded() -> None:
    url = "https://x.com/c?f=Two%20Words+Kind:Sample"
    assert canon(url) == url


def test_encoded_sub_delimiters_and_their_literals_give_one_key() -> None:
    assert canon("https://x.com/a%3Ab?f=%3A%2C%40") == canon("https://x.com/a:b?f=:,@") == "https://x.com/a:b?f=:,@"


def test_structural_escapes_stay_encoded() -> None:
    assert canon("https://x.com/a?q=%26%3D%3B") == "https://x.com/a?q=%26%3D%3B"


def test_a_literal_pipe_is_encoded_and_collapses_with_its_escape() -> None:
    assert canon("https://x.com/a|b?x=c|d") == canon("https://x.com/a%7cb?x=c%7Cd") == "https://x.com/a%7Cb?x=c%7Cd"


def test_one_trailing_slash_is_stripped_but_never_the_root() -> None:
    assert canon("https://x.com/a/") == "https://x.com/a"
    assert canon("https://x.com/") == "https://x.com/"
    assert canon("https://x.com") == "https://x.com/"


def test_preserve_keeps_the_trailing_slash_as_written() -> None:
    assert canon("https://x.com/a/", trailing_slash="preserve") == "https://x.com/a/"
    assert canon("https://x.com/a", trailing_slash="preserve") == "https://x.com/a"


def test_a_url_object_is_accepted_and_the_explicit_allowlist_applies() -> None:
    assert canonicalize_url(ada_url.URL("https://x.com/a?page=1&b=2"), ["b"]) == "https://x.com/a?b=2"


def test_unreserved_escapes_are_decoded() -> None:
    assert canon("https://x.com/%68ello/w%6Frld") == "https://x.com/hello/world"
    assert canon("https://x.com/%41%2D%5F%7E%39") == "https://x.com/A-_~9"


def test_dot_segments_resolve_even_when_encoded_and_an_inner_dot_escape_decodes() -> None:
    assert canon("https://x.com/p/%2E%2E/x") == "https://x.com/x"
    assert canon("https://x.com/a/%2e") == "https://x.com/a"
    assert canon("https://x.com/a%2Eb?f=1%2E5") == "https://x.com/a.b?f=1.5"


def test_structural_escapes_are_never_decoded_and_hex_is_upper_cased() -> None:
    url = "https://x.com/c?f=Coats%20%26%20Jackets%2FOuterwear%2Bx"
    assert canon(url) == url
    assert canon("https://x.com/c?f=a%2fb") == "https://x.com/c?f=a%2Fb"


def test_an_empty_decode_reserved_keeps_sub_delimiters_but_still_decodes_unreserved() -> None:
    assert canon("https://x.com/%68i?f=%3A%2C%40", decode_reserved=()) == "https://x.com/hi?f=%3A%2C%40"


def test_a_partial_decode_reserved_leaves_the_others_encoded() -> None:
    assert canon("https://x.com/a?f=%3A%2C%40", decode_reserved=(":", "@")) == "https://x.com/a?f=:%2C@"


def test_every_allowed_decode_reserved_character_can_be_decoded() -> None:
    escaped = "%3B%24%28%29%21%2A"
    assert canon(f"https://x.com/{escaped}", decode_reserved=tuple(";$()!*")) == "https://x.com/;$()!*"


def test_a_decoded_apostrophe_applies_to_the_path_but_a_query_keeps_its_escape() -> None:
    # A WHATWG parser encodes a literal ' in a query, so decoding it there would give a URL that
    # the renderer's browser spells differently from our key.
    out = canon("https://x.com/it%27s?q=it%27s&r=it's", decode_reserved=("'",))
    assert out == "https://x.com/it's?q=it%27s&r=it%27s"
    assert ada_url.URL(out).href == out


def test_an_invalid_decode_reserved_entry_raises_instead_of_being_ignored() -> None:
    # The reference silently keeps the previous list; here the config validator refuses such a list
    # and the function refuses it too.
    for bad in ([":", "&"], ["="], ["/"], ["%"], ["|"], ["::"]):
        with pytest.raises(ValueError, match="decode_reserved"):
            canon("https://x.com/", decode_reserved=bad)


def test_options_hold_no_state_between_calls() -> None:
    url = "https://x.com/a?f=%2C"
    assert canon(url, decode_reserved=(":",)) == "https://x.com/a?f=%2C"
    assert canon(url) == "https://x.com/a?f=,"
    assert canon(url, decode_reserved=(":",)) == "https://x.com/a?f=%2C"


def test_an_invalid_trailing_slash_mode_raises() -> None:
    with pytest.raises(ValueError, match="trailing_slash"):
        canon("https://x.com/a/", trailing_slash="sometimes")


def test_plus_is_space_off_keeps_two_spellings_apart() -> None:
    assert canon("https://x.com/c?f=Bath%20Rugs") != canon("https://x.com/c?f=Bath+Rugs")


def test_plus_is_space_on_folds_the_query_only_and_never_an_encoded_plus() -> None:
    on = {"plus_is_space": True}
    assert canon("https://x.com/c?f=Bath%20Rugs", **on) == canon("https://x.com/c?f=Bath+Rugs", **on)
    assert canon("https://x.com/a%20b?f=x", **on) == "https://x.com/a%20b?f=x"
    assert canon("https://x.com/c?f=ACME%2BCO", **on) != canon("https://x.com/c?f=ACME+CO", **on)


def test_plus_is_space_folds_before_the_sort() -> None:
    on = {"plus_is_space": True}
    assert canon("https://x.com/c?b=x%20y&a=1", **on) == canon("https://x.com/c?a=1&b=x+y", **on)


# ------------------------------------------------------------------------- what WHATWG contributes


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("HTTPS://EXAMPLE.COM/A", "https://example.com/A"),
        ("https://bücher.de/", "https://xn--bcher-kva.de/"),
        ("https://example.com./a", "https://example.com./a"),
        ("https://0x7f.1/", "https://127.0.0.1/"),
        ("https://192.168.0.1./", "https://192.168.0.1/"),
        ("https://[2001:DB8::1]:8443/", "https://[2001:db8::1]:8443/"),
        ("https://x.com:443/", "https://x.com/"),
        ("https://x.com:0443/", "https://x.com/"),
        ("http://x.com:80/", "http://x.com/"),
        ("https://x.com:80/", "https://x.com:80/"),
        ("https://x.com:08080/", "https://x.com:8080/"),
        ("https://x.com\\a\\b", "https://x.com/a/b"),
        ("  https://x.com/a  ", "https://x.com/a"),
        ("https:/x.com/p", "https://x.com/p"),
        ("https://x.com/a//b", "https://x.com/a//b"),
        ("https://x.com?", "https://x.com/"),
        ("https://x.com/a b\"<>`{}", "https://x.com/a%20b%22%3C%3E%60%7B%7D"),
        ("https://x.com/?q=a b\"<>'", "https://x.com/?q=a%20b%22%3C%3E%27"),
        ("https://x.com/é?é=ü", "https://x.com/%C3%A9?%C3%A9=%C3%BC"),
        ("https://x.com/[a]?b=[c]{d}^e`", "https://x.com/[a]?b=[c]{d}^e`"),
    ],
)
def test_the_whatwg_parser_normalizes_scheme_host_port_path_and_encoding(url: str, expected: str) -> None:
    assert canon(url) == expected


def test_a_caret_in_the_path_is_encoded_as_current_whatwg_does() -> None:
    # Node 20 kept `^` literal in a path; ada follows the current spec. Pinned so a change shows.
    assert canon("https://x.com/a^b?c=d^e") == "https://x.com/a%5Eb?c=d^e"


def test_userinfo_and_the_fragment_are_dropped() -> None:
    assert canon("https://user:pw@x.com:8080/a?b=1#top") == "https://x.com:8080/a?b=1"


def test_empty_query_segments_vanish_and_no_bare_question_mark_is_left() -> None:
    assert canon("https://x.com/a?&&b=1&") == "https://x.com/a?b=1"
    assert canon("https://x.com/a?&&") == "https://x.com/a"
    assert canon("https://x.com/a?utm=1", ()) == "https://x.com/a"


def test_a_valueless_key_sorts_as_the_whole_segment() -> None:
    assert canon("https://x.com/a?a=1&a1=2&flag") == "https://x.com/a?a1=2&a=1&flag"


# ------------------------------------------------------------------------------- the allowlist


def test_a_key_matches_the_allowlist_after_strict_percent_decoding() -> None:
    assert canon("https://x.com/a?pa%67e=2&x=1", ("page",)) == "https://x.com/a?page=2"
    assert canon("https://x.com/a?%C3%A9t%C3%A9=1", ("été",)) == "https://x.com/a?%C3%A9t%C3%A9=1"


def test_a_plus_in_a_key_is_not_a_space_for_the_allowlist() -> None:
    assert canon("https://x.com/a?a+b=1&a%20b=2", ("a b",)) == "https://x.com/a?a%20b=2"


def test_a_key_that_does_not_decode_is_compared_as_written() -> None:
    assert canon("https://x.com/a?k%zz=1&%FF=2", ("k%zz", "%FF")) == "https://x.com/a?%FF=2&k%zz=1"
    assert canon("https://x.com/a?k%zz=1", ("k",)) == "https://x.com/a"


def test_the_allowlist_is_case_sensitive() -> None:
    assert canon("https://x.com/a?Page=2", ("page",)) == "https://x.com/a"


def test_with_plus_is_space_a_plus_in_a_key_is_a_space_for_the_allowlist_too() -> None:
    # Deliberate: the reference keeps `a%20b` for ["a b"], folds it to `a+b`, then drops that on
    # the next pass. Here both spellings are kept, and the result is a fixed point.
    on = {"plus_is_space": True}
    out = canon("https://x.com/a?a%20b=1", ("a b",), **on)
    assert out == "https://x.com/a?a+b=1"
    assert canon(out, ("a b",), **on) == out


# --------------------------------------------------- idempotence (docs/serving.md#url-canonicalization)


def test_escapes_are_normalized_before_sorting_so_one_pass_is_enough() -> None:
    out = canon("https://x.com/a?%62=1&a=2")
    assert out == "https://x.com/a?a=2&b=1"
    assert canon(out) == out


def test_a_literal_pipe_is_encoded_before_sorting() -> None:
    out = canon("https://x.com/a?x|=1&x=2")
    assert out == "https://x.com/a?x%7C=1&x=2"
    assert canon(out) == out


def test_every_trailing_slash_is_stripped_so_the_result_is_a_fixed_point() -> None:
    assert canon("https://x.com/a//") == "https://x.com/a"
    assert canon("https://x.com//") == "https://x.com/"
    assert canon("https://x.com/a//", trailing_slash="preserve") == "https://x.com/a//"


def test_a_decoded_hex_digit_never_completes_an_escape_with_a_stray_percent() -> None:
    for url, expected in [
        ("https://x.com/%%34%31", "https://x.com/%%341"),
        ("https://x.com/%4%31", "https://x.com/%4%31"),
        ("https://x.com/?q=%%36%31&r=%a%62", "https://x.com/?q=%%361&r=%a%62"),
    ]:
        out = canon(url)
        assert out == expected
        assert canon(out) == out


def test_invalid_escapes_are_left_exactly_as_they_are() -> None:
    assert canon("https://x.com/a%zz%A?b=%g1%") == "https://x.com/a%zz%A?b=%g1%"


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("/a/b", "relative"),
        ("example.com/x", "relative"),
        ("https%3A%2F%2Fx.com%2F", "relative"),
        ("ftp://x.com/a", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("mailto:a@b.c", "scheme"),
        ("https://", "unparseable"),
        ("https://x.com:99999/", "unparseable"),
        ("https://exa mple.com/", "unparseable"),
        ("https://example.123/", "unparseable"),
        ("https://x.com/a\nb", "control-character"),
        ("https://x.com/a\tb", "control-character"),
        ("https://x.com/a\x00", "control-character"),
        ("https://x.com/\r\nSet-Cookie: a=b", "control-character"),
        ("https://x.com/#\x7f", "control-character"),
        ("https://x.com/\ud800", "unparseable"),
        ("https://x.com/" + "a" * MAX_URL_LENGTH, "too-long"),
    ],
)
def test_bad_input_raises_a_url_error_with_a_reason(url: str, reason: str) -> None:
    with pytest.raises(UrlError) as caught:
        canon(url)
    assert caught.value.reason == reason
    assert str(caught.value)  # a message an operator can read


def test_a_url_error_is_a_value_error() -> None:
    assert issubclass(UrlError, ValueError)


def test_a_non_string_input_raises_a_url_error() -> None:
    with pytest.raises(UrlError, match="expected a URL string"):
        canonicalize_url(42, ["*"])  # type: ignore[arg-type]


def test_a_canonical_url_that_grows_past_the_limit_is_refused() -> None:
    url = "https://x.com/" + "|" * (MAX_URL_LENGTH // 2)  # every | becomes %7C
    with pytest.raises(UrlError) as caught:
        canon(url)
    assert caught.value.reason == "too-long"


def test_bytes_that_are_not_utf8_are_percent_encoded_as_bytes() -> None:
    raw_path = b"/caf\xe9".decode("utf-8", "surrogateescape")
    assert canon("https://x.com" + raw_path) == "https://x.com/caf%E9"


# -------------------------------------------------------------------------------------- helpers


def test_url_host_and_url_path_split_a_canonical_url() -> None:
    assert url_host("https://x.com:8080/a?b=1") == "x.com"
    assert url_host("https://[::1]:8080/a") == "[::1]"
    assert url_path("https://x.com:8080/a/b?c=d") == "/a/b"
    assert url_path("https://x.com/") == "/"


def test_whatwg_path_resolves_dots_but_keeps_escapes_and_the_trailing_slash() -> None:
    assert whatwg_path("https://x.com/a/../%63atalog/") == "/%63atalog/"
    assert whatwg_path("https://x.com") == "/"
    with pytest.raises(UrlError):
        whatwg_path("not a url")


# ------------------------------------------------------------------------------------ properties

_PIECES = ["a", "Z", "0", "9", "-", ".", "_", "~", "/", "%", "2", "e", "E", "f", "7", "C", "c", "|", ":", ",",
           "@", ";", "$", "'", "(", ")", "!", "*", "+", "=", "&", "?", "#", " ", "\\", "^", "`", "{", "}",
           "[", "]", '"', "<", ">", "é", "%2e", "%2E", "%2F", "%7c", "%41", "%61", "%20", "%3A", "%FF",
           "%C3%A9", "%%", "..", "xn--", "\t"]
_HOSTS = ["x.com", "X.Com", "a-b.example.org", "sub.EXAMPLE.co.uk", "localhost", "bücher.de",
          "xn--bcher-kva.de", "XN--bcher-kva.de", "127.0.0.1", "0x7f.1", "a..b", "-a.com", "a_b.com", "[::1]",
          "example.123", "x.com.", "a.0x", "a.0xg", "1.2.3.a", "exa mple.com", ""]
_SCHEMES = ["http", "https", "HTTP", "Https", "ftp", "ws"]
_SEPARATORS = ["://", ":/", ":\\\\", ":///", "://u:p@", "://@"]
_PORTS = ["", ":80", ":443", ":0443", ":8080", ":08080", ":65535", ":65536", ":", ":0"]


@st.composite
def url_like(draw: st.DrawFn) -> str:
    """URL-shaped strings that wander across every boundary of the fast path."""
    text = st.lists(st.sampled_from(_PIECES), max_size=14).map("".join)
    return (
        draw(st.sampled_from(_SCHEMES))
        + draw(st.sampled_from(_SEPARATORS))
        + draw(st.sampled_from(_HOSTS))
        + draw(st.sampled_from(_PORTS))
        + draw(st.sampled_from(["", "/"]))
        + draw(text)
        + draw(st.sampled_from(["", "?"]))
        + draw(text)
        + draw(st.sampled_from(["", "#", "#frag", "#\x01"]))
    )


@PROPERTY
@given(url_like())
def test_the_fast_path_returns_exactly_what_ada_returns(url: str) -> None:
    fast = _fast_parts(url)
    if fast is not None:
        assert fast == _ada_parts(url)


def test_the_fast_path_takes_the_common_forms() -> None:
    for url in ["https://www.example.com/c/shoes?page=2&utm_source=x#top", "HTTP://Shop.Example.COM:8080/a|b/",
                "https://x.com?a=1", "https://x.com/a%20b/c'd?q=[1]"]:
        assert _fast_parts(url) is not None, url


def test_the_fast_path_declines_what_only_ada_can_settle() -> None:
    for url in ["https://bücher.de/", "https://xn--bcher-kva.de/", "https://127.0.0.1/", "https://x.com./",
                "https://x.com/./a", "https://x.com/%2e%2E/a", "https://x.com/a\\b", "https://x.com/a b",
                "https://x.com:0443/", "https://u@x.com/", "https://x.com/?q='", "https://x.com/a^b"]:
        assert _fast_parts(url) is None, url


_OPTIONS = st.fixed_dictionaries({
    "plus_is_space": st.booleans(),
    "trailing_slash": st.sampled_from(["strip", "preserve"]),
    "decode_reserved": st.lists(st.sampled_from(list(":,@;$'()!*")), unique=True).map(tuple),
})
_ALLOWLISTS = st.sampled_from([("*",), (), ("page",), ("a", "b", "%zz", "a b", "|"), ("é", "q")])


@PROPERTY
@given(st.one_of(url_like(), st.text(max_size=60).map(lambda s: "https://x.com/" + s)), _ALLOWLISTS, _OPTIONS)
def test_canonicalizing_a_canonical_url_changes_nothing(url: str, allowlist: tuple, options: dict) -> None:
    try:
        once = canonicalize_url(url, allowlist, **options)
    except UrlError:
        return
    assert canonicalize_url(once, allowlist, **options) == once
    assert ada_url.URL(once).href == once


_SAFE = string.ascii_letters + string.digits + "-._~!$'()*,;:@"
_segment = st.text(alphabet=_SAFE, min_size=1, max_size=8).filter(lambda s: not s.startswith("."))
_KEYS = ["page", "sort", "q"]


@st.composite
def one_url_two_spellings(draw: st.DrawFn) -> tuple[str, str, tuple[str, ...]]:
    scheme = draw(st.sampled_from(["http", "https"]))
    host = draw(st.sampled_from(["example.com", "shop.example.co.uk", "bücher.de", "x.io"]))
    segments = draw(st.lists(_segment, min_size=1, max_size=4))
    values = st.text(alphabet=_SAFE, max_size=6)
    params = draw(st.lists(st.tuples(st.sampled_from(_KEYS), values), max_size=4))
    tracking = draw(st.lists(st.sampled_from(["utm_source=x", "gclid=1", "fbclid=2"]), max_size=2))

    def spell(variant: bool) -> str:
        s, h, segs = scheme, host, list(segments)
        if variant and draw(st.booleans()):
            s = "".join(c.upper() if draw(st.booleans()) else c for c in s)
        if variant and draw(st.booleans()):
            h = "".join(c.upper() if draw(st.booleans()) else c for c in h)
        port = {"http": ":80", "https": ":443"}[scheme] if variant and draw(st.booleans()) else ""
        userinfo = "user:pw@" if variant and draw(st.booleans()) else ""
        if variant:
            segs = [_escape_some(seg, draw) for seg in segs]
        path = "/" + "/".join(segs) + ("/" if variant and draw(st.booleans()) else "")
        query = [f"{k}={v}" for k, v in params] + tracking
        if variant:
            query = draw(st.permutations(query))
            query = [_escape_some(q, draw) for q in query]
        out = f"{s}://{userinfo}{h}{port}{path}"
        if query:
            out += "?" + "&".join(query)
        if variant and draw(st.booleans()):
            out += "#" + draw(st.text(alphabet=string.ascii_letters + " é#?/", max_size=5))
        return out

    return spell(False), spell(True), tuple(draw(st.sampled_from([("*",), ("page", "q"), ("sort",), ()])))


def _escape_some(text: str, draw: st.DrawFn) -> str:
    """Percent-encode some unreserved or decodable characters, hex in either case."""
    out = []
    for c in text:
        if c not in "=&" and draw(st.booleans()):
            hexed = f"{ord(c):02X}"
            out.append("%" + (hexed.lower() if draw(st.booleans()) else hexed))
        else:
            out.append(c)
    return "".join(out)


@PROPERTY
@given(one_url_two_spellings())
def test_one_url_spelled_two_ways_gets_one_key(case: tuple[str, str, tuple[str, ...]]) -> None:
    plain, variant, allowlist = case
    decode = tuple("':,@;$()!*")  # every sub-delimiter the spellings may escape
    assert canonicalize_url(plain, allowlist, decode_reserved=decode) == canonicalize_url(
        variant, allowlist, decode_reserved=decode
    )
