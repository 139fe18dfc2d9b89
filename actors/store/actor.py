"""NodeStore: the one writer of this node's replicated stores (pages and registry).

Every value is stored in the replication envelope (hybrid-logical-clock version + node), deletes are
tombstones, so the same write can be applied on every node in any order with one outcome. Derived
indexes (targets by sitemap) are maintained here, on every write, local or replicated.

``NodeStore`` is a plain class composed of its parts, each handed what it uses: ``records`` (the writes
to the two RocksDBs, ``records.py``), ``members`` (the membership and placement, ``members.py``),
``shipping`` (outboxes and shipped marks, ``replication.py``), ``rebalancing`` (walks and pushes when
the membership changes, ``rebalance.py``), ``catch_up`` (pulls, and the answers to the peers',
``catchup.py``) and ``page_log`` (``page_log.py``). It routes between them: where a committed write
goes (``_written``, ``_received``) and what a new membership does (``_changed``). ``NodeStoreActor``
is the Ray shell.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import ray

from prerender_ray import logs, metrics, rpc
from prerender_ray.actors.client import MEMBERSHIP_DEADLINE_S, NodeActorClient
from prerender_ray.actors.common import Handles, bulk_gc, call, untraced
from prerender_ray.actors.store.catchup import CatchUp
from prerender_ray.actors.store.members import Members
from prerender_ray.actors.store.page_log import StorePageLog
from prerender_ray.actors.store.rebalance import Rebalancing
from prerender_ray.actors.store.records import BATCH_RECORDS, Op, Record, Records, Row
from prerender_ray.actors.store.replication import Shipping, peer_client
from prerender_ray.config.model import Config
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.membership import NOBODY, Membership
from prerender_ray.identity.nodes import Ownership
from prerender_ray.storage import history
from prerender_ray.storage.history import is_history_key
from prerender_ray.storage.keys import LIVE, TARGET
from prerender_ray.storage.pagelog.mirror import MirroredStore
from prerender_ray.storage.pages import PageDecodeError, PageMeta, decode_meta
from prerender_ray.storage.registry import SitemapReader, by_sitemap_prefix, sitemap_of_record
from prerender_ray.storage.replication import CLOCK_OFFSET_ENV, Clock, payload_of
from prerender_ray.storage.rocks import PAGES, REGISTRY, Store, pagelog_path, store_path
from prerender_ray.storage.touches import applicable, is_touch_key, touch_key, touched, touched_payload
from prerender_ray.tasks import Tasks
from prerender_ray.timeutil import SYSTEM_CLOCK
from prerender_ray.timeutil import Clock as WallClock

# Records one page listing reads per call, deleted ones included (about 2 us each): a prefix whose
# pages were retired keeps their tombstones, and must not hold the store's loop (the admin's wait is
# 3 s, but the store would go on reading after it gave up).
LISTING_SCAN = 20_000


class NodeStore:
    """The store, plain: ``NodeStoreActor`` below is what Ray places. ``membership``: the controller's
    at placement (``Membership.to_wire``; None: alone until the first push or check); ``fetch``: the
    controller's current membership, asked every few seconds (None: by push only); ``clock``: the
    time it reads; ``stores``: the peers' stores by name (Ray's named actors unless told); ``log``:
    its logger. The LocalNode harness and the simulated cluster pass their own."""

    def __init__(self, config: dict, node: str, data_dir: str, membership: dict | None = None,
                 fetch: Callable[[], Awaitable[Membership]] | None = None, clock: WallClock = SYSTEM_CLOCK,
                 stores: Any = None, log: Any = None):
        untraced(self)
        bulk_gc()
        cfg = Config.model_validate(config)
        if log is None:
            logs.setup(node, level=cfg.logging.level, json_lines=cfg.logging.json_lines, process="store")
        self.log = log if log is not None else logs.get("store")
        self.node = node
        self.cfg = cfg
        offset = int(os.environ.get(CLOCK_OFFSET_ENV) or 0)
        self.clock = Clock(node, lambda: clock.now_ms() + offset)
        if offset:
            self.log.warning("replication clock offset (a testing aid)", offset_ms=offset)
        self.pages = MirroredStore(store_path(data_dir, node, PAGES), direct_writes=True)
        self.registry = Store(store_path(data_dir, node, REGISTRY))
        self.started = clock.time()
        self._tasks = Tasks()  # every background task of its parts: ended before its files close
        self._closed = False
        self._sitemap_of = SitemapReader()
        self.log.info("store open", pages=str(self.pages.path), registry=str(self.registry.path),
                      pages_past_page_cache=self.pages.direct_writes)
        self.records = self._records(clock, self._index_ops)
        # Reconciled with the pages RocksDB before anything can write (or built from it in the
        # background when new); from here on every pages-store write goes to the page log first.
        self.page_log = StorePageLog(self.pages, pagelog_path(data_dir, node), self.log, self._recount_pages,
                                     count=lambda: self.records.live["pages"], records=self.records,
                                     refill=lambda keys: self.catch_up.refill(keys))
        self._compose(Membership.from_wire(membership) if membership is not None else None,
                      cfg.cluster.replicas, KeyFormat.from_config(cfg).url_of, fetch=fetch, wall=clock,
                      stores=stores)
        if fetch is not None:
            self._tasks.spawn(self.members.follow_membership())
        self._tasks.spawn(self.page_log.run())

    def _records(self, wall: WallClock, index_ops: Any) -> Records:
        """The records part, over ``self.registry`` and ``self.pages`` (first: the page log counts on it)."""
        return Records(self.node, self.clock, self.registry, self.pages, wall, index_ops,
                       on_local=self._written, on_remote=self._received)

    def _compose(self, membership: Membership | None, replicas: int, url_of_key: Any,
                 fetch: Callable[[], Awaitable[Membership]] | None, wall: WallClock, stores: Any) -> None:
        """The replication parts, each handed the parts it uses (see ``Members`` for the arguments);
        ``stores``: the peers' stores by name (``Handles``, Ray's, unless told)."""
        self.wall = wall
        self.stores = stores if stores is not None else Handles("store", wrap=peer_client)
        self.members = Members(self.node, membership, replicas, url_of_key, fetch, self.stores, self.log)
        self.rebalancing = Rebalancing(self.node, self.records, self.members, self.stores, wall, self.log,
                                       self._tasks)
        self.members.view.listen(self._changed)
        self.shipping = Shipping(self.records, self.members, self.stores, self.since, self.log, self._tasks)
        self.catch_up = CatchUp(self.node, self.clock, wall, self.records, self.members, self.shipping,
                                self.rebalancing, self.stores, self.apply_remote, self.log, self._tasks)
        self.shipping.start()
        self.catch_up.start()

    # ------------------------------------------------------------------------------------ writes

    def _index_ops(self, out: list[Op], key: bytes, old: bytes | None, new: bytes | None) -> None:
        """Keep the targets-by-sitemap index in step with a write of target ``key`` (``old`` is the
        record held, ``new`` the payload written): the ops go to ``out``."""
        before = sitemap_of_record(payload_of(old)) if old is not None else None
        after, prefix = self._sitemap_of(new)
        if before == after:
            return
        url = key[len(TARGET):]  # the same bytes by_sitemap_key would encode
        if before:
            out.append((by_sitemap_prefix(before) + url, None))
        if prefix is not None:
            out.append((prefix + url, b""))

    async def apply(self, registry: Sequence[Op] = (), pages: Sequence[Op] = (), history: Sequence[list] = ()) -> int:
        """Local writes (targets, control rows, pages, freshness records) with fresh versions; every
        peer gets the same records (see ``Shipping``). ``history``: render-history items
        ``[cache key, entry, report]`` (``storage/history.py``), written in the batch of ``pages``."""
        ops = [*self._untouch(pages), *self._history_ops(history)]
        for key, payload in ops:
            if payload is not None:
                kind = "freshness" if is_touch_key(key) else "history" if is_history_key(key) else "page"
                metrics.page_writes.labels(kind).inc()
                metrics.page_write_bytes.labels(kind).inc(len(payload))
        # Pages first: the page log may refuse them (a full disk), and then nothing is written.
        self.records.commit_local("pages", ops)
        written = self.records.commit_local("registry", registry)
        return written + len(pages)

    def _recount_pages(self) -> None:
        """A pages batch was refused after its live count was taken: back to the count on disk."""
        raw = self.pages.get(LIVE)
        if raw is not None and len(raw) == 8:
            self.records.live["pages"] = int.from_bytes(raw, "big")

    def _written(self, name: str, ops: Sequence[Op], records: list[bytes]) -> None:
        """This node's batch, committed (``records``: in ``ops``' order): queued for each peer that
        holds it; what this node does not hold is pushed on."""
        members, keys = self.members, [key for key, _ in ops]
        shipped = [[name, key, record] for key, record in zip(keys, records)]
        if members.view.epoch == NOBODY:
            self._alone(name, keys)
        if not members.placement.partial:
            for peer in members.peers:
                self.shipping.enqueue(peer, shipped)
            return
        plan = members.placement.split([*members.peers, self.node], name, keys)
        mine = plan.pop(self.node)
        for peer, held in plan.items():
            self.shipping.enqueue(peer, [shipped[i] for i in held])
        if len(mine) < len(ops):
            # A writer routed under an older membership than this store's (a keeper learns a change
            # on its own, later; a result of a grant made before it): records this node does not
            # hold, written after its walk may have passed them. Pushed on and dropped here, as a
            # stray received is; else they would stay here for good.
            here = set(mine)
            self.rebalancing.push_on(name, [(key, records[i]) for i, key in enumerate(keys) if i not in here])

    def _received(self, name: str, accepted: list[Row]) -> None:
        """A peer's records, accepted: noted for a joiner's second pass (``catchup.py``); what this
        node does not hold is pushed on."""
        self.catch_up.arrivals.accepted(min(r[2] for r in accepted))
        members = self.members
        if members.view.epoch == NOBODY:
            self._alone(name, [r[0] for r in accepted])
        if members.placement.partial:
            strays = [(r[0], r[1]) for r in accepted if not members.placement.holds(self.node, name, r[0])]
            if strays:
                self.rebalancing.push_on(name, strays)

    def _alone(self, name: str, keys: list[bytes]) -> None:
        """Records written while this store knows no membership: per-URL ones owe a walk (cluster-wide
        rows, a keeper's status at start, are held everywhere under any membership)."""
        if any(self.members.placement.url_of(name, key) is not None for key in keys):
            self.rebalancing.written_alone()

    def _changed(self, before: Membership, after: Membership) -> None:
        """All of it before any await: records ship to their new holders from now on, the peers'
        shippers follow the node list, and a walk moves what is held."""
        if self.node not in after.names:  # placed, or left: the controller stops this node; keep what it holds
            self.log.warning("the membership does not list this node", epoch=after.epoch, nodes=list(after.names))
            return
        placed, placed_epoch = self.members.place(after)
        peers = [n for n in after.names if n != self.node]
        self.shipping.follow(before.epoch == NOBODY, peers)
        self.members.peers = peers
        self.log.info("membership", epoch=after.epoch, nodes=list(after.names))
        self.rebalancing.rebalance_on(placed, self.members.placement, first=before.epoch == NOBODY,
                                      before_epoch=placed_epoch)
        if before.epoch == NOBODY and self.catch_up.synced.is_set():  # its catch-up ran alone: now there are peers
            self._tasks.spawn(self.catch_up.initial_catch_up())
        elif self.catch_up.synced.is_set():
            self.catch_up.pull_owed()  # a peer this store owes a pull from may be back

    # ---------------------------------------------------------------- what the peers and controller call

    async def apply_remote(self, records: list[Record], epoch: int | None = None,
                           membership: dict | None = None) -> int:
        """Records shipped by a peer (or pulled in a catch-up), sent under its membership ``epoch``
        (None: a local apply), which the call may carry: see ``Members.accept``."""
        if epoch is not None:
            await self.members.accept(epoch, "apply_remote", membership)
        by_db: dict[str, list[tuple[bytes, bytes]]] = {"registry": [], "pages": []}
        for name, key, record in records:
            by_db[name].append((key, record))
        return sum(self.records.commit_remote(n, items) for n, items in by_db.items() if items)

    async def holding(self, name: str, items: list[list], epoch: int | None = None,
                      membership: dict | None = None) -> list[bool]:
        return await self.catch_up.holding(name, items, epoch, membership)

    async def since(self, name: str, hlc: int, after: bytes | None, limit: int = BATCH_RECORDS,
                    holder: str | None = None, members: list[str] | None = None,
                    epoch: int | None = None, senders: list[str] | None = None,
                    instead_of: list[str] | None = None, arrived: Any = None,
                    unshipped_to: str | None = None, membership: dict | None = None) -> dict:
        return await self.catch_up.since(name, hlc, after, limit, holder, members, epoch, senders, instead_of,
                                         arrived, unshipped_to, membership)

    async def set_membership(self, wire: dict) -> dict:
        return await self.members.set_membership(wire)

    async def wait_synced(self, timeout: float) -> dict:
        return await self.catch_up.wait_synced(timeout)

    def replication_status(self) -> dict:
        return {"sync": self.catch_up.sync_report, "resyncing": sorted(self.shipping.resync_from),
                "pending": {p: len(b) for p, b in self.shipping.outbox.items()},
                "replicas": self.members.placement.replicas, "rebalance": self.rebalancing.rebalance_report}

    def _history_ops(self, items: Sequence[list]) -> list[Op]:
        if not items:
            return []
        keys = list(dict.fromkeys(item[0] for item in items))
        heads = self.pages.get_many([history.head_key(k) for k in keys])
        return history.plan_ops(items, {k: payload_of(v) for k, v in zip(keys, heads)})

    def _untouch(self, pages: Sequence[Op]) -> Sequence[Op]:
        """``pages`` and, in the same batch, the delete of each freshness record a page write or
        delete in it supersedes (readers ignore it anyway: it is older than the page)."""
        touches = {bytes(k) for k, _ in pages if is_touch_key(k)}
        stale = list(dict.fromkeys(touch_key(k) for k, _ in pages if not is_touch_key(k)))
        stale = [k for k in stale if k not in touches]
        if not stale:
            return pages
        held = self.pages.get_many(stale)
        return [*pages, *((k, None) for k, v in zip(stale, held) if payload_of(v) is not None)]

    async def apply_absent(self, registry: list[Op], deleted_within_ms: int = 0) -> list[bytes | None]:
        """Registry puts of keys that hold nothing live; per op, None when written, else the payload
        held (left as it is); ``deleted_within_ms``: see ``Records.commit_absent``."""
        return self.records.commit_absent("registry", registry, deleted_within_ms)

    async def apply_if(self, registry: list[Op], expected: list[bytes | None]) -> list[bool]:
        """Registry writes of keys that still hold ``expected``; per op, whether it was written
        (see ``Records.commit_if``)."""
        if len(expected) != len(registry):
            raise ValueError("one expected payload per op")
        return self.records.commit_if("registry", registry, expected)

    # ------------------------------------------------------------------------------------- reads

    async def get(self, keys: list[bytes]) -> list[bytes | None]:
        """Registry payloads (None when absent or deleted)."""
        return [payload_of(v) for v in self.registry.get_many(keys)]

    async def get_targets(self, urls: list[str]) -> list[bytes | None]:
        return [payload_of(v) for v in self.registry.get_many([TARGET + u.encode() for u in urls])]

    async def scan(self, prefix: bytes, start: bytes | None = None, limit: int = 1000) -> list[tuple[bytes, bytes]]:
        """Live registry records under ``prefix`` from ``start``, key order, at most ``limit``."""
        out = []
        for k, v in self.registry.items(prefix, start):
            payload = payload_of(v)
            if payload is not None:
                out.append((k, payload))
                if len(out) >= limit:
                    break
        return out

    async def urls_of_sitemap(self, sitemap_url: str, limit: int,
                              owned_under: list[str] | None = None) -> tuple[list[str], int]:
        """Target URLs attributed to a sitemap (up to ``limit``) and how many there are; with
        ``owned_under`` (a membership), only the URLs this node owns there (``actors/store/everywhere.py``)."""
        prefix = by_sitemap_prefix(sitemap_url)
        owner = Ownership(owned_under).owner if owned_under else None
        urls: list[str] = []
        n = 0
        for k in self.registry.keys(prefix):
            url = k[len(prefix):].decode()
            if owner is not None and owner(url) != self.node:
                continue
            n += 1
            if len(urls) < limit:
                urls.append(url)
        return urls, n

    def _read_pages(self, keys: list[bytes]) -> list[tuple[bytes | None, bytes | None]]:
        """(page record, freshness record) of each key, as stored, in one multi-get."""
        found = self.pages.get_many([*keys, *(touch_key(k) for k in keys)])
        return list(zip(found[:len(keys)], found[len(keys):]))

    async def get_pages(self, keys: list[str]) -> list[bytes | None]:
        """Page payloads, each with its freshness record applied (the times a bot is served by)."""
        return [touched_payload(page, touch) for page, touch in self._read_pages([k.encode() for k in keys])]

    async def stored_pages(self, keys: list[str]) -> list[list[bytes | None]]:
        """[page record, freshness record] of each key as stored (enveloped): what a node that does
        not hold the URL serves from (``api/bot/holders.py``)."""
        return [list(pair) for pair in self._read_pages([k.encode() for k in keys])]

    async def has_pages(self, keys: list[str]) -> list[bool]:
        return [payload_of(v) is not None for v in self.pages.get_many([k.encode() for k in keys])]

    async def targets_and_metas(self, urls: list[str], keys: list[str]) -> tuple[list, list]:
        """``get_targets`` and ``page_metas`` in one call: what a group of results is planned from."""
        return await self.get_targets(urls), await self.page_metas(keys)

    async def page_metas(self, keys: list[str]) -> list[PageMeta | None]:
        """The metadata of each page (freshness applied), without its body."""
        out: list[PageMeta | None] = []
        for page, touch in self._read_pages([k.encode() for k in keys]):
            payload = payload_of(page)
            try:
                meta = decode_meta(payload)[0] if payload is not None else None
            except PageDecodeError:
                meta = None
            out.append(touched(meta, applicable(meta, page, touch)) if meta is not None else None)
        return out

    async def page_times(self, keys: list[str]) -> list[int | None]:
        """When each page was last cached (a freshness record's time included), None without a
        readable page: an unchanged render moves it too, so a lastmod older than it is no change."""
        return [m.last_cached if m is not None else None for m in await self.page_metas(keys)]

    async def page_keys(self, prefix: str, start: str | None, limit: int) -> dict:
        """Up to ``limit`` live pages under ``prefix`` from ``start`` (key, payload), and the live
        page count of the same moment (``total``), so that a listing and its total agree. At most
        ``LISTING_SCAN`` records are read, deleted ones included: past that, fewer pages and
        ``resume``, the last key read, from which the listing goes on (a prefix of many deletes cannot
        hold the store in one call)."""
        found = []
        resume = None
        first = start.encode() if start else (prefix.encode() or b"\x01")  # past the internal families
        for read, (k, v) in enumerate(self.pages.items(prefix.encode(), first), 1):
            if payload_of(v) is not None:
                found.append((k, v))
                if len(found) >= limit:
                    break
            if read >= LISTING_SCAN:
                resume = k.decode()
                break
        touches = self.pages.get_many([touch_key(k) for k, _ in found])
        return {"pages": [(k.decode(), touched_payload(v, t) or b"") for (k, v), t in zip(found, touches)],
                "total": self.records.live["pages"], "resume": resume}

    async def render_history(self, key: str, screenshots: bool = False) -> dict:
        """``key``'s render history and diagnostics reports, newest first; a report's screenshot
        without its data unless ``screenshots``."""
        [head] = self.pages.get_many([history.head_key(key)])
        entries, reports = history.slots_of(key, payload_of(head), reports=True)
        found = [payload_of(v) for v in self.pages.get_many(entries + reports)] if entries or reports else []
        got = history.decoded(found[len(entries):])
        return {"renderHistory": history.decoded(found[:len(entries)]),
                "reports": got if screenshots else [history.summarized(r) for r in got]}

    async def counts(self) -> dict:
        """Exact: kept with every write (``Records.load_live_counts``)."""
        live = self.records.live
        return {"targets": live["registry"], "pages": live["pages"]}

    async def status(self) -> dict:
        live = self.records.live
        return {"live": True, "pid": os.getpid(), "pages": live["pages"], "targets": live["registry"],
                "replication": self.replication_status(), "pageLog": self.page_log.status()}

    async def close(self) -> None:
        """End the store's tasks, then close its files (a task still running would write to them); a
        second call does nothing."""
        if self._closed:
            return
        self._closed = True
        stuck = await self._tasks.close()
        if stuck:
            self.log.error("store tasks did not end when cancelled", tasks=[t.get_name() for t in stuck])
        self.shipping.close()
        self.page_log.close()
        for db in (self.pages, self.registry):
            db.flush()
            db.close()


NodeStoreActor = ray.remote(NodeStore)


class StoreClient(NodeActorClient):
    """Typed calls to a node's NodeStore, each under one deadline: the methods a caller uses are
    names tools can follow, not strings (``NodeStore`` above defines each)."""

    def __init__(self, handle: Any, deadline_s: float):
        self.handle = handle
        self.deadline_s = deadline_s

    async def apply(self, registry: Sequence[rpc.Op], pages: Sequence[rpc.Op] | None = None,
                    history: Sequence[list] | None = None) -> int:
        return await call(self.handle.apply.remote(registry, pages or [], history or []), self.deadline_s)

    async def apply_absent(self, registry: Sequence[rpc.Op], deleted_within_ms: int = 0) -> list[bytes | None]:
        return await call(self.handle.apply_absent.remote(registry, deleted_within_ms), self.deadline_s)

    async def apply_if(self, registry: Sequence[rpc.Op], expected: list[bytes | None]) -> list[bool]:
        return await call(self.handle.apply_if.remote(registry, expected), self.deadline_s)

    async def get(self, keys: list[bytes]) -> list[bytes | None]:
        return await call(self.handle.get.remote(keys), self.deadline_s)

    async def get_targets(self, urls: list[str]) -> list[bytes | None]:
        return await call(self.handle.get_targets.remote(urls), self.deadline_s)

    async def get_pages(self, keys: list[str]) -> list[bytes | None]:
        return await call(self.handle.get_pages.remote(keys), self.deadline_s)

    async def has_pages(self, keys: list[str]) -> list[bool]:
        return await call(self.handle.has_pages.remote(keys), self.deadline_s)

    async def page_metas(self, keys: list[str]) -> list[PageMeta | None]:
        return await call(self.handle.page_metas.remote(keys), self.deadline_s)

    async def targets_and_metas(self, urls: list[str], keys: list[str]) -> tuple[list, list]:
        return await call(self.handle.targets_and_metas.remote(urls, keys), self.deadline_s)

    async def page_times(self, keys: list[str]) -> list[int | None]:
        return await call(self.handle.page_times.remote(keys), self.deadline_s)

    async def render_history(self, key: str, screenshots: bool = False) -> dict:
        return await call(self.handle.render_history.remote(key, screenshots), self.deadline_s)

    async def scan(self, prefix: bytes, start: bytes | None = None, limit: int = 1000) -> list[tuple[bytes, bytes]]:
        return await call(self.handle.scan.remote(prefix, start, limit), self.deadline_s)

    async def wait_synced(self, timeout: float) -> dict:
        """Until the store caught up with its peers, or ``timeout``: this call's deadline follows it."""
        return await call(self.handle.wait_synced.remote(timeout), timeout + 10)

    async def urls_of_sitemap(self, sitemap_url: str, limit: int,
                              owned_under: list[str] | None = None) -> tuple[list[str], int]:
        return await call(self.handle.urls_of_sitemap.remote(sitemap_url, limit, owned_under), self.deadline_s)

    # ------------------------------------------------------------------------ the ingress's reads

    async def stored_pages(self, keys: list[str]) -> list[list[bytes | None]]:
        return await call(self.handle.stored_pages.remote(keys), self.deadline_s)

    async def page_keys(self, prefix: str, start: str | None, limit: int) -> dict:
        return await call(self.handle.page_keys.remote(prefix, start, limit), self.deadline_s)

    async def counts(self) -> dict:
        return await call(self.handle.counts.remote(), self.deadline_s)

    # ------------------------------------------------------------ one store asks another (replication)

    async def apply_remote(self, records: list[list], epoch: int | None = None,
                           membership: dict | None = None) -> int:
        """``StaleEpoch`` when the peer is on a newer membership than ``epoch`` (the sender's, whose
        wire ``membership`` may carry: a peer behind takes it)."""
        return await call(self.handle.apply_remote.remote(records, epoch, membership), self.deadline_s)

    async def holding(self, name: str, items: list[list], epoch: int | None = None,
                      membership: dict | None = None) -> list[bool]:
        """Per [key, hlc, writer]: whether the peer holds that version or a newer one (``CatchUp.holding``)."""
        return await call(self.handle.holding.remote(name, items, epoch, membership), self.deadline_s)

    async def since(self, name: str, hlc: int, after: bytes | None, limit: int,
                    holder: str | None = None, members: list[str] | None = None, epoch: int | None = None,
                    senders: list[str] | None = None, instead_of: list[str] | None = None,
                    arrived: Any = None, unshipped_to: str | None = None, membership: dict | None = None) -> dict:
        """A page of records (``NodeStore.since``; ``senders``: one sender per record of a share;
        ``unshipped_to``: the peer's own writes that may not have reached that node; ``membership``:
        the wire of ``epoch``'s, which a peer behind takes)."""
        return await call(self.handle.since.remote(name, hlc, after, limit, holder, members, epoch, senders,
                                                   instead_of, arrived, unshipped_to, membership), self.deadline_s)

    # ------------------------------------------------------------------------ the controller's

    async def set_membership(self, wire: dict) -> dict:
        """The controller's push (``Membership.to_wire()``): adopted only when its epoch is newer."""
        return await call(self.handle.set_membership.remote(wire), MEMBERSHIP_DEADLINE_S)
