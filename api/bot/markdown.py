"""Markdown for agents in the ingress: conversions off the event loop, coalesced, with a deadline,
and kept per page version in a byte-bounded LRU (docs/serving.md#markdown-for-agents).

A conversion runs in a small thread pool (html-to-markdown releases the GIL while it converts, but for
each call of the visitor that a page failing the inert check takes: serving/markdown_inert.py). The
request waits at most ``markdown.timeoutMs``, then gets the HTML; the conversion still finishes and
its result is kept, so the page's next request is answered from the cache. Concurrent requests for
the same page version share one conversion. A thread cannot be stopped, so what bounds the work is
the input cap, the pool's size and ``MAX_IN_FLIGHT``. A page that fails is remembered (per version)
and served as HTML without trying again; one past its deadline is served as HTML until it is done.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prerender_ray import logs, metrics
from prerender_ray.api.bot.counters import Counters
from prerender_ray.serving.answer import Prepared
from prerender_ray.serving.markdown import MarkdownSkipped
from prerender_ray.storage.pages import PageMeta

log = logs.get("bot")
WORKERS = 2  # conversion threads per replica (the machine's other work needs the cores too)
MAX_IN_FLIGHT = 8  # conversions queued or running per replica; past it a request gets the HTML ("busy")
VARIANTS = 4  # negotiated forms kept per entry (one per coding sent: br, gzip, identity)
SKIP_SIZE = 64  # what a remembered failure costs the byte budget


@dataclass(slots=True)
class Converted:
    """A page version's Markdown: its answer's metadata and the gzip-coded body."""

    meta: PageMeta
    body: bytes
    variants: dict[str, Prepared] = field(default_factory=dict)  # by the coding sent

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(p.body) for p in self.variants.values() if p.body is not self.body)


@dataclass(frozen=True, slots=True)
class Skipped:
    reason: str

    size = SKIP_SIZE


Entry = Converted | Skipped
Key = tuple[str, str]  # cache key, page version


class MarkdownCache:
    """LRU of converted pages by bytes: one entry per cache key, valid for one page version (a new
    render replaces it on its first request)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, tuple[str, Entry]] = OrderedDict()

    def get(self, key: Key) -> Entry | None:
        found = self._entries.get(key[0])
        if found is None:
            return None
        if found[0] != key[1]:  # another version of the page: stale
            self.drop(key[0])
            return None
        self._entries.move_to_end(key[0])
        return found[1]

    def put(self, key: Key, entry: Entry) -> None:
        self.drop(key[0])
        if entry.size > self.max_bytes:
            return
        self._entries[key[0]] = (key[1], entry)
        self.bytes += entry.size
        self._evict()

    def grow(self, key: Key, entry: Converted, coding: str, prepared: Prepared) -> None:
        """Keep a negotiated form with ``entry`` (sent in ``coding``), counted while it is the one cached."""
        if len(entry.variants) >= VARIANTS or coding in entry.variants:
            return
        before = entry.size
        entry.variants[coding] = prepared
        cached = self._entries.get(key[0])
        if cached is not None and cached[1] is entry:
            self.bytes += entry.size - before
            self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._entries:
            _, (_, old) = self._entries.popitem(last=False)
            self.bytes -= old.size

    def drop(self, cache_key: str) -> None:
        old = self._entries.pop(cache_key, None)
        if old is not None:
            self.bytes -= old[1].size

    def __len__(self) -> int:
        return len(self._entries)


class Converter:
    """The replica's conversions: the pool, the cache and the conversions in flight. Outlives a
    config change (``api/bot/replica.py``'s Services)."""

    def __init__(self, cache_bytes: int, counters: Counters, *, workers: int = WORKERS,
                 max_in_flight: int = MAX_IN_FLIGHT):
        self.cache = MarkdownCache(cache_bytes)
        self.counters = counters
        self.max_in_flight = max_in_flight
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="markdown")
        self._in_flight: dict[Key, asyncio.Future] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def get(self, key: Key, convert: Callable[[], Converted], timeout_s: float) -> Entry:
        """The entry of ``key``: cached, else ``convert`` run in the pool (shared with any request
        already waiting for it), waited for at most ``timeout_s``. Never raises: a conversion that
        fails is a Skipped entry."""
        entry = self.cache.get(key)
        if entry is not None:
            return entry
        fut = self._in_flight.get(key)
        if fut is None:
            if len(self._in_flight) >= self.max_in_flight:
                self.counters.count(metrics.markdown_conversions, "busy")
                return Skipped("busy")
            fut = asyncio.get_running_loop().run_in_executor(self._pool, _attempt, convert, key[0])
            self._in_flight[key] = fut
            fut.add_done_callback(lambda f: self._done(key, f))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            if self.cache.get(key) is None:  # the next request serves HTML at once, until it is done
                self.counters.count(metrics.markdown_conversions, "timeout")
                self.counters.warn_sometimes("markdown-timeout", "markdown conversion past its deadline; "
                                             "serving HTML", key=key[0], timeout_s=timeout_s)
                self.cache.put(key, Skipped("timeout"))
            return Skipped("timeout")

    def _done(self, key: Key, fut: asyncio.Future) -> None:
        self._in_flight.pop(key, None)
        if fut.cancelled():  # the pool shut down
            return
        entry = fut.result()
        if isinstance(entry, Skipped):
            self.counters.count(metrics.markdown_conversions, entry.reason)
        else:
            self.counters.count(metrics.markdown_conversions, "converted")
        self.cache.put(key, entry)


def _attempt(convert: Callable[[], Converted], cache_key: str) -> Entry:
    """``convert`` in a pool thread, its failure an entry: every waiter reads the same outcome, and it
    is logged and counted once (``Converter._done``)."""
    try:
        return convert()
    except MarkdownSkipped as e:
        log.warning("page not converted to markdown; serving HTML", key=cache_key, reason=e.reason, error=str(e))
        return Skipped(e.reason)
    except Exception as e:  # a bug of ours or the converter's: logged in full, the page served as HTML
        log.error("markdown conversion failed", key=cache_key, error=repr(e))
        return Skipped("failed")
