"""What each site's robots.txt declares about the use of its content, held in memory for the bot path.

With ``bots.contentSignals.applyAsDefaults`` the bot path looks a request's site up here (a dictionary
read, never a store read: a hit costs no store call) and hands it to the policy decision. The table is
filled from the replicated ``b:<origin>`` robots rows (written by robots.txt discovery), read from this
node's store in pages of ``PAGE`` rows every ``REFRESH_S`` when the option is on; a read that fails
keeps the table it had. A site with no row, or a row written before declarations were kept, has none.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prerender_ray import logs, metrics
from prerender_ray.actors.common import survivable
from prerender_ray.serving.origin_policy import label, origin_of
from prerender_ray.sitemaps.content_signals import Signals
from prerender_ray.storage.keys import ROBOTS
from prerender_ray.storage.registry import RecordError, decode_json

log = logs.get("bot")
REFRESH_S = 60.0  # discovery runs daily or when an admin asks: a minute behind is soon enough
READ_S = 10.0  # one page read from the store
PAGE = 16  # rows per read: a row holds up to robots.maxBytes of text
MAX_SITES = 1_000  # rows read (the admin report lists as many)
MAX_MEMO = 4_096  # URL heads remembered with their origin


class SiteSignals:
    def __init__(self, store: Any):
        self.store = store  # the node's StoreClient
        self.sites: dict[str, Signals] = {}  # origin -> what it declares (only sites that declare)
        self._origins: dict[str, str | None] = {}  # "scheme://authority" of a URL -> its origin

    def of(self, url: str) -> Signals | None:
        """What the site of a canonical URL declares, or None."""
        sites = self.sites
        if not sites:
            return None
        end = url.find("/", url.find("//") + 2)
        head = url if end < 0 else url[:end]
        origin = self._origins.get(head, "")
        if origin == "":
            parts = origin_of(head + "/")
            origin = None if parts is None else f"{parts[0]}://{label(*parts)}"
            if len(self._origins) >= MAX_MEMO:
                self._origins.clear()
            self._origins[head] = origin
        return sites.get(origin) if origin is not None else None

    async def reload(self) -> int:
        """Read every robots row (bounded) and swap the table in whole when it changed; how many sites
        declare."""
        sites: dict[str, Signals] = {}
        start: bytes | None = None
        read = 0
        while read < MAX_SITES:
            rows = await self.store.within(READ_S).scan(ROBOTS, start, min(PAGE, MAX_SITES - read))
            if not rows:
                break
            read += len(rows)
            sites.update(await asyncio.to_thread(_declaring, rows))
            start = rows[-1][0] + b"\x00"
            if len(rows) < PAGE:
                break
        if sites != self.sites:  # the memos hold the table by identity: an unchanged one stays
            self.sites = sites
        return len(sites)

    async def follow(self) -> None:
        """``reload`` now and every ``REFRESH_S``; survives its own failures."""
        while True:
            try:
                await self.reload()
            except Exception as e:
                if not survivable(e):
                    raise
                metrics.loop_errors.labels("content-signals").inc()
                log.warning("content signals not read; the last table stays", error=repr(e)[:300])
            await asyncio.sleep(REFRESH_S)


def _declaring(rows: list[tuple[bytes, bytes]]) -> dict[str, Signals]:
    out = {}
    for key, raw in rows:
        try:
            row = decode_json(raw)
        except RecordError:
            continue
        if not isinstance(row, dict):
            continue
        signals = Signals.from_row(row.get("signals"))
        if signals:
            out[key[len(ROBOTS):].decode("utf-8", "replace")] = signals
    return out
