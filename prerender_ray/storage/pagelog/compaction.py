"""Compaction: the live entries of a sealed segment are written again at the log's head, then the
segment is retired.

Why a reader never sees a torn or vanished page (no reader registry needed):

- bytes in a segment are never overwritten: a place an index record names holds that body for as
  long as the file exists;
- the writer retires a segment only after the records that move its live entries are in the index
  (``relocate``), and writes RETIRE before it unlinks the file;
- a reader opens a segment's file when it applies the first record naming it and keeps the
  descriptor until it applies RETIRE, so an unlink never takes a file from under a read (POSIX keeps
  an unlinked file while a descriptor is open). A reader that was so far behind that the file is
  gone when it first meets it knows the moves are already in the index, and reads on before it
  answers (``PageLogReader.poll``).

The space of a retired segment comes back when the last reader applies its RETIRE: a stalled reader
holds it meanwhile. Disk use: a sealed segment is compacted once less than ``ratio`` of it is live, so
segments hold at most ``1 / ratio`` times the live bytes, plus the active segment, plus the index
(at most twice the live records before ``checkpoint``, ``CHECKPOINT_MIN`` at least).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from prerender_ray.storage.pagelog import files
from prerender_ray.storage.pagelog.records import (
    ENTRY_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    PageLogError,
    parse_entry_header,
    unpack_value,
)
from prerender_ray.storage.pagelog.writer import PageLogWriter

DEFAULT_RATIO = 0.5
BATCH_BYTES = 8 * 1024 * 1024  # bodies moved per append (one sync pair each)


class Compacted(NamedTuple):
    segment: int
    moved: int  # entries written again
    dropped: int  # live entries whose body failed its checksum (deleted: never served torn)
    freed: int  # bytes of the retired file


def candidates(writer: PageLogWriter, ratio: float = DEFAULT_RATIO) -> list[int]:
    """Sealed segments less than ``ratio`` live, emptiest first."""
    found = []
    for seg, size in writer.sizes.items():
        if seg == writer.active:
            continue
        count = writer.live.get(seg, [0, 0])
        used = count[0] + count[1] * ENTRY_HEADER_SIZE
        if used < ratio * max(1, size - SEGMENT_HEADER_SIZE):
            found.append((used / max(1, size), seg))
    return [seg for _, seg in sorted(found)]


def compact(writer: PageLogWriter, segment: int, *, batch_bytes: int = BATCH_BYTES) -> Compacted:
    """Move ``segment``'s live entries to the head of the log and retire it. A crash part way leaves a
    valid log: moved entries are plain writes, and the next open retires a segment left empty."""
    if segment == writer.active:
        raise PageLogError(f"segment {segment} is the active one")
    path = files.segment_path(writer.path, segment)
    fd = os.open(path, os.O_RDONLY)
    moved = 0
    dropped: list[bytes] = []
    try:
        size = os.fstat(fd).st_size
        batch: list[tuple[bytes, int, bytes]] = []
        pending = 0
        pos = SEGMENT_HEADER_SIZE
        while pos + ENTRY_HEADER_SIZE <= size:
            parsed = parse_entry_header(os.pread(fd, ENTRY_HEADER_SIZE, pos), writer.max_record)
            if parsed is None:
                break
            length, checksum, key = parsed
            at = pos + ENTRY_HEADER_SIZE
            cur = writer.entries.get(key)
            if cur is not None and unpack_value(cur)[3] == segment and unpack_value(cur)[4] == at:
                data = files.read_body(fd, at, length, checksum)
                if data is None:
                    dropped.append(key)
                else:
                    batch.append((key, at, data))
                    pending += length
                    if pending >= batch_bytes:
                        moved += writer.relocate(segment, batch)
                        batch, pending = [], 0
            pos = at + length
        moved += writer.relocate(segment, batch)
        if segment in writer.live:  # entries the scan did not reach (a damaged entry header before them)
            skip = set(dropped)
            rest = [(k, v) for k, v in writer.entries.items() if unpack_value(v)[3] == segment and k not in skip]
            for key, value in rest:
                v = unpack_value(value)
                data = files.read_body(fd, v[4], v[5], v[6])
                if data is None:
                    dropped.append(key)
                else:
                    moved += writer.relocate(segment, [(key, v[4], data)])
    finally:
        os.close(fd)
    if dropped:
        writer.delete(dropped)
    writer.retire(segment)
    return Compacted(segment, moved, len(dropped), size)


def maintain(writer: PageLogWriter, ratio: float = DEFAULT_RATIO, max_segments: int = 1) -> list[Compacted]:
    """One round of upkeep: compact up to ``max_segments`` candidates, then a new index generation if
    the index has grown past twice the live records."""
    done = [compact(writer, seg) for seg in candidates(writer, ratio)[:max_segments]]
    if writer.needs_checkpoint():
        writer.checkpoint()
    return done
