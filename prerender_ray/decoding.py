"""Streaming decode of a content-coding (gzip, br, identity) with a cap on the decoded bytes.

A few KB of brotli (or 1 MB of gzip) can stand for a GiB of zeros: every decode of bytes someone else
chose (a render result, a stored page re-coded for a bot, the admin page view, a peer's page, a
sitemap) goes through ``Decoder``, which never produces more than ``PIECE`` bytes per step and raises
``TooLarge`` as soon as the output passes the cap, so memory stays near cap + one piece whatever the
input claims. The whole stream is checked: a corrupt middle, a truncated end (gzip without its
trailer, brotli not ``is_finished``) or bytes after the end are a ``DecodeError``. Several gzip members
and NUL padding after one are accepted, as gzip(1) and Python's ``gzip.decompress`` do; ``max_members``
bounds them where a sender has no reason for many (each costs a few Python steps: 10 MB of empty
members is half a million of them, most of a second).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import brotli
import xxhash

MAX_HTML_BYTES = 20 * 1024 * 1024  # the default cap on a decoded page (``server.maxHtmlBytes``)
PIECE = 256 * 1024  # most output asked of the decompressor per step (brotli may exceed it by half)
_SLICE = 64 * 1024  # gzip input fed per step: zlib copies the unconsumed rest on every call
_GZIP_MAGIC = b"\x1f\x8b"
CODINGS = ("gzip", "br", "identity")


class DecodeError(ValueError):
    """The bytes are not a complete, valid stream in their coding."""


class TooLarge(DecodeError):
    """The bytes decode to more than the cap; decoding stopped there."""

    def __init__(self, limit: int):
        super().__init__(f"decodes to more than {limit} bytes")
        self.limit = limit


class Decoder:
    """An incremental decoder: ``feed`` coded chunks and iterate the decoded pieces each yields (the
    input is processed only as the pieces are consumed), then ``finish`` to check the stream ended.

    ``limit`` caps the total output (None: no cap, the caller counts); ``piece`` is the most output
    asked for per step. ``trailing_garbage`` ignores
    non-gzip bytes after a gzip member instead of refusing them (sitemaps: the reference tolerates
    them, as gzip(1) does with a warning). ``max_members``: more gzip members than that are a
    ``DecodeError`` (None: any number)."""

    def __init__(self, coding: str, limit: int | None = MAX_HTML_BYTES, *, piece: int = PIECE,
                 trailing_garbage: bool = False, max_members: int | None = None):
        if coding not in CODINGS:
            raise ValueError(f"cannot decode content-coding {coding!r}")
        self.coding = coding
        self.limit = limit
        self.size = 0  # decoded bytes produced so far
        self.piece = piece
        self.trailing_garbage = trailing_garbage
        self.max_members = max_members
        self._z = zlib.decompressobj(wbits=31) if coding == "gzip" else None
        self._br = brotli.Decompressor() if coding == "br" else None
        self._fed = False
        self._started = False  # gzip: the current member has consumed input
        self._members = 0  # gzip: members completed
        self._pending = b""  # gzip: a split magic number (or padding) after a member
        self._ignoring = False  # gzip: in trailing garbage that is tolerated

    def feed(self, data: bytes | bytearray | memoryview) -> Iterator[bytes]:
        if not data:
            return
        self._fed = True
        if self.coding == "identity":
            yield self._count(bytes(data) if not isinstance(data, bytes) else data)
        elif self.coding == "br":
            yield from self._unbrotli(data)
        else:
            view = memoryview(data)
            for i in range(0, len(view), _SLICE):
                yield from self._gunzip(bytes(view[i:i + _SLICE]))

    def finish(self) -> None:
        """Raises DecodeError unless the input seen so far is a whole stream (or nothing)."""
        if self._br is not None and self._fed and not self._br.is_finished():
            raise DecodeError("truncated brotli stream")
        if self._z is not None and self._started:
            raise DecodeError("truncated gzip stream")

    @property
    def complete(self) -> bool:
        """No gzip member is half-read (sitemaps ask this of a gzip stream before closing)."""
        return not self._started

    def _count(self, piece: bytes) -> bytes:
        self.size += len(piece)
        if self.limit is not None and self.size > self.limit:
            raise TooLarge(self.limit)
        return piece

    def _unbrotli(self, data: bytes | bytearray | memoryview) -> Iterator[bytes]:
        d = self._br
        assert d is not None
        if d.is_finished():
            raise DecodeError("bytes after the end of the brotli stream")
        try:
            # With an output limit the decoder keeps what it could not emit (and may keep input): it
            # is called with no input until it emits nothing, whatever can_accept_more_data() says.
            out = d.process(data, output_buffer_limit=self.piece)
            while out:
                yield self._count(out)
                if d.is_finished():
                    return
                out = d.process(b"", output_buffer_limit=self.piece)
        except brotli.error:  # the binding says only "decoder failed"
            raise DecodeError("corrupt brotli stream (or bytes after its end)") from None

    def _gunzip(self, data: bytes) -> Iterator[bytes]:
        if self._pending:
            data, self._pending = self._pending + data, b""
        while data and not self._ignoring:
            if not self._started and self._members:
                data = data.lstrip(b"\0")  # padding after a member
                if len(data) < 2 and _GZIP_MAGIC.startswith(data):
                    self._pending = data  # nothing, or half a magic number: wait for more
                    return
                if data[:2] != _GZIP_MAGIC:
                    if self.trailing_garbage:
                        self._ignoring = True
                        return
                    raise DecodeError("bytes after the end of the gzip stream")
            self._started = True
            z = self._z
            assert z is not None
            while True:
                try:
                    out = z.decompress(data, self.piece)
                except zlib.error as e:
                    raise DecodeError(f"corrupt gzip stream: {e}") from None
                if out:
                    yield self._count(out)
                if z.eof:
                    data = z.unused_data
                    self._z, self._started = zlib.decompressobj(wbits=31), False
                    self._members += 1
                    if self.max_members is not None and self._members > self.max_members:
                        raise DecodeError(f"more than {self.max_members} gzip members")
                    break
                data = z.unconsumed_tail
                if not data and len(out) < self.piece:
                    return  # input used up and nothing left buffered in zlib


def decode(data: bytes | memoryview, coding: str, limit: int | None = MAX_HTML_BYTES) -> bytes:
    """The decoded bytes. Raises TooLarge past ``limit``, DecodeError for a bad stream."""
    if coding == "identity":
        if limit is not None and len(data) > limit:
            raise TooLarge(limit)
        return data if isinstance(data, bytes) else bytes(data)
    d = Decoder(coding, limit)
    parts = list(d.feed(data))
    d.finish()
    return b"".join(parts)


def decoded_size(data: bytes | memoryview, coding: str, limit: int | None = MAX_HTML_BYTES, *,
                 max_members: int | None = None) -> int:
    """Check the whole stream without keeping its output: the decoded size. Raises as ``decode``."""
    d = Decoder(coding, limit, max_members=max_members)
    for _ in d.feed(data):
        pass
    d.finish()
    return d.size


def decoded_digest(data: bytes | memoryview, coding: str, limit: int | None = MAX_HTML_BYTES) -> str:
    """A content hash of the decoded bytes (xxh3-128, hex): the same for the same page whatever its
    coding and on every node. Streams like ``decoded_size``; raises as ``decode``."""
    h = xxhash.xxh3_128()
    if coding == "identity":
        if limit is not None and len(data) > limit:
            raise TooLarge(limit)
        h.update(data)
        return h.hexdigest()
    d = Decoder(coding, limit)
    for piece in d.feed(data):
        h.update(piece)
    d.finish()
    return h.hexdigest()
