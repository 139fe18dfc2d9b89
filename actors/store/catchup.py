"""A node's catch-up of its share from its peers, one sender per record (docs/architecture.md#replication).

A node that joins (or comes back under another membership) holds a share of the per-URL records;
every record of it is held by up to R peers. It asks every peer at once for what it holds, and each
peer sends only the records it is the designated sender of (``storage/placement.share_sender``), so
each record travels once. A peer that does not answer, or that is catching up itself (it may lack
records it is designated for), is replaced: the others send the records it was designated for, each
by the next holder in rank order; a peer that did not answer is also asked again later, for
everything of the share it holds (``CatchUp._catch_up_later``).

Then a second pass asks each peer only for what reached it since the first began: a peer keeps the
lowest version it accepted between the marks it gives out (``Arrivals``), and sends from there. Records that arrive at a
peer while its scan runs may be versioned behind the scan's position; before, the second pass went
back a fixed 10 minutes, which re-sent the whole share of a cluster loaded just before the join.

With every node holding everything, one peer is pulled if it says it has caught up itself, else the
next too: it may lack what only another holds (``CatchUp._pull_full``). Between its two passes each
other peer sends what it wrote itself that may not have reached that one yet, however old
(``unshipped_to``): a writer ships only to the members it knew when it wrote, so nobody else would
send this node those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prerender_ray.actors.store.members import Members
from prerender_ray.actors.store.pulls import Arrivals, Owed, Pulled
from prerender_ray.actors.store.records import BATCH_BYTES, BATCH_RECORDS, DBS, HLC, Record, Records
from prerender_ray.identity.membership import NOBODY, StaleEpoch
from prerender_ray.storage.keys import FRESHNESS, VIDX
from prerender_ray.storage.placement import NEVER, Placement, share_sender
from prerender_ray.storage.replication import Clock, Version, is_stub, writer_bytes
from prerender_ray.tasks import Tasks
from prerender_ray.timeutil import Clock as WallClock

if TYPE_CHECKING:
    from prerender_ray.actors.store.actor import StoreClient
    from prerender_ray.actors.store.rebalance import Rebalancing
    from prerender_ray.actors.store.replication import Shipping

CATCH_UP_MARGIN_MS = 10 * 60_000  # records this much older than the newest held are pulled again
SCAN_BUDGET = 20_000  # index entries one ``since`` call reads at most (a filtered scan may skip many)
HOLDING_MAX = 2_000  # versions one ``holding`` call asks about at most
REFILL_BATCH = 200  # pages asked of a holder in one call to refill (a page record: tens of KB)


async def pull_share(store: CatchUp, since: int, margin: int) -> tuple[Pulled, list[str], list[str]]:
    """The share of ``store`` from every peer, one sender per record (see the module): what came,
    the peers that answered every pass, and those that did not (asked again later by the caller).
    ``margin`` (an HLC span): a peer that lost our mark sends the second pass from this long before
    the first began."""
    peers = sorted(store.members.peers)
    began = store.clock.now().hlc
    done: dict[str, Pulled] = {}
    failed: list[str] = []

    async def each(asked: list[str], start: int, second: bool = False, **kw: Any) -> dict[str, Pulled]:
        """One pull from each of ``asked`` at once (``second``: from its arrivals mark); those that fail
        go to ``failed`` and out of ``done``."""
        got = await asyncio.gather(*(store._pull(p, start, True, arrived=done[p].mark if second else None, **kw)
                                     for p in asked), return_exceptions=True)
        out = {}
        for peer, res in zip(asked, got):
            if isinstance(res, Pulled):
                out[peer] = res
                continue
            if not isinstance(res, Exception):
                raise res  # cancelled: the store is closing
            failed.append(peer)
            done.pop(peer, None)
            if isinstance(res, StaleEpoch):  # asked again later, under the membership it is on
                await store.members.refused(peer, res)
            else:
                store.log.warning("catch-up from a peer failed", peer=peer, error=repr(res)[:300])
        return out

    done.update(await each(peers, since, senders=peers))
    sure = [p for p in peers if p in done and done[p].complete]
    missing = [p for p in peers if p not in sure]
    if missing and done:
        # what the missing ones were designated for, from the others (everything, when none is sure)
        asked = sure or list(done)
        for peer, res in (await each(asked, since, senders=sure or None,
                                     instead_of=missing if sure else None)).items():
            done[peer].add(res)
    asked = [p for p in (sure or peers) if p in done]
    for peer, res in (await each(asked, max(0, began - margin), True, senders=sure or None)).items():
        done[peer].add(res)
    total = Pulled()
    for each_peer in done.values():
        total.add(each_peer)
    return total, [p for p in peers if p in done], sorted(set(failed))


class CatchUp:
    """What this store pulls from its peers, and what it answers to theirs: its catch-up at start and
    at its first membership, the pulls it owes (``Owed``), and the ``since`` and ``holding`` answers.
    ``clock``: this node's versions; ``wall``: the time it reads; ``records``, ``members``,
    ``shipping``, ``rebalancing``: the store's other parts; ``stores``: the peers' stores by name;
    ``apply(records)``: what a pull brings is applied as a peer's push is (``NodeStore.apply_remote``);
    ``tasks``: the store's, which start its pulls (ended when it closes)."""

    def __init__(self, node: str, clock: Clock, wall: WallClock, records: Records, members: Members,
                 shipping: Shipping, rebalancing: Rebalancing, stores: Any,
                 apply: Callable[[list[Record]], Awaitable[int]], log: Any, tasks: Tasks):
        self.node = node
        self.clock = clock
        self.wall = wall
        self.records = records
        self.members = members
        self.shipping = shipping
        self.rebalancing = rebalancing
        self.stores = stores
        self.apply = apply
        self.log = log
        self.tasks = tasks
        self.synced = asyncio.Event()
        self.sync_report: dict[str, Any] = {"state": "pending"}
        self.arrivals = Arrivals(wall.monotonic())
        self.owed = Owed(records.registry)  # the pulls this store owes, on disk (see ``Owed``)
        self._owed_tasks: dict[str, asyncio.Task] = {}  # "": the one of every node holding everything

    def start(self) -> None:
        self.tasks.spawn(self.initial_catch_up())

    async def _peer_store(self, peer: str) -> StoreClient:
        client: StoreClient = await self.stores.get(peer)
        return client

    async def refill(self, keys: list[bytes]) -> int:
        """Pages this node dropped with a lost page log, asked again of the URLs' other holders, peer
        after peer while some are missing (each call with its deadline), and applied as their records
        (last writer wins, their freshness records too). A single node has no one to ask: its pages
        come back with their next render. Returns how many records were applied."""
        missing = dict.fromkeys(keys)
        applied = 0
        for peer in list(self.members.peers):
            ask = [k for k in missing if self.members.placement.holds(peer, "pages", k)]
            for i in range(0, len(ask), REFILL_BATCH):
                chunk = ask[i:i + REFILL_BATCH]
                try:
                    pairs = await (await self._peer_store(peer)).stored_pages([k.decode() for k in chunk])
                except Exception as e:
                    self.log.warning("pages not refilled from a holder", peer=peer, error=repr(e)[:300])
                    break
                items = []
                for key, (page, touch) in zip(chunk, pairs):
                    if page is None or is_stub(page):
                        continue
                    items.append((key, page))
                    if touch is not None:
                        items.append((FRESHNESS + key, touch))
                    missing.pop(key, None)
                applied += self.records.commit_remote("pages", items) if items else 0
            if not missing:
                break
        self.log.info("pages refilled from their holders", asked=len(keys), applied=applied, missing=len(missing))
        return applied

    # ----------------------------------------------------------------------------------- pulling

    async def initial_catch_up(self) -> None:
        """Before the keeper loads: pull what peers hold that this node missed while away (all of it
        for a new node, and all of its share for one back under another membership: it may hold URLs
        it never had). Holding a share, from every peer at once, each record from one of them
        (``pull_share``); else from one peer that had caught up itself (``_pull_full``). Two passes, the second for what reached the peer
        during the first. A peer that does not answer is asked again in the background until it does
        (or leaves): the others push only to holders that were members before them, so nobody else
        would send what it holds."""
        members = self.members
        if members.view.epoch == NOBODY:
            await members.refresh()  # placed alone: the peers to pull from are the controller's
        t0 = self.wall.monotonic()
        newest = self.records.newest_hlc()
        since = max(0, newest - (CATCH_UP_MARGIN_MS << 16)) if newest and not self.rebalancing.share_moved else 0
        self.owed.add(list(members.peers), since)  # paid below by each peer that answers
        got = Pulled()
        partial = members.placement.partial
        if partial:
            got, sources, failed = await pull_share(self, since, CATCH_UP_MARGIN_MS << 16)
            self.owed.paid(sources, since)
        else:
            got.accepted, sources = await self._pull_full()
            failed = sorted(self._owed_members())  # asked again below (``pull_owed``)
        self.sync_report = {"state": "synced", "from": sources[0] if sources else None, "records": got.accepted,
                            "since": since, "ms": round((self.wall.monotonic() - t0) * 1000),
                            "peers": list(members.peers), "sources": sources, "retrying": failed}
        if partial:
            self.sync_report["received"] = got.received  # sent by the peers (duplicates of a record included)
        if members.peers and not sources:
            self.sync_report["state"] = "no-peer-answered"
        self.log.info("replica catch-up", **self.sync_report)
        self.synced.set()
        self.pull_owed()  # the peers that failed, and any owed from before a restart

    def _owed_members(self) -> dict[str, int]:
        """The members this store owes a pull, each from a version (``Owed``)."""
        return {p: v for p, v in self.owed.load().items() if p in self.members.peers}

    def caught_up(self) -> bool:
        """Whether this store holds what its peers held when it started (what a pull from it may be
        taken for): its catch-up is over and it owes no member a pull (the first node of a cluster
        owes none; one whose catch-up had no answer, or, with every node holding everything, only a
        peer's that had not caught up itself, owes the others). The debts on disk decide, not the
        peers this process's catch-up left to retry: a debt outlives its peer leaving and counts
        again when a membership lists it again. Before, a store holding a share went by the latter:
        one that owed a pull to a node dropped and back told a joiner it had caught up, was asked
        for the records that node was designated for, and got them only later, from its own pull,
        with no walk to bring them to the joiner (simulation seed 9073)."""
        return self.synced.is_set() and not self._owed_members()

    async def _pull_full(self) -> tuple[int, list[str]]:
        """Every node holds everything: a pull from each member this store owes one, in name order,
        until one that had caught up itself answers (it holds what the others held, but for their
        writes that have not reached it yet, which each sends: ``_pull_twice``; nothing is copied
        twice) or none is owed. One that had not (cut off through its own catch-up, or still in it)
        pays only its own debt: what it lacks, another may hold. Records accepted, and the peers that
        answered; a peer that failed is still owed."""
        accepted, sources = 0, []
        for peer in sorted(self.members.peers):
            owed = self._owed_members()
            if not owed:
                break
            if peer not in owed:
                continue
            since = min(owed.values())  # a pull that pays every debt covers the oldest
            try:
                got, paid = await self._pull_twice(peer, since, False, [p for p in owed if p != peer])
            except Exception as e:
                if isinstance(e, StaleEpoch):  # asked again later, under the membership it is on
                    await self.members.refused(peer, e)
                else:
                    self.log.warning("catch-up from a peer failed; trying the next", peer=peer, error=repr(e)[:300])
                continue
            accepted += got.accepted
            sources.append(peer)
            self.owed.paid(paid, since)
        return accepted, sources

    def pull_owed(self) -> None:
        """A pull, retried until it answers, from each member this store owes one (``Owed``); one
        whose peer is not a member waits on disk for a membership that lists it again. With every
        node holding everything, one task asks the members owed in turn (``_pull_full``)."""
        if not self.members.placement.partial:
            task = self._owed_tasks.get("")
            if self._owed_members() and (task is None or task.done()):
                self._owed_tasks[""] = self.tasks.spawn(self._catch_up_later(None, 0))
            return
        for peer, since in self.owed.load().items():
            task = self._owed_tasks.get(peer)
            if peer in self.members.peers and (task is None or task.done()):
                self._owed_tasks[peer] = self.tasks.spawn(self._catch_up_later(peer, since))

    async def _pull_twice(self, peer: str, since: int, share: bool,
                          writers: list[str] | None = None) -> tuple[Pulled, list[str]]:
        """Everything ``peer`` holds since ``since`` (with ``share``: of this node's share), then what
        reached it during that pull (from the margin before it began, if the peer lost our mark);
        complete only if the peer had caught up itself through both. What came, and the debts it
        pays: ``peer``'s and, complete, those of the ``writers`` (every node holding everything, the
        other members owed) that answered, between the passes, for their own writes that may not have
        reached ``peer`` (``since``'s ``unshipped_to``), however old: a write held up for longer than
        the margin is not in what this store held before. Between: what reached ``peer`` before a
        writer answered is in ``peer``'s first pass or in its arrivals, the second."""
        began = self.clock.now().hlc
        first = await self._pull(peer, since, share)
        paid = [peer]
        if first.complete and writers:
            got = await asyncio.gather(*(self._pull(w, 0, unshipped_to=peer) for w in writers),
                                       return_exceptions=True)
            for writer, res in zip(writers, got):
                if isinstance(res, Pulled):
                    first.add(res)
                    paid.append(writer)
                elif not isinstance(res, Exception):
                    raise res  # cancelled: the store is closing
                elif isinstance(res, StaleEpoch):  # still owed: asked again under its membership
                    await self.members.refused(writer, res)
        second = await self._pull(peer, max(0, began - (CATCH_UP_MARGIN_MS << 16)), share, arrived=first.mark)
        first.add(second)
        first.complete = first.complete and second.complete
        return first, paid if first.complete else [peer]

    async def _catch_up_later(self, peer: str | None, since: int) -> None:
        """The catch-up from ``peer`` that failed, retried with backoff until it answers or leaves the
        membership; a debt to ``peer`` stays on disk until paid (``Owed``). None: every node holds
        everything, and the members owed are asked in turn (``_pull_full``) until none is."""
        backoff = 1.0
        members = self.members
        while True:
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            if peer is None:
                if members.placement.partial:
                    self.pull_owed()  # per peer from now on
                    return
                n, sources = await self._pull_full()
                self.sync_report["retrying"] = sorted(self._owed_members())
                if sources:
                    self.log.info("replica catch-up from peers that had not answered", peers=sources, records=n)
                if not self.sync_report["retrying"]:
                    return
                continue
            if peer not in members.peers or peer not in self.owed.load():
                return  # the debt stays on disk for a membership that lists the peer again (or was paid)
            partial = members.placement.partial
            try:
                got, paid = await self._pull_twice(peer, since, partial, None if partial else [
                    p for p in self._owed_members() if p != peer])
            except StaleEpoch as e:
                await members.refused(peer, e)
                continue
            except Exception as e:
                self.log.info("catch-up from a peer failed again; retrying", peer=peer, error=type(e).__name__,
                              retry_s=backoff)
                continue
            self.log.info("replica catch-up from a peer that had not answered", peer=peer, records=got.accepted)
            self.owed.paid(paid, since)
            if self.sync_report.get("retrying"):
                self.sync_report["retrying"] = [x for x in self.sync_report["retrying"] if x != peer]
            return

    async def _pull(self, peer: str, since: int, share: bool = False, senders: list[str] | None = None,
                    instead_of: list[str] | None = None, arrived: Any = None,
                    unshipped_to: str | None = None) -> Pulled:
        """What ``peer`` holds since ``since``; with ``share``, only what this node holds (and with
        ``senders``, only what ``peer`` is the designated sender of; with ``unshipped_to``, only its
        own writes that may not have reached that peer: see ``since``)."""
        target = await self._peer_store(peer)
        got = Pulled()
        epoch = self.members.view.epoch
        wire = self.members.wire_of(epoch)
        members = list(self.members.placement.ownership.names) if share else None
        for name in DBS:
            after = None
            while True:
                page = await target.since(name, since, after, BATCH_RECORDS, self.node if share else None, members,
                                          epoch, senders, instead_of, arrived, unshipped_to, wire)
                if unshipped_to is None and page.get("owes"):
                    self._inherit(page["owes"])
                got.page(page, await self.apply(page["records"]))
                after = page["next"]
                if after is None:
                    break
        return got

    def _inherit(self, owes: Any) -> None:
        """The peer pulled owes these nodes a pull (``Owed``): we owe those outside our membership
        too. What the peer lacks of theirs we lack (our copy is its), no member can send it, and once
        they are back no walk does (we hold it already as they see it). A debt to a member leaves the
        peer not caught up instead (``caught_up``): its records are asked of the others. Before, a
        node that copied everything from a peer owing a pull to a node dropped while cut off never
        got what only that node held: back, it sent it to the peer alone (simulation seed 2074)."""
        if not isinstance(owes, dict):
            return
        names = self.members.view.current.names
        for peer, since in owes.items():
            if isinstance(peer, str) and isinstance(since, int) and since >= 0 and peer != self.node \
                    and peer not in names:
                self.owed.add([peer], since)

    async def wait_synced(self, timeout: float) -> dict:
        try:
            await asyncio.wait_for(self.synced.wait(), timeout)
        except asyncio.TimeoutError:
            return {"state": "timeout", **self.sync_report}
        return self.sync_report

    # ------------------------------------------------------------------------- answering the peers

    async def holding(self, name: str, items: list[list], epoch: int | None = None,
                      membership: dict | None = None) -> list[bool]:
        """Per [key, hlc, writer]: whether this store holds that version of the record or one that wins
        over it. A walk asks before it pushes (``Rebalancing._push``): a holder that has a record is
        not sent its bytes again (a joiner pulled its share already). Asked under the caller's
        membership ``epoch`` (see ``Members.accept``): the answer lets the caller drop its copy."""
        if epoch is not None:
            await self.members.accept(epoch, "holding", membership)
        if name not in DBS or not isinstance(items, list) or len(items) > HOLDING_MAX:
            raise ValueError(f"holding: a db name and at most {HOLDING_MAX} versions")
        asked: list[tuple[bytes, Version]] = []
        for item in items:
            if not (isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[0], bytes)
                    and isinstance(item[1], int) and isinstance(item[2], str)):
                raise ValueError("holding: each item is [key, hlc, writer]")
            asked.append((item[0], Version(item[1], item[2])))
        db = self.records.db(name)
        olds, helds, _ = self.records.held(db, name, [key for key, _ in asked])
        out: list[bool] = []
        tied = []  # a tie of clocks (what the walk asks about is mostly held): the writer decides
        for i, ((_, want), held) in enumerate(zip(asked, helds)):
            if held is not None and HLC.unpack(held)[0] == want.hlc:
                tied.append(i)
            out.append(held is not None and HLC.unpack(held)[0] > want.hlc)
        mine = self.records.versions(db, name, [asked[i][0] for i in tied], [olds[i] for i in tied])
        for i, v in zip(tied, mine):
            out[i] = v is not None and not asked[i][1].newer_than(v)
        return out

    async def since(self, name: str, hlc: int, after: bytes | None, limit: int = BATCH_RECORDS,
                    holder: str | None = None, members: list[str] | None = None,
                    epoch: int | None = None, senders: list[str] | None = None,
                    instead_of: list[str] | None = None, arrived: Any = None,
                    unshipped_to: str | None = None, membership: dict | None = None) -> dict:
        """Records of one store with a version at or after ``hlc``, in version order, from the index
        position ``after`` (exclusive); answers ``{records, next}`` within a byte budget. With
        ``holder``: only the records that node holds under ``members`` (default: this node's view),
        the caller's membership of ``epoch`` (see ``Members.accept``); with ``senders`` too (the peers
        the holder asks), only those this node is the designated sender of (``share_sender``).
        ``arrived``: a mark of this store's (``arrivals`` in an earlier answer): from the lowest
        version accepted since, not ``hlc``. ``unshipped_to`` (a peer): only this node's own writes
        that may not have reached that peer yet (``Shipping.unshipped_from``; mostly none, a short
        scan). Each answer says whether this store has caught up itself (``synced``: it may lack
        records it is designated for), and the pulls it owes (``owes``: see ``_inherit``)."""
        if unshipped_to is not None and not isinstance(unshipped_to, str):
            raise ValueError("since: unshipped_to is a node name")
        if epoch is not None:
            await self.members.accept(epoch, "since", membership)
        answer = {"synced": self.caught_up(), "arrivals": self.arrivals.mark()}
        owes = self.owed.load()
        if owes:  # passed on to the caller (``_inherit``)
            answer["owes"] = owes
        own = None
        if unshipped_to is not None:
            own = self.node.encode()
            hlc = max(hlc, self.shipping.unshipped_from(unshipped_to))
            if hlc >= NEVER and after is None:  # every write of ours has reached it
                return {"records": [], "next": None, **answer}
        if arrived is not None and after is None:
            low = self.arrivals.lowest_since(arrived)
            if low == NEVER:  # nothing reached this store since
                return {"records": [], "next": None, **answer}
            if low is not None:
                hlc = low
        db = self.records.db(name)
        start = after + b"\x00" if after else VIDX + HLC.pack(hlc)
        out: list[Record] = []
        size = 0
        nxt = None
        placement = self.members.placement if members is None else self.members.placement.under(members)
        keep = self._since_filter(name, placement, holder, senders, instead_of)
        scanned = 0
        for ikey, _ in db.items(VIDX, start):
            if scanned >= SCAN_BUDGET and nxt is not None:  # the next call goes on after ``nxt``
                return {"records": out, "next": nxt, **answer}
            scanned += 1
            key = ikey[len(VIDX) + HLC.size:]
            nxt = ikey
            if keep is not None and not keep(key, ikey):
                continue
            record = db.get(key)
            if record is None or (own is not None and writer_bytes(record) != own):
                continue
            out.append([name, key, record])
            size += len(record) + len(key)
            if len(out) >= limit or size >= BATCH_BYTES:
                return {"records": out, "next": nxt, **answer}
        return {"records": out, "next": None, **answer}

    def _since_filter(self, name: str, placement: Placement, holder: str | None, senders: list[str] | None,
                      instead_of: list[str] | None) -> Callable[[bytes, bytes], bool] | None:
        """keep(key, index key) of a ``since`` scan (None: everything)."""
        if holder is None or not placement.partial:
            return None
        if senders is None:
            return lambda key, _: placement.holds(holder, name, key)
        members = set(placement.ownership.names)
        senders = [p for p in senders if isinstance(p, str) and p in members]
        instead_of = [p for p in instead_of or () if isinstance(p, str) and p in members]
        unshipped = {p: self.shipping.unshipped_from(p) for p in senders if p != self.node}
        sends = share_sender(placement, self.rebalancing.walk_from, holder, self.node, senders, instead_of,
                             unshipped)
        at = len(VIDX)
        return lambda key, ikey: sends(name, key, HLC.unpack_from(ikey, at)[0])
