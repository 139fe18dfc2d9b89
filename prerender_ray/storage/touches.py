"""Freshness records: what a render whose stored record would not change writes instead of the page.

A render equal to the stored page (the same ETag, status, headers and indexability: only its times
would differ) does not rewrite and re-replicate a page of tens of KB. A small record under
``FRESHNESS + <cache key>`` holds the ETag of the page it extends and the new ``last_cached`` and
``expires_at``; it is versioned and replicated like every page-store write. A reader applies it only
when both hold, so neither replication order nor a write that raced it matters:

- its ETag is the page record's ETag (a touch of one content never extends another), and
- its version is newer than the page record's (any later full write of the page, a re-render with
  other headers or status included, supersedes it). The store also deletes the record in the batch
  of that write (``actors/store``), so none outlives its page.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

from prerender_ray.storage.keys import FRESHNESS
from prerender_ray.storage.pages import PageDecodeError, PageMeta, decode_meta, retimed
from prerender_ray.storage.replication import EnvelopeError, hlc_bytes, payload_of

_MAGIC = 0xF5
_VERSION = 1
# magic, version, flags, last_cached, expires_at, etag length
_HEAD = struct.Struct("<BBBqqH")
_HAS_LAST_CACHED = 0x01
_HAS_EXPIRES_AT = 0x02
MAX_ETAG = 1024  # ours are 34 characters; a page record's ETag is never longer than a header value


class TouchDecodeError(ValueError):
    """Bytes that are not a freshness record."""


def touch_key(cache_key: str | bytes) -> bytes:
    return FRESHNESS + (cache_key.encode() if isinstance(cache_key, str) else cache_key)


def is_touch_key(key: bytes) -> bool:
    return key.startswith(FRESHNESS)


@dataclass(frozen=True, slots=True)
class Touch:
    """New times for the stored page of ``cache_key`` whose ETag is ``etag`` ("" for a page stored
    without one)."""

    cache_key: str
    etag: str
    last_cached: int | None
    expires_at: int | None

    def encode(self) -> bytes:
        etag = self.etag.encode()
        if len(etag) > MAX_ETAG:
            raise ValueError(f"freshness record of {self.cache_key!r}: ETag longer than {MAX_ETAG} bytes")
        flags = ((_HAS_LAST_CACHED if self.last_cached is not None else 0)
                 | (_HAS_EXPIRES_AT if self.expires_at is not None else 0))
        try:
            head = _HEAD.pack(_MAGIC, _VERSION, flags, self.last_cached or 0, self.expires_at or 0, len(etag))
        except struct.error as e:
            raise ValueError(f"freshness record of {self.cache_key!r} cannot be encoded: {e}") from e
        return head + etag

    @classmethod
    def decode(cls, cache_key: str, data: bytes | memoryview) -> Touch:
        if len(data) < _HEAD.size:
            raise TouchDecodeError(f"freshness record too short ({len(data)} bytes)")
        magic, version, flags, last, expires, n = _HEAD.unpack_from(data)
        if magic != _MAGIC or version != _VERSION or flags & ~(_HAS_LAST_CACHED | _HAS_EXPIRES_AT):
            raise TouchDecodeError("not a freshness record")
        if len(data) != _HEAD.size + n:
            raise TouchDecodeError("freshness record length does not match its header")
        try:
            etag = str(data[_HEAD.size:], "utf-8")
        except UnicodeDecodeError as e:
            raise TouchDecodeError(f"freshness record is corrupt: {e}") from None
        return cls(cache_key, etag, last if flags & _HAS_LAST_CACHED else None,
                   expires if flags & _HAS_EXPIRES_AT else None)


def applicable(meta: PageMeta, page_record: bytes | None, touch_record: bytes | None) -> Touch | None:
    """The touch that applies to the page ``meta`` decoded from ``page_record``, given what the store
    holds under its touch key (both as stored: in their replication envelope). An unreadable touch is
    ignored: the page keeps its own times, which is what it had before the touch."""
    return applicable_to(meta.cache_key, meta.headers.get("etag", ""), page_record, touch_record)


def applicable_to(cache_key: str, etag: str, page_record: bytes | None, touch_record: bytes | None) -> Touch | None:
    """``applicable`` for a page known by its key and stored ETag alone (its headers not decoded)."""
    if touch_record is None or page_record is None:
        return None
    page_v, touch_v = hlc_bytes(page_record), hlc_bytes(touch_record)
    if page_v is None or touch_v is None or touch_v <= page_v:  # big-endian: byte order is number order
        return None
    try:
        payload = payload_of(touch_record)
        touch = Touch.decode(cache_key, payload) if payload is not None else None
    except (EnvelopeError, TouchDecodeError):
        return None
    if touch is None or touch.etag != etag:
        return None
    return touch


def touched(meta: PageMeta, touch: Touch | None) -> PageMeta:
    """``meta`` with the touch's times (itself when there is none)."""
    if touch is None:
        return meta
    return dataclasses.replace(meta, last_cached=touch.last_cached, expires_at=touch.expires_at)


def touched_payload(page_record: bytes | None, touch_record: bytes | None) -> bytes | None:
    """The live payload of a stored page record with its freshness record applied, for readers that
    take the whole record (admin views, a revalidate). Raises EnvelopeError; a page that does not
    decode is returned as it is (its reader reports it)."""
    payload = payload_of(page_record)
    if payload is None or touch_record is None:
        return payload
    try:
        touch = applicable(decode_meta(payload)[0], page_record, touch_record)
        return retimed(payload, touch.last_cached, touch.expires_at) if touch is not None else payload
    except PageDecodeError:
        return payload
