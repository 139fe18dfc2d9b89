"""Reads of the per-URL tier that need every node's share.

With ``cluster.replicas`` below the node count each node holds the targets of its share of URLs, and
its targets-by-sitemap index covers those only: "the targets attributed to sitemap S" is the union
of every node's answer (each URL comes from each of its R holders; duplicates merge). With every
node holding everything it is one local read, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prerender_ray.actors.store.actor import StoreClient


async def urls_of_sitemap(sitemap: str, limit: int, *, node: str, names: Sequence[str], replicas: int, local: Any,
                          store_of: Callable[[str], Awaitable[Any]], deadline_s: float) -> tuple[list[str], int]:
    """Up to ``limit`` URLs attributed to ``sitemap`` across the cluster, and how many there are. Each
    node answers for the URLs it owns under ``names`` (one node per URL: the lists are disjoint and
    the counts add up). When a node did not answer the count is one more than it knows, so a caller
    sees the list as incomplete (a prune scan leaves the rest to its next walk; a delete loop asks
    again). ``local`` and what ``store_of`` gives: a store's ``StoreClient`` or its handle; every
    call is under ``deadline_s``."""
    if replicas >= len(names):
        return await _client(local, deadline_s).urls_of_sitemap(sitemap, limit)

    async def one(name: str) -> tuple[list[str], int]:
        store = _client(local if name == node else await store_of(name), deadline_s)
        return await store.urls_of_sitemap(sitemap, limit, list(names))

    answers = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
    urls: list[str] = []
    total = 0
    for answer in answers:
        if isinstance(answer, BaseException):
            total += 1
            continue
        urls += answer[0]
        total += answer[1]
    return sorted(urls)[:limit], total


def _client(store: Any, deadline_s: float) -> StoreClient:
    """This read's deadline on a store's client (the api passes handles, the walker clients)."""
    return StoreClient(store.handle if isinstance(store, StoreClient) else store, deadline_s)
