"""The page log's on-disk formats: index records, the index file header, segment entries; the key
hash and the body checksum; the errors and the bounds.

Index file ``index-<generation>.log``: one 64-byte header, then 64-byte records, each with its own
CRC-32 (zlib, in C: ~0.1 us for 60 bytes), so a torn or foreign tail is found by length (a partial
record) and by checksum, and a reader never applies half a record. Fixed size keeps a reader's
position arithmetic trivial and lets a tail be read with one ``pread``.

Segment file ``seg-<id>.dat``: a 16-byte header, then entries ``_ENTRY`` header (magic, length,
body checksum, key) | body. Index records point at the body, so a hit is one ``pread`` of exactly the
bytes it sends; the entry header makes a segment self-describing for compaction and for cutting a
torn tail on open.

Body checksum: the low 32 bits of xxh3_64 (0.4 us for 20 KB against 6.6 us for zlib's crc32 on this
machine), cheap enough to verify on every hit. Key: blake2b-16 of the cache key and the coding (1 us);
xxh3_128 is 0.15 us but not collision resistant, and a collision would serve one URL's page for
another's.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import NamedTuple

import xxhash

RECORD_SIZE = 64
KEY_SIZE = 16
# kind, flags, tag, segment, offset, length, body checksum, last_cached, expires_at, version
_VALUE = struct.Struct("<BBHIIIIqqQ")
VALUE_SIZE = _VALUE.size  # 44: what an index keeps per key in memory (the record before its key)
_CRC = struct.Struct("<I")
_CRC_AT = RECORD_SIZE - _CRC.size  # 60
assert VALUE_SIZE + KEY_SIZE == _CRC_AT

PUT = 1  # key -> body in a segment, with its freshness
DELETE = 2  # key removed (a tombstone; only ``version`` is meaningful)
RETIRE = 3  # ``segment`` holds no live body any more: readers close it; the writer then unlinks it
SEAL = 4  # this generation ends here: the next one, ``generation + 1``, holds everything from now on
KINDS = (PUT, DELETE, RETIRE, SEAL)

HAS_LAST_CACHED = 0x01
HAS_EXPIRES_AT = 0x02
_KNOWN_FLAGS = HAS_LAST_CACHED | HAS_EXPIRES_AT

# The index header: magic, format, generation, snapshot records, next segment id, log id, max
# segment bytes, max record bytes; padded; its CRC-32 in the last 4 bytes as for records.
_HEADER = struct.Struct("<8sHQQIQII")
INDEX_MAGIC = b"PGLOGIX1"
FORMAT = 1

SEGMENT_MAGIC = b"PGLOGSG1"
_SEGMENT_HEAD = struct.Struct("<8sII")  # magic, segment id, reserved
SEGMENT_HEADER_SIZE = _SEGMENT_HEAD.size  # 16
_ENTRY = struct.Struct("<4sII16s")  # magic, body length, body checksum, key
ENTRY_MAGIC = b"PGE1"
ENTRY_HEADER_SIZE = _ENTRY.size  # 28

# Hard ceilings of the format (offsets and lengths are u32); a log's own, lower bounds are in its
# header and every length read from disk is checked against them before anything is allocated.
MAX_SEGMENT_CAP = 2**32 - 1
MAX_RECORD_CAP = 256 * 1024 * 1024
DEFAULT_MAX_SEGMENT = 256 * 1024 * 1024
DEFAULT_MAX_RECORD = 32 * 1024 * 1024


class PageLogError(RuntimeError):
    """The page log cannot do what was asked; the message names the path."""


class PageLogFull(PageLogError):
    """An append failed for lack of space (ENOSPC or EDQUOT). The first ``committed`` items of the
    batch are in the log (whole records, durable bodies); the others are not and may be retried."""

    def __init__(self, message: str, committed: int = 0):
        super().__init__(message)
        self.committed = committed


class PageLogCorrupt(PageLogError):
    """A file of the log is not what the log writes (a bad header, a foreign file)."""


class Value(NamedTuple):
    kind: int
    flags: int
    tag: int
    segment: int
    offset: int
    length: int
    checksum: int
    last_cached: int
    expires_at: int
    version: int


unpack_value = _VALUE.unpack  # bytes of VALUE_SIZE -> the fields of ``Value`` (a plain tuple: fast)


def key_hash(cache_key: str, coding: str = "") -> bytes:
    """The 16-byte key of one stored coding of a page."""
    return hashlib.blake2b(f"{cache_key}\0{coding}".encode(), digest_size=KEY_SIZE).digest()


CHECKSUM_HASH = xxhash.xxh3_64_intdigest  # a body's checksum is its low 32 bits (native/lane_page.c too)


def body_checksum(data: bytes | memoryview) -> int:
    return CHECKSUM_HASH(data) & 0xFFFFFFFF


def pack_value(kind: int, *, tag: int = 0, segment: int = 0, offset: int = 0, length: int = 0, checksum: int = 0,
               last_cached: int | None = None, expires_at: int | None = None, version: int = 0) -> bytes:
    flags = (HAS_LAST_CACHED if last_cached is not None else 0) | (HAS_EXPIRES_AT if expires_at is not None else 0)
    return _VALUE.pack(kind, flags, tag, segment, offset, length, checksum, last_cached or 0, expires_at or 0,
                       version)


def record(value: bytes, key: bytes) -> bytes:
    """One index record: the value, the key, the CRC-32 of both."""
    body = value + key
    return body + _CRC.pack(zlib.crc32(body))


def record_ok(view: memoryview | bytes, at: int) -> bool:
    """Whether the 64 bytes at ``at`` are a whole record of a known kind with a good checksum."""
    if zlib.crc32(view[at:at + _CRC_AT]) != _CRC.unpack_from(view, at + _CRC_AT)[0]:
        return False
    kind, flags = view[at], view[at + 1]
    return kind in KINDS and not flags & ~_KNOWN_FLAGS


class Header(NamedTuple):
    generation: int
    snapshot: int  # records right after the header that are the live state at the generation's start
    next_segment: int
    log_id: int
    max_segment: int
    max_record: int

    def encode(self) -> bytes:
        head = _HEADER.pack(INDEX_MAGIC, FORMAT, self.generation, self.snapshot, self.next_segment, self.log_id,
                            self.max_segment, self.max_record)
        head += bytes(_CRC_AT - len(head))
        return head + _CRC.pack(zlib.crc32(head))

    @classmethod
    def decode(cls, data: bytes, where: str) -> Header:
        if len(data) < RECORD_SIZE:
            raise PageLogCorrupt(f"{where}: index header too short ({len(data)} bytes)")
        if zlib.crc32(data[:_CRC_AT]) != _CRC.unpack_from(data, _CRC_AT)[0]:
            raise PageLogCorrupt(f"{where}: index header checksum mismatch")
        magic, fmt, gen, snap, nxt, log_id, max_seg, max_rec = _HEADER.unpack_from(data)
        if magic != INDEX_MAGIC or fmt != FORMAT:
            raise PageLogCorrupt(f"{where}: not a page log index (magic {magic!r}, format {fmt})")
        if not (0 < max_seg <= MAX_SEGMENT_CAP and 0 < max_rec <= MAX_RECORD_CAP):
            raise PageLogCorrupt(f"{where}: bounds out of range ({max_seg}, {max_rec})")
        return cls(gen, snap, nxt, log_id, max_seg, max_rec)


def segment_header(segment: int) -> bytes:
    return _SEGMENT_HEAD.pack(SEGMENT_MAGIC, segment, 0)


def segment_header_ok(data: bytes, segment: int) -> bool:
    return len(data) == SEGMENT_HEADER_SIZE and _SEGMENT_HEAD.unpack(data)[:2] == (SEGMENT_MAGIC, segment)


def entry_header(data: bytes | memoryview, checksum: int, key: bytes) -> bytes:
    return _ENTRY.pack(ENTRY_MAGIC, len(data), checksum, key)


def parse_entry_header(data: bytes | memoryview, max_record: int) -> tuple[int, int, bytes] | None:
    """(body length, checksum, key) of a segment entry header, or None if it is not one (a length
    over ``max_record`` included: refused before anything is read for it)."""
    if len(data) < ENTRY_HEADER_SIZE:
        return None
    magic, length, checksum, key = _ENTRY.unpack_from(data)
    if magic != ENTRY_MAGIC or length > max_record:
        return None
    return length, checksum, key


def index_name(generation: int) -> str:
    return f"index-{generation:010d}.log"


def segment_name(segment: int) -> str:
    return f"seg-{segment:010d}.dat"


def parse_name(name: str, prefix: str, suffix: str) -> int | None:
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return None
    digits = name[len(prefix):-len(suffix)]
    return int(digits) if len(digits) == 10 and digits.isdigit() else None
