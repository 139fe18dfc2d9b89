"""An answer as the bytes uvicorn writes for it, for the answers the HTTP protocol sends itself
(``api.connections.GuardedHttp``: memo hits, ``api/bot/memo.py``, and plain local hits whose bot
the decision memo knows, ``api/bot/decisions.py``).

uvicorn's ``RequestResponseCycle.send`` writes the status line, each header (names lowercased,
refused when a name or value holds what HTTP forbids), ``connection: close`` when the connection is
not kept, and the body as one write when a Content-Length frames it. Where it would do anything else
(refuse a header, take an app's ``connection`` or ``transfer-encoding``, chunk a body, or raise on a
length that does not match) these return None and the ASGI path sends the answer, so what a client
receives is the same either way (tests/api/bot/test_memo_protocol.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE

from prerender_ray.serving.answer import Reply
from prerender_ray.serving.dates import Dater, held_modified
from prerender_ray.serving.framing import NOT_WRITTEN

# the end of an answer's head, by whether the connection closes after it (uvicorn adds the header)
HEAD_END = {True: b"connection: close\r\n\r\n", False: b"\r\n"}


def header_lines(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes, int | None] | None:
    """``headers`` as uvicorn writes them, and the first Content-Length among them (None: none); None
    where uvicorn would refuse one or do more than write it."""
    pairs = headers if isinstance(headers, list) else list(headers)
    # uvicorn's checks are single-character classes: one search over the names (or the values) joined
    # by a character neither class holds finds what a search of each would
    if HEADER_RE.search(b"a".join([n for n, _ in pairs])) or HEADER_VALUE_RE.search(b"a".join([v for _, v in pairs])):
        return None
    out: list[bytes] = []
    length = None
    for name, value in pairs:
        name = name.lower()
        if name == b"content-length":
            if length is None:
                try:
                    length = int(value.decode())
                except ValueError:
                    return None
        elif name == b"transfer-encoding" or name == b"connection":
            return None
        out.extend((name, b": ", value, b"\r\n"))
    return b"".join(out), length


def frame_lines(block: bytes | memoryview, date: bytes, second: int, size: int) -> bytes | None:
    """A stored frame's header block (``framing.frame_block``: names and values NUL-joined) as
    ``header_lines(dater.headers(pairs))`` writes it after our Date, for a body of ``size`` bytes:
    the same bytes, or None where that would do more than write each pair (a name not lowercase, a
    character it refuses, a Date, ``connection`` or ``transfer-encoding``, a Content-Length not
    ``size``). A Last-Modified later than ``second`` is held to ``date`` as ``Dater.headers`` holds it.
    tests/api/bot/test_wire.py holds the two equal over many blocks."""
    parts = bytes(block).split(b"\0") if len(block) else []
    if len(parts) % 2:
        return None
    names, values = parts[0::2], parts[1::2]
    joined = b"a".join(names)
    if HEADER_RE.search(joined) or HEADER_VALUE_RE.search(b"a".join(values)) or joined != joined.lower() \
            or not NOT_WRITTEN.isdisjoint(names):
        return None
    try:
        if int(values[names.index(b"content-length")].decode()) != size:
            return None
    except (ValueError, UnicodeDecodeError):  # none (a body uvicorn would chunk), or not a number
        return None
    if b"last-modified" in names:
        if names.count(b"last-modified") > 1:
            return None
        at = names.index(b"last-modified")
        values[at] = held_modified(values[at], second, date)
    return b"".join([b"".join((name, b": ", value, b"\r\n")) for name, value in zip(names, values)])


def framed(method: str, status: int, size: int, length: int | None) -> bool:
    """Whether uvicorn writes a body of ``size`` bytes as it is, after these headers (a HEAD: none)."""
    if method == "HEAD":
        return True
    return size == length if length is not None else size == 0 and status == 304  # else chunked


def wire_reply(reply: Reply, method: str, dater: Dater, close: bool) -> list[Any] | None:
    """``reply`` as ``Dated`` dates it and uvicorn writes it: the buffers to write, or None."""
    if reply.status not in STATUS_LINE:
        return None
    lines = header_lines(dater.headers(reply.asgi_headers()))
    body = reply.body
    if lines is None or not framed(method, reply.status, len(body), lines[1]):
        return None
    head = b"".join((STATUS_LINE[reply.status], lines[0], HEAD_END[close]))
    return [head, body] if len(body) and method != "HEAD" else [head]
