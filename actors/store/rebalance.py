"""Keeping R copies of every URL when the membership changes (a mixin of ``Replication``).

With ``cluster.replicas`` below the node count each node holds a share: the records of the URLs whose
first R nodes (rendezvous order) it is among (``prerender_ray/storage/placement.py``). On a change
the store walks its per-URL records once:

- a record whose holder set gained a node that was already a member is pushed to it by one of the
  holders it had before (the first in rank order), since such a node does not catch up by itself; a
  node that just joined pulls its share in its own catch-up;
- a record this node no longer holds is pushed to every holder and, once each acknowledged, dropped
  here: a local removal of the record and its bookkeeping, not a delete (nothing is shipped), and
  only if the version held is still the one every holder acknowledged.

A record that reaches a node which does not hold it (shipped by a peer that had not yet learnt of the
change, after this node's walk passed its key) is pushed on the same way: to its holders, then dropped
here once each acknowledged; else it would stay here and its new holder would never get it. That
waits ``PUSH_ON_AFTER_S`` and asks the membership of then: a stale view must not send records away.

Pushes go to the peer's ``apply_remote`` directly, not through the outbox: a drop needs the ack. A
change while a walk runs cancels it and starts again from the membership the cancelled walk started
from (what it had not pushed yet is still owed); that membership is kept on disk until a walk
finishes, so a store that died mid-walk resumes it when it starts again. A holder that did not
answer keeps the record here and is retried by a later walk.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from prerender_ray import metrics
from prerender_ray.storage.keys import FRESHNESS, HPTR, REBALANCE, RENDER_HISTORY, TARGET, VIDX
from prerender_ray.storage.placement import Placement
from prerender_ray.storage.replication import hlc_bytes

WALK_CHUNK = 500  # records read per step of a walk
WALK_BYTES = 4 * 1024 * 1024  # and at most this many bytes of them (pages: ~30 KB each)
PUSH_DEADLINE_S = 15.0
PUSH_TRIES = 3
RETRY_AFTER_S = 30.0  # a walk that left records behind (a holder did not answer) runs again after this
PUSH_ON_TRIES = 5  # then a stray record waits here for the next walk
# A stray is pushed on only after this, and only if it still is one: a node whose membership is stale
# (a late push applied; corrected within ~5 s) would otherwise send away records it holds.
PUSH_ON_AFTER_S = 15.0
# per-URL key ranges of each store: (prefix, start); page keys sort after every \x00 family
RANGES = {"registry": ((TARGET, None),),
          "pages": ((FRESHNESS, None), (RENDER_HISTORY, None), (b"", b"\x01"))}


class Rebalancing:
    placement: Placement
    node: str
    log: Any

    def init_rebalancing(self) -> None:
        self.rebalance_task: asyncio.Task | None = None
        self._walk_from: Placement | None = None  # the membership the unfinished walk started from
        self.rebalance_report: dict[str, Any] = {"state": "idle"}
        owed = self.registry.get(REBALANCE)  # type: ignore[attr-defined]
        if owed is not None:  # a walk this store's last process did not finish: resume it
            try:
                names = [n for n in json.loads(owed) if isinstance(n, str)]
            except ValueError:
                names = []
            if names:
                self._start_walk(self.placement.under(names))

    def _start_walk(self, before: Placement) -> None:
        if self.rebalance_task is not None and not self.rebalance_task.done():
            self.rebalance_task.cancel()
        if self._walk_from is None:
            self._walk_from = before
            self.registry.put(REBALANCE, json.dumps(list(before.ownership.names)).encode())  # type: ignore[attr-defined]
        self.rebalance_task = asyncio.get_running_loop().create_task(self._rebalance(self._walk_from, self.placement))

    def rebalance_on(self, names: list[str]) -> None:
        """A new membership: from now on records ship to their new holders; a walk moves what is held."""
        before = self.placement
        after = before.under(names)
        if after.ownership.names == before.ownership.names:
            return
        self.placement = after
        if not (before.partial or after.partial or self._walk_from is not None):
            return  # every node holds everything, before and after
        self._start_walk(before)

    async def _rebalance(self, before: Placement, after: Placement) -> None:
        t0 = time.monotonic()
        report = {"state": "running", "members": list(after.ownership.names), "pushed": 0, "dropped": 0,
                  "unanswered": 0, "startedAt": int(time.time() * 1000)}
        self.rebalance_report = report
        try:
            for name in ("registry", "pages"):
                for prefix, start in RANGES[name]:
                    await self._walk(name, prefix, start, before, after, report)
        except asyncio.CancelledError:
            report["state"] = "superseded"
            raise
        except Exception as e:
            metrics.loop_errors.labels("rebalance").inc()
            self.log.error("rebalance failed", error=repr(e))
            report["state"] = "failed"
            report["error"] = repr(e)[:300]
        else:
            report["state"] = "done" if not report["unanswered"] else "incomplete"
        report["ms"] = round((time.monotonic() - t0) * 1000)
        self.log.info("rebalance", **{k: v for k, v in report.items() if k != "members"})
        if report["state"] == "done":
            self._walk_from = None
            self.registry.delete(REBALANCE)  # type: ignore[attr-defined]
        elif report["state"] in ("incomplete", "failed"):
            await asyncio.sleep(RETRY_AFTER_S)  # another change cancels this wait and walks at once
            self.rebalance_task = asyncio.get_running_loop().create_task(self._rebalance(before, self.placement))

    async def _walk(self, name: str, prefix: bytes, start: bytes | None, before: Placement, after: Placement,
                    report: dict) -> None:
        db = self._db(name)  # type: ignore[attr-defined]
        cursor = start
        while True:
            chunk: list[tuple[bytes, bytes]] = []
            size, full = 0, False
            for key, record in db.items(prefix, cursor):
                chunk.append((key, record))
                size += len(key) + len(record)
                if len(chunk) >= WALK_CHUNK or size >= WALK_BYTES:
                    full = True
                    break
            if not chunk:
                return
            cursor = chunk[-1][0] + b"\x00"
            await self._move(name, chunk, before, after, report)
            if not full:
                return
            await asyncio.sleep(0)

    async def _move(self, name: str, chunk: list[tuple[bytes, bytes]], before: Placement, after: Placement,
                    report: dict) -> None:
        """Push what others must now hold; drop what this node no longer holds once its holders have it."""
        sends: dict[str, list[list]] = {}
        leaving: list[tuple[bytes, bytes | None, tuple[str, ...]]] = []
        members_before = set(before.ownership.names)
        for key, record in chunk:
            now = after.holders(name, key)
            if now is None:
                continue  # cluster-wide: every node holds it
            was = before.holders(name, key) or ()
            if self.node not in now:
                dests = tuple(n for n in now if n != self.node)
                leaving.append((key, hlc_bytes(record), dests))
            else:
                pusher = next((n for n in now if n in was), None)
                if pusher != self.node:
                    continue
                dests = tuple(n for n in now if n not in was and n in members_before)
            for peer in dests:
                sends.setdefault(peer, []).append([name, key, record])
        answered = set()
        for peer, records in sends.items():
            if await self._push(peer, records):
                answered.add(peer)
                report["pushed"] += len(records)
            else:
                report["unanswered"] += len(records)
        gone = [(key, sent) for key, sent, dests in leaving if all(d in answered for d in dests)]
        report["dropped"] += self.drop_local(name, gone)

    def push_on(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        """Records just received that this node does not hold (``items``: key, record): to their
        holders, and dropped here once each has them."""
        tasks = self._tasks  # type: ignore[attr-defined]
        task = asyncio.get_running_loop().create_task(self._push_on(name, items))
        tasks.append(task)
        task.add_done_callback(lambda t: t in tasks and tasks.remove(t))

    async def _push_on(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        report = {"pushed": 0, "dropped": 0, "unanswered": 0}
        db = self._db(name)  # type: ignore[attr-defined]
        for attempt in range(PUSH_ON_TRIES):
            await asyncio.sleep(RETRY_AFTER_S if attempt else PUSH_ON_AFTER_S)
            # only what is still here at the version received (a newer one is pushed on by itself)
            # and still not held here under the membership of now
            held = db.get_many([key for key, _ in items])
            items = [(key, now) for (key, was), now in zip(items, held)
                     if now is not None and hlc_bytes(now) == hlc_bytes(was)
                     and not self.placement.holds(self.node, name, key)]
            report["unanswered"] = 0
            if not items:
                break
            try:
                await self._move(name, items, self.placement, self.placement, report)
            except Exception as e:
                self.log.warning("pushing on a record held elsewhere failed", error=repr(e)[:300])
                report["unanswered"] = len(items)
            if not report["unanswered"]:
                break
        if any(report.values()):
            self.log.info("records held elsewhere pushed on", db=name, **report)

    async def _push(self, peer: str, records: list[list]) -> bool:
        for attempt in range(PUSH_TRIES):
            try:
                store = await self._peer_store(peer)  # type: ignore[attr-defined]
                await asyncio.wait_for(store.apply_remote.remote(records), PUSH_DEADLINE_S)
                metrics.replication_shipped_bytes.labels("rebalance").inc(
                    sum(len(key) + len(record) for _, key, record in records))
                return True
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.log.info("rebalance push failed", peer=peer, attempt=attempt + 1, error=type(e).__name__)
                await asyncio.sleep(0.5 * (attempt + 1))
        return False

    def drop_local(self, name: str, items: list[tuple[bytes, bytes | None]]) -> int:
        """Remove records this node no longer holds (each only while its version is still ``sent``):
        the record, its version index entry, its page pointer, its derived index entries and its
        count. Nothing is shipped: the holders keep theirs."""
        if not items:
            return 0
        db = self._db(name)  # type: ignore[attr-defined]
        keys = [key for key, _ in items]
        olds, helds, lives = self._held(db, name, keys)  # type: ignore[attr-defined]
        ops: list[tuple[bytes, bytes | None]] = []
        derived: list[tuple[bytes, bytes | None]] = []
        dropped, was = [], []
        for (key, sent), old, held, live in zip(items, olds, helds, lives):
            if sent is None or held != sent:
                continue  # written since it was pushed: the next walk decides
            ops.append((key, None))
            ops.append((VIDX + held + key, None))
            if name == "pages":
                ops.append((HPTR + key, None))
            else:
                self._index_ops(derived, key, old or db.get(key), None)  # type: ignore[attr-defined]
            dropped.append(key)
            was.append(live)
        if dropped:
            counted = self._counted(name, dropped, [None] * len(dropped), was)  # type: ignore[attr-defined]
            db.write([*ops, *derived, counted])
        return len(dropped)
