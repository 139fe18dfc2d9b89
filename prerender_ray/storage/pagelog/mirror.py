"""The page log as a mirror of the node's pages RocksDB (issue 37; the contract is in the module doc
of ``reconcile`` and in notes/pagelog-contract.md): what one RocksDB batch of the pages store does to
the log, and the store whose every write passes through it first.

For each cache key the log holds the raw record RocksDB holds (replication envelope and page), its
HLC as the version, and its *effective* times: those of an applicable freshness record
(``storage/touches.py``) if one applies, else the page's own; a reader never needs the freshness
record. A tombstone or a removed key deletes the log entry. Internal keys (``\\x00...``) other than
freshness records are not the log's business.

Ordering (one writer, the node store): the log ops of a batch go in BEFORE the batch's RocksDB
write; a ``PageLogError`` (``PageLogFull`` on a full disk) aborts the batch with RocksDB unchanged and
reaches the caller. So once the store's write mark moved, the log already holds the write.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from prerender_ray.storage.keys import FRESHNESS, INTERNAL
from prerender_ray.storage.pagelog.records import (
    HAS_EXPIRES_AT,
    HAS_LAST_CACHED,
    PageLogError,
    key_hash,
    unpack_value,
)
from prerender_ray.storage.pagelog.writer import Item, PageLogWriter
from prerender_ray.storage.pages import PageDecodeError, decode_head, decode_meta
from prerender_ray.storage.replication import EnvelopeError, hlc_bytes, is_stub, payload_view, stub
from prerender_ray.storage.rocks import Store
from prerender_ray.storage.touches import applicable

GetMany = Callable[[list[bytes]], list[bytes | None]]
Op = tuple[bytes, bytes | None]
RETRY_AFTER_S = 30  # what a refused result asks the fleet to wait (its circuit; docs/fleet-protocol.md)


class LogOps(NamedTuple):
    puts: list[Item]  # pages written: the whole record
    retimes: list[Item]  # a freshness record written or removed: new effective times (the body again
    # only when the log lacks that version)
    deletes: list[bytes]  # log keys
    keys: list[bytes]  # the cache keys concerned (repaired after a batch that failed part way)
    logged: list[bytes]  # the cache keys whose last record in the batch the log takes whole (puts)


def log_key(cache_key: bytes) -> bytes | None:
    """The log key of a cache key (its identity coding); None for bytes that are no cache key."""
    try:
        return key_hash(cache_key.decode())
    except UnicodeDecodeError:
        return None


def live_payload(record: bytes | None) -> memoryview | None:
    """The payload of a stored record, None when absent, a tombstone or not a record at all."""
    if record is None:
        return None
    try:
        return payload_view(record)
    except EnvelopeError:
        return None


def hlc_of(record: bytes) -> int:
    raw = hlc_bytes(record)
    return int.from_bytes(raw, "big") if raw is not None else 0


def effective_times(page: bytes, payload: memoryview, touch: bytes | None) -> tuple[int | None, int | None]:
    """The times a page is served by: an applicable freshness record's, else its own (none when the
    record does not decode: a reader refuses it anyway)."""
    try:
        head = decode_head(payload)
    except PageDecodeError:
        return None, None
    if touch is not None:
        page_v, touch_v = hlc_bytes(page), hlc_bytes(touch)
        if page_v is not None and touch_v is not None and touch_v > page_v:  # else it cannot apply: no JSON
            try:
                found = applicable(decode_meta(payload)[0], page, touch)
            except PageDecodeError:
                found = None
            if found is not None:
                return found.last_cached, found.expires_at
    return head.last_cached, head.expires_at


def page_item(kh: bytes, record: bytes | None, touch: bytes | None) -> Item | None:
    """The log item for a stored record; None when it is not a live page."""
    payload = live_payload(record)
    if record is None or payload is None:
        return None
    last, expires = effective_times(record, payload, touch)
    return Item(kh, record, hlc_of(record), last, expires)


def entry_state(value: bytes) -> tuple[int, int | None, int | None]:
    """(version, last_cached, expires_at) of an index entry."""
    v = unpack_value(value)
    return v[9], v[7] if v[1] & HAS_LAST_CACHED else None, v[8] if v[1] & HAS_EXPIRES_AT else None


def plan(ops: Iterable[Op], get_many: GetMany, max_record: int) -> LogOps:
    """The log ops of a pages-store batch (a key written twice keeps its last value, as in RocksDB).
    Reads, in one multi-get, what the batch does not say itself: the freshness record held for a page
    written, the page held for a freshness record written. A record over the log's ``max_record``
    is deleted from the log instead (never served stale; such pages are read from RocksDB)."""
    final: dict[bytes, bytes | None] = {}
    for key, value in ops:
        if key[:1] != INTERNAL or key.startswith(FRESHNESS):
            final[bytes(key)] = value
    if not final:
        return LogOps([], [], [], [], [])
    pages: dict[bytes, bytes | None] = {}
    touches: dict[bytes, bytes | None] = {}
    for key, value in final.items():
        if key.startswith(FRESHNESS):
            touches[key[len(FRESHNESS):]] = value
        else:
            pages[key] = value
    want_touch = [k for k, v in pages.items() if v is not None and k not in touches]
    want_page = [k for k in touches if k not in pages]
    got = get_many([FRESHNESS + k for k in want_touch] + want_page) if want_touch or want_page else []
    held_touch = dict(zip(want_touch, got[:len(want_touch)]))
    held_page = dict(zip(want_page, got[len(want_touch):]))
    out = LogOps([], [], [], [], [])
    for key, value in pages.items():
        kh = log_key(key)
        if kh is None:
            continue
        out.keys.append(key)
        item = page_item(kh, value, touches[key] if key in touches else held_touch.get(key))
        if item is None or len(item.data) > max_record:
            out.deletes.append(kh)
        else:
            out.puts.append(item)
            out.logged.append(key)
    for key in want_page:
        kh = log_key(key)
        if kh is None:
            continue
        out.keys.append(key)
        item = page_item(kh, held_page[key], touches[key])
        if item is not None and len(item.data) <= max_record:
            out.retimes.append(item)
    return out


def apply(writer: PageLogWriter, ops: LogOps, changed: list[bool]) -> None:
    """Write ``ops`` to the log: pages first (the big write, the one a full disk stops before anything
    changed), then re-times, then deletes. ``changed[0]`` is set once the log holds any of it."""
    if ops.puts:
        try:
            writer.append(ops.puts)
        except PageLogError as e:
            changed[0] = bool(getattr(e, "committed", 0))
            raise
        changed[0] = True
    again = []
    for it in ops.retimes:
        held = writer.entries.get(it.key)
        if held is None or entry_state(held)[0] != it.version:
            again.append(it)  # the log lacks that version of the page: write it whole
        elif entry_state(held)[1:] != (it.last_cached, it.expires_at):
            writer.touch(it.key, version=it.version, last_cached=it.last_cached, expires_at=it.expires_at)
            changed[0] = True
    if again:
        writer.append(again)
        changed[0] = True
    if ops.deletes:
        writer.delete(ops.deletes)
        changed[0] = True


class Mirror:
    """The write path of a pages store into its log. ``lock`` serializes every use of the writer
    (the store's maintenance runs in a thread). ``dirty``: cache keys whose log entry may differ from
    RocksDB after a batch refused part way through (``reconcile.repair`` puts them right).
    ``get_many``: RocksDB's own reads (stubs as stored).

    ``stubs`` (set while the log is complete, so no reader keeps to RocksDB): a page record the log
    takes whole is written to RocksDB as a ``stub``, and reads resolve it from the log (one copy on
    disk). ``unresolved``: cache keys whose stub names a version the log does not hold (a crash
    between the log's write and RocksDB's, a log lost or cut): read as absent until the store settles
    them (``StorePageLog.settle``: the log's newer record applied, or the key dropped for its holders
    to fill again)."""

    def __init__(self, writer: PageLogWriter, get_many: GetMany,
                 on_refused: Callable[[PageLogError], None] | None = None,
                 on_accepted: Callable[[], None] | None = None):
        self.writer = writer
        self.get_many = get_many
        self.lock = threading.Lock()
        self.dirty: set[bytes] = set()
        self.stubs = False
        self.unresolved: set[bytes] = set()
        # log key -> the index entry it had before a batch refused part way through: a stub of that
        # version resolves again once ``repair`` puts it back (compaction waits while any is owed)
        self.previous: dict[bytes, bytes] = {}
        self._prior: dict[bytes, bytes] = {}  # the batch in flight's
        self.refusing: PageLogError | None = None  # the last refusal, until a batch goes in again
        self.refused = 0
        self.touched: set[bytes] | None = None  # while the log is built: the log keys written (``build``)
        self.on_refused = on_refused
        self.on_accepted = on_accepted

    def _logged(self, key: bytes) -> bytes | None:
        """(lock held) The record the log holds for cache key ``key`` (checksummed), None if none."""
        kh = log_key(key)
        try:
            return None if kh is None or self.writer.broken is not None else self.writer.read(kh)
        except (OSError, PageLogError):
            return None

    def resolve(self, key: bytes, value: bytes | None,
                again: Callable[[bytes], bytes | None] | None = None) -> bytes | None:
        """(lock held) ``value`` as RocksDB holds it, or for a stub the log's record of that very
        version; None (and the key ``unresolved``) when the log does not hold that version readably.
        ``again``: RocksDB's read of the key, for a ``value`` read before the lock was taken: one that
        does not resolve is read again first (a write may have fallen between)."""
        if not is_stub(value):
            return value
        record = self._logged(key)
        if record is not None and hlc_bytes(record) == hlc_bytes(value):
            return record
        if again is not None:
            return self.resolve(key, again(key))
        self.unresolved.add(bytes(key))
        return None

    def resolved_many(self, keys: list[bytes]) -> list[bytes | None]:
        """(lock held) ``get_many`` with stubs resolved."""
        return [self.resolve(k, v) for k, v in zip(keys, self.get_many(keys))]

    def unwind(self, log_ops: LogOps) -> None:
        """(lock held) The batch of ``log_ops`` reached the log, wholly or in part, and not RocksDB:
        its keys are owed a repair, which puts back the entries they had."""
        self.dirty.update(log_ops.keys)
        for kh, value in self._prior.items():
            self.previous.setdefault(kh, value)  # the oldest: the one RocksDB still names

    def settling(self) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes | None]]]:
        """(lock held) The ``unresolved`` stubs, checked again: ``(newer, lost)``, the (cache key,
        record) of those whose log entry is a newer version (its RocksDB write never came), the
        (cache key, stub's HLC) of those it holds no readable copy of. A key rewritten since, or
        resolving now, is in neither; with the writer broken, all wait for its reopening."""
        if self.writer.broken is not None:
            return [], []
        keys = [k for k in self.unresolved if k not in self.dirty]  # a repair owed puts those right first
        self.unresolved.difference_update(keys)
        newer: list[tuple[bytes, bytes]] = []
        lost: list[tuple[bytes, bytes | None]] = []
        for key, value in zip(keys, self.get_many(keys)):
            if not is_stub(value):
                continue
            record = self._logged(key)
            held, have = hlc_bytes(value), hlc_bytes(record)
            assert value is not None and held is not None
            if have is not None and have == held:
                continue
            if record is not None and have is not None and have > held:
                newer.append((key, record))
            else:
                lost.append((key, held))
        return newer, lost

    def before_write(self, ops: list[Op]) -> LogOps:
        """The log ops of a RocksDB batch about to be written; raises PageLogError to refuse it. Called
        with ``lock`` held until the RocksDB write is done (``MirroredStore.write``): a repair that
        read RocksDB between the two would put the log back behind it. Returns them (the cache keys
        they concern, those the log took whole)."""
        log_ops = plan(ops, self.resolved_many, self.writer.max_record)
        if not (log_ops.puts or log_ops.retimes or log_ops.deletes):
            return log_ops
        entries = self.writer.entries
        self._prior = {kh: v for kh in (*(it.key for it in log_ops.puts), *(it.key for it in log_ops.retimes),
                                        *log_ops.deletes) if (v := entries.get(kh)) is not None}
        if self.touched is not None:
            self.touched.update(it.key for it in log_ops.puts)
            self.touched.update(it.key for it in log_ops.retimes)
            self.touched.update(log_ops.deletes)
        changed = [False]
        try:
            apply(self.writer, log_ops, changed)
        except PageLogError as e:
            if changed[0]:
                self.unwind(log_ops)
            self.refused += 1
            self.refusing = e
            if self.on_refused is not None:
                self.on_refused(e)
            raise
        if self.refusing is not None:
            self.refusing = None
            if self.on_accepted is not None:
                self.on_accepted()
        return log_ops


def stubbed(ops: list[Op], logged: list[bytes]) -> list[Op]:
    """``ops`` with the records of ``logged`` keys as stubs (a new list: the caller's records are
    shipped whole to the peers)."""
    keys = set(logged)
    return [(k, stub(v)) if v is not None and k in keys and not is_stub(v) else (k, v) for k, v in ops]


class MirroredStore(Store):
    """A pages store whose writes go to its page log first (once ``mirror`` is attached): every writer
    of the pages RocksDB (local commits, replicated records, rebalance drops) is covered. Its reads
    hand out whole records: a stub is resolved from the log (``Mirror.resolve``); ``raw_reads`` reads
    RocksDB as it is."""

    mirror: Mirror | None = None

    def write(self, ops: Iterable[Op]) -> int:
        if not isinstance(ops, list):
            ops = list(ops)
        mirror = self.mirror
        if mirror is None or not ops:
            return super().write(ops)
        with mirror.lock:
            log_ops = mirror.before_write(ops)
            if log_ops.logged and mirror.stubs:
                ops = stubbed(ops, log_ops.logged)
            try:
                return super().write(ops)
            except BaseException:
                mirror.unwind(log_ops)  # the log is ahead of RocksDB for these: put right later
                raise

    def get(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        values = super().get_many(keys)
        mirror = self.mirror
        if mirror is None or not any(is_stub(v) for v in values):
            return values
        again = functools.partial(Store.get, self)
        with mirror.lock:
            return [mirror.resolve(k, v, again) for k, v in zip(keys, values)]

    def items(self, prefix: bytes = b"", start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        again = functools.partial(Store.get, self)
        for key, value in super().items(prefix, start):
            mirror = self.mirror
            if mirror is not None and is_stub(value):
                with mirror.lock:
                    found = mirror.resolve(key, value, again)
                if found is None:
                    continue
                value = found
            yield key, value

    def put(self, key: bytes, value: bytes) -> None:
        self.write([(key, value)])

    def delete(self, key: bytes) -> None:
        self.write([(key, None)])


def raw_reads(store: Store) -> GetMany:
    """``get_many`` of a pages store as RocksDB holds it, stubs as stubs (``Store``'s own, not
    ``MirroredStore``'s): the log's reconcile, build and repair, which put the log right."""
    return functools.partial(Store.get_many, store)


def refusal(e: BaseException) -> PageLogError | None:
    """The page log's refusal behind ``e`` (raised here, or carried by an actor call's error)."""
    seen = 0
    cur: BaseException | None = e
    while cur is not None and seen < 8:
        if isinstance(cur, PageLogError):
            return cur
        cur = getattr(cur, "cause", None) or cur.__cause__
        seen += 1
    return None


__all__ = ["LogOps", "Mirror", "MirroredStore", "RETRY_AFTER_S", "apply", "log_key", "plan", "raw_reads", "refusal", "stubbed"]
