"""The page log put right against the pages RocksDB: at the store's open (a crash between a batch's
log ops and its RocksDB write, a log cut on open, or the first start of a store that has pages and no
log yet) and for the keys of a batch refused part way through (``repair``).

RocksDB is the truth. Per page, the version pointer (``HPTR``: ``\\x00h<key>`` -> hlc:8 + live:1) says
which version is held and whether it is live, without reading a page:

- not live, or no pointer: the log entry, if any, is deleted;
- live and the log lacks that version: the record is read from RocksDB and appended whole;
- live and the log has that version: only its times can differ. A freshness record newer than the
  page (``FRESHNESS``, walked beside the pointers in key order) whose times the entry holds is the
  touch the mirror applied (it checks the ETag): right. Otherwise the page's own times are read
  from the head of the log's own copy (one small ``pread``), and the page is read from RocksDB only
  when a newer freshness record may apply (its ETag decides).

Log entries of keys with no live page are deleted. Memory: the log keys seen (16 bytes each) and one
chunk of pages at a time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import NamedTuple

from prerender_ray.storage.keys import FRESHNESS, HPTR
from prerender_ray.storage.pagelog import files
from prerender_ray.storage.pagelog.mirror import (
    GetMany,
    entry_state,
    hlc_of,
    live_payload,
    log_key,
    page_item,
    raw_reads,
)
from prerender_ray.storage.pagelog.records import unpack_value
from prerender_ray.storage.pagelog.writer import Item, PageLogWriter
from prerender_ray.storage.pages import HEAD_SIZE, PageDecodeError, head_times
from prerender_ray.storage.replication import hlc_bytes, is_stub
from prerender_ray.storage.rocks import Store
from prerender_ray.storage.touches import Touch, TouchDecodeError

CHUNK = 256  # pages read from RocksDB and appended at once
_PROBE = 512  # bytes of a log body read for its head (envelope, node name, page head)


class Reconciled(NamedTuple):
    pages: int  # live pages in RocksDB (of the keys looked at)
    appended: int
    retimed: int
    deleted: int
    seconds: float
    unresolved: int = 0  # stubs whose version the log lacks (``Mirror.unresolved``: the store settles them)


class _Pass:
    def __init__(self, writer: PageLogWriter, get_many: GetMany, unresolved: set[bytes] | None = None,
                 previous: dict[bytes, bytes] | None = None):
        self.writer = writer
        self.get_many = get_many  # RocksDB's own values: a stub as a stub (``mirror.raw_reads``)
        self.unresolved = unresolved if unresolved is not None else set()
        self.previous = previous if previous is not None else {}  # ``Mirror.previous``
        self.stubs = 0
        self.live = 0
        self.seen: set[bytes] = set()
        self.reads: list[tuple[bytes, bytes, bytes | None]] = []  # (cache key, log key, freshness record)
        self.retimes: list[tuple[bytes, int, int | None, int | None]] = []
        self.deletes: list[bytes] = []
        self.appended = 0
        self.batch = CHUNK  # pages read at once
        self.read_bytes = self.read_pages = 0  # pages read from RocksDB
        self._fds: dict[int, int] = {}

    def check(self, key: bytes, ptr: bytes | None, touch: bytes | None) -> None:
        kh = log_key(key)
        if kh is None:
            return
        held = self.writer.entries.get(kh)
        known = ptr is not None and len(ptr) > 8
        if ptr is None or (known and ptr[8] != 1):
            if held is not None:
                self.deletes.append(kh)
            return
        self.seen.add(kh)
        hlc = int.from_bytes(ptr[:8], "big")
        if not known or held is None or entry_state(held)[0] != hlc:  # (an old pointer: liveness unknown)
            self._read(key, kh, touch)
            return
        times = entry_state(held)[1:]
        touch_v = hlc_bytes(touch)
        if touch_v is not None and touch_v > ptr[:8]:  # a newer freshness record
            payload = live_payload(touch)
            if payload is not None and times == _touch_times(payload):
                self.live += 1
                return
            self._read(key, kh, touch)  # whether it applies: the page's ETag says
            return
        own = self._own_times(held)
        if own is None:
            self._read(key, kh, touch)  # the log's copy is unreadable: write it again
        else:
            self.live += 1
            if own != times:
                self.retimes.append((kh, hlc, *own))

    def _read(self, key: bytes, kh: bytes, touch: bytes | None) -> None:
        self.reads.append((key, kh, touch))
        if len(self.reads) >= self.batch:
            self.flush_reads()

    def flush_reads(self) -> None:
        """Read the pending pages from RocksDB; append those the log lacks, re-time the others."""
        if not self.reads:
            return
        reads, self.reads = self.reads, []
        records = self.get_many([key for key, _, _ in reads])
        self.read_bytes += sum(len(r) for r in records if r is not None)
        self.read_pages += len(records)
        items: list[Item] = []
        for (key, kh, touch), record in zip(reads, records):
            if record is not None and is_stub(record):  # one copy, and the log lacks its version
                prev = self.previous.get(kh)
                if prev is not None and entry_state(prev)[0] == hlc_of(record) and self.writer.restore(kh, prev):
                    del self.previous[kh]
                    self.live += 1  # the entry a refused batch replaced, put back
                    self.appended += 1
                    continue
                self.unresolved.add(key)  # a newer one, or none: the store settles it
                self.stubs += 1
                continue
            item = page_item(kh, record, touch)
            held = self.writer.entries.get(kh)
            if item is None or len(item.data) > self.writer.max_record:
                self.seen.discard(kh)
                if held is not None:
                    self.deletes.append(kh)
                continue
            self.live += 1
            if held is not None and entry_state(held)[0] == item.version:
                if entry_state(held)[1:] != (item.last_cached, item.expires_at):
                    self.retimes.append((kh, item.version, item.last_cached, item.expires_at))
            else:
                items.append(item)
        if items:
            self.writer.append(items)
            self.appended += len(items)

    def _own_times(self, value: bytes) -> tuple[int | None, int | None] | None:
        """The page's own times, from the head of the body the log holds (None: unreadable)."""
        v = unpack_value(value)
        seg, offset, length = v[3], v[4], v[5]
        fd = self._fds.get(seg)
        try:
            if fd is None:
                fd = self._fds[seg] = os.open(files.segment_path(self.writer.path, seg), os.O_RDONLY)
            head = os.pread(fd, min(length, _PROBE), offset)
            payload = live_payload(head)
            if payload is not None and len(payload) < HEAD_SIZE and length > len(head):
                payload = live_payload(os.pread(fd, length, offset))  # a very long node name
            return head_times(payload) if payload is not None else None
        except (OSError, PageDecodeError):
            return None

    def finish(self, started: float) -> Reconciled:
        self.flush_reads()
        w = self.writer
        for kh, version, last, expires in self.retimes:
            w.touch(kh, version=version, last_cached=last, expires_at=expires)
        if self.deletes:
            w.delete(self.deletes)
        self.close()
        return Reconciled(self.live, self.appended, len(self.retimes), len(self.deletes),
                          time.perf_counter() - started, self.stubs)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _touch_times(payload: memoryview) -> tuple[int | None, int | None] | None:
    try:
        t = Touch.decode("", payload)
    except TouchDecodeError:
        return None
    return t.last_cached, t.expires_at


def _pointers(store: Store) -> Iterator[tuple[bytes, bytes, bytes | None]]:
    """(cache key, pointer, freshness record) of every page pointer, the two families merged by key."""
    touches = store.items(FRESHNESS)
    t = next(touches, None)
    at = len(FRESHNESS)
    for hkey, ptr in store.items(HPTR):
        key = hkey[len(HPTR):]
        while t is not None and t[0][at:] < key:
            t = next(touches, None)
        yield key, ptr, t[1] if t is not None and t[0][at:] == key else None


def reconcile(writer: PageLogWriter, store: Store, unresolved: set[bytes] | None = None) -> Reconciled:
    """The whole log against the whole pages store (see the module doc); the keys of stubs whose
    version the log lacks go to ``unresolved``."""
    started = time.perf_counter()
    p = _Pass(writer, raw_reads(store), unresolved)
    for key, ptr, touch in _pointers(store):
        p.check(key, ptr, touch)
    p.flush_reads()
    gone = set(p.deletes)
    p.deletes += [kh for kh in writer.entries if kh not in p.seen and kh not in gone]
    return p.finish(started)


def repair(writer: PageLogWriter, get_many: GetMany, keys: list[bytes],
           unresolved: set[bytes] | None = None, previous: dict[bytes, bytes] | None = None) -> Reconciled:
    """``reconcile`` for the cache keys given (a batch refused part way through); ``get_many``:
    RocksDB's own values (``mirror.raw_reads``)."""
    started = time.perf_counter()
    p = _Pass(writer, get_many, unresolved, previous)
    keys = list(dict.fromkeys(keys))
    found = get_many([HPTR + k for k in keys] + [FRESHNESS + k for k in keys]) if keys else []
    for key, ptr, touch in zip(keys, found[:len(keys)], found[len(keys):]):
        p.check(key, ptr, touch)
    return p.finish(started)
