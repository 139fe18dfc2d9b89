"""The page log built from the pages RocksDB in bounded chunks while the store serves (issue 37): a
first start over pages written before the log, or a log rebuilt after damage (no ``COMPLETE`` mark).
A whole ``reconcile`` under the mirror's lock would keep every pages write waiting for minutes at
1,000,000 pages; here each ``step`` holds the lock for one chunk only.

A step walks the version pointers (``HPTR``, freshness records beside them) in key order from where
the last one stopped and checks each page as ``reconcile`` does, reading RocksDB as it is now: the
caller holds the mirror's lock, so every pages write is either wholly before the step (the log and
RocksDB already agree on it) or wholly after; the walk never writes an older record over a newer one.
Writes made meanwhile go through the mirror as usual: behind the cursor they are the log's truth,
ahead of it the walk finds the log already holding their version (a pointer check and one ``pread``).

Log entries whose key has no pointer are deleted at the end: those held when the build started, the
walk never met and no mirrored write touched since (``Mirror.touched``). Only then may the caller
mark the log complete. The cursor lives in memory: a build cut short (a crash, a close) starts
again from the first key on the next open, and what the log already holds costs a pointer check.
Memory: the log keys held at the start (16 bytes each), the keys written meanwhile, one chunk.
"""

from __future__ import annotations

import time

from prerender_ray.storage.keys import FRESHNESS, HPTR
from prerender_ray.storage.pagelog.mirror import log_key, raw_reads
from prerender_ray.storage.pagelog.reconcile import Reconciled, _Pass
from prerender_ray.storage.pagelog.writer import PageLogWriter
from prerender_ray.storage.rocks import Store

CHUNK_KEYS = 4096  # pointers passed per step (one lock hold)
CHUNK_BYTES = 4 << 20  # page bytes read and appended per step
READS = 32  # pages read from RocksDB at once
GUESS = 16 << 10  # bytes a page is taken to be before any was read (the byte bound counts reads queued)


class Build:
    """One build of ``writer``'s log from ``store``; ``step`` under the mirror's lock until it returns
    True, then ``finish`` (same lock hold). ``touched``: the set the mirror adds the log keys of its
    writes to (``Mirror.touched``), from before the first step."""

    def __init__(self, writer: PageLogWriter, store: Store, touched: set[bytes], *, keys: int = CHUNK_KEYS,
                 max_bytes: int = CHUNK_BYTES, unresolved: set[bytes] | None = None):
        self.writer = writer
        self.store = store
        self.touched = touched
        self.unresolved = unresolved  # stubs met whose version the log lacks (a log lost: its pages with it)
        self.stubs = 0
        self.keys = max(1, keys)
        self.max_bytes = max(1, max_bytes)
        self.held = set(writer.entries)  # met by the walk or a mirrored write, or deleted at the end
        self.after: bytes | None = None  # the last cache key passed
        self.passed = 0  # pointers passed
        self.pages = self.appended = self.retimed = self.deleted = 0
        self.steps = 0
        self.longest = 0.0  # the longest step (lock hold), seconds
        self.read_bytes, self.read_pages = 0, 0
        self.started = time.perf_counter()
        self.ended = False

    def step(self) -> bool:
        """The next chunk; True when the walk has passed every key (then ``finish``)."""
        t0 = time.perf_counter()
        p = _Pass(self.writer, raw_reads(self.store), self.unresolved)
        p.batch = READS
        walk = _pointers_after(self.store, self.after)
        before, n = self.after, 0
        try:
            for key, ptr, touch in walk:
                kh = log_key(key)
                if kh is not None:
                    self.held.discard(kh)
                p.check(key, ptr, touch)
                self.after = key
                n += 1
                if n >= self.keys or p.read_bytes + len(p.reads) * self._page_bytes() >= self.max_bytes:
                    break
            else:
                self.ended = True
            done = p.finish(t0)  # pending reads, re-times and deletes: within this lock hold
        except BaseException:  # (a full disk) the chunk is walked again by the next step
            self.after, self.ended = before, False
            p.close()
            raise
        finally:
            walk.close()
        self.passed += n
        self.read_bytes += p.read_bytes
        self.read_pages += p.read_pages
        self.pages += done.pages
        self.appended += done.appended
        self.retimed += done.retimed
        self.deleted += done.deleted
        self.stubs += done.unresolved
        self.steps += 1
        self.longest = max(self.longest, time.perf_counter() - t0)
        return self.ended

    def _page_bytes(self) -> int:
        return self.read_bytes // self.read_pages if self.read_pages else GUESS

    def finish(self) -> Reconciled:
        """Delete the entries of keys with no page (see the module doc); the log then mirrors the store."""
        stale = [kh for kh in self.held if kh not in self.touched and kh in self.writer.entries]
        if stale:
            self.writer.delete(stale)
            self.deleted += len(stale)
        self.held.clear()
        return Reconciled(self.pages, self.appended, self.retimed, self.deleted, time.perf_counter() - self.started,
                          self.stubs)


def _pointers_after(store: Store, after: bytes | None):
    """``reconcile._pointers`` from the first cache key after ``after``."""
    start = None if after is None else after + b"\x00"  # the least key greater than ``after``
    touches = store.items(FRESHNESS, None if start is None else FRESHNESS + start)
    t = next(touches, None)
    at = len(FRESHNESS)
    for hkey, ptr in store.items(HPTR, None if start is None else HPTR + start):
        key = hkey[len(HPTR):]
        while t is not None and t[0][at:] < key:
            t = next(touches, None)
        yield key, ptr, t[1] if t is not None and t[0][at:] == key else None


__all__ = ["Build", "CHUNK_BYTES", "CHUNK_KEYS", "READS"]
