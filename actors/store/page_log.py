"""The node store's page log (``storage/pagelog``; issue 37): opened and reconciled with the pages
RocksDB before the store serves, every pages-store write mirrored into it first
(``storage/pagelog/mirror.py``), and kept compact by a periodic task.

A log without its ``COMPLETE`` mark (a first start over pages written before the log, a log rebuilt
after damage) is built in the maintenance thread instead (``storage/pagelog/build.py``), one chunk per
hold of the mirror's lock: the store serves at once, a pages write waits for one chunk at most, and
readers keep to the store's RocksDB until the build has passed every key and made the mark.

A write the log cannot take (a full disk: ``PageLogFull``) is refused whole: RocksDB is left as it
was, the caller gets the error (a render result is answered 503 with ``Retry-After``, and the fleet
posts it again), ``prerender_pagelog_full`` is 1 until a batch goes in again.

Maintenance runs in a thread, one bounded step per turn (at most one segment compacted, a new index
generation when the index has grown past twice the live records), under the mirror's lock: a pages
write waits for the step in progress, nothing else on the store's loop does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.store.records import Records
from prerender_ray.storage.pagelog import (
    PageLogCorrupt,
    PageLogError,
    PageLogFull,
    PageLogWriter,
    compaction,
    files,
    thinning,
)
from prerender_ray.storage.pagelog import build as building
from prerender_ray.storage.pagelog.build import Build
from prerender_ray.storage.pagelog.mirror import Mirror, MirroredStore, raw_reads
from prerender_ray.storage.pagelog.reconcile import Reconciled, reconcile, repair
from prerender_ray.storage.pagelog.thinning import Thinning
from prerender_ray.storage.rocks import remove_tree

MAINTAIN_EVERY_S = 10.0
REPAIR_EVERY_S = 1.0  # while keys of a refused batch, or the whole log, wait to be put right
BUILD_TURN_S = 1.0  # chunks of a build per maintenance turn
BUILD_PAUSE_S = 0.002  # between chunks: a pages write waiting for the lock takes it (Lock is not fair)


class StorePageLog:
    def __init__(self, pages: MirroredStore, path: Path, log: Any, on_refused: Any = None,
                 count: Callable[[], int] | None = None, records: Records | None = None,
                 refill: Callable[[list[bytes]], Awaitable[int]] | None = None):
        """``on_refused()``: after a batch was refused (the store puts back what it counted for it);
        ``count()``: the live pages the store holds (a build's progress is told against it);
        ``records``: the store's writes, which settle the stubs the log cannot resolve (``settle``);
        ``refill(keys)``: the pages settling dropped, asked again of their other holders."""
        self.pages = pages
        self.count = count
        self.records = records
        self.refill = refill
        self.settled: dict[str, int] = {"applied": 0, "dropped": 0, "refilled": 0}
        self.thinning: Thinning | None = None
        self._compacting = threading.Lock()  # RocksDB's compaction after a thinning walk: close waits for it
        self.build: Build | None = None
        self._told = 0  # the tenth of a build last logged
        self.on_refused = on_refused
        self.path = path
        self.log = log
        self.unreconciled = True
        self.alerting = False
        self.last: Reconciled | None = None
        self._stats: dict = {}
        metrics.pagelog_full.set(0)
        self.writer = self._open()
        self.mirror = Mirror(self.writer, raw_reads(pages), self._refused, self._accepted)
        with self.mirror.lock:
            self._reconcile()
        pages.mirror = self.mirror  # from here on every write of the pages store goes through the log
        self._publish()

    def _open(self) -> PageLogWriter:
        # sync=False as the node's RocksDB stores: a process crash loses nothing (the page cache holds
        # every completed write); a power loss is what the checksums are for.
        try:
            return PageLogWriter(self.path, sync=False)
        except PageLogCorrupt as e:  # RocksDB is the truth: start the log again and rebuild it from there
            self.log.error("page log unreadable; rebuilding it from the pages store", path=str(self.path),
                           error=str(e)[:300])
            remove_tree(self.path)
            return PageLogWriter(self.path, sync=False)

    def _reconcile(self) -> None:
        """The whole log against RocksDB (lock held), or a build started when the log is not complete.
        A refusal (a full disk at start) leaves it owed: the maintenance task tries again, and the
        store serves meanwhile."""
        if not files.is_complete(self.path):
            self._start_build()
            return
        try:
            self.last = reconcile(self.writer, self.pages, self.mirror.unresolved)
        except PageLogError as e:
            self._refused(e)
            self.log.error("page log reconcile failed; retried by the maintenance task", error=str(e)[:300])
            return
        self._reconciled("page log reconciled")

    def _stubs(self) -> None:
        """(lock held) One copy on disk while the log is complete: readers then keep to it, and RocksDB
        holds stubs of what it holds whole (``Mirror.stubs``; the records written whole meanwhile are
        thinned by a walk, ``storage/pagelog/thinning.py``). Without the mark (a build, a log
        rebuilt), readers keep to RocksDB, so it gets whole records again."""
        self.mirror.stubs = not self.unreconciled and self.build is None and files.is_complete(self.path)
        try:
            if not self.mirror.stubs:
                self.thinning = None
                if thinning.thinned(self.pages):
                    thinning.owe(self.pages)
            elif self.thinning is None and not thinning.thinned(self.pages):
                if self._total() == 0:  # no live page, so none whole (a new store): nothing to walk
                    thinning.done(self.pages)
                else:
                    self.thinning = Thinning(self.writer, self.pages, keys=thinning.CHUNK_KEYS)
        except Exception as e:  # (a full disk) at worst records stay whole until a later walk: disk, not pages
            self.log.warning("page log: the one-copy mark not written", error=str(e)[:300])

    def thin_some(self, budget_s: float) -> None:
        """Chunks of the thinning walk (``_in_chunks``); when it ends, RocksDB's compaction."""
        ended: list[Thinning] = []

        def step() -> bool:
            t = self.thinning
            if t is None:
                return False
            if not self.mirror.stubs:  # whole records written meanwhile: a walk starts with the stubs again
                self.thinning = None
                return False
            if t.step():
                self.thinning = None
                ended.append(t)
                return False
            return True

        self._in_chunks(step, budget_s)
        if ended:
            self._thinned(ended[0])

    def _thinned(self, t: Thinning) -> None:
        """RocksDB's copies go from the disk now (outside the mirror's lock: writes go on meanwhile)."""
        walked = time.perf_counter() - t.started
        with self._compacting:
            if t.thinned and self.pages.mirror is not None:
                self.pages.compact()
        self.log.info("page log: one copy of every page on disk", passed=t.passed, thinned=t.thinned,
                      freed_bytes=t.freed, steps=t.steps, longest_step_s=round(t.longest, 3),
                      walk_s=round(walked, 1), compaction_s=round(time.perf_counter() - t.started - walked, 1))

    def _reconciled(self, what: str, **extra: Any) -> None:
        """The log mirrors RocksDB (``self.last``): mark it complete."""
        self.unreconciled = False
        try:
            files.mark_complete(self.path)  # readers may follow it now (a rebuilt log drops the mark with it)
        except OSError as e:  # a full disk: readers keep to the store's RocksDB meanwhile
            self.log.error("page log cannot be marked complete", error=str(e)[:300])
            self.unreconciled = True
        if self.mirror.refusing is None:
            self._accepted()
        self._stubs()
        r = self.last
        assert r is not None
        self.log.info(what, path=str(self.path), pages=r.pages, appended=r.appended, retimed=r.retimed,
                      deleted=r.deleted, seconds=round(r.seconds, 3), entries=len(self.writer.entries), **extra)

    # ---------------------------------------------------------------------------------- build

    def _start_build(self) -> None:
        """(lock held) Its first chunk now: a store smaller than a chunk is complete at open."""
        self.mirror.touched = set()
        self.build = Build(self.writer, self.pages, self.mirror.touched, keys=building.CHUNK_KEYS,
                           max_bytes=building.CHUNK_BYTES, unresolved=self.mirror.unresolved)
        self._stubs()  # whole records while readers keep to RocksDB
        self._told = 0
        metrics.pagelog_building.set(1)
        self.log.info("page log building from the pages store; readers keep to RocksDB until it is complete",
                      path=str(self.path), entries=len(self.writer.entries), pages=self._total())
        self._build_step()

    def _build_step(self) -> bool:
        """(lock held) One chunk; False when the turn should stop (ended, or refused: retried later)."""
        b = self.build
        assert b is not None
        try:
            if b.step():
                self.last = b.finish()
                self.build = self.mirror.touched = None
                metrics.pagelog_building.set(0)
                self._reconciled("page log built", steps=b.steps, longest_step_s=round(b.longest, 3))
                return False
        except PageLogError as e:
            self._refused(e)
            self.log.error("page log build step failed; retried by the maintenance task", error=str(e)[:300])
            return False
        if self.mirror.refusing is None:
            self._accepted()
        total = self._total()
        if total and b.pages * 10 // total > self._told:
            self._told = b.pages * 10 // total
            self.log.info("page log building", pages=b.pages, total=total, appended=b.appended,
                          longest_step_s=round(b.longest, 3))
        return True

    def build_some(self, budget_s: float) -> None:
        """Chunks of the build in progress (``_in_chunks``)."""
        self._in_chunks(lambda: self.build is not None and self._build_step(), budget_s)

    def _in_chunks(self, step: Callable[[], bool], budget_s: float) -> None:
        """``step()`` under the lock, again while it says so (True) for about ``budget_s`` (once at
        least), unless the store closed; a pause between: a pages write waiting for the lock takes it
        (Lock is not fair)."""
        until = time.monotonic() + budget_s
        while True:
            with self.mirror.lock:
                if self.pages.mirror is None or not step():
                    return
            if time.monotonic() >= until:
                return
            time.sleep(BUILD_PAUSE_S)

    def _total(self) -> int | None:
        return self.count() if self.count is not None else None

    # ------------------------------------------------------------------------------- refusals

    def _refused(self, e: PageLogError) -> None:
        full = isinstance(e, PageLogFull)
        metrics.pagelog_refused.labels("full" if full else "error").inc()
        if not self.alerting:  # said once per episode; the counter has every refusal
            self.log.error("page log refuses writes: page-store batches (render results included) are refused "
                           "until it takes them again", full=full, error=str(e)[:300])
        self.alerting = True
        metrics.pagelog_full.set(1)
        if self.on_refused is not None:
            self.on_refused()

    def _accepted(self) -> None:
        if self.alerting:
            self.alerting = False
            metrics.pagelog_full.set(0)
            self.log.warning("page log takes writes again", refused=self.mirror.refused)

    # ---------------------------------------------------------------------------- maintenance

    async def run(self) -> None:
        """The periodic task (in the store's ``_tasks``)."""
        while True:
            owed = (self.unreconciled or self.mirror.dirty or self.mirror.unresolved
                    or self.writer.broken is not None)
            # a build, a thinning walk go on turn after turn
            going = (self.build is not None or self.thinning is not None) and not self.alerting
            await asyncio.sleep(0 if going else REPAIR_EVERY_S if owed else MAINTAIN_EVERY_S)
            try:
                await asyncio.to_thread(self.turn)
                if self.mirror.unresolved and self.records is not None:
                    lost = self.settle(self.records)
                    if lost and self.refill is not None:
                        self.settled["refilled"] += await self.refill(lost)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                metrics.loop_errors.labels("page-log").inc()
                self.log.error("page log maintenance failed", error=repr(e)[:300])

    def turn(self) -> None:
        """One bounded step: reopen a writer that must be, put right what is owed, compact one segment;
        then chunks of a build in progress for ``BUILD_TURN_S``."""
        with self.mirror.lock:
            if self.pages.mirror is None:  # closed meanwhile
                return
            if self.writer.broken is not None:
                self.log.warning("page log reopened", why=self.writer.broken)
                self.writer.close()
                self.writer = self.mirror.writer = self._open()
                self.unreconciled = True
                self.build = self.mirror.touched = None  # a build starts again over the writer reopened
                self._stubs()
            if self.unreconciled and self.build is None:
                self._reconcile()
            if self.mirror.dirty and (self.build is not None or not self.unreconciled):
                keys = list(self.mirror.dirty)
                done = repair(self.writer, raw_reads(self.pages), keys, self.mirror.unresolved, self.mirror.previous)
                self.mirror.dirty.difference_update(keys)
                if not self.mirror.dirty:
                    self.mirror.previous.clear()
                self.log.info("page log repaired after a refused batch", keys=len(keys), appended=done.appended,
                              retimed=done.retimed, deleted=done.deleted)
            t0 = time.perf_counter()
            # (not while a repair is owed: the bytes a refused batch's entries named must stay where they are)
            done_c = compaction.maintain(self.writer, max_segments=1) if self.build is None and not self.mirror.dirty \
                else []
            if done_c:
                self.log.info("page log compacted", segments=[c.segment for c in done_c],
                              moved=sum(c.moved for c in done_c), freed=sum(c.freed for c in done_c),
                              seconds=round(time.perf_counter() - t0, 3))
            self._publish()
        if self.build is not None:
            self.build_some(BUILD_TURN_S)
        elif self.thinning is not None:
            self.thin_some(BUILD_TURN_S)

    def settle(self, records: Records) -> list[bytes]:
        """The stubs the log could not resolve, settled (on the store's loop): a newer record the log
        holds is applied as a peer's record would be (the write it was in reached the log, not
        RocksDB); a stub the log holds no copy of is dropped, as a rebalance drops a page this node no
        longer holds (a log lost or cut by a power loss). Returns the keys dropped: the store asks
        their other holders for them (``refill``)."""
        with self.mirror.lock:
            newer, lost = self.mirror.settling()
        try:
            if newer:
                records.commit_remote("pages", newer)
            if lost:
                records.drop_local("pages", lost)
        except BaseException:  # (a full disk) settled again at a later turn
            self.mirror.unresolved.update(k for k, _ in newer + lost)
            raise
        if newer:
            self.settled["applied"] += len(newer)
            metrics.pagelog_settled.labels("applied").inc(len(newer))
        if lost:
            self.settled["dropped"] += len(lost)
            metrics.pagelog_settled.labels("dropped").inc(len(lost))
            self.log.error("pages lost with the page log dropped; asked again of their other holders",
                           pages=len(lost), keys=[k.decode("utf-8", "replace") for k, _ in lost[:10]])
        if newer:
            self.log.warning("pages the page log held newer than the pages store applied", pages=len(newer),
                             keys=[k.decode("utf-8", "replace") for k, _ in newer[:10]])
        return [k for k, _ in lost]

    # --------------------------------------------------------------------------------- status

    def _publish(self) -> None:
        """Figures taken with the lock held (the maintenance thread changes them), read by status()."""
        w = self.writer
        self._stats = {"entries": len(w.entries), "diskBytes": w.disk_bytes(), "liveBytes": w.live_bytes()}
        metrics.pagelog_entries.set(self._stats["entries"])
        metrics.pagelog_disk_bytes.set(self._stats["diskBytes"])
        metrics.pagelog_live_bytes.set(self._stats["liveBytes"])

    def status(self) -> dict:
        if self.mirror.lock.acquire(blocking=False):  # else a maintenance step holds it: its last figures
            try:
                self._publish()
            finally:
                self.mirror.lock.release()
        r = self.last
        return {**self._stats, "path": str(self.path), "refusing": str(self.mirror.refusing)[:300]
                if self.mirror.refusing is not None else None, "refused": self.mirror.refused,
                "repairing": len(self.mirror.dirty), "reconciled": not self.unreconciled,
                "oneCopy": self.mirror.stubs, "unresolved": len(self.mirror.unresolved), "settled": dict(self.settled),
                "thinning": None if (t := self.thinning) is None else {"keys": t.passed, "thinned": t.thinned,
                                                                         "freedBytes": t.freed,
                                                                         "longestStepS": round(t.longest, 3)},
                "building": self._building(), "reconcile": r._asdict() if r is not None else None}

    def _building(self) -> dict | None:
        """A build's progress: live pages passed against those the store holds (an estimate: writes
        go on meanwhile), pointers passed, chunks and the longest (a pages write's longest wait)."""
        b = self.build
        if b is None:
            return None
        return {"pages": b.pages, "total": self._total(), "keys": b.passed, "appended": b.appended,
                "steps": b.steps, "longestStepS": round(b.longest, 3),
                "seconds": round(time.perf_counter() - b.started, 1)}

    def close(self) -> None:
        """After the task is cancelled: waits for a maintenance step in progress."""
        with self._compacting, self.mirror.lock:
            self.pages.mirror = None
            self.build = self.mirror.touched = None  # a build cut short starts again at the next open
            metrics.pagelog_building.set(0)
            self.writer.close()
