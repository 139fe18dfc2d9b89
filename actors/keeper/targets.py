"""The keeper's target writes: put, patch, delete, suppress, revalidate and render-now.

Each writes the replicated target rows (and pages to drop) through the node's store, then the schedule
rows through the keeper's funnel. Items this node does not own (the caller's membership view lagged)
go on to their owners' keepers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prerender_ray.actors.keeper.rows import CurrentConfig, Rows
from prerender_ray.identity.membership import MembershipView, StaleEpoch, never_moved, unchecked
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.rpc import Peers, StoreApi
from prerender_ray.storage.keys import TARGET
from prerender_ray.storage.registry import RecordError, Target, target_key
from prerender_ray.storage.touches import Touch, touch_key

SCAN_CHUNK = 2_000
PATCH_TRIES = 3  # a target written between a patch's read and its write: read and patched again


class Targets:
    def __init__(self, rows: Rows, conf: CurrentConfig, store: StoreApi, peers: Peers, view: MembershipView,
                 node: str):
        self.rows = rows
        self.conf = conf
        self.store = store
        self.peers = peers
        self.view = view
        self.node = node
        # the membership protocol (Handoff.accept / fetch_membership), wired by the keeper
        self.accept: Callable[[int, str], Awaitable[None]] = unchecked
        self.moved_past: Callable[[int], Awaitable[bool]] = never_moved
        self.publish_now: Callable[[], None] = lambda: None
        self.woke: Callable[[], bool] = lambda: False  # did the last publish wake this node's consumers

    async def put_targets(self, items: list[dict], forwarded: bool = False, absent_only: bool = False,
                          deleted_within_ms: int = 0, epoch: int | None = None) -> dict:
        """Put semantics for canonical URLs: (re)activate, one jittered row per device.

        ``absent_only``: create only the targets that do not exist; the answer's ``held`` lists the
        others as [url, stored payload], untouched (a sitemap walk decides about those). With it,
        ``deleted_within_ms``: a target deleted that recently counts as existing (held as ``b""``).
        ``epoch``: the forwarding keeper's membership epoch (``Handoff.accept``). An item's
        ``discovered: true`` (never from the API) marks a target a bot's miss made (``Target.discovered``)."""
        if forwarded and epoch is not None:
            await self.accept(epoch, "put_targets")
        return await self._put([it["url"] for it in items], [it.get("sitemapUrl") for it in items],
                               [it.get("renderInterval") for it in items],
                               [it.get("nextRenderTime") for it in items], forwarded, absent_only,
                               deleted_within_ms, [it.get("discovered") is True for it in items])

    async def put_listed(self, sitemap_url: str, urls: list[str], intervals: list[int],
                         dues: list[int | None], forwarded: bool = False, absent_only: bool = False) -> dict:
        """``put_targets`` for URLs listed by one sitemap, as columns (what a sitemap walk sends:
        no dict per URL to build, ship and read)."""
        return await self._put(urls, [sitemap_url] * len(urls), intervals, dues, forwarded, absent_only)

    async def _put(self, urls: list, sitemaps: list, intervals: list, dues: list,
                   forwarded: bool, absent_only: bool, deleted_within_ms: int = 0,
                   discovered: list[bool] | None = None) -> dict:
        written, held = 0, []
        marks = discovered if discovered is not None else [False] * len(urls)
        m = self.view.current  # routed under one membership; a receiver on a newer one refuses
        if len(m.names) > 1 and not forwarded:
            foreign: dict[str, list[int]] = {}
            mine = []
            for i, url in enumerate(urls):
                owner = m.owner(url)
                (mine.append(i) if owner == self.node else foreign.setdefault(owner, []).append(i))
            for owner, idx in foreign.items():
                items = [{"url": urls[i], "sitemapUrl": sitemaps[i], "renderInterval": intervals[i],
                          "nextRenderTime": dues[i], **({"discovered": True} if marks[i] else {})} for i in idx]
                try:
                    answer = await (await self.peers.of(owner)).put_targets(items, True, absent_only,
                                                                           deleted_within_ms, m.epoch)
                except StaleEpoch:  # our view lagged: refresh, then route these again (once more at most)
                    if not await self.moved_past(m.epoch):
                        raise
                    answer = await self._put([urls[i] for i in idx], [sitemaps[i] for i in idx],
                                             [intervals[i] for i in idx], [dues[i] for i in idx], False,
                                             absent_only, deleted_within_ms, [marks[i] for i in idx])
                written += answer["written"]
                held += answer.get("held", [])
            if foreign:
                urls, sitemaps, intervals, dues, marks = (_pick(col, mine)
                                                          for col in (urls, sitemaps, intervals, dues, marks))
        now = self.rows.clock.now_ms()
        rules = self.conf.rules
        routes: dict[str, Any] = {}  # found while building the rows: ranking them asks no router again
        # absent_only creates only new targets (no held row to look at); any other put may be a re-put
        registry, rows = rules.put_many(urls, sitemaps, intervals, dues, now=now, node=self.node, routes=routes,
                                        held=None if absent_only else self._due_of,
                                        discovered=marks if any(marks) else None)
        if not absent_only:
            await self.store.apply(registry)
        elif registry:
            live = await self.store.apply_absent(registry, deleted_within_ms)
            fresh = [i for i, payload in enumerate(live) if payload is None]
            if len(fresh) < len(urls):  # rows only for the targets just created (same now: same dues)
                held += [[urls[i], payload] for i, payload in enumerate(live) if payload is not None]
                urls, sitemaps, intervals, dues, marks = (_pick(col, fresh)
                                                          for col in (urls, sitemaps, intervals, dues, marks))
                routes = {}
                _, rows = rules.put_many(urls, sitemaps, intervals, dues, now=now, node=self.node, routes=routes)
        self.rows.write(rows, lambda key: routes[key] if key in routes else self.rows.route_of(key))
        self.rows.flow("added", len(urls))
        out: dict[str, Any] = {"written": written + len(urls)}
        if absent_only:
            out["held"] = held
        return out

    async def patch_targets(self, items: list[list]) -> dict:
        """Merge fields into existing targets ([url, changes] pairs); never touches schedule rows (the
        render clock). Each write is conditional on the target read: one deleted meanwhile (a
        redirect retired it, an operator deleted it) stays deleted, and one written meanwhile is
        read again and patched again (a sitemap walk patches what it saw seconds before). A patch that
        attributes a target to a sitemap confirms a discovered one (``Target.discovered`` cleared)."""
        patched = 0
        for _ in range(PATCH_TRIES):
            found = await self.store.get_targets([u for u, _ in items])
            registry: list[Any] = []
            expected: list[bytes | None] = []
            tried = []
            for (url, changes), data in zip(items, found):
                if data is not None:
                    confirmed = {"discovered": False} if changes.get("sitemap_url") else {}
                    registry.append([target_key(url),
                                     Target.decode(url, data).patched(**{**changes, **confirmed}).encode()])
                    expected.append(data)
                    tried.append([url, changes])
            written = await self.store.apply_if(registry, expected) if registry else []
            patched += sum(written)
            items = [item for item, ok in zip(tried, written) if not ok]
            if not items:
                break
        return {"patched": patched}

    async def delete_targets(self, urls: list[str]) -> dict:
        found = await self.store.get_targets(urls)
        registry: list[tuple[bytes, bytes | None]] = []
        pages: list[tuple[bytes, bytes | None]] = []
        keys = []
        for url in urls:
            registry.append((target_key(url), None))
            for key in self.conf.rules.all_keys(url):
                pages.append((key.encode(), None))
                keys.append(key)
        await self.store.apply(registry, pages, [[key, None, None] for key in keys])  # and their history
        self.rows.delete(keys)
        return {"deleted": sum(1 for d in found if d is not None)}

    async def suppress(self, url: str, reason: str | None, status: int | None) -> dict:
        """A redirect landed on ``url``, which had no target, and found it non-indexable: created
        suppressed (the reference's destination row). A target there by now (written since the plan
        read it) is left as it is: another URL's result never strikes, suppresses or deletes it."""
        rules = self.conf.rules
        s = rules.suppress(None, url, reason=reason, status_code=status, now=self.rows.clock.now_ms())
        assert s.target is not None  # a creating verdict never deletes
        [held] = await self.store.apply_absent([(target_key(url), s.target.encode())])
        if held is not None:
            return {"held": url}
        await self.store.apply([], [(k.encode(), None) for k in rules.all_keys(url)])
        self.rows.write(s.rows)
        return {"suppressed": url, "strikes": s.target.strikes}

    async def revalidate(self, urls: list[str]) -> dict:
        """Every device of each target due now (cadence left to config); cached pages expire now, by
        a freshness record each (the pages themselves are not rewritten)."""
        now = self.rows.clock.now_ms()
        rules = self.conf.rules
        found = await self.store.get_targets(urls)
        rows: list[ScheduleRow] = []
        pages: list[tuple[bytes, bytes | None]] = []
        for url, data in zip(urls, found):
            if data is None:
                continue
            target = Target.decode(url, data)
            rows += rules.revalidate(target, now)
            keys = rules.keys_of(url)
            for key, meta in zip(keys, await self.store.page_metas(keys)):
                if meta is not None:
                    touch = Touch(key, meta.headers.get("etag", ""), meta.last_cached, now)
                    pages.append((touch_key(key), touch.encode()))
        if pages:
            await self.store.apply([], pages)
        self.rows.write(rows)
        self.rows.on_due()
        return {"revalidating": len(rows), "examined": len(urls)}

    async def revalidate_prefix(self, prefix: str, within: int) -> dict:
        """Every target this node owns whose URL starts with ``prefix`` ("" = all) due within
        ``within`` ms, paced by key (``paced_due``); rows only, the pages stay served until their
        re-render (expiring them would rewrite and re-replicate every page). Never delays a row."""
        now = self.rows.clock.now_ms()
        rules = self.conf.rules
        start = TARGET + prefix.encode()
        cursor: bytes | None = None
        matched = written = 0
        while True:
            chunk = await self.store.scan(start, cursor, SCAN_CHUNK)
            rows: list[ScheduleRow] = []
            for k, payload in chunk:
                url = k[len(TARGET):].decode()
                if self.view.current.owner(url) != self.node:
                    continue
                try:
                    target = Target.decode(url, payload)
                except RecordError:
                    continue
                matched += 1
                rows += rules.revalidate_paced(target, now, within, self._due_of)
            self.rows.write(rows)
            written += len(rows)
            if len(chunk) < SCAN_CHUNK:
                break
            cursor = chunk[-1][0] + b"\x00"
            await asyncio.sleep(0)
        return {"node": self.node, "targets": matched, "revalidating": written}

    async def lastmod_due(self, urls: list[str], lastmods: list[int], within: int) -> dict:
        """A sitemap refresh listed these URLs with a ``lastmod`` (epoch ms) newer than its last walk:
        every device whose page was last cached before it is due within ``within`` ms
        (``Rules.lastmod_due``). Reads targets and page times, never page bodies. A URL this node does
        not own (the walk's membership view lagged) is left to its cadence. Answers how many URLs were
        made due."""
        now = self.rows.clock.now_ms()
        rules = self.conf.rules
        m = self.view.current
        mine = [(u, at) for u, at in zip(urls, lastmods) if m.owner(u) == self.node]
        found = await self.store.get_targets([u for u, _ in mine])
        keyed: list[tuple[int, Target, list[str]]] = []
        for (url, at), data in zip(mine, found):
            try:
                if data is not None:
                    keyed.append((at, Target.decode(url, data), rules.keys_of(url)))
            except RecordError:
                continue
        times = await self.store.page_times([k for *_, keys in keyed for k in keys]) if keyed else []
        rows: list[ScheduleRow] = []
        due = i = 0
        for at, target, keys in keyed:
            made = rules.lastmod_due(target, at, times[i:i + len(keys)], now, within, self._due_of)
            i += len(keys)
            due += bool(made)
            rows += made
        self.rows.write(rows)
        return {"due": due, "rows": len(rows)}

    def _due_of(self, key: str) -> int | None:
        row = self.rows.row(key)
        return row.next_render_time if row is not None else None

    async def revalidate_key(self, key: str) -> dict | None:
        """Admin: one key due now; None when the URL has no target (it would render once, then drop)."""
        rules = self.conf.rules
        url = rules.url_of(key)
        [data] = await self.store.get_targets([url])
        if data is None:
            return None
        row = rules.due_now(Target.decode(url, data), key, self.rows.clock.now_ms())
        self.rows.write([row])
        self.publish_now()  # one key: publish at once, so the answer can say whether consumers woke
        return {"cacheKey": key, "nextRenderTime": row.next_render_time, "scheduleOwnedBy": self.node,
                "wokeLocalConsumers": self.woke(), "node": self.node}

    async def render_now(self, key: str) -> int | None:
        """Render-now: the key due this minute (a one-off row when there is no target)."""
        rules = self.conf.rules
        url = rules.url_of(key)
        [data] = await self.store.get_targets([url])
        row = rules.due_now(Target.decode(url, data) if data else None, key, self.rows.clock.now_ms())
        self.rows.write([row])
        self.publish_now()
        return row.next_render_time

    async def apply_rows(self, rows: list[ScheduleRow], deletes: list[str]) -> None:
        """Schedule writes routed here by another node's keeper (this node owns the keys)."""
        self.rows.write(rows)
        self.rows.delete(deletes)


def _pick(col: list, idx: list[int]) -> list[Any]:
    return [col[i] for i in idx]
