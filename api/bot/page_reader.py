"""The ingress side of the page store, read in the ingress process without an actor call: a cache hit
is one dict look-up in the node's page log index and one ``pread`` (``prerender_ray.storage.pagelog``;
docs/architecture.md#the-bot-hot-path-has-no-actor-hop). Decoding the record and negotiating it are
kept with the page (``DecodedPages``, ``api/bot/pages.py``) for the next read of the same index entry.

The NodeStore actor is the only writer. It appends a write to the page log before it writes RocksDB,
and the RocksDB write bumps the store's write mark (``prerender_ray.storage.write_mark``): once the
mark moved, the log holds the write. So a read (``read``) that finds the mark moved since the last poll
polls the log first (a ``pread`` of the index tail, no waiting) and reads its own writes: a store
writes before its caller gets an answer (a result's 204 included). A timer polls too, so a replica
follows compactions, retirements and new index generations, which move no mark.

Fallback: while the node has no page log (a store of an older release, or one that has not created
it yet) the reader uses a RocksDB *secondary* instance of the pages database instead, as before the
log: it sees the primary's writes only after ``try_catch_up_with_primary()`` (about 0.7 ms when
nothing changed), so it catches up on a timer and, whenever the mark moved, before a read. Those
catch-ups are shared: one at a time, at most one per ``gap_s``, each serving every read that began
waiting before it started. The timer looks for the log meanwhile; once the log is there it is
authoritative (the store reconciles it with RocksDB at open) and the secondary is closed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

from rocksdict import AccessType, Options, Rdict

from prerender_ray import logs, metrics
from prerender_ray.api.bot.pages import DecodedPages, StoredPage, decode_page
from prerender_ray.storage.pagelog import PageLogError, PageLogReader, key_hash
from prerender_ray.storage.pagelog.files import is_complete
from prerender_ray.storage.replication import is_stub
from prerender_ray.storage.rocks import PAGES, node_dir, pagelog_path, store_path
from prerender_ray.storage.touches import touch_key
from prerender_ray.storage.write_mark import WriteMark

CATCH_UP_INTERVAL_S = 0.25  # the secondary's timer (it also follows compactions, which move no mark)
# The page log's timer: a poll that finds nothing new is an fstat (about 1 us), so a replica follows
# compactions and retirements (which move no mark) within this, and frees a retired file's space.
LOG_POLL_INTERVAL_S = 0.05
# Catch-ups a read waits for start at least this far apart: at about 0.7 ms each, a store that writes
# without pause costs a replica at most ~7% of its loop, and a read after a write waits at most this.
CATCH_UP_GAP_S = 0.01
CATCH_UP_WAIT_S = 1.0  # a read's deadline for its catch-up; past it the read takes the view it has
log = logs.get("pagestore")


class PageReader:
    def __init__(self, primary: Path, secondary: Path, *, log: Path | None = None,
                 interval_s: float = CATCH_UP_INTERVAL_S, poll_s: float = LOG_POLL_INTERVAL_S,
                 gap_s: float = CATCH_UP_GAP_S, wait_s: float = CATCH_UP_WAIT_S):
        self.primary = primary
        self.secondary = secondary
        self.log_path = log  # the node's page log; None: this reader uses the secondary only
        self.interval_s = interval_s
        self.poll_s = poll_s
        self.gap_s = gap_s
        self.wait_s = wait_s
        self._log: PageLogReader | None = None  # set once the log is there: from then on the only source
        self._db: Rdict | None = None
        self._caught_up = 0.0  # monotonic time of the last catch-up (or open)
        self._task: asyncio.Task | None = None
        self._mark: WriteMark | None = None  # the store's write mark, once it has one
        self._seen: int | None = None  # the mark as read just before the last catch-up or poll (or open) began
        self._next: asyncio.Future | None = None  # the catch-up reads wait for, scheduled not started
        self._closed = False
        self.catch_ups = 0
        self.waited = 0  # catch-ups that reads waited for (the rest: the timer's)
        self.polls = 0  # polls of the page log that a moved mark (or the timer) asked for
        self.open_error: str | None = None
        self.log_error: str | None = None  # why the page log is not used, when it is there but fails
        self.decoded = DecodedPages()
        self.generation = 0  # bumped by every catch-up that ran
        if not self._open_log():
            self._open()

    @classmethod
    def for_node(cls, data_dir: str, node: str, replica: int, **kw: float) -> PageReader:
        # One secondary directory per replica: it holds the instance's own info log and state.
        secondary = node_dir(data_dir, node) / "ingress" / f"pages-{replica}"
        return cls(store_path(data_dir, node, PAGES), secondary, log=pagelog_path(data_dir, node), **kw)

    # --------------------------------------------------------------------------------- lifecycle

    @property
    def ready(self) -> bool:
        return self._log is not None or self._db is not None

    @property
    def source(self) -> str:  # where hits are read from
        return "pagelog" if self._log is not None else "secondary" if self._db is not None else "none"

    def _open_log(self) -> bool:
        """Load the page log's whole index once the store has created the log; from then on it is the
        only source (the store reconciles it with RocksDB at open), and the secondary is closed."""
        path = self.log_path
        if path is None or self._closed or not is_complete(path):
            return False
        mark = self._follow()  # read before the load: the index is at least as new
        try:
            reader = PageLogReader(path)
        except (PageLogError, OSError) as e:  # a damaged header: stay on the secondary, say why
            if self.log_error is None:
                log.error("page log unusable; reading the secondary", path=str(path), error=str(e))
            self.log_error = str(e)
            return False
        if not reader.ready:  # the directory without its first index yet (being created)
            reader.close()
            return False
        self._log, self._seen, self.log_error = reader, mark, None
        self._close_secondary()
        log.info("page reader follows the page log", path=str(path), pages=len(reader))
        return True

    def _open(self) -> bool:
        """Open the secondary once the primary exists (the store actor may start after us)."""
        if self._db is not None:
            return True
        mark = self._follow()  # read before the open: the view is at least as new
        if not (self.primary / "CURRENT").exists():
            self.open_error = f"{self.primary} does not exist yet"
            return False
        opts = Options(raw_mode=True)
        opts.create_if_missing(False)
        # A secondary must keep every table file open: the primary may delete one it has compacted
        # away before the secondary reads it (RocksDB wiki, "Secondary instance").
        opts.set_max_open_files(-1)
        self.secondary.mkdir(parents=True, exist_ok=True)
        try:
            self._db = Rdict(str(self.primary), opts, access_type=AccessType.secondary(str(self.secondary)))
        except Exception as e:  # rocksdict raises bare Exception
            self.open_error = f"cannot open {self.primary} as a secondary: {e}"
            return False
        self.open_error = None
        self._caught_up = time.monotonic()
        self._seen = mark
        log.info("page reader open", primary=str(self.primary))
        return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._timer())

    async def _timer(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s if self._log is not None else self.interval_s)
            try:
                if self._log is not None and not is_complete(self._log.path):
                    self._leave_log()
                self.catch_up(force=True)
            except Exception as e:  # never let the timer die: the replica would serve a frozen view
                metrics.loop_errors.labels("page-catch-up").inc()
                log.error("page catch-up failed", error=repr(e))

    def close(self) -> None:
        self._closed = True
        if self._next is not None and not self._next.done():
            self._next.set_result(None)
        if self._mark is not None:
            self._mark.close()
            self._mark = None
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self._close_secondary()

    def _leave_log(self) -> None:
        """The store is building its log anew (it found it damaged): the secondary until it is whole."""
        log.warning("page log being rebuilt; reading the secondary", path=str(self.log_path))
        assert self._log is not None
        self._log.close()
        self._log = None
        self.decoded = DecodedPages()  # pages read by log entries: a secondary's are validated otherwise
        self._open()

    def _close_secondary(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except Exception as e:  # nothing left to protect: it is not read any more
                log.warning("page reader close failed", error=repr(e))
            self._db = None

    # ------------------------------------------------------------------------------------- reads

    def _follow(self) -> int | None:
        """The store's write mark now (following it anew if its file was made again), or None while
        the store has none."""
        mark = self._mark
        if mark is not None and mark.replaced():
            mark.close()
            mark = self._mark = None
        if mark is None:
            mark = self._mark = WriteMark.follow(self.primary)
            if mark is None:
                return None
        return mark.value()

    def behind(self) -> bool:
        """The store wrote since the last catch-up began (one load; False while it has no mark)."""
        mark = self._mark
        return mark is not None and mark.value() != self._seen

    def poll(self) -> bool:
        """Apply the page log's new records. One that fails leaves the index as it was (its bodies
        are checksummed on every read); False then, or with no log."""
        if self._log is None:
            return False
        mark = self._follow()  # read before the poll: every write it counts is in the log already
        try:
            self._log.poll()
        except (PageLogError, OSError) as e:
            metrics.serve_errors.labels("page-log-poll").inc()
            log.error("page log poll failed", error=str(e))
            return False
        self._seen = mark
        self.polls += 1
        return True

    def catch_up(self, *, force: bool = False) -> bool:
        """A poll of the page log, or (no log yet) a look for it and a replay of the primary's new
        writes, without ``force`` at most once per ``gap_s``; returns whether it ran."""
        if self._log is not None or self._open_log():
            return self.poll()
        now = time.monotonic()
        if self._closed or (not force and now - self._caught_up < self.gap_s):
            return False
        self._caught_up = now
        mark = self._follow()  # read before the replay starts: every write it counts is replayed
        if self._db is None:
            return self._open()
        self._db.try_catch_up_with_primary()
        self._seen = mark
        self.catch_ups += 1
        self.generation += 1  # the view may have changed: every decoded page is re-read once
        return True

    def get(self, key: str) -> StoredPage | None:
        """The page stored under ``key``, or None. Raises UnreadablePage."""
        if self._log is not None:
            return self._from_log(self._log, key)
        db = self._db
        if db is None:
            return None
        page = self.decoded.peek(key)
        if page is not None and page.seen == self.generation:
            return page  # read since the last catch-up: the store cannot hold anything else
        k = key.encode()
        raw, touch = cast("list[bytes | None]", db.get([k, touch_key(k)]))  # one multi-get: page and touch
        if raw is None or is_stub(raw):  # a stub's page is in the page log alone, which is being built again
            self.decoded.drop(key)
            return None
        page = self.decoded.lookup(key, raw)
        if page is not None:
            page.retouch(touch)
            page.seen = self.generation
            return page
        page = decode_page(key, raw, touch)
        if page is None:
            return None
        page.seen = self.generation
        self.decoded.add(key, page)
        return page

    def _from_log(self, found: PageLogReader, key: str) -> StoredPage | None:
        """A dict look-up; a page decoded from the very same index entry is served as it is, else one
        ``pread`` of the record (checksummed: a torn or short body is a miss, counted) with the
        entry's times, which are the effective ones (a freshness record applied by the store)."""
        decoded = self.decoded
        page = decoded.peek(key)
        hashed = page.log_key if page is not None and page.log_key is not None else key_hash(key)
        stamp = found.entries.get(hashed)
        if stamp is None:
            decoded.drop(key)  # deleted: its memory goes now
            return None
        if page is not None and page.stamp == stamp:
            # The same entry: the same bytes (a place in a segment is never written twice), the same times.
            decoded.used(key)
            return page
        hit = found.get(hashed)
        if hit is None:
            decoded.drop(key)
            metrics.serve_errors.labels("page-log-unreadable").inc()
            return None
        page = decoded.lookup(key, hit.data)  # moved by a compaction, or only new times: same bytes
        if page is None:
            page = decode_page(key, hit.data, None)
            if page is None:  # a tombstone (the store deletes those from the log; not served either way)
                return None
            decoded.add(key, page)
        page.retime(hit.last_cached, hit.expires_at)
        page.stamp, page.log_key = stamp, hashed
        return page

    async def read(self, key: str) -> StoredPage | None:
        """``get`` of what the store holds now (a write answered before this call included): first a
        poll of the log (no wait), or a catch-up of the secondary, when the store wrote since the last
        one began. Raises UnreadablePage."""
        if self._log is not None:
            return self.read_log(key)
        if self.behind():
            await self.sync()
        found = self.get(key)
        if found is None and self._mark is None and self._follow() is not None and self.behind():
            await self.sync()  # the store opened since this reader last looked for its mark
            found = self.get(key)
        return found

    def read_log(self, key: str) -> StoredPage | None:
        """``read`` over the page log, which never waits; None without a log too."""
        if self._log is None:
            return None
        if self._mark is None or self.behind():  # no mark followed yet: the store may just have made it
            self.poll()
        found = self._log
        return None if found is None else self._from_log(found, key)

    @property
    def log(self) -> PageLogReader | None:
        """The page log hits are read from (a rebuild of the log gives another), None on the secondary."""
        return self._log

    def log_entry(self, hashed: bytes) -> bytes | None:
        """The page log's index entry ``read`` would find for ``hashed`` (``StoredPage.log_key``) now,
        a write answered before this call included; None when it holds none, or without a log."""
        found = self._log
        if found is None:
            return None
        if self._mark is None or self.behind():
            self.poll()
        return found.entries.get(hashed)

    async def record(self, key: str) -> bytes | None:
        """The record ``read`` would decode (enveloped, for ``decode_page``), without keeping it decoded:
        a bulk reader (llms.txt) must not push the bots' pages out of ``decoded``."""
        if self._log is not None:
            if self._mark is None or self.behind():
                self.poll()
            found = self._log.get(key_hash(key))
            return None if found is None else found.data
        if self.behind():
            await self.sync()
        db = self._db
        raw = None if db is None else cast("bytes | None", db.get(key.encode()))
        return None if is_stub(raw) else raw

    def writes(self) -> int | None:
        """The store's write mark (a count of its writes), None while it has none: a reader of many
        pages compares it to tell whether anything was written since it last read."""
        return self._follow()

    async def sync(self) -> bool:
        """Wait, at most ``wait_s``, for a catch-up that starts after this call. Every read that
        calls meanwhile waits for the same one (one scheduled at a time, ``gap_s`` after the last
        began), so a flood of reads costs one catch-up per gap at most. False past the deadline."""
        fut = self._next
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._next = loop.create_future()
            loop.call_later(max(0.0, self._caught_up + self.gap_s - time.monotonic()), self._run_scheduled, fut)
        try:
            async with asyncio.timeout(self.wait_s):
                await asyncio.shield(fut)  # a reader that goes away does not cancel the others' catch-up
        except TimeoutError:
            metrics.serve_errors.labels("page-catch-up-late").inc()
            return False
        return True

    def _run_scheduled(self, fut: asyncio.Future) -> None:
        if self._next is fut:
            self._next = None  # a read from now on waits for the next one: this one may miss its write
        try:
            # Not behind: a catch-up (the timer's) began after the last write its waiters could know of.
            if self._db is not None and self._mark is not None and not self.behind():
                return
            if self.catch_up(force=True):
                self.waited += 1
        except Exception as e:  # the waiters read the view they have; the timer tries again
            metrics.loop_errors.labels("page-catch-up").inc()
            log.error("page catch-up failed", error=repr(e))
        finally:
            if not fut.done():
                fut.set_result(None)
