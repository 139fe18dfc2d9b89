"""An answer as the bytes uvicorn writes (api/bot/wire.py), against uvicorn's own checks."""

from __future__ import annotations

import pytest
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE

from prerender_ray.api.bot.wire import framed, header_lines, wire_reply
from prerender_ray.serving.answer import Reply
from prerender_ray.serving.dates import Dater

OK = [(b"content-type", b"text/html"), (b"Content-Length", b"3"), (b"x-a", b"v\tw")]


def test_uvicorns_checks_are_single_character_classes() -> None:
    # header_lines searches the names (and the values) joined by "a" at once: that finds what a
    # search of each finds only while each pattern is one character class without "a"
    for pattern in (HEADER_RE, HEADER_VALUE_RE):
        assert pattern.pattern.startswith(b"[") and pattern.pattern.endswith(b"]")
        assert pattern.pattern.count(b"[") - pattern.pattern.count(b"\\[") == 1
        assert not pattern.search(b"a")


def test_headers_are_written_lowercased_with_their_length() -> None:
    assert header_lines(OK) == (b"content-type: text/html\r\ncontent-length: 3\r\nx-a: v\tw\r\n", 3)
    assert header_lines([]) == (b"", None)


@pytest.mark.parametrize("where", range(3))
@pytest.mark.parametrize("bad", [(b"x y", b"v"), (b"x\x00", b"v"), (b"x", b"v\r\nInjected: 1"), (b"x", b"\x7f")])
def test_a_header_uvicorn_refuses_anywhere_is_refused(where: int, bad: tuple[bytes, bytes]) -> None:
    headers = list(OK)
    headers.insert(where, bad)
    assert header_lines(headers) is None


@pytest.mark.parametrize("name", [b"connection", b"Transfer-Encoding"])
def test_what_uvicorn_acts_on_is_left_to_it(name: bytes) -> None:
    assert header_lines([*OK, (name, b"close")]) is None
    assert header_lines([(b"content-length", b"x")]) is None


def test_a_body_is_written_whole_only_where_its_length_frames_it() -> None:
    assert framed("GET", 200, 3, 3) and framed("HEAD", 200, 0, 3)
    assert not framed("GET", 200, 2, 3) and not framed("GET", 200, 3, None)
    assert framed("GET", 304, 0, None) and not framed("GET", 200, 0, None)


def test_a_reply_is_dated_and_closed_as_asked() -> None:
    dater = Dater()
    out = wire_reply(Reply(200, {"content-type": "text/html", "content-length": "3"}, b"abc"), "GET", dater, True)
    assert out is not None and out[1] == b"abc"
    head = out[0]
    assert head.startswith(b"HTTP/1.1 200 OK\r\ndate: ") and head.endswith(b"connection: close\r\n\r\n")
    assert wire_reply(Reply(200, {"content-type": "text/html"}, b"abc"), "GET", dater, False) is None  # chunked
    head_only = wire_reply(Reply(200, {"content-length": "3"}, b"abc"), "HEAD", dater, False)
    assert head_only is not None and len(head_only) == 1 and head_only[0].endswith(b"\r\n\r\n")


def test_a_frame_block_is_written_as_dated_header_lines_write_its_pairs() -> None:
    """``frame_lines`` against ``header_lines(dater.headers(pairs))`` (without its Date line) over
    seeded random blocks: every answer the same, or None where the general path would do more than
    write the pairs (then the full path answers)."""
    import random
    import struct

    from prerender_ray.api.bot.wire import frame_lines
    from prerender_ray.serving.dates import http_date
    from prerender_ray.serving.framing import WIRE_VERSION, wire_block, wire_frame

    rnd = random.Random(37)
    second = 1_800_000_000
    date = http_date(second)
    names = [b"content-type", b"etag", b"last-modified", b"content-encoding", b"vary", b"x-harper-rendered",
             b"Content-Type", b"date", b"connection", b"transfer-encoding", b"x y", b"content-length"]
    values = [b"text/html", b'"e1"', http_date(second - 10), http_date(second + 10), date, b"gzip", b"v\tw",
              b"x\r\ny", b"\x7f", b"not a date", b"", b"1"]
    same = refused = wired = 0
    for _ in range(3000):
        size = rnd.choice([0, 5, 31_790])
        pairs = [(rnd.choice(names), rnd.choice(values)) for _ in range(rnd.randrange(0, 6))]
        if rnd.random() < 0.8:
            pairs.insert(rnd.randrange(len(pairs) + 1), (b"content-length", str(rnd.choice([size, size + 1])).encode()))
        block = b"\0".join(part for pair in pairs for part in pair)
        mine = frame_lines(memoryview(block), date, second, size)
        general = header_lines(Dater().headers(pairs, second))
        # the block as stored in header lines (framing version 2), where it can be: the same bytes
        wire = wire_block(pairs, size)
        if wire is not None:
            frame = wire_frame(struct.pack("<BBHH", WIRE_VERSION, 1, 0, 0) + wire)
            assert frame is not None and mine is not None, pairs
            assert bytes(frame.lines(second, date)) == mine, pairs
            wired += 1
        if mine is None:
            refused += 1
            continue
        assert general is not None and general[1] == size, pairs
        assert b"date: " + date + b"\r\n" + mine == general[0], pairs
        same += 1
    assert same > 300 and refused > 300 and wired > 100, (same, refused, wired)  # each kind met
    # the usual frame: written, its Last-Modified held to the Date when later
    usual = [(b"content-type", b"text/html"), (b"last-modified", http_date(second + 5)), (b"content-length", b"5")]
    written = frame_lines(b"\0".join(part for pair in usual for part in pair), date, second, 5)
    assert written == b"content-type: text/html\r\nlast-modified: " + date + b"\r\ncontent-length: 5\r\n"
