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
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prerender_ray.actors.store.members import Members
from prerender_ray.actors.store.records import BATCH_BYTES, BATCH_RECORDS, DBS, HLC, Record, Records
from prerender_ray.identity.membership import NOBODY, StaleEpoch
from prerender_ray.storage.keys import PULL_OWED, VIDX
from prerender_ray.storage.placement import NEVER, Placement, share_sender
from prerender_ray.storage.replication import Clock, Version, version_of
from prerender_ray.timeutil import Clock as WallClock

if TYPE_CHECKING:
    from prerender_ray.actors.store.actor import StoreClient
    from prerender_ray.actors.store.rebalance import Rebalancing
    from prerender_ray.actors.store.replication import Shipping

CATCH_UP_MARGIN_MS = 10 * 60_000  # records this much older than the newest held are pulled again
SCAN_BUDGET = 20_000  # index entries one ``since`` call reads at most (a filtered scan may skip many)
HOLDING_MAX = 2_000  # versions one ``holding`` call asks about at most
ARRIVALS_KEPT = 20_000  # spans between marks remembered; an older mark falls back to the margin
_BIRTHS = itertools.count()  # tells apart two stores of one process (the simulation, the tests)


class Arrivals:
    """The lowest version a store accepted from its peers between one mark it gave out and the next:
    "what reached it since" a mark, for a second pass that sends only that."""

    def __init__(self, now: float):
        self.born = [now, next(_BIRTHS)]  # a mark of another process (the store restarted) is not ours
        self.spans: deque[list[int]] = deque()  # [index, lowest version accepted in it]
        self.next = 0  # the index of the next span
        self.sealed = True  # a mark was given since the last span opened: arrivals open a new one
        self.kept_from = 0

    def accepted(self, low: int) -> None:
        if self.spans and not self.sealed:
            self.spans[-1][1] = min(self.spans[-1][1], low)
            return
        if len(self.spans) >= ARRIVALS_KEPT:
            self.kept_from = self.spans.popleft()[0] + 1
        self.spans.append([self.next, low])
        self.next += 1
        self.sealed = False

    def mark(self) -> list:
        self.sealed = True
        return [*self.born, self.next]

    def lowest_since(self, mark: Any) -> int | None:
        """The lowest version accepted since ``mark`` was given (``NEVER``: nothing arrived); None when
        the mark is not one of this store's, or older than what it remembers."""
        if not (isinstance(mark, list) and len(mark) == 3 and mark[:2] == self.born and isinstance(mark[2], int)
                and self.kept_from <= mark[2] <= self.next):
            return None
        return min((low for index, low in self.spans if index >= mark[2]), default=NEVER)


OWED_KEPT = 64  # peers a store keeps owing a pull from (the oldest debts beyond are forgotten)


class Owed:
    """The peers a store still owes a pull of its share from, each from a version, kept on disk.

    A peer that lists this store in a membership counts its share as delivered (it records its
    records as placed under that membership and its walks push this store nothing of it): the pull
    is the only way those records arrive. So the debt outlives a failed pull, the peer leaving the
    membership and this store's restarts, and is paid only when that peer answered a pull (or, with
    every node holding everything, any one peer did). Before, it lived in a retry task that gave up
    when the peer left the membership or the store died: a joiner cut off during its catch-up never
    pulled what the peer alone held, and the peer, back later, took it for delivered (simulation
    seeds 5000 and 6057)."""

    def __init__(self, db: Any):
        self.db = db

    def load(self) -> dict[str, int]:
        raw = self.db.get(PULL_OWED)
        try:
            doc = json.loads(raw) if raw is not None else {}
        except ValueError:
            return {}
        if not isinstance(doc, dict):
            return {}
        return {p: v for p, v in doc.items() if isinstance(p, str) and isinstance(v, int) and v >= 0}

    def add(self, peers: list[str], since: int) -> None:
        owed = self.load()
        for peer in peers:
            owed[peer] = min(since, owed.get(peer, since))
        self._save(dict(list(owed.items())[-OWED_KEPT:]))

    def paid(self, peers: list[str], since: int) -> None:
        """A pull from ``since`` pays the debts from that version on (not an older one)."""
        owed = self.load()
        left = {p: v for p, v in owed.items() if not (p in peers and v >= since)}
        if left != owed:
            self._save(left)

    def _save(self, owed: dict[str, int]) -> None:
        if owed:
            self.db.put(PULL_OWED, json.dumps(owed).encode())
        else:
            self.db.delete(PULL_OWED)


@dataclass
class Pulled:
    """What one pull from a peer brought: records accepted and received, the peer's arrivals mark
    at its start, and whether the peer had caught up itself (on every page)."""

    accepted: int = 0
    received: int = 0
    mark: Any = None
    complete: bool = True

    def page(self, answer: dict, accepted: int) -> None:
        self.accepted += accepted
        self.received += len(answer["records"])
        if self.mark is None:
            self.mark = answer.get("arrivals")
        self.complete = self.complete and bool(answer.get("synced", True))

    def add(self, other: Pulled) -> None:
        self.accepted += other.accepted
        self.received += other.received


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
    ``tasks``: the store's, cancelled when it closes."""

    def __init__(self, node: str, clock: Clock, wall: WallClock, records: Records, members: Members,
                 shipping: Shipping, rebalancing: Rebalancing, stores: Any,
                 apply: Callable[[list[Record]], Awaitable[int]], log: Any, tasks: list[asyncio.Task]):
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
        self._owed_tasks: dict[str, asyncio.Task] = {}

    def start(self) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(self.initial_catch_up()))

    async def _peer_store(self, peer: str) -> StoreClient:
        client: StoreClient = await self.stores.get(peer)
        return client

    # ----------------------------------------------------------------------------------- pulling

    async def initial_catch_up(self) -> None:
        """Before the keeper loads: pull what peers hold that this node missed while away (all of it
        for a new node, and all of its share for one back under another membership: it may hold URLs
        it never had). Holding a share, from every peer at once, each record from one of them
        (``pull_share``); else from one peer. Two passes, the second for what reached the peer
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
        sources: list[str] = []
        failed: list[str] = []
        partial = members.placement.partial
        if partial:
            got, sources, failed = await pull_share(self, since, CATCH_UP_MARGIN_MS << 16)
        for peer in [] if partial else sorted(members.peers):
            try:
                got.accepted += await self._pull_twice(peer, since, False)
                sources.append(peer)
                break  # every peer holds everything: one is enough
            except Exception as e:
                failed.append(peer)
                if isinstance(e, StaleEpoch):  # asked again later, under the membership it is on
                    await members.refused(peer, e)
                else:
                    self.log.warning("catch-up from a peer failed; trying the next", peer=peer, error=repr(e)[:300])
        self.sync_report = {"state": "synced", "from": sources[0] if sources else None, "records": got.accepted,
                            "since": since, "ms": round((self.wall.monotonic() - t0) * 1000),
                            "peers": list(members.peers)}
        if partial:
            self.sync_report["received"] = got.received  # sent by the peers (duplicates of a record included)
            self.sync_report["sources"] = sources
            self.sync_report["retrying"] = failed
        self.owed.paid(sources if partial or not sources else list(members.peers), since)  # (every peer holds
        # everything: one is enough)
        if members.peers and not sources:
            self.sync_report["state"] = "no-peer-answered"
            if not partial:
                self.tasks.append(asyncio.get_running_loop().create_task(self._catch_up_later(None, since)))
        self.log.info("replica catch-up", **self.sync_report)
        self.synced.set()
        if partial:
            self.pull_owed()  # the peers that failed, and any owed from before a restart

    def pull_owed(self) -> None:
        """A pull, retried until it answers, from each member this store owes one (``Owed``); one
        whose peer is not a member waits on disk for a membership that lists it again."""
        for peer, since in self.owed.load().items():
            task = self._owed_tasks.get(peer)
            if peer in self.members.peers and (task is None or task.done()):
                self._owed_tasks[peer] = task = asyncio.get_running_loop().create_task(self._catch_up_later(peer, since))
                self.tasks.append(task)

    async def _pull_twice(self, peer: str, since: int, share: bool) -> int:
        """Everything ``peer`` holds since ``since`` (with ``share``: of this node's share), then what
        reached it during that pull (from the margin before it began, if the peer lost our mark)."""
        began = self.clock.now().hlc
        first = await self._pull(peer, since, share)
        second = await self._pull(peer, max(0, began - (CATCH_UP_MARGIN_MS << 16)), share, arrived=first.mark)
        return first.accepted + second.accepted

    async def _catch_up_later(self, peer: str | None, since: int) -> None:
        """The catch-up from ``peer`` (None: from any one peer) that failed, retried with backoff until
        it answers or leaves the membership; a debt to ``peer`` stays on disk until paid (``Owed``)."""
        backoff = 1.0
        members = self.members
        while True:
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            candidates = sorted(members.peers) if peer is None else [peer] if peer in members.peers else []
            if not candidates or (peer is not None and peer not in self.owed.load()):
                return  # the debt stays on disk for a membership that lists the peer again (or was paid)
            for p in candidates:
                partial = members.placement.partial
                try:
                    n = await self._pull_twice(p, since, partial)
                except StaleEpoch as e:
                    await members.refused(p, e)
                    continue
                except Exception as e:
                    self.log.info("catch-up from a peer failed again; retrying", peer=p, error=type(e).__name__,
                                  retry_s=backoff)
                    continue
                self.log.info("replica catch-up from a peer that had not answered", peer=p, records=n)
                self.owed.paid([p] if partial else list(members.peers), since)
                if self.sync_report.get("retrying"):
                    self.sync_report["retrying"] = [x for x in self.sync_report["retrying"] if x != p]
                return

    async def _pull(self, peer: str, since: int, share: bool = False, senders: list[str] | None = None,
                    instead_of: list[str] | None = None, arrived: Any = None) -> Pulled:
        """What ``peer`` holds since ``since``; with ``share``, only what this node holds (and with
        ``senders``, only what ``peer`` is the designated sender of: see ``since``)."""
        target = await self._peer_store(peer)
        got = Pulled()
        epoch = self.members.view.epoch
        members = list(self.members.placement.ownership.names) if share else None
        for name in DBS:
            after = None
            while True:
                page = await target.since(name, since, after, BATCH_RECORDS, self.node if share else None, members,
                                          epoch, senders, instead_of, arrived)
                got.page(page, await self.apply(page["records"]))
                after = page["next"]
                if after is None:
                    break
        return got

    async def wait_synced(self, timeout: float) -> dict:
        try:
            await asyncio.wait_for(self.synced.wait(), timeout)
        except asyncio.TimeoutError:
            return {"state": "timeout", **self.sync_report}
        return self.sync_report

    # ------------------------------------------------------------------------- answering the peers

    async def holding(self, name: str, items: list[list], epoch: int | None = None) -> list[bool]:
        """Per [key, hlc, writer]: whether this store holds that version of the record or one that wins
        over it. A walk asks before it pushes (``Rebalancing._push``): a holder that has a record is
        not sent its bytes again (a joiner pulled its share already). Asked under the caller's
        membership ``epoch`` (see ``Members.accept``): the answer lets the caller drop its copy."""
        if epoch is not None:
            await self.members.accept(epoch, "holding")
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
        out = []
        for (key, want), old, held in zip(asked, olds, helds):
            if held is None or HLC.unpack(held)[0] != want.hlc:
                out.append(held is not None and HLC.unpack(held)[0] > want.hlc)
                continue
            mine = version_of(old if name == "registry" else db.get(key))  # a tie: read the writer
            out.append(mine is not None and not want.newer_than(mine))
        return out

    async def since(self, name: str, hlc: int, after: bytes | None, limit: int = BATCH_RECORDS,
                    holder: str | None = None, members: list[str] | None = None,
                    epoch: int | None = None, senders: list[str] | None = None,
                    instead_of: list[str] | None = None, arrived: Any = None) -> dict:
        """Records of one store with a version at or after ``hlc``, in version order, from the index
        position ``after`` (exclusive); answers ``{records, next}`` within a byte budget. With
        ``holder``: only the records that node holds under ``members`` (default: this node's view),
        the caller's membership of ``epoch`` (see ``Members.accept``); with ``senders`` too (the peers
        the holder asks), only those this node is the designated sender of (``share_sender``).
        ``arrived``: a mark of this store's (``arrivals`` in an earlier answer): from the lowest
        version accepted since, not ``hlc``. Each answer says whether this store has caught up
        itself (``synced``: it may lack records it is designated for)."""
        if epoch is not None:
            await self.members.accept(epoch, "since")
        answer = {"synced": self.synced.is_set() and not self.sync_report.get("retrying"),
                  "arrivals": self.arrivals.mark()}
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
            if record is None:
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
