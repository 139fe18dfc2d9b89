"""The stored page record, its binary form in the page store, and the freshness rule.

One RocksDB value per cache key::

    fixed header (struct _HEAD) | cache key (UTF-8) | headers (compact JSON object) | body

The fixed header carries every length, so ``decode_meta`` reads the metadata and hands back a
zero-copy view of the body: a request that will not be served from cache never copies the body.
Times are epoch milliseconds; ``None`` means absent, never zero.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Literal

MAGIC = b"PG"
VERSION = 1

# magic, version, flags, status, last_cached, expires_at, key length, headers length, body length
_HEAD = struct.Struct("<2sBBHqqIII")
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

    def encode(self) -> bytes:
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
            )
        except struct.error as e:
            raise ValueError(f"page {self.cache_key!r} cannot be encoded: {e}") from e
        return b"".join((head, key, hdrs, self.content))

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


def decode_meta(data: bytes | bytearray | memoryview) -> tuple[PageMeta, memoryview]:
    """The metadata of an encoded page and a view of its body (no copy). Raises PageDecodeError."""
    view = memoryview(data)
    if view.nbytes < _HEAD.size:
        raise PageDecodeError(f"page record too short ({view.nbytes} bytes)")
    magic, version, flags, status, last, expires, key_len, hdr_len, body_len = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise PageDecodeError("not a page record (bad magic)")
    if version != VERSION:
        raise PageDecodeError(f"unsupported page record version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise PageDecodeError(f"unknown page record flags {flags:#x}")
    key_end = _HEAD.size + key_len
    hdr_end = key_end + hdr_len
    if hdr_end + body_len != view.nbytes:
        raise PageDecodeError(f"page record length {view.nbytes} does not match its header")
    try:
        key = str(view[_HEAD.size : key_end], "utf-8")
        headers = json.loads(str(view[key_end:hdr_end], "utf-8"))
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
    return meta, view[hdr_end:]


def retimed(data: bytes, last_cached: int | None, expires_at: int | None) -> bytes:
    """An encoded page with other times: its fixed header rewritten, the rest copied as it is (a
    freshness record applied for a reader that wants the whole record). Raises PageDecodeError."""
    if len(data) < _HEAD.size:
        raise PageDecodeError(f"page record too short ({len(data)} bytes)")
    magic, version, flags, status, _, _, key_len, hdr_len, body_len = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise PageDecodeError("not a page record this version reads")
    flags &= ~(_HAS_LAST_CACHED | _HAS_EXPIRES_AT)
    flags |= (_HAS_LAST_CACHED if last_cached is not None else 0) | (_HAS_EXPIRES_AT if expires_at is not None else 0)
    head = _HEAD.pack(magic, version, flags, status, last_cached or 0, expires_at or 0, key_len, hdr_len, body_len)
    return head + data[_HEAD.size:]


def freshness(page: PageMeta, now: int, swr_ttl: int) -> Freshness | None:
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
