"""Content-encoding negotiation and transcoding (docs/serving.md#content-coding: q-values, Vary, HEAD)."""

from __future__ import annotations

import gzip

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.serving.negotiation import (
    MAX_CODINGS,
    PREFERENCE,
    EncodingError,
    UnsupportedEncoding,
    add_vary,
    choose_encoding,
    decode_body,
    encode_body,
    negotiate,
    parse_accept_encoding,
    transcode,
)

HTML = b"<!doctype html><html><body>" + b"<p>hello bots</p>" * 500 + b"</body></html>"
GZ = gzip.compress(HTML)
BR = brotli.compress(HTML)


def _choose(stored: str, accept: str | None) -> str:
    return choose_encoding(stored, parse_accept_encoding(accept))


def test_the_stored_encoding_is_kept_when_accepted() -> None:
    headers, body = negotiate({"content-encoding": "gzip", "content-type": "text/html"}, GZ, "gzip, deflate")
    assert body is GZ
    assert headers["content-encoding"] == "gzip"
    assert headers["content-length"] == str(len(GZ))


def test_an_identity_body_is_gzipped_for_a_gzip_client() -> None:
    headers, body = negotiate({"content-type": "text/html"}, HTML, "gzip")
    assert headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == HTML
    assert headers["content-length"] == str(len(body))


def test_a_gzip_body_is_decompressed_for_an_identity_client() -> None:
    headers, body = negotiate({"content-encoding": "gzip"}, GZ, "identity")
    assert body == HTML
    assert "content-encoding" not in headers
    assert headers["content-length"] == str(len(HTML))


def test_a_stored_gzip_body_stays_gzip_for_a_br_and_gzip_client() -> None:
    assert _choose("gzip", "br, gzip") == "gzip"


def test_an_identity_body_becomes_br_for_a_br_and_gzip_client() -> None:
    assert _choose("identity", "br, gzip") == "br"


def test_no_accept_encoding_means_identity() -> None:
    assert _choose("gzip", None) == "identity"
    assert _choose("br", "") == "identity"


def test_a_zero_q_refuses_a_coding() -> None:
    assert _choose("gzip", "gzip;q=0") == "identity"
    assert _choose("gzip", "gzip;q=0, br") == "br"


def test_a_better_ranked_coding_beats_the_stored_one() -> None:
    assert _choose("br", "br;q=0.5, gzip") == "gzip"
    assert _choose("gzip", "gzip;q=0.4, br;q=0.9") == "br"


def test_a_tie_keeps_the_stored_encoding() -> None:
    assert _choose("br", "gzip;q=0.8, br;q=0.8") == "br"
    assert _choose("gzip", "*") == "gzip"


def test_the_wildcard_covers_only_codings_not_listed() -> None:
    assert _choose("br", "br;q=0, *") == "gzip"
    assert _choose("gzip", "*;q=0, identity") == "identity"


def test_identity_ranks_below_any_listed_coding_unless_listed_itself() -> None:
    assert _choose("identity", "gzip;q=0.5") == "gzip"
    assert _choose("gzip", "identity, gzip;q=0.5") == "identity"


def test_a_refused_identity_is_honoured_when_another_coding_is_acceptable() -> None:
    assert _choose("identity", "identity;q=0, gzip;q=0.1") == "gzip"


def test_identity_is_the_fallback_when_everything_is_refused() -> None:
    assert _choose("gzip", "*;q=0") == "identity"
    assert _choose("gzip", "identity;q=0, gzip;q=0") == "identity"


def test_coding_tokens_are_case_insensitive_and_x_gzip_is_gzip() -> None:
    assert _choose("identity", "GZIP") == "gzip"
    assert _choose("identity", "X-Gzip") == "gzip"
    assert _choose("BR", "Br") == "br"


@pytest.mark.parametrize(
    "garbage", ["%%%", ";;;,,,", "gzip;q=abc", "gzip;q=2", "gzip;q=nan", "g zip", "\x00\x01"]
)
def test_garbage_accept_encoding_means_identity(garbage: str) -> None:
    assert _choose("gzip", garbage) == "identity"


def test_a_malformed_item_is_skipped_without_losing_the_rest() -> None:
    assert _choose("identity", "%%%, br;q=1.0, gzip;q=x") == "br"


def test_a_coding_listed_twice_keeps_its_refusal() -> None:
    assert _choose("gzip", "gzip, gzip;q=0") == "identity"


def test_an_unknown_stored_encoding_is_kept_when_the_client_asks_for_it() -> None:
    headers, body = negotiate({"content-encoding": "zstd"}, b"zstd bytes", "zstd, gzip;q=0.5")
    assert (headers["content-encoding"], body) == ("zstd", b"zstd bytes")


def test_an_unknown_stored_encoding_that_must_be_recoded_raises() -> None:
    with pytest.raises(UnsupportedEncoding):
        negotiate({"content-encoding": "zstd"}, b"zstd bytes", "gzip")


def test_a_corrupt_stored_body_raises_an_encoding_error() -> None:
    with pytest.raises(EncodingError):
        negotiate({"content-encoding": "gzip"}, b"not gzip", "br")
    with pytest.raises(EncodingError):
        decode_body(b"not brotli", "br")


def test_a_stored_body_is_never_decoded_past_the_cap() -> None:
    bomb = brotli.compress(bytes(8 * 1024 * 1024), quality=3)  # 8 MiB of zeros in a few bytes
    with pytest.raises(EncodingError, match="more than 1048576 bytes"):
        negotiate({"content-encoding": "br"}, bomb, None, max_bytes=1024 * 1024)
    with pytest.raises(EncodingError, match="more than"):
        decode_body(gzip.compress(HTML), "gzip", len(HTML) - 1)
    assert decode_body(BR, "br", len(HTML)) == HTML  # the cap itself is allowed
    with pytest.raises(EncodingError):  # a truncated stream no longer decodes to its first part
        decode_body(GZ[:-4], "gzip")
    # what is sent as stored is not decoded at all
    assert negotiate({"content-encoding": "br"}, bomb, "br", max_bytes=1024)[1] == bomb


def test_negotiated_responses_vary_on_accept_encoding() -> None:
    headers, _ = negotiate({"content-encoding": "gzip"}, GZ, "gzip")
    assert headers["vary"] == "Accept-Encoding"
    headers, _ = negotiate({"content-encoding": "gzip", "vary": "Accept-Language"}, GZ, None)
    assert headers["vary"] == "Accept-Language, Accept-Encoding"


def test_vary_lists_accept_encoding_once_and_leaves_a_star_alone() -> None:
    assert add_vary("accept-encoding, User-Agent") == "accept-encoding, User-Agent"
    assert add_vary("*") == "*"
    assert add_vary("  ") == "Accept-Encoding"


def test_head_gets_the_get_headers_and_no_body() -> None:
    for accept in ("br", "gzip", "identity", None, "gzip;q=0"):
        get_headers, get_body = negotiate({"content-encoding": "gzip", "etag": '"v1"'}, GZ, accept)
        head_headers, head_body = negotiate(
            {"content-encoding": "gzip", "etag": '"v1"'}, GZ, accept, head=True
        )
        assert head_body == b""
        assert head_headers == get_headers
        assert head_headers["content-length"] == str(len(get_body))


def test_head_does_not_keep_an_unaccepted_stored_encoding() -> None:
    headers, _ = negotiate({"content-encoding": "br"}, BR, "gzip", head=True)
    assert headers["content-encoding"] == "gzip"


def test_a_recoded_body_gets_a_weak_etag() -> None:
    headers, _ = negotiate({"content-encoding": "gzip", "etag": '"v1"'}, GZ, "br")
    assert headers["etag"] == 'W/"v1"'
    headers, _ = negotiate({"content-encoding": "gzip", "etag": 'w/"v1"'}, GZ, "br")
    assert headers["etag"] == 'w/"v1"'


def test_an_untouched_body_keeps_its_strong_etag() -> None:
    headers, _ = negotiate({"content-encoding": "gzip", "etag": '"v1"'}, GZ, "gzip")
    assert headers["etag"] == '"v1"'


def test_an_empty_body_is_sent_uncoded() -> None:
    headers, body = negotiate({"content-encoding": "gzip", "content-length": "99"}, b"", "br")
    assert body == b""
    assert "content-encoding" not in headers
    assert headers["content-length"] == "0"


def test_negotiation_does_not_change_the_stored_headers() -> None:
    stored = {"content-encoding": "gzip"}
    negotiate(stored, GZ, "br")
    assert stored == {"content-encoding": "gzip"}


def test_gzip_output_is_deterministic() -> None:
    assert encode_body(HTML, "gzip") == encode_body(HTML, "gzip")


def test_producing_an_unknown_coding_raises() -> None:
    with pytest.raises(UnsupportedEncoding):
        encode_body(HTML, "compress")


@given(st.text(max_size=200))
def test_any_accept_encoding_string_never_raises(value: str) -> None:
    for stored in ("gzip", "br", "identity"):
        assert _choose(stored, value) in PREFERENCE


_codings = st.sampled_from(["identity", "gzip", "br"])


@settings(deadline=None)
@given(st.binary(max_size=5_000), _codings, _codings)
def test_transcoding_round_trips_bytes(data: bytes, source: str, target: str) -> None:
    stored = encode_body(data, source)
    assert decode_body(transcode(stored, source, target), target) == data


@settings(deadline=None)
@given(st.binary(min_size=1, max_size=2_000), _codings, st.text(max_size=60))
def test_a_negotiated_body_always_decodes_to_the_original(data: bytes, stored: str, accept: str) -> None:
    headers, body = negotiate({"content-encoding": stored}, encode_body(data, stored), accept)
    assert decode_body(body, headers.get("content-encoding", "identity")) == data
    assert headers["content-length"] == str(len(body))


def test_only_the_first_items_of_an_accept_encoding_are_read() -> None:
    # a head may be 64 KiB: 40,000 empty items took 12 ms a request to parse
    assert parse_accept_encoding(", " * (MAX_CODINGS - 1) + "gzip").q("gzip") == 1.0
    assert parse_accept_encoding(", " * MAX_CODINGS + "gzip").q("gzip") == 0.0
    assert parse_accept_encoding("gzip, " + ", " * 40_000 + "gzip;q=0").q("gzip") == 1.0
