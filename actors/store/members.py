"""The membership a node store is on, and where its records are placed under it (issue 36).

One ``MembershipView``, replaced only by a higher epoch, through one path (``offer``) whatever brought
it: the controller's push, its answer to a check, the membership at placement. A call that moves or
writes held data carries its caller's epoch (``accept``): a caller on a newer epoch makes this store
refresh first, one on an older epoch is refused (``StaleEpoch``). What a change does to the store
(outboxes, walks, catch-up) is the store's (``NodeStore._changed``, a listener of the view).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.common import MEMBERSHIP_CHECK_S, Sometimes, end_if_cancelled, survivable
from prerender_ray.identity.membership import NOBODY, Membership, MembershipView, StaleEpoch
from prerender_ray.storage.placement import Placement


def _whole_key(key: str) -> str:
    return key


class Members:
    """``membership``: the controller's at placement (None, or one without this node: alone until
    the first push or check); ``replicas``: how many nodes hold each URL's records
    (``cluster.replicas``); ``url_of_key``: a cache key's URL (the key layout is config); ``fetch``:
    the controller's current membership (None: by push only); ``stores``: the peers' stores by name
    (renewed at each change)."""

    def __init__(self, node: str, membership: Membership | None, replicas: int = 64, url_of_key: Any = _whole_key,
                 fetch: Callable[[], Awaitable[Membership]] | None = None, stores: Any = None, log: Any = None):
        if membership is None or node not in membership.names:
            membership = Membership.of(NOBODY, [node])
        self.node = node
        self.log = log
        self.stores = stores
        self.view = MembershipView(membership)
        self.fetch_membership = fetch
        self._unasked = Sometimes()
        self._refusals: set[tuple[str, int]] = set()  # (peer, its epoch) refusals said once each
        self.peers: list[str] = [p for p in membership.names if p != node]
        self.placement = Placement(membership.ownership, replicas, url_of_key)
        self.placed_epoch = membership.epoch  # the epoch ``placement`` is of

    def place(self, after: Membership) -> tuple[Placement, int]:
        """``after``'s placement from now on; the one it replaces, and its epoch."""
        placed, placed_epoch = self.placement, self.placed_epoch
        self.placement, self.placed_epoch = placed.under(after.names), after.epoch
        return placed, placed_epoch

    async def set_membership(self, wire: dict) -> dict:
        """The controller's push (``Membership.to_wire``), through the one path (``offer``); a
        malformed one is a ValueError and changes nothing."""
        return await self.offer(Membership.from_wire(wire))

    async def offer(self, m: Membership) -> dict:
        """The one way the membership changes, whatever brought it (push, start, check): only a higher
        epoch replaces the one held; the change takes effect synchronously, in the view's listeners."""
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

    async def accept(self, epoch: int, what: str, membership: dict | None = None) -> None:
        """A call that moves or writes held data, made under ``epoch``. A caller on a newer epoch
        means ours is behind: we take the membership the call carries (``membership``, its wire:
        every value is the controller's, so the caller's is as good as the controller's answer, and
        a store cut off from the controller learns it too: before, such a store answered a joiner's
        pull and went on shipping its later writes to the members it knew, not the joiner), or,
        without one, refresh from the controller first. One on an older epoch is refused
        (``StaleEpoch``): it refreshes and sends again. A malformed or mismatched membership is a
        ValueError and changes nothing."""
        if epoch > self.view.epoch:
            if membership is None:
                await self.refresh()
            else:
                carried = Membership.from_wire(membership)
                if carried.epoch != epoch:
                    raise ValueError(f"{what}: the membership carried is of epoch {carried.epoch}, not {epoch}")
                await self.offer(carried)
        self.view.check(epoch, what)

    def wire_of(self, epoch: int) -> dict | None:
        """What a call made under ``epoch`` carries: our membership's wire when it is of that epoch
        (a walk may still run under an older one: then nothing, and the receiver refreshes)."""
        current = self.view.current
        return current.wire if current.epoch == epoch else None

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
