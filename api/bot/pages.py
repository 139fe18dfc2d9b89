"""The page as the ingress serves it from its node's store (``StoredPage``, decoded from a stored record
by ``decode_page``), and the replica's LRU of decoded pages (``DecodedPages``) that the page reader
(``api/bot/page_reader.py``) reads through. Decoding the record and negotiating it are kept with the
page for the next read of the same index entry.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, cast

from prerender_ray.serving.framing import Frame, parse_frame
from prerender_ray.storage.pages import PageDecodeError, PageMeta, RecordHead, decode_head, decode_meta
from prerender_ray.storage.replication import EnvelopeError, payload_view
from prerender_ray.storage.touches import applicable_to

DECODED_MAX_PAGES = 4096  # decoded pages kept per replica (validated against the store every read)
DECODED_MAX_BYTES = 64 * 1024 * 1024
VARIANTS_PER_PAGE = 4  # negotiated forms kept per page: one per coding sent (br, gzip, identity, stored)


class UnreadablePage(Exception):
    """A stored record that does not decode (counted; the request falls back to the origin)."""


class StoredPage:
    """A page as read from the store: its times, its body, and the negotiated forms already served
    (``prerender_ray.serving.answer.Prepared`` by the coding sent, ``api/bot/hit.py``'s ``_form``). A record written with its
    frame (``prerender_ray.serving.framing``) is served from that alone: its JSON headers are decoded
    only when ``meta`` is asked for. The times are those of the page's freshness record when one
    applies (``storage/touches.py``): a new one changes them and nothing else, so the body and its
    negotiated forms are kept."""

    __slots__ = ("_base", "_meta", "_payload", "base_times", "body", "cache_key", "etag", "expires_at", "frame",
                 "is_indexable", "last_cached", "log_key", "raw", "seen", "size", "stamp", "status_code", "touch",
                 "variants")

    def __init__(self, raw: bytes, meta: PageMeta | None, body: bytes | memoryview, touch: bytes | None = None, *,
                 head: RecordHead | None = None, frame: Frame | None = None, payload: memoryview | None = None,
                 cache_key: str = ""):
        self.raw = raw  # the stored record: a later read equal to it is this same version
        self._base = meta  # as the record says (None: not decoded yet, ``head`` and ``frame`` given)
        self._payload = payload
        self._meta: PageMeta | None = None
        self.frame = frame
        if meta is not None:
            self.cache_key, self.etag = meta.cache_key, meta.headers.get("etag", "")
            self.status_code, self.is_indexable = meta.status_code, meta.is_indexable
            self.base_times = (meta.last_cached, meta.expires_at)
        else:
            assert head is not None and frame is not None
            self.cache_key, self.etag = cache_key, frame.etag
            self.status_code, self.is_indexable = head.status_code, head.is_indexable
            self.base_times = (head.last_cached, head.expires_at)
        self.last_cached, self.expires_at = self.base_times
        self.touch: bytes | None = None  # the freshness record the times were derived with, as stored
        self.body = body  # a view of the record's tail (no copy), or the bytes of a peer's page
        self.variants: dict[str, Any] = {}
        self.size = len(raw) or len(body)
        self.seen = -1  # the reader generation in which the record was last read
        self.stamp: bytes | None = None  # the page log's index entry it was last read by (``PageReader``)
        self.log_key: bytes | None = None  # and that entry's key (``key_hash(cache_key)``: 1 us saved a hit)
        self.retouch(touch)

    def retouch(self, touch: bytes | None) -> None:
        """Apply the freshness record now stored under the page's touch key (None: there is none)."""
        if touch != self.touch:
            self.touch = touch
            t = applicable_to(self.cache_key, self.etag, self.raw, touch) if self.raw else None
            self.last_cached, self.expires_at = (t.last_cached, t.expires_at) if t is not None else self.base_times
            self._meta = None

    def retime(self, last_cached: int | None, expires_at: int | None) -> None:
        """Take the effective times the page log holds for the record (a freshness record applied)."""
        if (last_cached, expires_at) != (self.last_cached, self.expires_at):
            self.last_cached, self.expires_at = last_cached, expires_at
            self._meta = None

    @property
    def meta(self) -> PageMeta:
        """The page's metadata with its current times. Raises UnreadablePage for a framed record
        whose headers do not decode."""
        meta = self._meta
        if meta is None:
            base = self._base
            if base is None:
                try:
                    base = self._base = decode_meta(cast("memoryview", self._payload))[0]
                except PageDecodeError as e:
                    raise UnreadablePage(f"page {self.cache_key!r}: {e}") from None
            meta = base
            if (base.last_cached, base.expires_at) != (self.last_cached, self.expires_at):
                meta = dataclasses.replace(base, last_cached=self.last_cached, expires_at=self.expires_at)
            self._meta = meta
        return meta

    def add_variant(self, coding: str, prepared: Any) -> int:
        """Keep ``prepared``, the page sent in ``coding`` (when there is room); the bytes it adds to
        the page's size. Add through ``DecodedPages.add_variant`` when the page is cached, so the
        cache's budget counts them."""
        if len(self.variants) >= VARIANTS_PER_PAGE or coding in self.variants:
            return 0
        self.variants[coding] = prepared
        added = len(prepared.body) if prepared.body is not self.body else 0
        self.size += added
        return added


def decode_page(key: str, raw: bytes, touch: bytes | None) -> StoredPage | None:
    """A stored page record (and its freshness record) as served; None for a tombstone. Raises
    UnreadablePage."""
    try:
        payload = payload_view(raw)
        if payload is None:  # a tombstone: deleted
            return None
        head = decode_head(payload)
        frame = parse_frame(head.frame) if head.frame else None
        meta, body = (None, head.body) if frame is not None else decode_meta(payload)
    except (EnvelopeError, PageDecodeError) as e:
        raise UnreadablePage(f"page {key!r}: {e}") from None
    # The payload is a view of the record and the body a view of the payload: no copy.
    return StoredPage(raw, meta, body if body.nbytes else b"", touch, head=head, frame=frame, payload=payload,
                      cache_key=key)


class DecodedPages:
    """LRU of decoded pages. A decoded page is reused only while it is what the store holds: while the
    page log's index entry it was read by is unchanged (``StoredPage.stamp``), within one reader generation
    of a secondary (between two catch-ups its view cannot change), or after a new read returned the
    very record it was decoded from (a memcmp). A new version or new times are served the moment the
    reader sees them."""

    def __init__(self, max_pages: int = DECODED_MAX_PAGES, max_bytes: int = DECODED_MAX_BYTES):
        self.max_pages = max_pages
        self.max_bytes = max_bytes
        self.bytes = 0
        self._pages: OrderedDict[str, StoredPage] = OrderedDict()

    def peek(self, key: str) -> StoredPage | None:
        return self._pages.get(key)

    def used(self, key: str) -> None:
        self._pages.move_to_end(key)

    def lookup(self, key: str, raw: bytes) -> StoredPage | None:
        page = self._pages.get(key)
        if page is None:
            return None
        if page.raw != raw:
            self.drop(key)
            return None
        self._pages.move_to_end(key)
        return page

    def add(self, key: str, page: StoredPage) -> None:
        self.drop(key)
        self._pages[key] = page
        self.bytes += page.size
        self._evict()

    def add_variant(self, key: str, page: StoredPage, coding: str, prepared: Any) -> None:
        """A negotiated form kept with ``page``, counted against the byte budget while the page is
        the one cached under ``key`` (a decoded form of a small br page can be 20 MB)."""
        added = page.add_variant(coding, prepared)
        if added and self._pages.get(key) is page:
            self.bytes += added
            self._evict()

    def _evict(self) -> None:
        while self._pages and (len(self._pages) > self.max_pages or self.bytes > self.max_bytes):
            _, old = self._pages.popitem(last=False)
            self.bytes -= old.size

    def drop(self, key: str) -> None:
        old = self._pages.pop(key, None)
        if old is not None:
            self.bytes -= old.size

