"""One copy on disk for pages written whole (issue 37): a walk that turns into stubs the RocksDB
records the page log already holds, in bounded chunks while the store serves.

Pages are written whole to RocksDB while the log is not complete (a store's first start over pages
written before the log, a build of a lost log) and by releases before one copy; the mirror writes
stubs only while the log is complete (``Mirror.stubs``). The walk passes the version pointers
(``HPTR``) in key order from where the last chunk stopped, reads the records of live ones, and
writes a stub over each record whose very version the log holds (its entry's version is the
record's HLC: the log has those bytes), straight to RocksDB: the log, the versions, the index and
the counts are unchanged, so nothing else moves. A record written meanwhile is a stub already or
newer than the walk's read; the caller holds the mirror's lock for each chunk, so no write falls
between a chunk's read and its write.

When a walk has passed every key, ``ONE_COPY`` is set in the store, and later opens skip the walk;
whoever writes whole records again (the mirror with stubs off) clears it (``StorePageLog``).
"""

from __future__ import annotations

import time

from prerender_ray.storage.keys import HPTR, ONE_COPY
from prerender_ray.storage.pagelog.mirror import entry_state, hlc_of, live_payload, log_key, raw_reads
from prerender_ray.storage.pagelog.writer import PageLogWriter
from prerender_ray.storage.replication import is_stub, stub
from prerender_ray.storage.rocks import Store

CHUNK_KEYS = 256  # pointers passed per step (a step holds the mirror's lock)


class Thinning:
    def __init__(self, writer: PageLogWriter, store: Store, *, keys: int = CHUNK_KEYS):
        self.writer = writer
        self.store = store
        self.keys = max(1, keys)
        self.after: bytes | None = None  # the last cache key passed
        self.passed = self.thinned = self.steps = 0
        self.freed = 0  # record bytes RocksDB no longer keeps (before its own compaction)
        self.longest = 0.0  # the longest step (a hold of the mirror's lock: what a pages write may wait), s
        self.started = time.perf_counter()

    def step(self) -> bool:
        """(the mirror's lock held) The next chunk; True when the walk has passed every key (and
        ``ONE_COPY`` is set)."""
        t0 = time.perf_counter()
        try:
            return self._step()
        finally:
            self.steps += 1
            self.longest = max(self.longest, time.perf_counter() - t0)

    def _step(self) -> bool:
        start = HPTR if self.after is None else HPTR + self.after + b"\x00"
        keys: list[bytes] = []
        for hkey, ptr in Store.items(self.store, HPTR, start):
            if len(ptr) > 8 and ptr[8] == 1:  # live (an old pointer without the flag: left whole)
                keys.append(hkey[len(HPTR):])
            self.after = hkey[len(HPTR):]
            self.passed += 1
            if self.passed % self.keys == 0:
                break
        else:
            self._thin(keys)
            done(self.store)
            return True
        self._thin(keys)
        return False

    def _thin(self, keys: list[bytes]) -> None:
        ops = []
        entries = self.writer.entries
        for key, record in zip(keys, raw_reads(self.store)(keys)):
            if record is None or is_stub(record):
                continue
            kh = log_key(key)
            held = entries.get(kh) if kh is not None else None
            if held is not None and live_payload(record) is not None and entry_state(held)[0] == hlc_of(record):
                ops.append((key, stub(record)))
                self.freed += len(record)
        if ops:
            Store.write(self.store, ops)  # not through the mirror: the log holds these very records
            self.thinned += len(ops)


def thinned(store: Store) -> bool:
    """Whether every record the log holds is a stub already (a walk ended since whole ones were written)."""
    return Store.get(store, ONE_COPY) is not None


def done(store: Store) -> None:
    Store.write(store, [(ONE_COPY, b"1")])


def owe(store: Store) -> None:
    """Whole records are written again: the next walk must pass every key."""
    Store.write(store, [(ONE_COPY, None)])


__all__ = ["CHUNK_KEYS", "Thinning", "done", "owe", "thinned"]
