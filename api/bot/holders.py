"""Pages this node does not hold (docs/architecture.md#tiers): with ``cluster.replicas`` below the node count a
URL's pages live on its first R nodes, and any other node serves a bot by reading a holder.

The holders are asked in rank order (the owner first: results are applied there), each through its
store actor under ``cluster.holderReadTimeoutMs``; the next one on a timeout or an error, the slow
ones still heard: the first answer wins, and once every holder was asked they get LATE_GRACE more
timeouts (on a loaded machine every holder can be slower than one timeout, and giving up sent bots to
the origin for minutes in the namespace test). A holder's answer is final, a page or none: they hold
the same records. What was read is kept in a bounded cache (bytes, and ``cluster.holderCacheTtlMs``:
a new render reaches this node's bots within that), so a crawler's repeats cost no call. When no holder answers in time (a holder just died, the machine
is loaded), the copy read last is served if the cache still has it, past its TTL: the page's own
expiry decides whether it is a hit. Only when there is none does the caller go on to the miss path
(render-now, the origin).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

from prerender_ray import logs, metrics
from prerender_ray.api.bot.pages import StoredPage, UnreadablePage, decode_page
from prerender_ray.api.context import NodeContext
from prerender_ray.config.service import Cluster

log = logs.get("bot")
LATE_GRACE = 3  # timeouts more for any holder asked, once every holder was asked


@dataclass(slots=True)
class HolderRead:
    page: StoredPage | None  # None: the holder has no page for the key
    answered: bool  # False: no holder answered in time
    holder: str | None = None


class HolderReader:
    def __init__(self, ctx: NodeContext, cluster: Cluster):
        self.ctx = ctx
        self.timeout_s = cluster.holder_read_timeout_ms / 1000
        self.max_bytes = cluster.holder_cache_bytes
        self.ttl_s = cluster.holder_cache_ttl_ms / 1000
        self._cache: OrderedDict[str, tuple[float, StoredPage, int]] = OrderedDict()  # expiry, page, bytes
        self._bytes = 0

    def applies(self, url: str) -> bool:
        return not self.ctx.holds(url)

    def elsewhere(self, url: str) -> bool:
        """Another node holds ``url`` too: a holder that misses locally asks it (a node that just
        became a holder has no copy until the rebalance brings it; seen as a 502 in the namespace
        test right after a node's loss)."""
        return any(h != self.ctx.node.name for h in self.ctx.holders_of(url))

    async def get(self, key: str, url: str, *, cached: bool = True) -> HolderRead:
        """The page of ``key`` from this node's cache or from a holder of ``url``."""
        hit = self._cache.get(key)
        if cached and hit is not None and hit[0] > time.monotonic():
            self._cache.move_to_end(key)
            metrics.holder_reads.labels("cached").inc()
            return HolderRead(hit[1], True)
        holders = [h for h in self.ctx.holders_of(url) if h != self.ctx.node.name]
        asked: dict[asyncio.Future, tuple[str, float]] = {}  # the calls not answered yet: holder, start
        longest = self.timeout_s * (len(holders) + LATE_GRACE)  # all this get waits: a call's deadline
        try:
            for i, holder in enumerate(holders):
                asked[asyncio.ensure_future(self._ask(holder, key, longest))] = (holder, time.perf_counter())
                wait = self.timeout_s * (1 + LATE_GRACE if i == len(holders) - 1 else 1)
                got = await self._first_answer(asked, key, wait)
                if got is not None:
                    return self._answered(key, *got)
        finally:
            for call, (holder, _) in asked.items():  # slower than the whole wait
                call.cancel()
                metrics.holder_reads.labels("failed").inc()
                log.info("holder read failed", key=key, holder=holder, error="TimeoutError")
        if hit is not None:  # no holder answered in time: the copy read last (its own freshness rules)
            metrics.holder_reads.labels("stale").inc()
            return HolderRead(hit[1], False)
        return HolderRead(None, False)

    async def _ask(self, holder: str, key: str, deadline_s: float) -> tuple[bytes | None, bytes | None]:
        store = await self.ctx.store_at(holder)
        [[raw, touch]] = await store.within(deadline_s).stored_pages([key])
        return raw, touch

    async def _first_answer(self, asked: dict[asyncio.Future, tuple[str, float]], key: str,
                            wait: float) -> tuple[str, float, tuple] | None:
        """The first of ``asked`` to answer within ``wait`` (holder, start, answer); None when none
        did, or every one failed (a node away, a stale handle: the caller asks the next)."""
        deadline = time.monotonic() + wait
        while asked:
            done, _ = await asyncio.wait(asked, timeout=max(0.0, deadline - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                return None
            for call in [c for c in asked if c in done]:  # answers of one turn: the holder asked first
                holder, t0 = asked.pop(call)
                if call.exception() is None:
                    return holder, t0, call.result()
                metrics.holder_reads.labels("failed").inc()
                log.info("holder read failed", key=key, holder=holder, error=type(call.exception()).__name__)
                self.ctx.forget_remote()
        return None

    def _answered(self, key: str, holder: str, t0: float, answer: tuple) -> HolderRead:
        metrics.holder_read_seconds.observe(time.perf_counter() - t0)
        raw, touch = answer
        try:
            page = decode_page(key, raw, touch) if raw is not None else None
        except UnreadablePage as e:
            log.warning("unreadable page from a holder", key=key, holder=holder, error=str(e))
            page = None
        metrics.holder_reads.labels("page" if page is not None else "none").inc()
        if page is not None:
            self._keep(key, page)
        else:
            self._drop(key)
        return HolderRead(page, True, holder)

    def _keep(self, key: str, page: StoredPage) -> None:
        size = page.size  # the negotiated forms it gains are bounded per page (VARIANTS_PER_PAGE)
        if size > self.max_bytes:
            return
        self._drop(key)
        self._cache[key] = (time.monotonic() + self.ttl_s, page, size)
        self._bytes += size
        while self._bytes > self.max_bytes and self._cache:
            _, (_, _, old) = self._cache.popitem(last=False)
            self._bytes -= old

    def _drop(self, key: str) -> None:
        held = self._cache.pop(key, None)
        if held is not None:
            self._bytes -= held[2]
