"""RocksDB (rocksdict) stores: one directory per node and purpose, exactly one writer process each.

Readers in other processes open a secondary instance and catch up on a timer (``catch_up``), never a
second writer. Keys and values are bytes (raw mode); each module owns its value encoding.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import cast

from rocksdict import AccessType, BlockBasedOptions, Options, Rdict, WriteBatch, WriteOptions

from prerender_ray.storage.write_mark import WriteMark

# Purposes, one RocksDB each (docs/architecture.md#stores).
SCHEDULE = "schedule"  # owner tier, written by the keeper
LEASES = "leases"  # owner tier, written by the lease table
PAGES = "pages"  # replicated tier, written by the node store
REGISTRY = "registry"  # replicated tier: targets, sitemaps, runs, queue control, overrides
PURPOSES = (SCHEDULE, LEASES, PAGES, REGISTRY)
SORT_AT = 64  # ops in a batch from which it is written in key order (see Store.write)
COMPACTION_READAHEAD = 2 * 1024 * 1024  # RocksDB's advice for compactions reading with direct I/O
DIRECT_BLOCK = 4096
_KEY = itemgetter(0)


class StoreError(RuntimeError):
    """A store that cannot be opened or written; the message names the path."""


def _options(create: bool, memtable_bloom: bool = True, direct_writes: bool = False) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.set_max_open_files(256)
    # Bloom filters: a point read of an absent key (a new target, a version pointer) skips SST files
    # instead of searching each; measured 4.9 -> 2.2 us per miss at 1M keys.
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    # The same for the memtable (10% of its size): a sitemap ingest checks every new URL's absent
    # target before it writes it; measured 3.2 -> 0.8 us per absent key at 600,000 keys. A store
    # that is written blind (the schedule: the keeper holds every row in memory) skips it: two rows
    # per URL of an ingest, 3.6 -> 3.1 us of write and 5.7 -> 4.8 us of RocksDB CPU in all.
    if memtable_bloom:
        opts.set_memtable_whole_key_filtering(True)
        opts.set_memtable_prefix_bloom_ratio(0.1)
    # L0 -> L1 compaction at 16 flushed files instead of 4: each one rewrites the L1 files its inputs
    # overlap, which for random keys (URLs) is most of L1, so L1 is rewritten 4 times less often. A
    # sitemap ingest of 1,000,000 targets: 12.9-13.2 -> 9.3-9.7 us of RocksDB CPU per URL in a harness;
    # point reads of absent keys stay as fast (bloom filters skip each L0 file). The write stall
    # triggers move up with it (defaults 20 and 36).
    opts.set_level_zero_file_num_compaction_trigger(16)
    opts.set_level_zero_slowdown_writes_trigger(40)
    opts.set_level_zero_stop_writes_trigger(64)
    if direct_writes:
        # Flushes and compactions write SST files past the page cache (O_DIRECT): the pages store's
        # copy of every body then takes no memory, which the page log's copy (the one hits read)
        # needs once the pages outgrow half of it (issue 37's 1,000,000-page row). Reads stay
        # buffered: what a result or a peer reads is cached as before.
        opts.set_use_direct_io_for_flush_and_compaction(True)
        opts.set_compaction_readahead_size(COMPACTION_READAHEAD)
    return opts


def direct_io_works(path: str | os.PathLike) -> bool:
    """Whether the file system under ``path`` takes an O_DIRECT write (tmpfs before Linux 6.6 does not)."""
    probe = Path(path) / ".direct-probe"
    buf = mmap.mmap(-1, DIRECT_BLOCK)  # page-aligned, as O_DIRECT wants its buffers
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)
    except OSError:
        return False
    try:
        return hasattr(os, "O_DIRECT") and os.write(fd, buf) == DIRECT_BLOCK
    except OSError:
        return False
    finally:
        os.close(fd)
        buf.close()
        probe.unlink(missing_ok=True)


class Store:
    """A thin, bytes-in bytes-out view of one RocksDB."""

    def __init__(self, path: str | os.PathLike, *, secondary: str | os.PathLike | None = None,
                 read_only: bool = False, sync: bool = False, memtable_bloom: bool = True,
                 direct_writes: bool = False):
        """``direct_writes``: SST files are written past the page cache where the file system allows
        it (``self.direct_writes`` says whether it did)."""
        self.path = Path(path)
        self.secondary = secondary is not None
        self.direct_writes = False
        try:
            if secondary is not None:
                Path(secondary).mkdir(parents=True, exist_ok=True)
                self._db = Rdict(str(self.path), _options(False), access_type=AccessType.secondary(str(secondary)))
            elif read_only:
                self._db = Rdict(str(self.path), _options(False), access_type=AccessType.read_only())
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                self.direct_writes = direct_writes and direct_io_works(self.path)
                self._db = Rdict(str(self.path), _options(True, memtable_bloom, self.direct_writes))
        except Exception as e:  # rocksdict raises bare Exception
            raise StoreError(f"cannot open store {self.path}: {e}") from None
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        # The writer counts its writes where secondaries can see it (storage/write_mark.py).
        try:
            self.mark = WriteMark.publish(self.path) if secondary is None and not read_only else None
        except OSError as e:
            self._db.close()
            raise StoreError(f"cannot publish the write mark of {self.path}: {e}") from None

    # --- reads
    def get(self, key: bytes) -> bytes | None:
        return cast("bytes | None", self._db.get(key))

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return cast("list[bytes | None]", self._db.get(list(keys))) if keys else []

    def exists(self, key: bytes) -> bool:
        return self._db.get(key) is not None

    def items(self, prefix: bytes = b"", start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Key-ordered items under ``prefix``, from ``start`` (inclusive) if given."""
        first = start if start is not None and start > prefix else prefix
        # iterates in Rust; raw mode: keys and values are bytes
        native = cast("Iterator[tuple[bytes, bytes]]", self._db.items(from_key=first) if first else self._db.items())
        if not prefix:
            yield from native
            return
        for key, value in native:
            if not key.startswith(prefix):
                break
            yield key, value

    def keys(self, prefix: bytes = b"") -> Iterator[bytes]:
        for k, _ in self.items(prefix):
            yield k

    def last_key(self, prefix: bytes) -> bytes | None:
        """The greatest key under ``prefix`` (prefix must not end in 0xff bytes)."""
        it = self._db.iter()
        it.seek_for_prev(prefix + b"\xff" * 16)
        if it.valid() and it.key().startswith(prefix):
            return it.key()
        return None

    def count(self, prefix: bytes = b"") -> int:
        it = self._db.iter()
        it.seek(prefix)
        n = 0
        while it.valid() and it.key().startswith(prefix):
            n += 1
            it.next()
        return n

    def estimate_keys(self) -> int:
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)

    # --- writes
    def put(self, key: bytes, value: bytes) -> None:
        self._db.put(key, value, self._write_opts)
        self._bump()

    def delete(self, key: bytes) -> None:
        self._db.delete(key, self._write_opts)
        self._bump()

    def _bump(self) -> None:
        if self.mark is not None:
            self.mark.bump()

    def write(self, ops: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Apply puts (value) and deletes (None) atomically; returns how many.

        A large batch goes in key order: each memtable insert then starts next to the last one's skip
        list nodes, still in cache (2,000 new targets: 5.3 -> 3.6 us of write per URL, the sort
        included). The sort is stable, so a key written twice keeps its last value.
        """
        if not isinstance(ops, list):
            ops = list(ops)
        if len(ops) >= SORT_AT:
            ops = sorted(ops, key=_KEY)
        batch = WriteBatch(raw_mode=True)
        for key, value in ops:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if ops:
            self._db.write(batch, self._write_opts)
            self._bump()
        return len(ops)

    # --- lifecycle
    def catch_up(self) -> None:
        if self.secondary:
            self._db.try_catch_up_with_primary()

    def flush(self) -> None:
        if not self.secondary:
            self._db.flush()

    def compact(self) -> None:
        """Rewrite every table now (blocking; writes go on meanwhile): the space of values written over
        comes back at once instead of whenever the background compactions reach them."""
        if not self.secondary:
            self._db.compact_range(None, None)

    def close(self) -> None:
        try:
            self._db.close()
        except Exception:
            pass
        if self.mark is not None:
            self.mark.close()
            self.mark = None


def node_dir(data_dir: str | os.PathLike, node: str) -> Path:
    """Each node keeps its stores under its own name, so simulated nodes can share a machine."""
    return Path(data_dir) / "nodes" / node


def store_path(data_dir: str | os.PathLike, node: str, purpose: str) -> Path:
    if purpose not in PURPOSES:
        raise ValueError(f"unknown store purpose {purpose!r}")
    return node_dir(data_dir, node) / purpose


def pagelog_path(data_dir: str | os.PathLike, node: str) -> Path:
    """The node's page log (``storage/pagelog``): written by its store, read by its ingress replicas."""
    return node_dir(data_dir, node) / "pagelog"


def check_writable(path: str | os.PathLike) -> None:
    """Fail early, with the path named, when a data dir cannot be used."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise StoreError(f"data dir {p} is not writable: {e.strerror or e}") from None


def remove_tree(path: str | os.PathLike) -> None:
    shutil.rmtree(path, ignore_errors=True)
