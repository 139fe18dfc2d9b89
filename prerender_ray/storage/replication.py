"""Versioned records of the replicated tier: a hybrid logical clock, the envelope every replicated
value is stored in, and last-writer-wins with tombstones.

Every node holds a full copy of the replicated tier (targets, pages, sitemaps, sitemap runs, queue
control and status). A write is applied locally and shipped to every peer; a peer applies it only if
its version is newer than what it holds, so replays and reordering are harmless. A delete is a
tombstone (a version with no payload), kept long enough that a late older write cannot resurrect it.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

_MAGIC = 0xA7
_HEAD = struct.Struct(">BBQH")  # magic, flags, hlc, len(node)
_TOMBSTONE = 0x01
_IN_LOG = 0x02  # a stub: the record's whole bytes are in the node's page log (``stub``)
_FLAGS = (0, _TOMBSTONE, _IN_LOG)
LOGICAL_BITS = 16  # low bits of an HLC value count events within one millisecond


class EnvelopeError(ValueError):
    """Stored bytes that are not a replicated record."""


class Version(NamedTuple):
    hlc: int
    node: str

    @property
    def wall_ms(self) -> int:
        return self.hlc >> LOGICAL_BITS

    def newer_than(self, other: Version | None) -> bool:
        """Total order: hlc, then node name, so every node picks the same winner."""
        return other is None or (self.hlc, self.node) > (other.hlc, other.node)


CLOCK_OFFSET_ENV = "PRERENDER_CLOCK_OFFSET_MS"  # a testing aid: simulate a node whose clock is off


def wall_clock(offset_ms: int = 0) -> Callable[[], int]:
    """The wall clock in ms, shifted by ``offset_ms`` (tests simulate clock skew between nodes)."""
    if not offset_ms:
        return lambda: time.time_ns() // 1_000_000
    return lambda: time.time_ns() // 1_000_000 + offset_ms


class Clock:
    """Hybrid logical clock: physical ms in the high bits, a counter in the low bits. Never goes
    backwards, and moves past any version it has seen, so causally later writes always win even
    with a few seconds of clock skew between nodes."""

    def __init__(self, node: str, wall_ms: Callable[[], int] = wall_clock()):
        self.node = node
        self._wall = wall_ms
        self._last = 0
        self._lock = threading.Lock()

    def now(self) -> Version:
        with self._lock:
            physical = self._wall() << LOGICAL_BITS
            self._last = max(physical, self._last + 1)
            return Version(self._last, self.node)

    def reserve(self, n: int) -> int:
        """The first of ``n`` consecutive versions, all issued at once (a batch write): one lock and
        one wall-clock read instead of ``n``."""
        with self._lock:
            first = max(self._wall() << LOGICAL_BITS, self._last + 1)
            self._last = first + max(n, 1) - 1
            return first

    def observe(self, seen: Version) -> None:
        with self._lock:
            self._last = max(self._last, seen.hlc)


def wrap(version: Version, payload: bytes | None) -> bytes:
    return wrap_many(version.node, version.hlc, [payload])[0]


def wrap_many(node: str, first_hlc: int, payloads: list[bytes | None]) -> list[bytes]:
    """``wrap`` for a batch stamped with consecutive versions from ``first_hlc`` (``Clock.reserve``)."""
    name = node.encode()
    pack, n = _HEAD.pack, len(name)
    return [pack(_MAGIC, 0 if p is not None else _TOMBSTONE, first_hlc + i, n) + name + (p or b"")
            for i, p in enumerate(payloads)]


def hlc_bytes(data: bytes | None) -> bytes | None:
    """The big-endian HLC of a stored record, read from its header without unwrapping it."""
    if data is None or len(data) < _HEAD.size or data[0] != _MAGIC:
        return None
    return data[2:10]


def writer_bytes(data: bytes | None) -> bytes | None:
    """The node name of a stored record as its header holds it, without unwrapping it."""
    if data is None or len(data) < _HEAD.size or data[0] != _MAGIC:
        return None
    end = _HEAD.size + int.from_bytes(data[10:12], "big")
    return bytes(data[_HEAD.size:end]) if len(data) >= end else None


def _parse(data: bytes | memoryview) -> tuple[Version, int, bool]:
    """(version, where the payload starts, whether it is a tombstone)."""
    try:
        magic, flags, hlc, n = _HEAD.unpack_from(data)
    except struct.error as e:
        raise EnvelopeError(f"record too short ({len(data)} bytes)") from e
    if magic != _MAGIC or flags not in _FLAGS:
        raise EnvelopeError(f"not a replicated record (magic {magic:#x}, flags {flags:#x})")
    start = _HEAD.size + n
    if len(data) < start:
        raise EnvelopeError("record truncated inside its node name")
    node = bytes(data[_HEAD.size:start]).decode("utf-8", "replace")
    return Version(hlc, node), start, bool(flags & _TOMBSTONE)


def stub(record: bytes) -> bytes:
    """What the pages RocksDB keeps of a live record whose whole bytes the page log holds
    (``storage/pagelog/mirror.py``): its header and writer, so versions, liveness and last-writer-wins
    read as before, and no payload. Unwrapped, a stub is live with an empty payload (no page decodes
    from it); ``MirroredStore`` reads hand out the log's record in its place."""
    end = _HEAD.size + int.from_bytes(record[10:12], "big")
    return bytes((_MAGIC, _IN_LOG)) + record[2:end]


def is_stub(data: bytes | memoryview | None) -> bool:
    return data is not None and len(data) >= _HEAD.size and data[0] == _MAGIC and data[1] == _IN_LOG


def unwrap(data: bytes | memoryview) -> tuple[Version, bytes | None]:
    """(version, payload); payload None is a tombstone."""
    version, start, tombstone = _parse(data)
    return version, None if tombstone else bytes(data[start:])


def payload_view(data: bytes) -> memoryview | None:
    """``payload_of`` as a view of ``data`` (no copy of a page of tens of KB on the read path)."""
    _, start, tombstone = _parse(data)
    return None if tombstone else memoryview(data)[start:]


def payload_of(data: bytes | None) -> bytes | None:
    """The live payload of stored bytes, or None when absent or deleted."""
    if data is None:
        return None
    return unwrap(data)[1]


def version_of(data: bytes | None) -> Version | None:
    if data is None:
        return None
    try:
        return unwrap(data)[0]
    except EnvelopeError:
        return None


def wins(incoming: bytes, existing: bytes | None) -> bool:
    """Last writer wins: is ``incoming`` newer than what is stored (unreadable stored bytes lose)?"""
    new = unwrap(incoming)[0]
    return new.newer_than(version_of(existing))
