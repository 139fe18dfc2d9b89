"""The node store's page log (``storage/pagelog``; issue 37): opened and reconciled with the pages
RocksDB before the store serves, every pages-store write mirrored into it first
(``storage/pagelog/mirror.py``), and kept compact by a periodic task.

A write the log cannot take (a full disk: ``PageLogFull``) is refused whole: RocksDB is left as it
was, the caller gets the error (a render result is answered 503 with ``Retry-After``, and the fleet
posts it again), ``prerender_pagelog_full`` is 1 until a batch goes in again.

Maintenance runs in a thread, one bounded step per turn (at most one segment compacted, a new index
generation when the index has grown past twice the live records), under the mirror's lock: a pages
write waits for the step in progress, nothing else on the store's loop does.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from prerender_ray import metrics
from prerender_ray.storage.pagelog import (
    PageLogCorrupt,
    PageLogError,
    PageLogFull,
    PageLogWriter,
    compaction,
    files,
)
from prerender_ray.storage.pagelog.mirror import Mirror, MirroredStore
from prerender_ray.storage.pagelog.reconcile import Reconciled, reconcile, repair
from prerender_ray.storage.rocks import remove_tree

MAINTAIN_EVERY_S = 10.0
REPAIR_EVERY_S = 1.0  # while keys of a refused batch, or the whole log, wait to be put right


class StorePageLog:
    def __init__(self, pages: MirroredStore, path: Path, log: Any, on_refused: Any = None):
        """``on_refused()``: after a batch was refused (the store puts back what it counted for it)."""
        self.pages = pages
        self.on_refused = on_refused
        self.path = path
        self.log = log
        self.unreconciled = True
        self.alerting = False
        self.last: Reconciled | None = None
        self._stats: dict = {}
        metrics.pagelog_full.set(0)
        self.writer = self._open()
        self.mirror = Mirror(self.writer, pages.get_many, self._refused, self._accepted)
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
        """The whole log against RocksDB (lock held). A refusal (a full disk at start) leaves it owed:
        the maintenance task tries again, and the store serves meanwhile."""
        try:
            self.last = reconcile(self.writer, self.pages)
        except PageLogError as e:
            self._refused(e)
            self.log.error("page log reconcile failed; retried by the maintenance task", error=str(e)[:300])
            return
        self.unreconciled = False
        try:
            files.mark_complete(self.path)  # readers may follow it now (a rebuilt log drops the mark with it)
        except OSError as e:  # a full disk: readers keep to the store's RocksDB meanwhile
            self.log.error("page log cannot be marked complete", error=str(e)[:300])
            self.unreconciled = True
        if self.mirror.refusing is None:
            self._accepted()
        r = self.last
        self.log.info("page log reconciled", path=str(self.path), pages=r.pages, appended=r.appended,
                      retimed=r.retimed, deleted=r.deleted, seconds=round(r.seconds, 3),
                      entries=len(self.writer.entries))

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
            owed = self.unreconciled or self.mirror.dirty or self.writer.broken is not None
            await asyncio.sleep(REPAIR_EVERY_S if owed else MAINTAIN_EVERY_S)
            try:
                await asyncio.to_thread(self.turn)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                metrics.loop_errors.labels("page-log").inc()
                self.log.error("page log maintenance failed", error=repr(e)[:300])

    def turn(self) -> None:
        """One bounded step: reopen a writer that must be, put right what is owed, compact one segment."""
        with self.mirror.lock:
            if self.pages.mirror is None:  # closed meanwhile
                return
            if self.writer.broken is not None:
                self.log.warning("page log reopened", why=self.writer.broken)
                self.writer.close()
                self.writer = self.mirror.writer = self._open()
                self.unreconciled = True
            if self.unreconciled:
                self._reconcile()
            if self.mirror.dirty and not self.unreconciled:
                keys = list(self.mirror.dirty)
                done = repair(self.writer, self.pages.get_many, keys)
                self.mirror.dirty.difference_update(keys)
                self.log.info("page log repaired after a refused batch", keys=len(keys), appended=done.appended,
                              retimed=done.retimed, deleted=done.deleted)
            t0 = time.perf_counter()
            done_c = compaction.maintain(self.writer, max_segments=1)
            if done_c:
                self.log.info("page log compacted", segments=[c.segment for c in done_c],
                              moved=sum(c.moved for c in done_c), freed=sum(c.freed for c in done_c),
                              seconds=round(time.perf_counter() - t0, 3))
            self._publish()

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
                "reconcile": r._asdict() if r is not None else None}

    def close(self) -> None:
        """After the task is cancelled: waits for a maintenance step in progress."""
        with self.mirror.lock:
            self.pages.mirror = None
            self.writer.close()
