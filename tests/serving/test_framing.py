"""The answer framed at write time must be the answer ``prepare`` builds at read time, byte for
byte, for every request the frame is used for (docs/architecture.md#the-bot-hot-path-has-no-actor-hop)."""

from __future__ import annotations

import gzip
import struct

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.serving import framing
from prerender_ray.serving.answer import prepare, prepared_reply
from prerender_ray.serving.framing import (
    FRAME_VERSION,
    encode_page,
    frame_block,
    frame_of,
    framed_reply,
    parse_frame,
    sends_stored_coding,
)
from prerender_ray.serving.negotiation import choose_encoding, parse_accept_encoding
from prerender_ray.storage.pages import Page, decode_head, decode_meta

NOW = 1_780_000_000_000
HTML = b"<html><body>" + b"<p>hello</p>" * 50 + b"</body></html>"
CODED = {"gzip": gzip.compress(HTML), "br": brotli.compress(HTML), "identity": HTML}
ACCEPTS = [None, "", "gzip", "gzip, deflate, br", "br", "identity", "br;q=0.5, gzip", "gzip;q=0", "*", "*;q=0",
           "x-gzip", "GZIP", "br, gzip;q=0.9, identity;q=0", "deflate", "gzip;q=garbage", "identity;q=0"]


def page(coding: str = "gzip", **kw) -> Page:
    headers = {"content-type": "text/html", "etag": '"v1"', "last-modified": "Wed, 01 Jan 2025 00:00:00 GMT",
               "link": "</a.js>; rel=preload", "x-harper-rendered": "1", "cache-control": "max-age=60"}
    if coding != "identity":
        headers["content-encoding"] = coding
    fields = {"cache_key": "https://x.com/a|desktop", "status_code": 200, "last_cached": NOW - 5_000,
              "expires_at": NOW + 60_000, "headers": headers, "content": CODED[coding]}
    fields.update(kw)
    return Page(**fields)  # type: ignore[arg-type]


CONDITIONALS = [{}, {"if-none-match": '"v1"'}, {"if-none-match": 'W/"v1"'}, {"if-none-match": '"v2"'},
                {"if-none-match": "*"}, {"if-none-match": "garbage,,"}, {"if-none-match": ""},
                {"if-modified-since": "Wed, 01 Jan 2025 00:00:00 GMT"},
                {"if-modified-since": "Tue, 31 Dec 2024 00:00:00 GMT"}, {"if-modified-since": "not a date"},
                {"if-none-match": '"v2"', "if-modified-since": "Wed, 01 Jan 2025 00:00:00 GMT"}]


def both(p: Page, accept: str | None, *, head: bool = False, now: int = NOW, conditional: dict | None = None):
    """The framed answer and ``prepare``'s, as the wire would see them."""
    frame = parse_frame(frame_of(p))
    assert frame is not None
    request = ({} if accept is None else {"accept-encoding": accept}) | (conditional or {})
    slow = prepared_reply(prepare(p, p.content, accept), last_cached=p.last_cached, now=now,
                          request_headers=request, head=head)
    fast = framed_reply(frame, p.content, last_cached=p.last_cached, now=now, request_headers=request, head=head)
    return (fast.status, fast.asgi_headers(), bytes(fast.body)), (slow.status, slow.asgi_headers(), bytes(slow.body))


@pytest.mark.parametrize("coding", ["gzip", "br", "identity"])
@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("head", [False, True])
def test_where_the_frame_answers_its_answer_is_prepares(coding: str, accept: str | None, head: bool) -> None:
    p = page(coding)
    frame = parse_frame(frame_of(p))
    assert frame is not None and frame.coding == coding
    stored = choose_encoding(coding, parse_accept_encoding(accept)) == coding
    assert sends_stored_coding(frame, accept) is stored
    if stored:
        statuses = set()
        for conditional in CONDITIONALS:
            fast, slow = both(p, accept, head=head, conditional=conditional)
            assert fast == slow, conditional
            statuses.add(fast[0])
        assert statuses == {200, 304}


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-:\n ", min_size=1, max_size=12)
_values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)


_validators = st.fixed_dictionaries({}, optional={
    "etag": st.sampled_from(['"v1"', 'W/"v1"', "", "bare", '"caf\u00e9"', '"\u2603"', '"a\x01b"']),
    "last-modified": st.sampled_from(["Wed, 01 Jan 2025 00:00:00 GMT", "", "junk", "Wed, 01 Jan 2025 00:00:00 \u2603"]),
})


@settings(max_examples=400, deadline=None)
@given(headers=st.dictionaries(_names, _values, max_size=8), validators=_validators,
       coding=st.sampled_from(["gzip", "br", "identity"]), accept=st.sampled_from(ACCEPTS),
       last_cached=st.none() | st.integers(NOW - 10**10, NOW + 10**6), head=st.booleans(),
       conditional=st.sampled_from(CONDITIONALS) | st.fixed_dictionaries({}, optional={
           "if-none-match": st.sampled_from(['"v1"', '"caf\u00c3\u00a9"', '"\u2603"', "*", 'W/"v1", "x"']),
           "if-modified-since": st.sampled_from(["Wed, 01 Jan 2025 00:00:00 GMT", "junk"])}))
def test_any_stored_headers_frame_to_prepares_answer(headers, validators, coding, accept, last_cached, head,
                                                       conditional) -> None:
    """Names that are not tokens, values with control characters or outside latin-1, a stored
    ``content-length``, ``vary`` or ``age``: the frame drops and rewrites them as ``prepare`` does."""
    headers = {k: v for k, v in headers.items() if k not in ("content-encoding", "etag", "last-modified")}
    headers.update(validators)
    if coding != "identity":
        headers["content-encoding"] = coding
    p = page(coding, headers=headers, last_cached=last_cached)
    frame = parse_frame(frame_of(p))
    assert frame is not None
    assert frame.headers == [tuple(pair) for pair in prepare(p, p.content, coding).encoded]  # either version
    if sends_stored_coding(frame, accept):
        fast, slow = both(p, accept, head=head, conditional=conditional)
        assert fast == slow


@pytest.mark.parametrize("p", [
    page(status_code=404), page(status_code=301), page(content=b""),
    page(headers={"content-type": "text/html", "content-encoding": "deflate"}),
    page(headers={"content-type": "text/html", "content-encoding": "zstd"}),
], ids=["404", "301", "empty", "deflate", "zstd"])
def test_pages_the_frame_cannot_answer_get_none(p: Page) -> None:
    assert frame_of(p) == b""
    meta, body = decode_meta(encode_page(p))
    assert decode_head(encode_page(p)).frame.nbytes == 0 and bytes(body) == p.content


def test_a_framed_record_keeps_its_metadata_and_body() -> None:
    p = page()
    record = encode_page(p)
    meta, body = decode_meta(record)
    assert bytes(body) == p.content and meta.headers == p.headers and meta.cache_key == p.cache_key
    head = decode_head(record)
    assert (head.status_code, head.last_cached, head.expires_at) == (200, p.last_cached, p.expires_at)
    frame = parse_frame(head.frame)
    assert frame is not None and frame.etag == '"v1"' and (b"age", b"0") not in frame.headers
    assert frame.last_modified == "Wed, 01 Jan 2025 00:00:00 GMT"
    bare = parse_frame(frame_of(page(headers={"content-type": "text/html", "content-encoding": "gzip"})))
    assert bare is not None and bare.etag == "" and bare.last_modified is None and bare.validators() == {}


@pytest.mark.parametrize("frame", [
    b"", b"\x01", struct.pack("<BBHH", FRAME_VERSION + 1, 1, 0, 0) + b"a\0b",  # another version
    struct.pack("<BBHH", FRAME_VERSION, 9, 0, 0) + b"a\0b",  # an unknown coding
    struct.pack("<BBHH", FRAME_VERSION, 1, 50, 0) + b"a\0b",  # an ETag past the end
    struct.pack("<BBHH", FRAME_VERSION, 1, 0, 50) + b"a\0b",  # a Last-Modified past the end
    struct.pack("<BBHH", FRAME_VERSION, 1, 0, 0) + b"a name without a value",
    struct.pack("<BBHH", FRAME_VERSION, 1, 2, 0) + b"\xff\xfe" + b"a\0b",  # an ETag that is not UTF-8
    struct.pack("<BBHH", FRAME_VERSION, 1, 0, 2) + b"\xff\xfe" + b"a\0b",  # nor a Last-Modified
], ids=["empty", "short", "version", "coding", "etag-length", "lm-length", "pair", "etag-utf8", "lm-utf8"])
def test_a_frame_that_does_not_parse_is_ignored(frame: bytes) -> None:
    assert parse_frame(frame) is None
    # the spread lane's reading of it (api/bot/lane.py) refuses it too: at the head, or its block
    from prerender_ray.api.bot.wire import frame_lines

    found = frame_block(frame)
    if frame.endswith(b"a name without a value"):  # its head is whole: the block does not pair up
        assert found is not None and frame_lines(found[1], b"Thu, 01 Jan 2026 00:00:00 GMT", 1_767_225_600, 1) is None
    else:
        assert found is None


def test_long_accept_encoding_values_are_negotiated_but_never_kept() -> None:
    frame = parse_frame(frame_of(page()))
    assert frame is not None
    framing._memo.cache_clear()
    long = "gzip, " + "x" * 300
    assert sends_stored_coding(frame, long) and framing._memo.cache_info().currsize == 0
    assert sends_stored_coding(frame, "gzip") and framing._memo.cache_info().currsize == 1


WIRED = [(b"content-type", b"text/html"), (b"last-modified", b"Wed, 01 Jan 2025 00:00:00 GMT"),
         (b"content-length", b"5"), (b"vary", b"Accept-Encoding")]


def test_a_usual_frame_is_stored_as_header_lines_and_reads_back_as_its_pairs() -> None:
    p = page()
    data = frame_of(p)
    assert data[0] == framing.WIRE_VERSION
    wired = framing.wire_frame(data)
    assert wired is not None and wired.coding == "gzip"
    frame = parse_frame(data)
    assert frame is not None
    assert bytes(wired.block) == b"".join(b"%s: %s\r\n" % pair for pair in frame.headers)
    lm = bytes(wired.block[wired.at:wired.end])
    assert lm == b"last-modified: Wed, 01 Jan 2025 00:00:00 GMT\r\n" and wired.modified == 1_735_689_600
    # held to the Date only when later than it
    assert wired.lines(1_735_689_600, b"D") is wired.block
    held = bytes(wired.lines(1_735_689_599, b"D"))
    assert held == bytes(wired.block).replace(lm, b"last-modified: D\r\n")
    assert framing.frame_block(data) is None  # the NUL-joined block is version 1's alone


@pytest.mark.parametrize("pairs", [
    [(b"Content-Type", b"text/html"), *WIRED[1:]],  # a name not lowercase
    [(b"x y", b"1"), *WIRED],  # not a token
    [*WIRED, (b"x", b"a\r\nb")],  # a control character
    [*WIRED, (b"date", b"Wed, 01 Jan 2025 00:00:00 GMT")],
    [*WIRED, (b"connection", b"close")],
    [*WIRED, (b"transfer-encoding", b"chunked")],
    [*WIRED, (b"last-modified", b"Thu, 02 Jan 2025 00:00:00 GMT")],  # two
    [pair for pair in WIRED if pair[0] != b"content-length"],  # none
    [*WIRED, (b"content-length", b"5")],  # two
    [(b"content-length", b"6"), *WIRED[:2]],  # not the body's
    [(b"content-length", b"+5"), *WIRED[:2]],  # not as written
], ids=["upper", "token", "control", "date", "connection", "transfer-encoding", "two-lm", "no-length",
        "two-lengths", "wrong-length", "odd-length"])
def test_pairs_the_server_would_refuse_or_act_on_are_not_stored_as_lines(pairs: list[tuple[bytes, bytes]]) -> None:
    assert framing.wire_block(pairs, 5) is None
    assert framing.wire_block(WIRED, 5) is not None


def test_a_last_modified_that_is_no_date_is_sent_as_it_is() -> None:
    block = framing.wire_block([(b"last-modified", b"junk"), (b"content-length", b"5")], 5)
    assert block is not None
    wired = framing.wire_frame(struct.pack("<BBHH", framing.WIRE_VERSION, 1, 0, 0) + block)
    assert wired is not None and bytes(wired.lines(0, b"D")).startswith(b"last-modified: junk\r\n")


_V2 = struct.pack("<BBHH", 2, 1, 0, 0)


@pytest.mark.parametrize("frame", [
    _V2 + b"\0" * 8,  # shorter than its fixed part
    _V2 + struct.pack("<qII", 0, 0, 0) + b"a: b",  # a line without its end
    _V2 + struct.pack("<qII", 0, 0, 0) + b"a b\r\n",  # a line without ": "
    _V2 + struct.pack("<qII", 0, 0, 99) + b"a: b\r\n",  # its Last-Modified past the end
    _V2 + struct.pack("<qII", 0, 4, 2) + b"a: b\r\n",  # ending before it starts
], ids=["short", "unended", "unsplit", "lm-past-end", "lm-backwards"])
def test_a_header_lines_frame_that_does_not_parse_is_ignored(frame: bytes) -> None:
    parsed, wired = parse_frame(frame), framing.wire_frame(frame)
    if frame.endswith(b"a: b\r\n"):  # its lines are whole: only the lane's read, of the Last-Modified, refuses
        assert parsed is not None and wired is None
    else:
        assert parsed is None
        # the lane sends a version 2 block as written (wire_block checked each pair); its read checks
        # the frame's ends only
        assert wired is None or bytes(wired.block) == b"a b\r\n"
