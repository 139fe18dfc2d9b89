"""The records of a node store: every write to its two RocksDBs (registry and pages), local or a peer's.

- Every record carries a version (hybrid logical clock + node); a peer's record is applied only if it
  is newer than what is held (last writer wins; deletes are tombstones), so duplicates, reordering
  and replays are harmless.
- Each store keeps a version index inside each RocksDB (``\\x00v<hlc><key>``), so "everything written
  since T" is a range scan (``catchup.py``). The pages store also keeps a pointer ``\\x00h<key> -> hlc,
  live, writer`` (a race, a tie of clocks included, is decided without reading a 30 KB page); a
  registry record is small and read anyway, so its own header gives its version (pointers that older
  versions wrote there are ignored).
- Exact live counts of targets and pages are kept under ``LIVE``, in the batch of the records they
  count.

Where a write goes next (the peers' outboxes, a push on) is the store's to decide: ``Records`` hands
each committed batch to ``on_local`` / ``on_remote`` (``NodeStore``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from prerender_ray import metrics
from prerender_ray.storage.keys import FRESHNESS, HPTR, LIVE, RENDER_HISTORY, TARGET, VIDX
from prerender_ray.storage.replication import (
    LOGICAL_BITS,
    Clock,
    Version,
    hlc_bytes,
    is_stub,
    payload_of,
    unwrap,
    version_of,
    wrap_many,
    writer_bytes,
)
from prerender_ray.storage.rocks import Store
from prerender_ray.timeutil import Clock as WallClock

_LIVE_FLAG = (b"\x00", b"\x01")
_NOT_PAGES = (FRESHNESS, RENDER_HISTORY)
HLC = struct.Struct(">Q")
DBS = ("registry", "pages")
BATCH_RECORDS = 500
BATCH_BYTES = 4 * 1024 * 1024
# [db name, key, enveloped record]: a list, since Ray pickles every tuple of an argument (see
# Claims.grant) and a batch carries hundreds of records
Record = list
Op = tuple[bytes, bytes | None]  # (key, payload) ; payload None = delete
# (key, record, hlc, payload, held record, held hlc): a row a batch writes
Row = tuple[bytes, bytes, int, bytes | None, bytes | None, bytes | None]
IndexOps = Callable[[list[Op], bytes, bytes | None, bytes | None], None]


def no_index(out: list[Op], key: bytes, old: bytes | None, new: bytes | None) -> None:
    """No derived index (``NodeStore`` keeps targets by sitemap)."""


class Records:
    """``registry``, ``pages``: the two RocksDBs; ``clock``: the versions this node stamps; ``wall``:
    the time it reads; ``index_ops(out, key, old, new)``: the derived index entries of a registry
    write; ``on_local(name, ops, records)``: a local batch was committed (its enveloped records, in
    ``ops``' order); ``on_remote(name, rows)``: a peer's rows were accepted."""

    def __init__(self, node: str, clock: Clock, registry: Store, pages: Store, wall: WallClock,
                 index_ops: IndexOps = no_index,
                 on_local: Callable[[str, Sequence[Op], list[bytes]], None] | None = None,
                 on_remote: Callable[[str, list[Row]], None] | None = None):
        self.node = node
        self.clock = clock
        self.registry = registry
        self.pages = pages
        self.wall = wall
        self.index_ops = index_ops
        self.on_local = on_local
        self.on_remote = on_remote
        self.live: dict[str, int] = {}
        self.load_live_counts()

    def db(self, name: str) -> Any:
        return self.registry if name == "registry" else self.pages

    def newest_hlc(self) -> int:
        newest = 0
        for name in DBS:
            last = self.db(name).last_key(VIDX)  # the index's last key holds the newest version
            if last is not None:
                newest = max(newest, HLC.unpack_from(last, len(VIDX))[0])
        return newest

    # ------------------------------------------------------------------------------ live counts

    def load_live_counts(self) -> None:
        """Exact counts of live pages and targets, kept in each store under ``LIVE`` and updated in
        the same write batch as the records they count; a store that has none yet is counted once."""
        for name in DBS:
            db = self.db(name)
            raw = db.get(LIVE)
            if raw is not None and len(raw) == HLC.size:
                self.live[name] = HLC.unpack(raw)[0]
                continue
            # the internal families (\x00...) sort before every page key
            rows = db.items(TARGET) if name == "registry" else db.items(b"", b"\x01")
            n = sum(1 for _, v in rows if payload_of(v) is not None)
            self.live[name] = n
            db.write([(LIVE, HLC.pack(n))])

    def counted(self, name: str, keys: list[bytes], payloads: list[bytes | None],
                lives: list[bool | None]) -> tuple[bytes, bytes]:
        """The ``LIVE`` op for a batch writing ``payloads`` at ``keys`` over records whose liveness
        was ``lives`` (None: unknown, an old pointer: read it)."""
        db, delta = self.db(name), 0
        seen: dict[bytes, bool] = {}  # a key written twice in one batch: its first write came before
        for key, payload, was in zip(keys, payloads, lives):
            if (name == "registry" and not key.startswith(TARGET)) or key.startswith(_NOT_PAGES):
                continue  # control rows, freshness and history records are not what is counted
            if key in seen:
                was = seen[key]
            elif was is None:
                was = payload_of(db.get(key)) is not None
            seen[key] = payload is not None
            delta += seen[key] - was
        self.live[name] = max(0, self.live[name] + delta)
        return LIVE, HLC.pack(self.live[name])

    # -------------------------------------------------------------------------------- committing

    def commit_local(self, name: str, ops: Sequence[Op]) -> int:
        """This node's writes (payload None deletes): stamped with consecutive fresh versions, written
        with their index entries, and handed to ``on_local`` (queued for the peers)."""
        if not ops:
            return 0
        db = self.db(name)
        olds, helds, lives = self.held(db, name, [key for key, _ in ops])
        self._commit(db, name, ops, olds, helds, lives)
        return len(ops)

    def commit_absent(self, name: str, ops: Sequence[Op], deleted_within_ms: int = 0) -> list[bytes | None]:
        """``commit_local`` of the puts whose key holds no live record (absent or deleted); the others
        are left as they are. Returns, per op, None when written, else the live payload held: a
        sitemap walk creates its new targets in one call, the check and the write in one step.
        ``deleted_within_ms``: a key deleted that recently counts as held too (answered ``b""``): a
        put made on what was seen before the delete must not undo it."""
        if not ops:
            return []
        db = self.db(name)
        olds, helds, lives = self.held(db, name, [key for key, _ in ops])
        live = [payload_of(old) for old in olds]
        if deleted_within_ms > 0:
            since = (self.wall.now_ms() - deleted_within_ms) << LOGICAL_BITS
            live = [b"" if payload is None and held is not None and HLC.unpack(held)[0] >= since else payload
                    for payload, held in zip(live, helds)]
        self._commit_picked(db, name, [i for i, payload in enumerate(live) if payload is None], ops, olds, helds,
                            lives)
        return live

    def commit_if(self, name: str, ops: Sequence[Op], expected: list[bytes | None]) -> list[bool]:
        """``commit_local`` of the ops whose key still holds the live payload ``expected`` (None: nothing
        live); per op, whether it was written. A read-modify-write (a patch) made on what was read
        before a delete or another write must not undo it: the check and the write in one step."""
        if not ops:
            return []
        db = self.db(name)
        olds, helds, lives = self.held(db, name, [key for key, _ in ops])
        same = [payload_of(old) == want for old, want in zip(olds, expected)]
        self._commit_picked(db, name, [i for i, ok in enumerate(same) if ok], ops, olds, helds, lives)
        return same

    def _commit_picked(self, db: Any, name: str, picked: list[int], *cols: Sequence) -> None:
        """``_commit`` of the ops at ``picked`` (the columns as ``held`` gave them, ops first)."""
        if picked:
            self._commit(db, name, *([col[i] for i in picked] for col in cols))

    def _commit(self, db: Any, name: str, ops: Sequence, olds: list, helds: list, lives: list) -> None:
        first = self.clock.reserve(len(ops))
        records = wrap_many(self.node, first, [p for _, p in ops])
        batch = self.batch(name, [(key, records[i], first + i, payload, olds[i], helds[i])
                                  for i, (key, payload) in enumerate(ops)])
        batch.append(self.counted(name, [k for k, _ in ops], [p for _, p in ops], lives))
        db.write(batch)
        if self.on_local is not None:
            self.on_local(name, ops, records)

    def commit_remote(self, name: str, items: list[tuple[bytes, bytes]]) -> int:
        """A peer's enveloped records, each applied only when newer than what is held."""
        db = self.db(name)
        now = self.wall.now_ms()
        items = [it for it in items if not is_stub(it[1])]  # a stub has no page: never one of ours to take
        keys = [key for key, _ in items]
        olds, helds, lives = self.held(db, name, keys)
        unwrapped = [unwrap(record) for _, record in items]
        tied = [i for i, ((version, _), held) in enumerate(zip(unwrapped, helds))
                if held is not None and version.hlc == HLC.unpack(held)[0]]  # a duplicate, mostly
        ties = dict(zip(tied, self.versions(db, name, [keys[i] for i in tied], [olds[i] for i in tied])))
        accepted: list[Row] = []
        was = []
        for i, ((key, record), (version, payload), held_hlc, old, live) in enumerate(
                zip(items, unwrapped, helds, olds, lives)):
            held = HLC.unpack(held_hlc)[0] if held_hlc is not None else -1
            if version.hlc < held or (i in ties and not version.newer_than(ties[i])):
                continue
            self.clock.observe(version)
            metrics.replication_lag_seconds.observe(max(0.0, (now - version.wall_ms) / 1000))
            accepted.append((key, record, version.hlc, payload, old, held_hlc))
            was.append(live)
        batch = self.batch(name, accepted)
        if accepted:
            batch.append(self.counted(name, [r[0] for r in accepted], [r[3] for r in accepted], was))
        db.write(batch)
        if accepted and self.on_remote is not None:
            self.on_remote(name, accepted)
        return len(accepted)

    def batch(self, name: str, rows: list[Row]) -> list[Op]:
        """The write batch for accepted rows of (key, record, hlc, payload, held record, held hlc):
        each record, its version index entry (the held version's entry removed), the page pointer,
        and derived indexes. One loop for a whole batch: a sitemap walk writes thousands of rows."""
        registry = name == "registry"
        retired: list[Op] = []
        versions: list[Op] = []
        pointers: list[Op] = []
        derived: list[Op] = []
        records: list[Op] = []
        index, pack = self.index_ops, HLC.pack
        for key, record, version, payload, old, held in rows:
            hlc = pack(version)
            versions.append((VIDX + hlc + key, b""))
            if held is not None and held != hlc:
                retired.append((VIDX + held + key, None))
            if not registry:
                pointers.append((HPTR + key, hlc + _LIVE_FLAG[payload is not None] + (writer_bytes(record) or b"")))
            elif key.startswith(TARGET):
                index(derived, key, old, payload)
            records.append((key, record))
        # family after family, each in key order when the rows are (a walk sorts its batches): the
        # sort before the RocksDB write then only merges runs
        return retired + versions + pointers + derived + records

    @staticmethod
    def held(db: Any, name: str, keys: list[bytes]) -> tuple[list, list, list]:
        """(held records, their HLCs as 8 bytes, whether each is live: None when not known). A
        registry record is read whole anyway (the by-sitemap index needs it), so its own header gives
        the version; a page is not: a pointer decides the race without reading 30 KB."""
        if name == "registry":
            olds = db.get_many(keys)
            return olds, [hlc_bytes(o) for o in olds], [payload_of(o) is not None for o in olds]
        pointers = db.get_many([HPTR + key for key in keys])
        return ([None] * len(keys), [p[:8] if p is not None else None for p in pointers],
                [False if p is None else (p[8] == 1 if len(p) > 8 else None) for p in pointers])

    @staticmethod
    def versions(db: Any, name: str, keys: list[bytes], olds: list) -> list[Version | None]:
        """The version held at each key, writer included (None: none, or unreadable), for a tie of
        clocks with the HLC ``held`` gave: a registry record's from ``olds`` (read whole anyway), a
        page's from its pointer (no 30 KB read); only a pointer an older version wrote, without the
        writer, leaves the page to read."""
        if name == "registry":
            return [version_of(old) for old in olds]
        pointers = db.get_many([HPTR + key for key in keys]) if keys else []
        return [Version(HLC.unpack_from(p)[0], p[9:].decode("utf-8", "replace")) if p is not None and len(p) > 9
                else version_of(db.get(key)) for key, p in zip(keys, pointers)]

    def drop_local(self, name: str, items: list[tuple[bytes, bytes | None]]) -> int:
        """Remove records this node no longer holds (each only while its version is still ``sent``):
        the record, its version index entry, its page pointer, its derived index entries and its
        count. Nothing is shipped: the holders keep theirs (``rebalance.py``)."""
        if not items:
            return 0
        db = self.db(name)
        keys = [key for key, _ in items]
        olds, helds, lives = self.held(db, name, keys)
        ops: list[Op] = []
        derived: list[Op] = []
        dropped, was = [], []
        for (key, sent), old, held, live in zip(items, olds, helds, lives):
            if sent is None or held != sent:
                continue  # written since it was pushed: the next walk decides
            ops.append((key, None))
            ops.append((VIDX + held + key, None))
            if name == "pages":
                ops.append((HPTR + key, None))
            else:
                self.index_ops(derived, key, old or db.get(key), None)
            dropped.append(key)
            was.append(live)
        if dropped:
            counted = self.counted(name, dropped, [None] * len(dropped), was)
            db.write([*ops, *derived, counted])
        return len(dropped)
