"""The page log's single writer (the node store): append framed bodies, touch and delete keys,
write a new index generation; recovery on open.

A batch is made durable in this order, so an index record never names bytes that are not there:

1. the bodies are written to the active segment (one ``pwrite`` per segment run) and, with
   ``sync``, fdatasync'd: one sync for the whole batch;
2. the batch's index records are written with one ``pwrite`` and, with ``sync``, fdatasync'd; only
   then is the batch acknowledged.

``sync=False`` (RocksDB's setting for the node's stores, ``storage/rocks.py``) survives a process
crash (the page cache holds every completed write, in order); after a power loss a record may name
a body that did not reach the disk, which its checksum then refuses on every read.

Recovery on open: the index is applied from the newest generation's start; the first record that is
not whole or whose CRC fails ends it and the file is cut there. The active segment is cut after its
last whole, valid entry (never below an end the index names). Retired segments still on disk are
unlinked; segments with no live entry are retired.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import NamedTuple

from prerender_ray.storage.pagelog import files
from prerender_ray.storage.pagelog.files import Sync, Write, failure
from prerender_ray.storage.pagelog.index import apply_file, live_by_segment
from prerender_ray.storage.pagelog.records import (
    DEFAULT_MAX_RECORD,
    DEFAULT_MAX_SEGMENT,
    DELETE,
    ENTRY_HEADER_SIZE,
    HAS_EXPIRES_AT,
    HAS_LAST_CACHED,
    KEY_SIZE,
    MAX_RECORD_CAP,
    MAX_SEGMENT_CAP,
    PUT,
    RECORD_SIZE,
    RETIRE,
    SEAL,
    SEGMENT_HEADER_SIZE,
    Header,
    PageLogCorrupt,
    PageLogError,
    body_checksum,
    entry_header,
    pack_value,
    parse_entry_header,
    record,
    segment_header,
    segment_header_ok,
    unpack_value,
)

CHECKPOINT_MIN = 1024 * 1024  # index bytes below which no new generation is written


class Item(NamedTuple):
    """One body to store under ``key`` (``records.key_hash``)."""

    key: bytes
    data: bytes
    version: int = 0
    last_cached: int | None = None
    expires_at: int | None = None
    tag: int = 0  # 16 bits the log keeps for its caller (e.g. which answer the bytes are)


class Position(NamedTuple):
    """A point in the index log: a reader at or past it has applied every write before it."""

    generation: int
    offset: int


class PageLogWriter:
    def __init__(self, path: str | os.PathLike, *, sync: bool = True, max_segment: int = DEFAULT_MAX_SEGMENT,
                 max_record: int = DEFAULT_MAX_RECORD, write: Write = os.pwrite, fsync: Sync = os.fdatasync):
        if not SEGMENT_HEADER_SIZE + ENTRY_HEADER_SIZE < max_segment <= MAX_SEGMENT_CAP:
            raise ValueError(f"max_segment {max_segment} out of range")
        if not 0 < max_record <= min(MAX_RECORD_CAP, max_segment - SEGMENT_HEADER_SIZE - ENTRY_HEADER_SIZE):
            raise ValueError(f"max_record {max_record} out of range")
        self.path = Path(path)
        self.sync = sync
        self.max_segment = max_segment
        self.max_record = max_record
        self._write = write
        self._fsync = fsync
        self.entries: dict[bytes, bytes] = {}
        self.live: dict[int, list[int]] = {}  # segment -> [live body bytes, live entries]
        self.sizes: dict[int, int] = {}  # segment -> bytes on disk
        self._read_fds: dict[int, int] = {}
        self.broken: str | None = None  # set when a sync failed: the page cache can no longer be trusted
        self.cut = {"index": 0, "segment": 0}  # bytes cut from torn tails on open
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = files.lock(self.path)
        try:
            self._open()
        except BaseException:
            os.close(self._lock)
            raise

    # ------------------------------------------------------------------------------------- open

    def _open(self) -> None:
        for name in os.listdir(self.path):
            if name.endswith(".tmp"):
                files.unlink(self.path / name)
        gens = files.generations(self.path)
        if not gens:
            head = Header(1, 0, 1, secrets.randbits(63), self.max_segment, self.max_record)
            files.create_durable(self.path / "new.tmp", files.index_path(self.path, 1), head.encode(),
                                 self._write, self._fsync, self.sync)
            gens = [1]
        for old in gens[:-1]:
            files.unlink(files.index_path(self.path, old))
        self._index_fd = os.open(files.index_path(self.path, gens[-1]), os.O_RDWR)
        self.header = Header.decode(os.pread(self._index_fd, RECORD_SIZE, 0), str(self.path))
        ends: dict[int, int] = {}
        applied = apply_file(self.entries, self._index_fd, RECORD_SIZE, ends)
        if applied.count < self.header.snapshot:
            raise PageLogCorrupt(f"{self.path}: generation {self.header.generation} holds {applied.count} of its "
                                 f"{self.header.snapshot} snapshot records")
        size = os.fstat(self._index_fd).st_size
        if size > applied.end:
            os.ftruncate(self._index_fd, applied.end)
            self.cut["index"] = size - applied.end
        self._index_end = applied.end
        on_disk = files.segments(self.path)
        retired = set(applied.retired)
        for seg in retired & set(on_disk):  # retired in the log, unlink not done before a crash
            files.unlink(files.segment_path(self.path, seg))
        on_disk = [s for s in on_disk if s not in retired]
        self.next_segment = max([self.header.next_segment, *(s + 1 for s in on_disk),
                                 *(s + 1 for s in ends)])
        self.live = live_by_segment(self.entries)
        lost = [k for k, v in self.entries.items() if unpack_value(v)[3] not in on_disk]
        if lost:  # a segment file removed behind our back: its pages are gone for every reader too
            self._commit([record(pack_value(DELETE), k) for k in lost])
        self._open_active(on_disk, ends)
        for seg in on_disk[:-1]:
            if seg not in self.live:
                self.retire(seg)
        if applied.sealed or (self.header.max_segment, self.header.max_record) != (self.max_segment,
                                                                                   self.max_record):
            self.checkpoint()

    def _open_active(self, on_disk: list[int], ends: dict[int, int]) -> None:
        for seg in on_disk:
            self.sizes[seg] = os.stat(files.segment_path(self.path, seg)).st_size
        if not on_disk:
            self._new_segment()
            return
        seg = on_disk[-1]
        fd = os.open(files.segment_path(self.path, seg), os.O_RDWR)
        if not segment_header_ok(os.pread(fd, SEGMENT_HEADER_SIZE, 0), seg) and seg not in self.live:
            os.close(fd)  # torn at creation, before any record named it
            files.unlink(files.segment_path(self.path, seg))
            del self.sizes[seg]
            self._new_segment()
            return
        end = max(self._valid_end(fd), ends.get(seg, 0))
        if self.sizes[seg] > end:
            os.ftruncate(fd, end)
            self.cut["segment"] = self.sizes[seg] - end
            self.sizes[seg] = end
        self._active, self._active_fd, self._active_end = seg, fd, end

    def _valid_end(self, fd: int) -> int:
        """The end of the last whole entry with a good checksum, scanning from the start."""
        pos, size = SEGMENT_HEADER_SIZE, os.fstat(fd).st_size
        while pos + ENTRY_HEADER_SIZE <= size:
            parsed = parse_entry_header(os.pread(fd, ENTRY_HEADER_SIZE, pos), self.max_record)
            if parsed is None or pos + ENTRY_HEADER_SIZE + parsed[0] > size:
                break
            body = files.read_body(fd, pos + ENTRY_HEADER_SIZE, parsed[0], parsed[1])
            if body is None:
                break
            pos += ENTRY_HEADER_SIZE + parsed[0]
        return pos

    def _new_segment(self) -> None:
        seg = self.next_segment
        p = files.segment_path(self.path, seg)
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            files.write_all(self._write, fd, segment_header(seg), 0)
            if self.sync:
                self._fsync(fd)
                files.sync_dir(self.path)
        except OSError as e:
            os.close(fd)
            files.unlink(p)
            raise failure(f"cannot create segment {p}", e) from None
        old = getattr(self, "_active_fd", None)
        if old is not None:
            os.close(old)
        self.next_segment = seg + 1
        self.sizes[seg] = SEGMENT_HEADER_SIZE
        self._active, self._active_fd, self._active_end = seg, fd, SEGMENT_HEADER_SIZE

    # ----------------------------------------------------------------------------------- writes

    @property
    def position(self) -> Position:
        return Position(self.header.generation, self._index_end)

    def append(self, items: list[Item]) -> Position:
        """Store every item (a key written twice keeps the last); durable on return (see the module
        doc). Raises ValueError for a bad item before anything is written, PageLogFull when the disk
        is full (``committed`` says how many of the items were stored), PageLogError otherwise."""
        self._check()
        for it in items:
            if len(it.key) != KEY_SIZE:
                raise ValueError(f"key must be {KEY_SIZE} bytes, not {len(it.key)}")
            if len(it.data) > self.max_record:
                raise ValueError(f"record of {len(it.data)} bytes is over the log's limit of {self.max_record}")
        return self._commit(self._store_bodies(items))

    def _store_bodies(self, items: list[Item]) -> list[bytes]:
        """Write the bodies (segment by segment, each run synced); the index records that name them."""
        records: list[bytes] = []
        run: list[bytes] = []
        start = self._active_end
        for it in items:
            need = ENTRY_HEADER_SIZE + len(it.data)
            if self._active_end + need > self.max_segment and self._active_end > SEGMENT_HEADER_SIZE:
                self._flush_run(run, start)
                self._new_segment()
                run, start = [], self._active_end
            checksum = body_checksum(it.data)
            run += (entry_header(it.data, checksum, it.key), it.data)
            offset = self._active_end + ENTRY_HEADER_SIZE
            records.append(record(pack_value(PUT, tag=it.tag, segment=self._active, offset=offset,
                                             length=len(it.data), checksum=checksum, last_cached=it.last_cached,
                                             expires_at=it.expires_at, version=it.version), it.key))
            self._active_end += need
        self._flush_run(run, start)
        return records

    def _flush_run(self, run: list[bytes], start: int) -> None:
        if not run:
            return
        try:
            files.write_all(self._write, self._active_fd, b"".join(run), start)
            if self.sync:
                self._fsync(self._active_fd)
        except OSError as e:
            # Nothing names these bytes yet: cut them, so the segment ends where it did.
            self._active_end = start
            try:
                os.ftruncate(self._active_fd, start)
            except OSError:
                pass  # the bytes stay as a dead tail; the next append overwrites them
            raise failure(f"cannot append to segment {self._active} of {self.path}", e) from None
        self.sizes[self._active] = max(self.sizes.get(self._active, 0), self._active_end)

    def _commit(self, records: list[bytes]) -> Position:
        """Write index records with one pwrite (and one sync), then apply them in memory. On a write
        that fails part way, the whole records written are kept and applied (readers may have seen
        them), the partial one is cut, and the error says how many went in."""
        data = b"".join(records)
        try:
            files.write_all(self._write, self._index_fd, data, self._index_end)
            written = len(data)
        except OSError as e:
            written = getattr(e, "written", 0)
            whole = written // RECORD_SIZE
            self._apply(records[:whole])
            self._index_end += whole * RECORD_SIZE
            try:
                os.ftruncate(self._index_fd, self._index_end)
            except OSError:
                self.broken = f"index tail could not be cut after: {e}"
            raise failure(f"cannot append to the index of {self.path}", e, whole) from None
        if self.sync:
            try:
                self._fsync(self._index_fd)
            except OSError as e:
                self.broken = f"index sync failed: {e}"
                raise failure(f"cannot sync the index of {self.path}", e) from None
        self._apply(records)
        self._index_end += written
        return self.position

    def _apply(self, records: list[bytes]) -> None:
        live, entries = self.live, self.entries
        for rec in records:
            kind = rec[0]
            if kind != PUT and kind != DELETE:
                continue
            key = rec[44:60]
            old = entries.pop(key, None)
            if old is not None:
                o = unpack_value(old)
                acc = live[o[3]]
                acc[0] -= o[5]
                acc[1] -= 1
                if not acc[1]:
                    del live[o[3]]
            if kind == PUT:
                value = entries[key] = rec[:44]
                v = unpack_value(value)
                acc = live.setdefault(v[3], [0, 0])
                acc[0] += v[5]
                acc[1] += 1

    def relocate(self, segment: int, found: list[tuple[bytes, int, bytes]]) -> int:
        """Compaction's append: each (key, body offset, body) read from ``segment`` is written again
        with its current freshness, if the index still names that very place (a newer write or a
        delete since the read wins). Returns how many moved."""
        items = []
        for key, offset, data in found:
            cur = self.entries.get(key)
            if cur is None:
                continue
            v = unpack_value(cur)
            if v[3] != segment or v[4] != offset:
                continue
            items.append(Item(key, data, v[9], v[7] if v[1] & HAS_LAST_CACHED else None,
                              v[8] if v[1] & HAS_EXPIRES_AT else None, v[2]))
        if items:
            self.append(items)
        return len(items)

    @property
    def active(self) -> int:
        return self._active

    def touch(self, key: bytes, *, version: int, last_cached: int | None, expires_at: int | None) -> Position | None:
        """New freshness for a stored key, without writing its body again; None if it is not stored."""
        self._check()
        old = self.entries.get(key)
        if old is None:
            return None
        v = unpack_value(old)
        value = pack_value(PUT, tag=v[2], segment=v[3], offset=v[4], length=v[5], checksum=v[6],
                           last_cached=last_cached, expires_at=expires_at, version=version)
        return self._commit([record(value, key)])

    def restore(self, key: bytes, value: bytes) -> bool:
        """Put back an index entry this writer held before a batch refused part way through replaced
        or deleted it (its bytes are still where it says: no compaction ran meanwhile); False when
        its segment is gone."""
        self._check()
        v = unpack_value(value)
        if v[0] != PUT or v[3] not in self.sizes:
            return False
        self._commit([record(value, key)])
        return True

    def delete(self, keys: list[bytes], *, version: int = 0) -> Position:
        self._check()
        present = [k for k in keys if k in self.entries]
        return self._commit([record(pack_value(DELETE, version=version), k) for k in present])

    def retire(self, segment: int) -> None:
        """Unlink a sealed segment no live entry names: the RETIRE record first (readers close the
        file when they apply it; one that still has it open reads on from its descriptor), then the
        unlink. A crash between the two leaves a file that the next open unlinks."""
        if segment == self._active or segment in self.live:
            raise PageLogError(f"segment {segment} of {self.path} is still in use")
        self._commit([record(pack_value(RETIRE, segment=segment), bytes(KEY_SIZE))])
        fd = self._read_fds.pop(segment, None)
        if fd is not None:
            os.close(fd)
        files.unlink(files.segment_path(self.path, segment))
        self.sizes.pop(segment, None)

    def _check(self) -> None:
        if self.broken is not None:
            raise PageLogError(f"page log {self.path} must be reopened: {self.broken}")

    # ----------------------------------------------------------------------------- generations

    def needs_checkpoint(self) -> bool:
        """The index holds more than twice the live records (and at least ``CHECKPOINT_MIN``)."""
        return self._index_end > max(CHECKPOINT_MIN, 2 * RECORD_SIZE * (len(self.entries) + 1))

    def checkpoint(self) -> Position:
        """A new index generation holding only the live records; the old one is sealed (a reader that
        applied it to the SEAL skips the snapshot: it already holds that state) and unlinked."""
        self._check()
        old_gen, old_fd = self.header.generation, self._index_fd
        head = Header(old_gen + 1, len(self.entries), self.next_segment, self.header.log_id, self.max_segment,
                      self.max_record)
        data = b"".join([head.encode(), *(record(v, k) for k, v in self.entries.items())])
        final = files.index_path(self.path, head.generation)
        try:
            files.create_durable(self.path / "checkpoint.tmp", final, data, self._write, self._fsync, self.sync)
        except OSError as e:
            raise failure(f"cannot write a new index generation for {self.path}", e) from None
        new_fd = os.open(final, os.O_RDWR)
        try:
            self._commit([record(pack_value(SEAL), bytes(KEY_SIZE))])
        except PageLogError:
            pass  # readers find the newer generation beside an unsealed one and reload from it
        self._index_fd, self.header, self._index_end = new_fd, head, len(data)
        os.close(old_fd)
        files.unlink(files.index_path(self.path, old_gen))
        return self.position

    # ------------------------------------------------------------------------------------ reads

    def read(self, key: bytes) -> bytes | None:
        """The body stored under ``key`` (checked), or None."""
        value = self.entries.get(key)
        if value is None:
            return None
        v = unpack_value(value)
        return files.read_body(self._segment_fd(v[3]), v[4], v[5], v[6])

    def _segment_fd(self, segment: int) -> int:
        fd = self._read_fds.get(segment)
        if fd is None:
            fd = self._read_fds[segment] = os.open(files.segment_path(self.path, segment), os.O_RDONLY)
        return fd

    def disk_bytes(self) -> int:
        return sum(self.sizes.values()) + self._index_end

    def live_bytes(self) -> int:
        return sum(acc[0] + acc[1] * ENTRY_HEADER_SIZE for acc in self.live.values())

    def close(self) -> None:
        for fd in (*self._read_fds.values(), self._active_fd, self._index_fd, self._lock):
            try:
                os.close(fd)
            except OSError:
                pass
        self._read_fds.clear()
