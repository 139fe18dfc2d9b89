"""Replication of the NodeStore's data to every peer (a mixin of ``NodeStore``).

- Every record carries a version (hybrid logical clock + node); a peer applies it only if it is newer
  than what it holds (last writer wins; deletes are tombstones), so duplicates, reordering and
  replays are harmless.
- Each store keeps a version index inside each RocksDB (``\\x00v<hlc><key>``), so "everything written
  since T" is a range scan: the catch-up of a node that joins or restarts, and the re-push to a peer
  whose outbox overflowed. The pages store also keeps a pointer ``\\x00h<key> -> hlc`` (a race is
  decided without reading a 30 KB page); a registry record is small and read anyway, so its own
  header gives its version (pointers that older versions wrote there are ignored).
- Local writes go to an in-memory outbox per peer, shipped in batches by one task per peer and
  retried with backoff while the peer is unreachable. An outbox that grows past its bound is dropped
  and replaced by a re-push from the version index once the peer answers again.
- The outbox dies with the process, so each peer's *shipped mark* is kept on disk: every version
  below it has reached that peer. A store that starts again re-pushes from it what an outbox may
  have held (a write acknowledged here and not yet shipped is never left on this node alone).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from prerender_ray import metrics
from prerender_ray.actors.common import MEMBERSHIP_CHECK_S, Handles, Sometimes, end_if_cancelled, survivable
from prerender_ray.actors.store.catchup import Arrivals, Owed, Pulled, pull_share
from prerender_ray.actors.store.rebalance import Rebalancing
from prerender_ray.identity.membership import NOBODY, Membership, MembershipView, StaleEpoch
from prerender_ray.storage.keys import FRESHNESS, HPTR, LIVE, RENDER_HISTORY, SHIPPED, TARGET, VIDX
from prerender_ray.storage.placement import NEVER, Placement, share_sender
from prerender_ray.storage.replication import (
    LOGICAL_BITS,
    Clock,
    Version,
    hlc_bytes,
    payload_of,
    unwrap,
    version_of,
    wins,
    wrap_many,
)
from prerender_ray.storage.rocks import Store
from prerender_ray.timeutil import SYSTEM_CLOCK
from prerender_ray.timeutil import Clock as WallClock

if TYPE_CHECKING:
    from prerender_ray.actors.store.actor import StoreClient

_LIVE_FLAG = (b"\x00", b"\x01")
_NOT_PAGES = (FRESHNESS, RENDER_HISTORY)
_HLC = struct.Struct(">Q")
DBS = ("registry", "pages")
BATCH_RECORDS = 500
BATCH_BYTES = 4 * 1024 * 1024
MAX_PENDING = 200_000
SHIP_DEADLINE_S = 15.0
CATCH_UP_MARGIN_MS = 10 * 60_000  # records this much older than the newest held are pulled again
SCAN_BUDGET = 20_000  # index entries one ``since`` call reads at most (a filtered scan may skip many)
HOLDING_MAX = 2_000  # versions one ``holding`` call asks about at most
# [db name, key, enveloped record]: a list, since Ray pickles every tuple of an argument (see
# Claims.grant) and a batch carries hundreds of records
Record = list


def _whole_key(key: str) -> str:
    return key


class Replication(Rebalancing):
    # what the store this is part of provides (``NodeStore``; the tests' ``Node``)
    clock: Clock
    registry: Store
    pages: Store
    _tasks: list[asyncio.Task]

    def _index_ops(self, out: list[tuple[bytes, bytes | None]], key: bytes, old: bytes | None,
                   new: bytes | None) -> None:
        """The derived index entries of a registry write (``NodeStore`` keeps targets by sitemap)."""

    def init_replication(self, membership: Membership | None, replicas: int = 64,
                         url_of_key: Any = _whole_key,
                         fetch: Callable[[], Awaitable[Membership]] | None = None,
                         wall: WallClock = SYSTEM_CLOCK, stores: Any = None) -> None:
        """``membership``: the controller's at placement (None, or one without this node: alone until
        the first push or check); ``replicas``: how many nodes hold each URL's records
        (``cluster.replicas``); ``url_of_key``: a cache key's URL (the key layout is config);
        ``fetch``: the controller's current membership (None: by push only); ``wall``: the time
        this store reads; ``stores``: the peers' stores by name (``Handles``, Ray's, unless told)."""
        if membership is None or self.node not in membership.names:
            membership = Membership.of(NOBODY, [self.node])
        self.view = MembershipView(membership)
        self.fetch_membership = fetch
        self.wall = wall
        self._unasked = Sometimes()
        self._refusals: set[tuple[str, int]] = set()  # (peer, its epoch) refusals said once each
        self.peers: list[str] = [p for p in membership.names if p != self.node]
        self.placement = Placement(membership.ownership, replicas, url_of_key)
        self.placed_epoch = membership.epoch  # the epoch ``placement`` is of
        self.init_rebalancing()
        self.view.listen(self._changed)
        self.stores = stores if stores is not None else Handles("store", wrap=_peer_client)  # the peers' stores
        self.outbox: dict[str, deque[Record]] = {}
        self.resync_from: dict[str, int] = {}  # peer -> hlc to re-push from (its outbox overflowed)
        self.wake: dict[str, asyncio.Event] = {}
        self.shippers: dict[str, asyncio.Task] = {}
        self.synced = asyncio.Event()
        self.sync_report: dict[str, Any] = {"state": "pending"}
        self.shipped: dict[str, int] = {}
        self._inflight: dict[str, int] = {}  # peer -> first version of the batch being shipped to it
        self.arrivals = Arrivals(wall.monotonic())
        self.owed = Owed(self.registry)  # the pulls this store owes, on disk (see ``Owed``)
        self._owed_tasks: dict[str, asyncio.Task] = {}
        newest = self.newest_hlc()
        for peer in self.peers:
            self._resume(peer, newest)
            self._add_peer(peer)
        self._tasks.append(asyncio.get_running_loop().create_task(self._initial_catch_up()))

    def _db(self, name: str) -> Any:
        return self.registry if name == "registry" else self.pages

    def _resume(self, peer: str, newest: int) -> None:
        """At start: what an earlier process may have left in its outbox for ``peer`` is re-pushed
        from the version index, from the peer's shipped mark (without one, a store of an older
        release: from the catch-up margin before ``newest``, the newest version held)."""
        if not newest:
            return
        raw = self.registry.get(SHIPPED + peer.encode())
        if raw is not None and len(raw) == _HLC.size:
            mark = _HLC.unpack(raw)[0]
        else:
            mark = max(0, newest - (CATCH_UP_MARGIN_MS << 16))
        self.shipped[peer] = mark
        if mark <= newest:
            self.resync_from[peer] = min(mark, self.resync_from.get(peer, mark))

    def _mark_shipped(self, peer: str, below: int) -> None:
        """Every version below ``below`` has reached ``peer`` (never past a re-push still owed)."""
        if peer in self.resync_from:
            below = min(below, self.resync_from[peer])
        if below > self.shipped.get(peer, 0):
            self.shipped[peer] = below
            self.registry.put(SHIPPED + peer.encode(), _HLC.pack(below))

    # ------------------------------------------------------------------------------ live counts

    def load_live_counts(self) -> None:
        """Exact counts of live pages and targets, kept in each store under ``LIVE`` and updated in
        the same write batch as the records they count; a store that has none yet is counted once."""
        self.live: dict[str, int] = {}
        for name in DBS:
            db = self._db(name)
            raw = db.get(LIVE)
            if raw is not None and len(raw) == _HLC.size:
                self.live[name] = _HLC.unpack(raw)[0]
                continue
            # the internal families (\x00...) sort before every page key
            rows = db.items(TARGET) if name == "registry" else db.items(b"", b"\x01")
            n = sum(1 for _, v in rows if payload_of(v) is not None)
            self.live[name] = n
            db.write([(LIVE, _HLC.pack(n))])

    def _counted(self, name: str, keys: list[bytes], payloads: list[bytes | None],
                 lives: list[bool | None]) -> tuple[bytes, bytes]:
        """The ``LIVE`` op for a batch writing ``payloads`` at ``keys`` over records whose liveness
        was ``lives`` (None: unknown, an old pointer: read it)."""
        db, delta = self._db(name), 0
        seen: dict[bytes, bool] = {}  # a key written twice in one batch: its first write came before
        for key, payload, was in zip(keys, payloads, lives):
            if (name == "registry" and not key.startswith(TARGET)) or key.startswith(_NOT_PAGES):
                continue  # control rows, freshness and history records are not what is counted
            if key in seen:
                was = seen[key]
            elif was is None:
                was = payload_of(db.get(key)) is not None
            seen[key] = payload is not None
            delta += seen[key] - was
        self.live[name] = max(0, self.live[name] + delta)
        return LIVE, _HLC.pack(self.live[name])

    # -------------------------------------------------------------------------------- committing

    def commit_local(self, name: str, ops: Sequence[tuple[bytes, bytes | None]]) -> int:
        """This node's writes (payload None deletes): stamped with consecutive fresh versions, written
        with their index entries, and queued for every peer."""
        if not ops:
            return 0
        db = self._db(name)
        olds, helds, lives = self._held(db, name, [key for key, _ in ops])
        self._commit(db, name, ops, olds, helds, lives)
        return len(ops)

    def commit_absent(self, name: str, ops: Sequence[tuple[bytes, bytes | None]],
                      deleted_within_ms: int = 0) -> list[bytes | None]:
        """``commit_local`` of the puts whose key holds no live record (absent or deleted); the others
        are left as they are. Returns, per op, None when written, else the live payload held: a
        sitemap walk creates its new targets in one call, the check and the write in one step.
        ``deleted_within_ms``: a key deleted that recently counts as held too (answered ``b""``): a
        put made on what was seen before the delete must not undo it."""
        if not ops:
            return []
        db = self._db(name)
        olds, helds, lives = self._held(db, name, [key for key, _ in ops])
        live = [payload_of(old) for old in olds]
        if deleted_within_ms > 0:
            since = (self.wall.now_ms() - deleted_within_ms) << LOGICAL_BITS
            live = [b"" if payload is None and held is not None and _HLC.unpack(held)[0] >= since else payload
                    for payload, held in zip(live, helds)]
        self._commit_picked(db, name, [i for i, payload in enumerate(live) if payload is None], ops, olds, helds,
                            lives)
        return live

    def commit_if(self, name: str, ops: Sequence[tuple[bytes, bytes | None]],
                  expected: list[bytes | None]) -> list[bool]:
        """``commit_local`` of the ops whose key still holds the live payload ``expected`` (None: nothing
        live); per op, whether it was written. A read-modify-write (a patch) made on what was read
        before a delete or another write must not undo it: the check and the write in one step."""
        if not ops:
            return []
        db = self._db(name)
        olds, helds, lives = self._held(db, name, [key for key, _ in ops])
        same = [payload_of(old) == want for old, want in zip(olds, expected)]
        self._commit_picked(db, name, [i for i, ok in enumerate(same) if ok], ops, olds, helds, lives)
        return same

    def _commit_picked(self, db: Any, name: str, picked: list[int], *cols: Sequence) -> None:
        """``_commit`` of the ops at ``picked`` (the columns as ``_held`` gave them, ops first)."""
        if picked:
            self._commit(db, name, *([col[i] for i in picked] for col in cols))

    def _commit(self, db: Any, name: str, ops: Sequence, olds: list, helds: list, lives: list) -> None:
        first = self.clock.reserve(len(ops))
        records = wrap_many(self.node, first, [p for _, p in ops])
        batch = self._batch(name, [(key, records[i], first + i, payload, olds[i], helds[i])
                                   for i, (key, payload) in enumerate(ops)])
        batch.append(self._counted(name, [k for k, _ in ops], [p for _, p in ops], lives))
        db.write(batch)
        shipped = [[name, key, record] for (key, _), record in zip(ops, records)]
        if self.view.epoch == NOBODY:
            self._alone(name, [key for key, _ in ops])
        if not self.placement.partial:
            for peer in self.peers:
                self._enqueue(peer, shipped)
            return
        plan = self.placement.split([*self.peers, self.node], name, [key for key, _ in ops])
        mine = plan.pop(self.node)
        for peer, held in plan.items():
            self._enqueue(peer, [shipped[i] for i in held])
        if len(mine) < len(ops):
            # A writer routed under an older membership than this store's (a keeper learns a change
            # on its own, later; a result of a grant made before it): records this node does not
            # hold, written after its walk may have passed them. Pushed on and dropped here, as a
            # stray received is; else they would stay here for good.
            here = set(mine)
            self.push_on(name, [(key, shipped[i][2]) for i, (key, _) in enumerate(ops) if i not in here])

    def _alone(self, name: str, keys: list[bytes]) -> None:
        """Records written while this store knows no membership: per-URL ones owe a walk (cluster-wide
        rows, a keeper's status at start, are held everywhere under any membership)."""
        if any(self.placement.url_of(name, key) is not None for key in keys):
            self.written_alone()

    def commit_remote(self, name: str, items: list[tuple[bytes, bytes]]) -> int:
        """A peer's enveloped records, each applied only when newer than what is held."""
        db = self._db(name)
        now = self.wall.now_ms()
        keys = [key for key, _ in items]
        olds, helds, lives = self._held(db, name, keys)
        accepted, was = [], []
        for (key, record), held_hlc, old, live in zip(items, helds, olds, lives):
            version, payload = unwrap(record)
            held = _HLC.unpack(held_hlc)[0] if held_hlc is not None else -1
            if version.hlc < held or (version.hlc == held and not wins(record, old or db.get(key))):
                continue
            self.clock.observe(version)
            metrics.replication_lag_seconds.observe(max(0.0, (now - version.wall_ms) / 1000))
            accepted.append((key, record, version.hlc, payload, old, held_hlc))
            was.append(live)
        batch = self._batch(name, accepted)
        if accepted:
            batch.append(self._counted(name, [r[0] for r in accepted], [r[3] for r in accepted], was))
        db.write(batch)
        if accepted:  # a joiner's second pass asks for what arrived since its first (``catchup.py``)
            self.arrivals.accepted(min(r[2] for r in accepted))
        if accepted and self.view.epoch == NOBODY:
            self._alone(name, [r[0] for r in accepted])
        if accepted and self.placement.partial:
            strays = [(r[0], r[1]) for r in accepted if not self.placement.holds(self.node, name, r[0])]
            if strays:
                self.push_on(name, strays)
        return len(accepted)

    def _batch(self, name: str, rows: list[tuple[bytes, bytes, int, bytes | None, bytes | None, bytes | None]]
               ) -> list[tuple[bytes, bytes | None]]:
        """The write batch for accepted rows of (key, record, hlc, payload, held record, held hlc):
        each record, its version index entry (the held version's entry removed), the page pointer,
        and derived indexes. One loop for a whole batch: a sitemap walk writes thousands of rows."""
        registry = name == "registry"
        retired: list[tuple[bytes, bytes | None]] = []
        versions: list[tuple[bytes, bytes | None]] = []
        pointers: list[tuple[bytes, bytes | None]] = []
        derived: list[tuple[bytes, bytes | None]] = []
        records: list[tuple[bytes, bytes | None]] = []
        index, pack = self._index_ops, _HLC.pack
        for key, record, version, payload, old, held in rows:
            hlc = pack(version)
            versions.append((VIDX + hlc + key, b""))
            if held is not None and held != hlc:
                retired.append((VIDX + held + key, None))
            if not registry:
                pointers.append((HPTR + key, hlc + _LIVE_FLAG[payload is not None]))
            elif key.startswith(TARGET):
                index(derived, key, old, payload)
            records.append((key, record))
        # family after family, each in key order when the rows are (a walk sorts its batches): the
        # sort before the RocksDB write then only merges runs
        return retired + versions + pointers + derived + records

    @staticmethod
    def _held(db: Any, name: str, keys: list[bytes]) -> tuple[list, list, list]:
        """(held records, their HLCs as 8 bytes, whether each is live: None when not known). A
        registry record is read whole anyway (the by-sitemap index needs it), so its own header gives
        the version; a page is not: a pointer decides the race without reading 30 KB."""
        if name == "registry":
            olds = db.get_many(keys)
            return olds, [hlc_bytes(o) for o in olds], [payload_of(o) is not None for o in olds]
        pointers = db.get_many([HPTR + key for key in keys])
        return ([None] * len(keys), [p[:8] if p is not None else None for p in pointers],
                [False if p is None else (p[8] == 1 if len(p) > 8 else None) for p in pointers])

    async def apply_remote(self, records: list[Record], epoch: int | None = None) -> int:
        """Records shipped by a peer (or pulled in a catch-up), sent under its membership ``epoch``
        (None: a local apply): see ``accept``."""
        if epoch is not None:
            await self.accept(epoch, "apply_remote")
        by_db: dict[str, list[tuple[bytes, bytes]]] = {n: [] for n in DBS}
        for name, key, record in records:
            by_db[name].append((key, record))
        return sum(self.commit_remote(n, items) for n, items in by_db.items() if items)

    async def holding(self, name: str, items: list[list], epoch: int | None = None) -> list[bool]:
        """Per [key, hlc, writer]: whether this store holds that version of the record or one that wins
        over it. A walk asks before it pushes (``Rebalancing._push``): a holder that has a record is
        not sent its bytes again (a joiner pulled its share already). Asked under the caller's
        membership ``epoch`` (see ``accept``): the answer lets the caller drop its copy."""
        if epoch is not None:
            await self.accept(epoch, "holding")
        if name not in DBS or not isinstance(items, list) or len(items) > HOLDING_MAX:
            raise ValueError(f"holding: a db name and at most {HOLDING_MAX} versions")
        asked: list[tuple[bytes, Version]] = []
        for item in items:
            if not (isinstance(item, (list, tuple)) and len(item) == 3 and isinstance(item[0], bytes)
                    and isinstance(item[1], int) and isinstance(item[2], str)):
                raise ValueError("holding: each item is [key, hlc, writer]")
            asked.append((item[0], Version(item[1], item[2])))
        db = self._db(name)
        olds, helds, _ = self._held(db, name, [key for key, _ in asked])
        out = []
        for (key, want), old, held in zip(asked, olds, helds):
            if held is None or _HLC.unpack(held)[0] != want.hlc:
                out.append(held is not None and _HLC.unpack(held)[0] > want.hlc)
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
        the caller's membership of ``epoch`` (see ``accept``); with ``senders`` too (the peers the
        holder asks), only those this node is the designated sender of (``share_sender``).
        ``arrived``: a mark of this store's (``arrivals`` in an earlier answer): from the lowest
        version accepted since, not ``hlc``. Each answer says whether this store has caught up
        itself (``synced``: it may lack records it is designated for)."""
        if epoch is not None:
            await self.accept(epoch, "since")
        answer = {"synced": self.synced.is_set() and not self.sync_report.get("retrying"),
                  "arrivals": self.arrivals.mark()}
        if arrived is not None and after is None:
            low = self.arrivals.lowest_since(arrived)
            if low == NEVER:  # nothing reached this store since
                return {"records": [], "next": None, **answer}
            if low is not None:
                hlc = low
        db = self._db(name)
        start = after + b"\x00" if after else VIDX + _HLC.pack(hlc)
        out: list[Record] = []
        size = 0
        nxt = None
        placement = self.placement if members is None else self.placement.under(members)
        keep = self._since_filter(name, placement, holder, senders, instead_of)
        scanned = 0
        for ikey, _ in db.items(VIDX, start):
            if scanned >= SCAN_BUDGET and nxt is not None:  # the next call goes on after ``nxt``
                return {"records": out, "next": nxt, **answer}
            scanned += 1
            key = ikey[len(VIDX) + _HLC.size:]
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
        unshipped = {p: self._unshipped_from(p) for p in senders if p != self.node}
        sends = share_sender(placement, self._walk_from, holder, self.node, senders, instead_of, unshipped)
        at = len(VIDX)
        return lambda key, ikey: sends(name, key, _HLC.unpack_from(ikey, at)[0])

    def _unshipped_from(self, peer: str) -> int:
        """The oldest version of this node's writes that may not have reached ``peer`` yet (in its
        outbox, being shipped, or owed by a re-push); ``NEVER`` when every one has."""
        box = self.outbox.get(peer)
        lows = [_version(box[0])] if box else []
        lows += [v for v in (self.resync_from.get(peer), self._inflight.get(peer)) if v is not None]
        return min(lows, default=NEVER)

    # -------------------------------------------------------------------------------- membership

    async def set_membership(self, wire: dict) -> dict:
        """The controller's push (``Membership.to_wire``), through the one path (``offer``); a
        malformed one is a ValueError and changes nothing."""
        return await self.offer(Membership.from_wire(wire))

    async def offer(self, m: Membership) -> dict:
        """The one way the membership changes, whatever brought it (push, start, check): only a higher
        epoch replaces the one held; the change takes effect synchronously, in ``_changed``."""
        if not self.view.offer(m):
            return {"changed": False, "epoch": self.view.epoch}
        await self.stores.renew(list(self.peers))
        return {"changed": True, "epoch": m.epoch}

    async def refresh(self) -> bool:
        """The controller's membership, offered (False: no controller to ask, or it did not answer)."""
        if self.fetch_membership is None:
            return False
        try:
            m = await self.fetch_membership()
        except Exception as e:
            if self._unasked.due():
                self.log.warning("the controller's membership could not be read", error=repr(e)[:200])
            return False
        await self.offer(m)
        return True

    async def follow_membership(self) -> None:
        """Pushes can be lost or overtaken: the controller is asked every ``MEMBERSHIP_CHECK_S``."""
        while True:
            await asyncio.sleep(MEMBERSHIP_CHECK_S)
            end_if_cancelled()
            try:
                await self.refresh()
            except BaseException as e:
                if not survivable(e):
                    raise
                metrics.loop_errors.labels("membership-check").inc()
                self.log.error("membership check failed", error=repr(e)[:300])

    async def accept(self, epoch: int, what: str) -> None:
        """A call that moves or writes held data, made under ``epoch``. A caller on a newer epoch
        means ours is behind: refresh first, then decide; one on an older epoch is refused
        (``StaleEpoch``): it refreshes and sends again."""
        if epoch > self.view.epoch:
            await self.refresh()
        self.view.check(epoch, what)

    async def refused(self, peer: str, e: StaleEpoch) -> None:
        """``peer`` refused our call as stale: said once per peer and epoch (both epochs, no
        traceback), and our membership refreshed."""
        if (peer, e.receiver) not in self._refusals:
            if len(self._refusals) > 1024:
                self._refusals.clear()
            self._refusals.add((peer, e.receiver))
            self.log.info("a peer store is on a newer membership; refreshing", peer=peer, ours=e.caller,
                          theirs=e.receiver)
        await self.refresh()

    def _changed(self, before: Membership, after: Membership) -> None:
        """All of it before any await: records ship to their new holders from now on, the peers'
        shippers follow the node list, and a walk moves what is held."""
        if self.node not in after.names:  # placed, or left: the controller stops this node; keep what it holds
            self.log.warning("the membership does not list this node", epoch=after.epoch, nodes=list(after.names))
            return
        placed, placed_epoch = self.placement, self.placed_epoch
        self.placement, self.placed_epoch = placed.under(after.names), after.epoch
        peers = [n for n in after.names if n != self.node]
        for peer in peers:
            if peer not in self.outbox:  # a peer that was away pulls what it missed when it starts
                # and, back from a leave, is sent what its outbox here lost when it left: its pull
                # starts a margin before the newest record it holds, and it may have written its own
                # while cut off from this node for longer. A store that started alone does at its
                # first membership what it does at start (its outboxes died with its last process).
                if before.epoch == NOBODY or self.registry.get(SHIPPED + peer.encode()) is not None:
                    self._resume(peer, self.newest_hlc())
                self._add_peer(peer)
        for peer in [p for p in self.outbox if p not in peers]:
            if peer in self.shipped:  # its mark as of now (on disk only once it moved): see above
                self.registry.put(SHIPPED + peer.encode(), _HLC.pack(self.shipped[peer]))
            self.shippers.pop(peer).cancel()
            del self.outbox[peer], self.wake[peer]
            self.resync_from.pop(peer, None)
            metrics.replication_pending.labels(peer).set(0)
        self.peers = peers
        self.log.info("membership", epoch=after.epoch, nodes=list(after.names))
        self.rebalance_on(placed, self.placement, first=before.epoch == NOBODY, before_epoch=placed_epoch)
        if before.epoch == NOBODY and self.synced.is_set():  # its catch-up ran alone: now there are peers
            self._tasks.append(asyncio.get_running_loop().create_task(self._initial_catch_up()))
        elif self.synced.is_set():
            self._pull_owed()  # a peer this store owes a pull from may be back

    def _add_peer(self, peer: str) -> None:
        self.outbox[peer] = deque()
        self.wake[peer] = asyncio.Event()
        self.shippers[peer] = asyncio.get_running_loop().create_task(self._ship(peer))
        if peer not in self.peers:
            self.peers.append(peer)

    def _enqueue(self, peer: str, records: list[Record]) -> None:
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

    # ---------------------------------------------------------------------------------- shipping

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
                        await (await self._peer_store(peer)).apply_remote(batch, self.view.epoch)
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
                await self.refused(peer, e)
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
        newest = self.newest_hlc()  # what the scans below cover at least; later writes are in the outbox
        target = await self._peer_store(peer)
        for name in DBS:
            after = None
            while True:
                page = await self.since(name, since, after, holder=peer)
                if page["records"]:
                    await target.apply_remote(page["records"], self.view.epoch)
                    metrics.replication_shipped_bytes.labels("repush").inc(_size(page["records"]))
                after = page["next"]
                if after is None:
                    break
        del self.resync_from[peer]
        box = self.outbox.get(peer)
        self._mark_shipped(peer, min(_version(box[0]), newest + 1) if box else newest + 1)

    # --------------------------------------------------------------------------------- catch-up

    def newest_hlc(self) -> int:
        newest = 0
        for name in DBS:
            last = self._db(name).last_key(VIDX)  # the index's last key holds the newest version
            if last is not None:
                newest = max(newest, _HLC.unpack_from(last, len(VIDX))[0])
        return newest

    async def _initial_catch_up(self) -> None:
        """Before the keeper loads: pull what peers hold that this node missed while away (all of it
        for a new node, and all of its share for one back under another membership: it may hold URLs
        it never had). Holding a share, from every peer at once, each record from one of them
        (``catchup.py``); else from one peer. Two passes, the second for what reached the peer
        during the first. A peer that does not answer is asked again in the background until it does
        (or leaves): the others push only to holders that were members before them, so nobody else
        would send what it holds."""
        if self.view.epoch == NOBODY:
            await self.refresh()  # placed alone: the peers to pull from are the controller's
        t0 = self.wall.monotonic()
        newest = self.newest_hlc()
        since = max(0, newest - (CATCH_UP_MARGIN_MS << 16)) if newest and not self.share_moved else 0
        self.owed.add(list(self.peers), since)  # paid below by each peer that answers
        got = Pulled()
        sources: list[str] = []
        failed: list[str] = []
        partial = self.placement.partial
        if partial:
            got, sources, failed = await pull_share(self, since, CATCH_UP_MARGIN_MS << 16)
        for peer in [] if partial else sorted(self.peers):
            try:
                got.accepted += await self._pull_twice(peer, since, False)
                sources.append(peer)
                break  # every peer holds everything: one is enough
            except Exception as e:
                failed.append(peer)
                if isinstance(e, StaleEpoch):  # asked again later, under the membership it is on
                    await self.refused(peer, e)
                else:
                    self.log.warning("catch-up from a peer failed; trying the next", peer=peer, error=repr(e)[:300])
        self.sync_report = {"state": "synced", "from": sources[0] if sources else None, "records": got.accepted,
                            "since": since, "ms": round((self.wall.monotonic() - t0) * 1000), "peers": list(self.peers)}
        if partial:
            self.sync_report["received"] = got.received  # sent by the peers (duplicates of a record included)
            self.sync_report["sources"] = sources
            self.sync_report["retrying"] = failed
        self.owed.paid(sources if partial or not sources else list(self.peers), since)  # (every peer holds
        # everything: one is enough)
        if self.peers and not sources:
            self.sync_report["state"] = "no-peer-answered"
            if not partial:
                self._tasks.append(asyncio.get_running_loop().create_task(self._catch_up_later(None, since)))
        self.log.info("replica catch-up", **self.sync_report)
        self.synced.set()
        if partial:
            self._pull_owed()  # the peers that failed, and any owed from before a restart

    def _pull_owed(self) -> None:
        """A pull, retried until it answers, from each member this store owes one (``Owed``); one
        whose peer is not a member waits on disk for a membership that lists it again."""
        for peer, since in self.owed.load().items():
            task = self._owed_tasks.get(peer)
            if peer in self.peers and (task is None or task.done()):
                self._owed_tasks[peer] = task = asyncio.get_running_loop().create_task(self._catch_up_later(peer, since))
                self._tasks.append(task)

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
        while True:
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            candidates = sorted(self.peers) if peer is None else [peer] if peer in self.peers else []
            if not candidates or (peer is not None and peer not in self.owed.load()):
                return  # the debt stays on disk for a membership that lists the peer again (or was paid)
            for p in candidates:
                partial = self.placement.partial
                try:
                    n = await self._pull_twice(p, since, partial)
                except StaleEpoch as e:
                    await self.refused(p, e)
                    continue
                except Exception as e:
                    self.log.info("catch-up from a peer failed again; retrying", peer=p, error=type(e).__name__,
                                  retry_s=backoff)
                    continue
                self.log.info("replica catch-up from a peer that had not answered", peer=p, records=n)
                self.owed.paid([p] if partial else list(self.peers), since)
                if self.sync_report.get("retrying"):
                    self.sync_report["retrying"] = [x for x in self.sync_report["retrying"] if x != p]
                return

    async def _pull(self, peer: str, since: int, share: bool = False, senders: list[str] | None = None,
                    instead_of: list[str] | None = None, arrived: Any = None) -> Pulled:
        """What ``peer`` holds since ``since``; with ``share``, only what this node holds (and with
        ``senders``, only what ``peer`` is the designated sender of: see ``since``)."""
        target = await self._peer_store(peer)
        got = Pulled()
        epoch = self.view.epoch
        members = list(self.placement.ownership.names) if share else None
        for name in DBS:
            after = None
            while True:
                page = await target.since(name, since, after, BATCH_RECORDS, self.node if share else None, members,
                                          epoch, senders, instead_of, arrived)
                got.page(page, await self.apply_remote(page["records"]))
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

    def replication_status(self) -> dict:
        return {"sync": self.sync_report, "pending": {p: len(b) for p, b in self.outbox.items()},
                "resyncing": sorted(self.resync_from), "replicas": self.placement.replicas,
                "rebalance": self.rebalance_report}


def _peer_client(handle: Any) -> StoreClient:
    """A peer's store, each call under ``SHIP_DEADLINE_S``."""
    from prerender_ray.actors.store.actor import StoreClient  # that module imports this one

    return StoreClient(handle, SHIP_DEADLINE_S)


def _size(records: list[Record]) -> int:
    return sum(len(key) + len(record) for _, key, record in records)


def _version(record: Record) -> int:
    return unwrap(record[2])[0].hlc


__all__ = ["Replication", "Version"]
