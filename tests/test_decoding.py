"""Streaming, output-capped decode of gzip and br (prerender_ray/decoding.py)."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import brotli
import pytest

from prerender_ray.decoding import PIECE, DecodeError, Decoder, TooLarge, decode, decoded_size

HTML = b"".join(b"<div class=row>%d %x</div>\n" % (i, i * 2654435761 % 2**32) for i in range(20_000))
ENCODE = {"gzip": gzip.compress, "br": lambda b: brotli.compress(b, quality=5), "identity": bytes}
CODED = {coding: encode(HTML) for coding, encode in ENCODE.items()}  # 700 KB: several pieces


def zeros_bomb(coding: str, mib: int) -> bytes:
    """``mib`` MiB of zeros, compressed a MiB at a time (never held whole)."""
    chunk = bytes(1 << 20)
    if coding == "br":
        c = brotli.Compressor(quality=3)
        return b"".join([c.process(chunk) for _ in range(mib)] + [c.finish()])
    z = zlib.compressobj(9, wbits=31)
    return b"".join([z.compress(chunk) for _ in range(mib)] + [z.flush()])


@pytest.mark.parametrize("coding", ["gzip", "br", "identity"])
def test_a_good_stream_decodes_whole_and_in_any_chunking(coding) -> None:
    data = CODED[coding]
    assert decode(data, coding) == HTML and decode(memoryview(data), coding) == HTML
    assert decoded_size(data, coding) == len(HTML)
    d = Decoder(coding)
    out = b"".join(p for i in range(0, len(data), 777) for p in d.feed(data[i:i + 777]))
    d.finish()
    assert out == HTML and d.size == len(HTML)


def test_several_gzip_members_and_nul_padding_are_one_stream_as_gzip_allows() -> None:
    data = gzip.compress(b"<html>") + gzip.compress(b"</html>") + b"\0" * 7
    assert decode(data, "gzip") == gzip.decompress(data) == b"<html></html>"


def _corrupt_middle(data: bytes) -> bytes:
    mid = len(data) // 2
    return data[:mid] + bytes(b ^ 0x5A for b in data[mid:mid + 32]) + data[mid + 32:]


@pytest.mark.parametrize("coding", ["gzip", "br"])
@pytest.mark.parametrize("damage", ["truncated", "corrupt middle", "trailing garbage", "one byte"])
def test_a_damaged_stream_is_refused(coding, damage) -> None:
    good = CODED[coding]
    bad = {"truncated": good[:-9], "corrupt middle": _corrupt_middle(good),
           "trailing garbage": good + b"<script>", "one byte": good[:1]}[damage]
    with pytest.raises(DecodeError) as e:
        decode(bad, coding)
    assert not isinstance(e.value, TooLarge)
    with pytest.raises(DecodeError):
        decoded_size(bad, coding)


def test_plain_html_labelled_gzip_or_br_is_refused() -> None:
    for coding in ("gzip", "br"):
        with pytest.raises(DecodeError):
            decoded_size(b"<html>not coded</html>", coding)


def test_gzip_members_past_max_members_are_refused_at_the_first_extra() -> None:
    data = gzip.compress(b"<html>") + gzip.compress(b"</html>")
    assert decoded_size(data, "gzip", max_members=2) == len(b"<html></html>")
    with pytest.raises(DecodeError, match="more than 1 gzip members"):
        decoded_size(data, "gzip", max_members=1)
    d = Decoder("gzip", max_members=3)
    with pytest.raises(DecodeError, match="more than 3 gzip members"):
        for _ in d.feed(gzip.compress(b"") * 1_000_000):  # 20 MB: stops after the fourth
            pass
    assert d.size == 0


def test_sitemaps_may_ignore_garbage_after_a_gzip_member() -> None:
    d = Decoder("gzip", None, trailing_garbage=True)
    assert b"".join(d.feed(gzip.compress(b"<urlset/>") + b"junk")) == b"<urlset/>"
    d.finish()


@pytest.mark.parametrize("coding", ["gzip", "br"])
def test_a_bomb_stops_at_the_cap_without_producing_the_rest(coding) -> None:
    bomb = zeros_bomb(coding, 64)  # 64 MiB of zeros in 65 KB of gzip or 1 KB of br
    limit = 4 * 1024 * 1024
    d = Decoder(coding, limit)
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge):
            for _ in d.feed(bomb):
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert limit < d.size <= limit + 2 * PIECE  # stopped within one piece past the cap
    assert peak < 4 * PIECE  # pieces are dropped as they come: the cap is never even allocated
    with pytest.raises(TooLarge, match=f"more than {limit} bytes"):
        decode(bomb, coding, limit)


def test_identity_counts_against_the_cap_too() -> None:
    assert decoded_size(b"x" * 100, "identity", 100) == 100
    with pytest.raises(TooLarge):
        decoded_size(b"x" * 101, "identity", 100)
    with pytest.raises(TooLarge):
        decode(b"x" * 101, "identity", 100)


def test_exactly_the_cap_is_accepted() -> None:
    for coding in ("gzip", "br"):
        assert decoded_size(CODED[coding], coding, len(HTML)) == len(HTML)
        with pytest.raises(TooLarge):
            decoded_size(CODED[coding], coding, len(HTML) - 1)


def test_an_unknown_coding_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="zstd"):
        Decoder("zstd")
