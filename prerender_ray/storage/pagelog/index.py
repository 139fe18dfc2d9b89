"""The in-memory index of a page log: key -> the record's value bytes, built by applying index
records in order. Writer and readers build it with the same code, so both stop at the same first
bad record.

Each entry is a 16-byte key and the record's 44-byte value as ``bytes``: about 180 bytes per entry
in a dict at 1,000,000 entries (``bench/bench_pagelog.py``), against about 430 for a tuple of ints;
a hit unpacks it with one precompiled ``struct`` call (0.1 us).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field

from prerender_ray.storage.pagelog.records import (
    DELETE,
    KEY_SIZE,
    PUT,
    RECORD_SIZE,
    RETIRE,
    SEAL,
    VALUE_SIZE,
    unpack_value,
)

_CRC_AT = VALUE_SIZE + KEY_SIZE
_FLAGS_MASK = 0xFC  # flags bits the format does not define
READ_CHUNK = 4 * 1024 * 1024  # bytes of index read at once: a reload or a far-behind tail is chunked


@dataclass(slots=True)
class Applied:
    """What one pass over index bytes did."""

    end: int  # the file offset after the last record applied (a record that is not whole stays)
    count: int = 0
    segments: set[int] = field(default_factory=set)  # segments that PUT records named
    retired: list[int] = field(default_factory=list)
    sealed: bool = False  # a SEAL record was applied: the generation ends at ``end``
    unlinked: bool = False  # the file had no name when its size was taken: nothing more will come


def apply(entries: dict[bytes, bytes], view: memoryview, base: int, out: Applied,
          ends: dict[int, int] | None = None) -> None:
    """Apply the whole, valid records of ``view`` (file bytes from offset ``base``) to ``entries``,
    stopping at the first that is not (torn, corrupt, or not written yet) or after a SEAL.
    ``ends``, when given, gets each segment's highest referenced end (the writer's cut bound)."""
    crc32 = zlib.crc32
    from_bytes = int.from_bytes
    segments = out.segments
    pos, stop = 0, len(view) - RECORD_SIZE
    while pos <= stop:
        rec = view[pos:pos + RECORD_SIZE]
        if crc32(rec[:_CRC_AT]) != from_bytes(rec[_CRC_AT:], "little") or rec[1] & _FLAGS_MASK:
            break
        kind = rec[0]
        if kind == PUT:
            key = bytes(rec[VALUE_SIZE:_CRC_AT])
            entries[key] = bytes(rec[:VALUE_SIZE])
            seg = from_bytes(rec[4:8], "little")
            segments.add(seg)
            if ends is not None:
                end = from_bytes(rec[8:12], "little") + from_bytes(rec[12:16], "little")
                if end > ends.get(seg, 0):
                    ends[seg] = end
        elif kind == DELETE:
            entries.pop(bytes(rec[VALUE_SIZE:_CRC_AT]), None)
        elif kind == RETIRE:
            out.retired.append(from_bytes(rec[4:8], "little"))
        elif kind == SEAL:
            out.sealed = True
            pos += RECORD_SIZE
            out.count += 1
            break
        else:
            break
        pos += RECORD_SIZE
        out.count += 1
    out.end = base + pos


def apply_file(entries: dict[bytes, bytes], fd: int, start: int, ends: dict[int, int] | None = None,
               limit: int | None = None) -> Applied:
    """Apply the records of the file ``fd`` from offset ``start`` to its end (or ``limit``), in
    chunks of ``READ_CHUNK`` bytes: memory is bounded whatever the file's size."""
    out = Applied(end=start)
    st = os.fstat(fd)
    out.unlinked = st.st_nlink == 0
    size = st.st_size if limit is None else limit
    while out.end + RECORD_SIZE <= size and not out.sealed:
        want = min(READ_CHUNK, size - out.end)
        want -= want % RECORD_SIZE
        data = os.pread(fd, want, out.end)
        before = out.end
        apply(entries, memoryview(data), out.end, out, ends)
        if out.end - before < len(data) - len(data) % RECORD_SIZE:
            break  # stopped at a record that is not whole or valid
        if len(data) < want:
            break
    return out


def live_by_segment(entries: dict[bytes, bytes]) -> dict[int, list[int]]:
    """segment -> [live bytes, live entries], from the index (the writer's compaction accounting)."""
    live: dict[int, list[int]] = {}
    for value in entries.values():
        v = unpack_value(value)
        acc = live.get(v[3])
        if acc is None:
            live[v[3]] = [v[5], 1]
        else:
            acc[0] += v[5]
            acc[1] += 1
    return live
