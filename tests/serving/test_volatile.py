"""The content hash ignores per-response noise it can identify, and nothing else."""

from __future__ import annotations

import gzip
import re

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.decoding import TooLarge, decoded_digest
from prerender_ray.serving import volatile
from prerender_ray.serving.volatile import (
    MAX_CANDIDATES,
    MAX_TAG,
    Budget,
    Normalizer,
    content_digest,
    normalized,
)

PAGE = (b'<!doctype html><html><head><meta http-equiv="Content-Security-Policy" '
        b"content=\"script-src 'self' 'nonce-QWxhZGRpbjpvcGVu'; style-src 'nonce-QWxhZGRpbjpvcGVu'\">"
        b'<meta name="csrf-token" content="k3Jd9a-Zx_0=">'
        b'<script nonce="QWxhZGRpbjpvcGVu" src="/app.js"></script>'
        b"<style nonce='QWxhZGRpbjpvcGVu'>p{color:red}</style>"
        b'<link rel="preload" as="script" nonce=QWxhZGRpbjpvcGVu href="/x.js">'
        b"</head><body><h1>Shoes</h1><p>In stock: 4</p></body></html>")


def varied(nonce: bytes = b"QWxhZGRpbjpvcGVu", token: bytes = b"k3Jd9a-Zx_0=") -> bytes:
    return PAGE.replace(b"QWxhZGRpbjpvcGVu", nonce).replace(b"k3Jd9a-Zx_0=", token)


def test_nonces_and_csrf_tokens_do_not_change_the_hash() -> None:
    base = content_digest(PAGE, "identity")
    assert content_digest(varied(b"Zm9vYmFyYmF6cXV4"), "identity") == base
    assert content_digest(varied(token=b"another-token"), "identity") == base
    assert content_digest(varied(b"x", b"y"), "identity") == base


@pytest.mark.parametrize("edit", [
    (b"In stock: 4", b"In stock: 3"),  # the text
    (b'src="/app.js"', b'src="/app2.js"'),  # an attribute next to a nonce
    (b"script-src 'self'", b"script-src 'unsafe-inline'"),  # the policy itself
    (b'name="csrf-token"', b'name="description"'),  # a meta that is not a token
])
def test_any_other_change_changes_the_hash(edit: tuple[bytes, bytes]) -> None:
    assert content_digest(PAGE.replace(*edit), "identity") != content_digest(PAGE, "identity")


@pytest.mark.parametrize("doc", [
    b'<head><meta name="description" content="Red shoes"></head>',  # a meta that is no token
    b'<body><p>Set nonce="Red" on the tag</p></body>',  # text that looks like a nonce is text
    b'<body><div nonce="Red">a div</div></body>',  # a nonce on an element it means nothing on
    b'<body><script data-x="a>b" nonce="Red"></script></body>',  # unsure where the tag is: as it is
])
def test_values_outside_the_places_it_knows_count(doc: bytes) -> None:
    assert content_digest(doc, "identity") != content_digest(doc.replace(b"Red", b"Blue"), "identity")


def test_a_long_run_without_a_tag_end_is_passed_on_in_bounded_pieces(monkeypatch) -> None:
    monkeypatch.setattr(volatile, "MAX_SEGMENT", 1000)
    out: list[bytes] = []
    n = Normalizer(out.append)
    for _ in range(10):
        n.feed(b"z" * 300)
        assert len(n._carry) <= 1300
    n.finish()
    assert b"".join(out) == b"z" * 3000


def test_a_page_without_noise_hashes_as_its_raw_bytes() -> None:
    html = b"<html><body>" + b"<p>plain</p>" * 1000 + b"</body></html>"
    assert content_digest(html, "identity") == decoded_digest(html, "identity", None)


def test_every_coding_gives_the_same_hash_and_the_cap_holds() -> None:
    big = varied() * 200
    tags = {content_digest(c, coding) for c, coding in
            ((big, "identity"), (gzip.compress(big), "gzip"), (brotli.compress(big), "br"))}
    assert tags == {content_digest(normalized(big), "identity")}
    with pytest.raises(TooLarge):
        content_digest(gzip.compress(big), "gzip", 1000)


def streamed(doc: bytes, cuts: list[int], limit: int = MAX_CANDIDATES) -> bytes:
    """``doc`` through a Normalizer, fed in pieces cut at ``cuts`` (modulo its length)."""
    out: list[bytes] = []
    n = Normalizer(out.append, limit)
    last = 0
    for cut in sorted(c % (len(doc) + 1) for c in cuts):
        n.feed(doc[last:cut])
        last = cut
    n.feed(doc[last:])
    n.finish()
    return b"".join(out)


@settings(deadline=None)  # a loaded machine is slow; speed is the benchmarks' business
@given(st.lists(st.integers(min_value=0, max_value=12_000), max_size=12), st.integers(min_value=0, max_value=9))
def test_streamed_in_any_pieces_is_the_whole_normalized(cuts: list[int], filler: int) -> None:
    # tags straddling piece borders, and a tag longer than the bound (hashed as it is) among them
    doc = (b"x" * (filler * 997) + varied() + b"<script nonce='" + b"n" * (MAX_TAG + 50) + b"'>" + varied()) * 2
    assert streamed(doc, cuts) == normalized(doc)
    assert b"QWxhZGRpbjpvcGVu" not in normalized(varied())


# ------------------------------------------------------------------ a page of millions of candidates

_OLD_META = re.compile(rb"<meta\b[^<>]{0,%d}>" % MAX_TAG)  # every meta a candidate


def _old_normalized(data: bytes) -> bytes:
    """The pass before candidates were bounded: the oracle below the bound."""
    nonce = b"nonce" in data
    if nonce:
        data = volatile._NONCE.sub(volatile._nonce, data)
    if nonce or b"csrf-token" in data:
        data = _OLD_META.sub(volatile._meta, data)
    return data


PIECES = [b"<script ", b"<style ", b"<link ", b"<meta ", b"<div ", b"nonce", b"=", b'"a"', b"'b'", b"c", b" ", b">",
          b"<", b"name=", b"csrf-token", b"csp-nonce", b"content=", b"'nonce-x'", b"/", b"\n", b"http-equiv=x "]


@settings(deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=60))
def test_below_the_bound_it_blanks_what_it_always_did(parts: list[bytes]) -> None:
    doc = b"".join(parts)
    assert normalized(doc) == _old_normalized(doc)


@pytest.mark.parametrize("unit", [b"<script nonce=a>", b" nonce=a", b"<meta name=csrf-token content=a>",
                                  b"<meta content=\"'nonce-a'\">"])
def test_a_page_of_candidates_costs_a_bounded_number_of_calls(monkeypatch, unit: bytes) -> None:
    calls = []
    for name in ("_nonce", "_meta"):
        fn = getattr(volatile, name)
        monkeypatch.setattr(volatile, name, lambda m, fn=fn: calls.append(1) or fn(m))
    doc = b"<html>" + unit * (3 * MAX_CANDIDATES)
    out = normalized(doc)
    assert len(calls) <= 2 * MAX_CANDIDATES  # one bound a kind, however many the page holds
    if unit.startswith(b"<"):  # a candidate blanks: the first ones are, the rest pass as they are
        assert out != doc and out.endswith(unit * MAX_CANDIDATES)


@settings(deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4000), max_size=8))
def test_the_bound_holds_the_same_whatever_the_pieces(cuts: list[int]) -> None:
    doc = (varied() + b"<script nonce=q>" * 3 + b'<meta name="csrf-token" content="t">') * 6
    assert streamed(doc, cuts, limit=5) == normalized(doc, Budget(5)) != doc
