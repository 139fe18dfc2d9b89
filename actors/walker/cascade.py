"""Deleting a sitemap (``DELETE /sitemaps``; docs/sitemaps.md#delete-cascade): a part of the node's
SitemapWalker (walker/actor.py), as robots.txt discovery is (walker/robots.py). The walks it stops are
the walker's; the targets it deletes or re-attributes go through the keeper of each one's owner.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from prerender_ray.actors.walker.walk import BATCH
from prerender_ray.sitemaps.parser import SitemapEntry
from prerender_ray.sitemaps.rules import still_listed
from prerender_ray.storage.registry import entries_key, sitemap_key


class Cascade:
    """``delete``: what ``DELETE /sitemaps`` does, for the walker that was asked."""

    def __init__(self, walker: Any):
        # the SitemapWalker: store, runs, keepers, ownership, fetcher, log, sitemap_urls, _sitemaps
        self.w = walker

    async def delete(self, url: str) -> dict:
        """The cascade: descendants (by parentUrl, cycle-safe), every target attributed to any of
        them (with its schedule rows and pages), then their rows. Refresh rows are kept."""
        rows = await self.w._sitemaps()
        if url not in rows:
            return {"url": url, "deleted": False}
        children: dict[str, list[str]] = {}
        for child, row in rows.items():
            parent = row.get("parentUrl")
            if isinstance(parent, str) and child != parent:
                children.setdefault(parent, []).append(child)
        order, seen = [url], {url}
        for s in order:  # breadth-first; grows while iterating
            for child in sorted(children.get(s, ())):
                if child not in seen:
                    seen.add(child)
                    order.append(child)
        for s in order:
            run = self.w.runs.get(s)
            if run is not None and run.task is not None:
                run.cancel_reason = f"sitemap {url} was deleted"
                run.task.cancel()
        kept = await self._listed_elsewhere(order, rows)
        targets = 0
        for s in order:
            targets += await self._delete_targets_of(s, kept)
        ops: list[tuple[bytes, bytes | None]] = []
        for s in order:
            got = rows[s].get("chunks")
            chunks = got if isinstance(got, int) else 0
            ops += [(entries_key(s, i), None) for i in range(chunks)]
            ops.append((sitemap_key(s), None))
        await self.w.store.apply(ops)
        self.w.log.info("sitemap deleted", url=url, sitemaps=len(order), targets=targets,
                        reattributed=len(kept))
        return {"url": url, "deleted": True, "sitemaps": order, "targets": targets,
                "reattributed": len(kept)}

    async def _listed_elsewhere(self, order: list[str], rows: dict[str, dict]) -> dict[str, str]:
        """Targets of the sitemaps being deleted that a remaining sitemap still lists, with that
        sitemap: they are re-attributed, not deleted (the same file under two root names)."""
        gone = set(order)
        remaining = sorted(u for u, row in rows.items() if u not in gone and not row.get("isIndex")
                           and isinstance(row.get("chunks"), int) and row["chunks"] > 0)
        if not remaining:
            return {}
        candidates: set[str] = set()
        for s in order:
            urls, _ = await self.w.sitemap_urls(s, 1 << 30)
            candidates.update(urls)
        kept: dict[str, str] = {}
        classify, canonicalize = self.w.fetcher.classify, self.w.fetcher.canonicalize
        for s in remaining:
            keys = [entries_key(s, i) for i in range(rows[s]["chunks"])]
            for i in range(0, len(keys), 16):  # a chunk holds ENTRY_CHUNK entries: bounded reads
                for raw in await self.w.store.get(keys[i:i + 16]):
                    if raw:
                        entries = [SitemapEntry(*(list(r) + [None] * 4)[:4]) for r in orjson.loads(raw)
                                   if isinstance(r, list)]
                        still_listed(candidates, s, entries, classify, canonicalize, kept)
        return kept

    async def _delete_targets_of(self, sitemap: str, kept: dict[str, str]) -> int:
        """Every target attributed to ``sitemap``, in batches until its index is empty; one that
        ``kept`` names is re-attributed to the sitemap that still lists it."""
        deleted, last_total = 0, None
        while True:
            urls, total = await self.w.sitemap_urls(sitemap, BATCH * 5)
            if not urls or total == last_total:  # nothing left, or nothing could be deleted
                return deleted
            last_total = total
            by_owner: dict[str, tuple[list[str], list[list]]] = {}
            for u in urls:
                drop, move = by_owner.setdefault(self.w.ownership.owner(u), ([], []))
                (move.append([u, {"sitemap_url": kept[u]}]) if u in kept else drop.append(u))
            keepers = {owner: await self.w.keepers.get(owner) for owner in by_owner}
            drops = [keepers[o].delete_targets(drop[i:i + BATCH]) for o, (drop, _) in by_owner.items()
                     for i in range(0, len(drop), BATCH)]
            moves = [keepers[o].patch_targets(move[i:i + BATCH]) for o, (_, move) in by_owner.items()
                     for i in range(0, len(move), BATCH)]
            answers = await asyncio.gather(*drops, *moves)
            deleted += sum(answer.get("deleted", 0) for answer in answers[:len(drops)])
