"""Shipping a node store's writes to its peers: outboxes, shippers and shipped marks.

- Local writes go to an in-memory outbox per peer, shipped in batches by one task per peer and
  retried with backoff while the peer is unreachable. An outbox that grows past its bound is dropped
  and replaced by a re-push from the version index once the peer answers again.
- The outbox dies with the process, so each peer's *shipped mark* is kept on disk: every version
  below it has reached that peer. A store that starts again re-pushes from it what an outbox may
  have held (a write acknowledged here and not yet shipped is never left on this node alone).

Versions, the version index and how a record is applied: ``records.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prerender_ray import metrics
from prerender_ray.actors.store import catchup
from prerender_ray.actors.store.members import Members
from prerender_ray.actors.store.records import BATCH_BYTES, BATCH_RECORDS, DBS, HLC, Record, Records
from prerender_ray.identity.membership import StaleEpoch
from prerender_ray.storage.keys import SHIPPED
from prerender_ray.storage.placement import NEVER
from prerender_ray.storage.replication import unwrap
from prerender_ray.tasks import Tasks

if TYPE_CHECKING:
    from prerender_ray.actors.store.actor import StoreClient

MAX_PENDING = 200_000
SHIP_DEADLINE_S = 15.0


class Shipping:
    """``records``: what is shipped (and the shipped marks' store); ``members``: the peers, the
    epoch a batch is sent under; ``stores``: the peers' stores by name (``get(peer)``: its
    ``StoreClient``); ``since``: this store's answer to a pull (``NodeStore.since``), what a re-push
    sends; ``tasks``: the store's, which start the shippers (ended when it closes)."""

    def __init__(self, records: Records, members: Members, stores: Any, since: Callable[..., Awaitable[dict]],
                 log: Any, tasks: Tasks):
        self.records = records
        self.tasks = tasks
        self.members = members
        self.stores = stores
        self.since = since
        self.log = log
        self.outbox: dict[str, deque[Record]] = {}
        self.resync_from: dict[str, int] = {}  # peer -> hlc to re-push from (its outbox overflowed)
        self.wake: dict[str, asyncio.Event] = {}
        self.shippers: dict[str, asyncio.Task] = {}
        self.shipped: dict[str, int] = {}
        self._inflight: dict[str, int] = {}  # peer -> first version of the batch being shipped to it

    def start(self) -> None:
        """A shipper for each peer, each resuming what an earlier process may have left unshipped."""
        newest = self.records.newest_hlc()
        for peer in self.members.peers:
            self.resume(peer, newest)
            self.add_peer(peer)

    def follow(self, first: bool, peers: list[str]) -> None:
        """The members changed (``first``: this store knew none before): a shipper for each new peer,
        none for one that left."""
        registry = self.records.registry
        for peer in peers:
            if peer not in self.outbox:  # a peer that was away pulls what it missed when it starts
                # and, back from a leave, is sent what its outbox here lost when it left: its pull
                # starts a margin before the newest record it holds, and it may have written its own
                # while cut off from this node for longer. A store that started alone does at its
                # first membership what it does at start (its outboxes died with its last process).
                if first or registry.get(SHIPPED + peer.encode()) is not None:
                    self.resume(peer, self.records.newest_hlc())
                self.add_peer(peer)
        for peer in [p for p in self.outbox if p not in peers]:
            if peer in self.shipped:  # its mark as of now (on disk only once it moved): see above
                registry.put(SHIPPED + peer.encode(), HLC.pack(self.shipped[peer]))
            self.shippers.pop(peer).cancel()
            del self.outbox[peer], self.wake[peer]
            self.resync_from.pop(peer, None)
            metrics.replication_pending.labels(peer).set(0)

    def resume(self, peer: str, newest: int) -> None:
        """At start: what an earlier process may have left in its outbox for ``peer`` is re-pushed
        from the version index, from the peer's shipped mark (without one, a store of an older
        release: from the catch-up margin before ``newest``, the newest version held)."""
        if not newest:
            return
        raw = self.records.registry.get(SHIPPED + peer.encode())
        if raw is not None and len(raw) == HLC.size:
            mark = HLC.unpack(raw)[0]
        else:
            mark = max(0, newest - (catchup.CATCH_UP_MARGIN_MS << 16))
        self.shipped[peer] = mark
        if mark <= newest:
            self.resync_from[peer] = min(mark, self.resync_from.get(peer, mark))

    def _mark_shipped(self, peer: str, below: int) -> None:
        """Every version below ``below`` has reached ``peer`` (never past a re-push still owed)."""
        if peer in self.resync_from:
            below = min(below, self.resync_from[peer])
        if below > self.shipped.get(peer, 0):
            self.shipped[peer] = below
            self.records.registry.put(SHIPPED + peer.encode(), HLC.pack(below))

    def add_peer(self, peer: str) -> None:
        self.outbox[peer] = deque()
        self.wake[peer] = asyncio.Event()
        self.shippers[peer] = self.tasks.spawn(self._ship(peer))
        if peer not in self.members.peers:
            self.members.peers.append(peer)

    def enqueue(self, peer: str, records: list[Record]) -> None:
        box = self.outbox.get(peer)
        if box is None:
            return
        if len(box) + len(records) > MAX_PENDING:  # bounded memory: re-push from the index later
            oldest = min((unwrap(r)[0].hlc for _, _, r in box), default=unwrap(records[0][2])[0].hlc)
            self.resync_from[peer] = min(self.resync_from.get(peer, oldest), oldest)
            box.clear()
            self.log.warning("replication outbox overflowed; will re-push from the index", peer=peer)
        else:
            box.extend(records)
        metrics.replication_pending.labels(peer).set(len(box))
        self.wake[peer].set()

    def unshipped_from(self, peer: str) -> int:
        """The oldest version of this node's writes that may not have reached ``peer`` yet (in its
        outbox, being shipped, or owed by a re-push); ``NEVER`` when every one has."""
        box = self.outbox.get(peer)
        lows = [_version(box[0])] if box else []
        lows += [v for v in (self.resync_from.get(peer), self._inflight.get(peer)) if v is not None]
        return min(lows, default=NEVER)

    async def _peer_store(self, peer: str) -> StoreClient:
        client: StoreClient = await self.stores.get(peer)
        return client

    async def _ship(self, peer: str) -> None:
        backoff = 1.0
        box = self.outbox[peer]
        while True:
            if not box and peer not in self.resync_from:
                self.wake[peer].clear()
                await self.wake[peer].wait()
            try:
                if peer in self.resync_from:
                    await self._repush(peer)
                batch: list[Record] = []
                size = 0
                while box and len(batch) < BATCH_RECORDS and size < BATCH_BYTES:
                    rec = box.popleft()
                    batch.append(rec)
                    size += len(rec[2])
                if batch:
                    self._inflight[peer] = _version(batch[0])  # neither in the box nor arrived (see ``since``)
                    try:
                        current = self.members.view.current
                        await (await self._peer_store(peer)).apply_remote(batch, current.epoch, current.wire)
                    except BaseException:
                        box.extendleft(reversed(batch))  # keep order; retried after the backoff
                        raise
                    finally:
                        self._inflight.pop(peer, None)
                    metrics.replication_shipped_bytes.labels("write").inc(_size(batch))
                    # The outbox is in version order: what is left in it is all that has not been shipped.
                    self._mark_shipped(peer, _version(box[0]) if box else _version(batch[-1]) + 1)
                metrics.replication_pending.labels(peer).set(len(box))
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except StaleEpoch as e:  # sent again once we know the membership the peer is on
                await self.members.refused(peer, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception as e:
                self.log.info("peer unreachable; retrying", peer=peer, pending=len(box), error=type(e).__name__,
                              retry_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _repush(self, peer: str) -> None:
        """After an overflow or a restart: ship everything written since the oldest record an outbox
        lost."""
        since = self.resync_from[peer]
        newest = self.records.newest_hlc()  # what the scans below cover at least; later writes are in the outbox
        target = await self._peer_store(peer)
        for name in DBS:
            after = None
            while True:
                page = await self.since(name, since, after, holder=peer)
                if page["records"]:
                    current = self.members.view.current
                    await target.apply_remote(page["records"], current.epoch, current.wire)
                    metrics.replication_shipped_bytes.labels("repush").inc(_size(page["records"]))
                after = page["next"]
                if after is None:
                    break
        del self.resync_from[peer]
        box = self.outbox.get(peer)
        self._mark_shipped(peer, min(_version(box[0]), newest + 1) if box else newest + 1)

    def close(self) -> None:
        for task in self.shippers.values():
            task.cancel()


def peer_client(handle: Any) -> StoreClient:
    """A peer's store, each call under ``SHIP_DEADLINE_S``."""
    from prerender_ray.actors.store.actor import StoreClient  # that module imports this one

    return StoreClient(handle, SHIP_DEADLINE_S)


def _size(records: list[Record]) -> int:
    return sum(len(key) + len(record) for _, key, record in records)


def _version(record: Record) -> int:
    return unwrap(record[2])[0].hlc

