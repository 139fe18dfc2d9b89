"""A page's answer framed once, when the page is written: the header block a bot gets when it takes
the body in its stored coding (the usual case: pages are stored gzip, crawlers accept gzip).

``prepare`` (``serving/answer.py``) builds that block from the record on every read of a page not
in the replica's decoded cache: the JSON headers decoded, ``Accept-Encoding`` parsed and negotiated,
the header list encoded. Over a crawl that touches each page once, that was most of a hit's cost
(docs/architecture.md#the-bot-hot-path-has-no-actor-hop). With the frame stored beside the body, a
hit is one read, the record's fixed header, and the frame split into header pairs; only ``age`` is
computed per request, and the 304 when the request's validators match. Anything the frame does not
cover (another coding, debug headers, a status page) takes ``prepare`` as before, so the frame is an optimisation whose
answer must equal ``prepare``'s byte for byte (tests/serving/test_framing.py holds them equal).

Layout: ``struct _HEAD`` (frame version, stored coding, ETag length, Last-Modified length) | ETag |
Last-Modified (both UTF-8, as stored, for the conditional check) | then by version:

- **1**: the header block, names and values alternating, joined by NUL (``asgi_headers`` lets no NUL
  through: names are tokens and values hold no control character);
- **2** (``WIRE_VERSION``, written wherever it can be): ``struct _WIRE`` (the Last-Modified in epoch
  seconds, its line's start and end) | the header block as HTTP/1.1 header lines, ``name: value``
  and CRLF each, exactly as the ingress's server writes them. The spread lane (``api/bot/lane.py``)
  sends those bytes as they are, setting only a Last-Modified later than the Date to the Date
  (``WireFrame.lines``): no split, no check, no date parse per hit. Only a block whose names are
  lowercase tokens, whose values hold no control character but tab, with one Content-Length equal to
  the body's size, one Last-Modified at most and no Date, Connection or Transfer-Encoding is
  written so (those are what the server would refuse or act on); any other is written as version 1.

A frame of another version is ignored: the page is answered by ``prepare`` until it is rendered again.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from functools import lru_cache
from typing import NamedTuple

from prerender_ray.serving.answer import Body, Prepared, Reply, prepare, prepared_reply
from prerender_ray.serving.conditional import NOT_MODIFIED_HEADERS
from prerender_ray.serving.dates import http_seconds
from prerender_ray.serving.negotiation import choose_encoding, normalize_coding, parse_accept_encoding
from prerender_ray.storage.pages import Page

FRAME_VERSION = 1
WIRE_VERSION = 2
_WIRE = struct.Struct("<qII")  # Last-Modified in epoch seconds (_NEVER_LATE: none, or not a date), its line
_NEVER_LATE = -(2**63)
_NAME = re.compile(rb"[a-z0-9!#$%&'*+.^_`|~-]+")  # a lowercase token
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but tab
# what the ingress's Date (``Dated``) or its server would set or act on: never in a frame's lines
NOT_WRITTEN = frozenset((b"date", b"connection", b"transfer-encoding"))
_HEAD = struct.Struct("<BBHH")  # frame version, coding (an index of CODINGS), ETag and Last-Modified lengths
CODINGS = ("identity", "gzip", "br")
_MEMO_MAX_VALUE = 256  # longer Accept-Encoding values are negotiated afresh, never kept


class Frame(NamedTuple):
    coding: str  # the body's stored coding, normalized
    etag: str  # the stored ETag ("" without one), for the freshness record's check
    last_modified: str | None  # the stored Last-Modified
    headers: list[tuple[bytes, bytes]]  # ready for ASGI, ``age`` excluded

    def validators(self) -> dict[str, str]:
        """What ``is_not_modified`` reads of the 200's headers."""
        out = {"etag": self.etag} if self.etag else {}
        if self.last_modified is not None:
            out["last-modified"] = self.last_modified
        return out

    def not_modified(self) -> list[tuple[bytes, bytes]]:
        return [(name, value) for name, value in self.headers if name in _NOT_MODIFIED]


_NOT_MODIFIED = frozenset(name.encode() for name in NOT_MODIFIED_HEADERS)


def frame_of(page: Page) -> bytes:
    """The frame of ``page`` (a 200 with a body in a coding we serve), or b"" for a page the frame
    cannot answer."""
    coding = normalize_coding(page.headers.get("content-encoding"))
    if page.status_code != 200 or not page.content or coding not in CODINGS:
        return b""
    prepared = prepare(page, page.content, coding)
    if prepared.body is not page.content:  # negotiation re-coded it: not the stored coding's answer
        return b""
    etag = page.headers.get("etag", "").encode()
    modified = page.headers.get("last-modified")
    lm = b"\xff" if modified is None else modified.encode()  # never UTF-8: absent
    if len(etag) > 0xFFFF or len(lm) > 0xFFFF:
        return b""
    wire = wire_block(prepared.encoded, len(page.content))
    if wire is not None:
        return _HEAD.pack(WIRE_VERSION, CODINGS.index(coding), len(etag), len(lm)) + etag + lm + wire
    block = b"\0".join(part for pair in prepared.encoded for part in pair)
    return _HEAD.pack(FRAME_VERSION, CODINGS.index(coding), len(etag), len(lm)) + etag + lm + block


def wire_block(pairs: list[tuple[bytes, bytes]], size: int) -> bytes | None:
    """A version 2 frame's block (``_WIRE`` and the header lines) for ``pairs`` with a body of
    ``size`` bytes, or None where they are not plainly written as they are (see the module)."""
    lines: list[bytes] = []
    at = end = pos = 0  # the Last-Modified's line (none while at == end)
    seconds = _NEVER_LATE
    lengths = 0
    for name, value in pairs:
        if not _NAME.fullmatch(name) or _BAD_VALUE.search(value) or name in NOT_WRITTEN:
            return None
        line = b"%s: %s\r\n" % (name, value)
        if name == b"content-length":
            lengths += 1
            if value != str(size).encode():
                return None
        elif name == b"last-modified":
            if at != end:  # a second one
                return None
            at, end = pos, pos + len(line)
            parsed = http_seconds(value)
            seconds = _NEVER_LATE if parsed is None else parsed  # not a date: sent as it is (a cache ignores it)
        lines.append(line)
        pos += len(line)
    if lengths != 1 or pos > 0xFFFFFFFF:
        return None
    return _WIRE.pack(seconds, at, end) + b"".join(lines)


class WireFrame(NamedTuple):
    coding: str
    block: memoryview  # the header lines
    modified: int  # the Last-Modified in epoch seconds (_NEVER_LATE: none to hold)
    at: int  # its line in ``block``
    end: int

    def lines(self, second: int, date: bytes) -> bytes | memoryview:
        """The header lines sent with the Date ``date`` (of ``second``): a later Last-Modified held
        to it (``dates.held_modified``)."""
        if self.modified <= second:
            return self.block
        block = self.block
        return b"".join((block[: self.at], b"last-modified: ", date, b"\r\n", block[self.end :]))


def wire_frame(data: bytes | memoryview) -> WireFrame | None:
    """A version 2 frame's stored coding and header lines; None for another version or one that does
    not parse (the spread lane, which never answers a conditional request and needs no validators)."""
    found = _read(data)
    if found is None or found[0] != WIRE_VERSION:
        return None
    block = found[4]
    if block.nbytes < _WIRE.size + 2:
        return None
    modified, at, end = _WIRE.unpack_from(block)
    lines = block[_WIRE.size:]
    if not at <= end <= lines.nbytes or lines[-2:] != b"\r\n":
        return None
    return WireFrame(found[1], lines, modified, at, end)


def encode_page(page: Page) -> bytes:
    """``page`` as stored, with its frame."""
    return page.encode(frame_of(page))


def parse_frame(data: bytes | memoryview) -> Frame | None:
    """The frame stored in a record, or None when there is none, it is of another version, or it does
    not parse (the page is then answered by ``prepare``)."""
    found = _read(data)
    if found is None:
        return None
    version, coding, etag, modified, block = found
    if version == WIRE_VERSION:
        if block.nbytes < _WIRE.size:
            return None
        lines = bytes(block[_WIRE.size:]).split(b"\r\n")
        if lines.pop() != b"":
            return None
        pairs = [line.partition(b": ") for line in lines]
        if any(not sep for _, sep, _ in pairs):
            return None
        return Frame(coding, etag, modified, [(name, value) for name, _, value in pairs])
    parts = bytes(block).split(b"\0") if len(block) else []
    if len(parts) % 2:
        return None
    return Frame(coding, etag, modified, list(zip(parts[::2], parts[1::2], strict=True)))


def frame_block(data: bytes | memoryview) -> tuple[str, memoryview] | None:
    """The stored coding and the header block of a frame (names and values NUL-joined), not split;
    None where ``parse_frame`` finds none at the head (the spread lane, api/bot/lane.py, which never
    answers a conditional request and so needs no validators)."""
    found = _read(data)
    return None if found is None or found[0] != FRAME_VERSION else (found[1], found[4])


def _read(data: bytes | memoryview) -> tuple[int, str, str, str | None, memoryview] | None:
    """The head of a frame: its version, coding, ETag and Last-Modified, and a view of what follows;
    None for an unknown version or coding, lengths past the end or validators that are not UTF-8."""
    if len(data) < _HEAD.size:
        return None
    version, coding, etag_len, lm_len = _HEAD.unpack_from(data)
    lm_start = _HEAD.size + etag_len
    block_start = lm_start + lm_len
    if (version != FRAME_VERSION and version != WIRE_VERSION) or coding >= len(CODINGS) or block_start > len(data):
        return None
    view = memoryview(data)
    lm = view[lm_start:block_start]
    try:
        etag = str(view[_HEAD.size:lm_start], "utf-8")
        modified = None if lm == b"\xff" else str(lm, "utf-8")
    except UnicodeDecodeError:
        return None
    return version, CODINGS[coding], etag, modified, view[block_start:]


def _target(stored: str, accept: str | None) -> str:
    return choose_encoding(stored, parse_accept_encoding(accept))


_memo = lru_cache(maxsize=512)(_target)


def sends_stored_coding(frame: Frame, accept_encoding: str | None) -> bool:
    """Whether negotiation gives a client with ``accept_encoding`` the body as stored. Each distinct
    short value is negotiated once per process (bots send a handful of them)."""
    return takes_stored(frame.coding, accept_encoding)


def takes_stored(coding: str, accept_encoding: str | None) -> bool:
    """``sends_stored_coding`` for a body stored in ``coding``."""
    return sent_coding(coding, accept_encoding) == coding


def taken_codings(accept_encoding: str | None) -> int:
    """The stored codings a client with ``accept_encoding`` takes as they are: bit ``i`` for
    ``CODINGS[i]`` (``takes_stored`` of each), kept per short value as ``sent_coding`` keeps its."""
    long = accept_encoding is not None and len(accept_encoding) > _MEMO_MAX_VALUE
    return (_taken if long else _taken_memo)(accept_encoding)


def _taken(accept_encoding: str | None) -> int:
    return sum(1 << i for i, coding in enumerate(CODINGS) if takes_stored(coding, accept_encoding))


_taken_memo = lru_cache(maxsize=512)(_taken)


def sent_coding(stored: str, accept_encoding: str | None) -> str:
    """The coding negotiation sends a (non-empty) body stored in ``stored`` for ``accept_encoding``:
    what a page's negotiated forms are kept by, never the raw header (any number of values asks for
    the same few forms)."""
    long = accept_encoding is not None and len(accept_encoding) > _MEMO_MAX_VALUE
    return (_target if long else _memo)(stored, accept_encoding)


def framed_reply(frame: Frame, body: Body, *, last_cached: int | None, now: int, request_headers: Mapping[str, str],
                 head: bool = False) -> Reply:
    """``prepared_reply``'s answer for the stored coding: the 200, or the 304 when the request's
    validators match (debug headers take ``prepare``). The validators and the 304's headers are
    taken from the frame only for a conditional request."""
    conditional = "if-none-match" in request_headers or "if-modified-since" in request_headers
    prepared = Prepared(200, frame.validators() if conditional else {}, body, frame.headers,
                        frame.not_modified() if conditional else [])
    return prepared_reply(prepared, last_cached=last_cached, now=now, request_headers=request_headers, head=head)
