"""A page log reader (an ingress replica, any process): the whole index in memory, kept current by
tailing the index log; a hit is one dict look-up, one ``pread`` and a checksum.

``poll`` applies the records written since the last one: whole ones only (a record being written is
left for the next poll), stopping at a generation's SEAL to go on in the next generation after its
snapshot (the state it already holds). A full reload (``load``) happens at open, and when the
reader finds its generation gone or superseded without a SEAL (the writer crashed in a checkpoint).
``position`` says how far it has applied: the writer's ``Position`` of a write, once the reader is
at or past it, is served.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from prerender_ray.storage.pagelog import files
from prerender_ray.storage.pagelog.index import apply_file
from prerender_ray.storage.pagelog.records import (
    HAS_EXPIRES_AT,
    HAS_LAST_CACHED,
    RECORD_SIZE,
    Header,
    PageLogError,
    body_checksum,
    unpack_value,
)
from prerender_ray.storage.pagelog.writer import Position


class Hit(NamedTuple):
    data: bytes
    last_cached: int | None
    expires_at: int | None
    version: int
    tag: int


class PageLogReader:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.entries: dict[bytes, bytes] = {}
        self.header: Header | None = None
        self._index_fd: int | None = None
        self._pos = 0
        self._fds: dict[int, int] = {}
        self._gone: set[int] = set()  # segments retired or found unlinked (ids are never reused)
        self._max_record = 0
        self._sealed = False  # the current generation's SEAL is applied: the next one is where to go on
        self.reloads = 0
        self.unreadable = 0  # hits refused: a body short or failing its checksum, or its file gone
        self.load()

    # ------------------------------------------------------------------------------------ state

    @property
    def ready(self) -> bool:
        return self.header is not None

    @property
    def position(self) -> Position:
        return Position(self.header.generation if self.header is not None else 0, self._pos)

    def caught_up(self, position: Position) -> bool:
        return self.position >= position

    def load(self) -> bool:
        """Rebuild the index from the newest generation (False while the log has none yet). The new
        state replaces the old one only once whole."""
        for gen in reversed(files.generations(self.path) if self.path.is_dir() else []):
            try:
                fd = os.open(files.index_path(self.path, gen), os.O_RDONLY)
            except FileNotFoundError:
                continue  # superseded while we listed: an older one will not do either, list again
            header = Header.decode(os.pread(fd, RECORD_SIZE, 0), str(self.path))
            entries: dict[bytes, bytes] = {}
            applied = apply_file(entries, fd, RECORD_SIZE)
            self._close_all()
            self.entries, self.header, self._index_fd, self._pos = entries, header, fd, applied.end
            self._max_record = header.max_record
            self.reloads += 1
            self._segments(applied.segments, applied.retired)
            self._sealed = applied.sealed
            self.poll()
            return True
        return False

    def close(self) -> None:
        self._close_all()
        self.header = None

    def _close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._gone.clear()
        if self._index_fd is not None:
            os.close(self._index_fd)
            self._index_fd = None

    # ---------------------------------------------------------------------------------- follow

    def poll(self) -> int:
        """Apply what the writer added since the last poll; returns how many records."""
        if self._index_fd is None:
            return len(self.entries) if self.load() else 0
        total = 0
        while True:
            if self._sealed and not self._next_generation():
                return total
            applied = apply_file(self.entries, self._index_fd, self._pos)
            self._pos = applied.end
            total += applied.count
            missed = self._segments(applied.segments, applied.retired)
            self._sealed = applied.sealed
            if applied.sealed or missed:
                # After an unlinked segment: the records that moved its entries precede the unlink,
                # so read on before answering anything (compaction.py).
                continue
            if applied.unlinked:
                # Our generation was unlinked without a SEAL (a checkpoint whose SEAL failed, or a
                # writer that crashed in one and reopened): every SEAL precedes the unlink, and
                # everything written before it has just been applied, so none is coming.
                self.load()
            return total

    def _segments(self, named: set[int], retired: list[int]) -> bool:
        """Open the segments newly named, close the retired; True if one was already unlinked."""
        missed = False
        for seg in retired:
            self._gone.add(seg)
            fd = self._fds.pop(seg, None)
            if fd is not None:
                os.close(fd)
        for seg in named:
            if seg in self._fds or seg in self._gone:
                continue
            try:
                self._fds[seg] = os.open(files.segment_path(self.path, seg), os.O_RDONLY)
            except FileNotFoundError:
                self._gone.add(seg)
                missed = True
        return missed

    def _next_generation(self) -> bool:
        """Go on after a SEAL in the next generation, past its snapshot (False while it is not there;
        a reload when ours is gone too, or the next one is not ours)."""
        assert self.header is not None and self._index_fd is not None
        try:
            fd = os.open(files.index_path(self.path, self.header.generation + 1), os.O_RDONLY)
        except FileNotFoundError:
            if os.fstat(self._index_fd).st_nlink == 0:
                self.load()  # the writer has moved on further: start from the newest
            return False
        header = Header.decode(os.pread(fd, RECORD_SIZE, 0), str(self.path))
        start = RECORD_SIZE * (1 + header.snapshot)
        if header.log_id != self.header.log_id or os.fstat(fd).st_size < start:
            os.close(fd)
            self.load()
            return False
        os.close(self._index_fd)
        self._index_fd, self.header, self._pos, self._max_record = fd, header, start, header.max_record
        self._sealed = False
        return True

    # ------------------------------------------------------------------------------------- hits

    def get(self, key: bytes) -> Hit | None:
        """The body stored under ``key`` with its freshness, or None: absent, or not readable whole
        (counted in ``unreadable``; never served)."""
        value = self.entries.get(key)
        if value is None:
            return None
        _, flags, tag, seg, offset, length, checksum, last, expires, version = unpack_value(value)
        fd = self._fds.get(seg)
        if fd is None or length > self._max_record:
            self.unreadable += 1
            return None
        data = os.pread(fd, length, offset)
        if len(data) != length or body_checksum(data) != checksum:
            self.unreadable += 1
            return None
        return Hit(data, last if flags & HAS_LAST_CACHED else None, expires if flags & HAS_EXPIRES_AT else None,
                   version, tag)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self.entries


__all__ = ["Hit", "PageLogError", "PageLogReader"]
