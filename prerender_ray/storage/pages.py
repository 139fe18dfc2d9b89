"""The stored page record, its binary form in the page store, and the freshness rule.

One RocksDB value per cache key::

    fixed header (struct _HEAD) | frame length (v2) | cache key (UTF-8) | headers (compact JSON
    object) | frame (v2) | body

The fixed header carries every length, so ``decode_meta`` reads the metadata and hands back a
zero-copy view of the body: a request that will not be served from cache never copies the body.
``decode_head`` reads only the fixed part (no JSON): with the *frame*, the answer already framed at
write time (``prerender_ray.serving.framing``), that is all a cache hit needs. The frame is opaque
here and may be empty; version 1 records (no frame) still load. Times are epoch milliseconds;
``None`` means absent, never zero.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Literal, Protocol

MAGIC = b"PG"
VERSION = 2
_READS = (1, 2)

# magic, version, flags, status, last_cached, expires_at, key length, headers length, body length
_HEAD = struct.Struct("<2sBBHqqIII")
_FRAME_LEN = struct.Struct("<I")  # version 2: the frame's length, right after _HEAD
_HAS_LAST_CACHED = 0x01
_HAS_EXPIRES_AT = 0x02
_HAS_INDEXABLE = 0x04
_INDEXABLE = 0x08
_KNOWN_FLAGS = _HAS_LAST_CACHED | _HAS_EXPIRES_AT | _HAS_INDEXABLE | _INDEXABLE

Freshness = Literal["hit", "swr"]


class PageDecodeError(ValueError):
    """The bytes are not a page record written by ``Page.encode`` (truncated, foreign or corrupt)."""


def _lower_keys(headers: dict[str, str]) -> dict[str, str]:
    if all(k == k.lower() for k in headers):
        return headers
    return {k.lower(): v for k, v in headers.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class PageMeta:
    """Everything about a stored page except its body. Header names are lowercase."""

    cache_key: str
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    last_cached: int | None = None
    expires_at: int | None = None
    is_indexable: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", _lower_keys(self.headers))

    @property
    def content_encoding(self) -> str:
        """The coding the body is stored in, from the stored ``content-encoding`` header."""
        return self.headers.get("content-encoding", "").strip().lower() or "identity"


@dataclass(frozen=True, slots=True, kw_only=True)
class Page(PageMeta):
    """A stored page: metadata plus the body, already encoded in ``content_encoding``."""

    content: bytes = b""

    def encode(self, frame: bytes = b"") -> bytes:
        key = self.cache_key.encode()
        hdrs = json.dumps(self.headers, separators=(",", ":"), ensure_ascii=False).encode()
        flags = (
            (_HAS_LAST_CACHED if self.last_cached is not None else 0)
            | (_HAS_EXPIRES_AT if self.expires_at is not None else 0)
            | (_HAS_INDEXABLE if self.is_indexable is not None else 0)
            | (_INDEXABLE if self.is_indexable else 0)
        )
        try:
            head = _HEAD.pack(
                MAGIC,
                VERSION,
                flags,
                self.status_code,
                self.last_cached or 0,
                self.expires_at or 0,
                len(key),
                len(hdrs),
                len(self.content),
            ) + _FRAME_LEN.pack(len(frame))
        except struct.error as e:
            raise ValueError(f"page {self.cache_key!r} cannot be encoded: {e}") from e
        return b"".join((head, key, hdrs, frame, self.content))

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Page:
        meta, body = decode_meta(data)
        return cls(
            cache_key=meta.cache_key,
            status_code=meta.status_code,
            headers=meta.headers,
            last_cached=meta.last_cached,
            expires_at=meta.expires_at,
            is_indexable=meta.is_indexable,
            content=bytes(body),
        )


@dataclass(frozen=True, slots=True)
class RecordHead:
    """What a record's fixed part says, and views of its frame and body (no copy, no JSON)."""

    status_code: int
    last_cached: int | None
    expires_at: int | None
    is_indexable: bool | None
    frame: memoryview
    body: memoryview


def _layout(view: memoryview) -> tuple[int, int, int, int, int, int, int, int]:
    """flags, status, last, expires, key start, headers start, frame start, body start."""
    if view.nbytes < _HEAD.size:
        raise PageDecodeError(f"page record too short ({view.nbytes} bytes)")
    magic, version, flags, status, last, expires, key_len, hdr_len, body_len = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise PageDecodeError("not a page record (bad magic)")
    if version not in _READS:
        raise PageDecodeError(f"unsupported page record version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise PageDecodeError(f"unknown page record flags {flags:#x}")
    key_start, frame_len = _HEAD.size, 0
    if version >= 2:
        if view.nbytes < _HEAD.size + _FRAME_LEN.size:
            raise PageDecodeError(f"page record too short ({view.nbytes} bytes)")
        (frame_len,) = _FRAME_LEN.unpack_from(view, _HEAD.size)
        key_start += _FRAME_LEN.size
    hdr_start = key_start + key_len
    frame_start = hdr_start + hdr_len
    body_start = frame_start + frame_len
    if body_start + body_len != view.nbytes:
        raise PageDecodeError(f"page record length {view.nbytes} does not match its header")
    return flags, status, last, expires, key_start, hdr_start, frame_start, body_start


HEAD_SIZE = _HEAD.size


def head_times(prefix: bytes | memoryview) -> tuple[int | None, int | None]:
    """(last_cached, expires_at) from the first ``HEAD_SIZE`` bytes of an encoded page alone (the page
    log's reconcile reads just that much of each stored body). Raises PageDecodeError."""
    if len(prefix) < _HEAD.size:
        raise PageDecodeError(f"page record too short ({len(prefix)} bytes)")
    magic, version, flags, _, last, expires, _, _, _ = _HEAD.unpack_from(prefix)
    if magic != MAGIC or version not in _READS or flags & ~_KNOWN_FLAGS:
        raise PageDecodeError("not a page record")
    return last if flags & _HAS_LAST_CACHED else None, expires if flags & _HAS_EXPIRES_AT else None


def decode_head(data: bytes | bytearray | memoryview) -> RecordHead:
    """The fixed part of an encoded page, with views of its frame (empty in version 1) and body.
    Raises PageDecodeError."""
    view = memoryview(data)
    flags, status, last, expires, _, _, frame_start, body_start = _layout(view)
    return RecordHead(
        status_code=status,
        last_cached=last if flags & _HAS_LAST_CACHED else None,
        expires_at=expires if flags & _HAS_EXPIRES_AT else None,
        is_indexable=bool(flags & _INDEXABLE) if flags & _HAS_INDEXABLE else None,
        frame=view[frame_start:body_start],
        body=view[body_start:],
    )


def decode_meta(data: bytes | bytearray | memoryview) -> tuple[PageMeta, memoryview]:
    """The metadata of an encoded page and a view of its body (no copy). Raises PageDecodeError."""
    view = memoryview(data)
    flags, status, last, expires, key_start, hdr_start, frame_start, body_start = _layout(view)
    try:
        key = str(view[key_start:hdr_start], "utf-8")
        headers = json.loads(str(view[hdr_start:frame_start], "utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise PageDecodeError(f"page record is corrupt: {e}") from e
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise PageDecodeError("page record headers are not an object of strings")
    meta = PageMeta(
        cache_key=key,
        status_code=status,
        headers=headers,
        last_cached=last if flags & _HAS_LAST_CACHED else None,
        expires_at=expires if flags & _HAS_EXPIRES_AT else None,
        is_indexable=bool(flags & _INDEXABLE) if flags & _HAS_INDEXABLE else None,
    )
    return meta, view[body_start:]


def retimed(data: bytes, last_cached: int | None, expires_at: int | None) -> bytes:
    """An encoded page with other times: its fixed header rewritten, the rest copied as it is (a
    freshness record applied for a reader that wants the whole record). Raises PageDecodeError."""
    _layout(memoryview(data))
    magic, version, flags, status, _, _, key_len, hdr_len, body_len = _HEAD.unpack_from(data)
    flags &= ~(_HAS_LAST_CACHED | _HAS_EXPIRES_AT)
    flags |= (_HAS_LAST_CACHED if last_cached is not None else 0) | (_HAS_EXPIRES_AT if expires_at is not None else 0)
    head = _HEAD.pack(magic, version, flags, status, last_cached or 0, expires_at or 0, key_len, hdr_len, body_len)
    return head + data[_HEAD.size:]


class Expiring(Protocol):
    @property
    def expires_at(self) -> int | None: ...


def freshness(page: Expiring, now: int, swr_ttl: int) -> Freshness | None:
    """``hit`` before ``expires_at``; ``swr`` from ``expires_at`` (inclusive) for ``swr_ttl`` ms
    (exclusive); otherwise ``None``, the page is not served. ``swr_ttl`` <= 0 disables the window."""
    expires = page.expires_at
    if expires is None:
        return None
    if expires > now:
        return "hit"
    if now < expires + swr_ttl:
        return "swr"
    return None
