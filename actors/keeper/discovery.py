"""The keeper's side of bot-miss discovery: the ceiling of unrendered discovered targets per site for
the URLs this node owns (``prerender_ray.queue.discovery``), then an absent-only put.

Every discovery of a URL comes here, to its owner, whichever ingress replica or node the bot asked,
so the count is the one authority for its slice. A result for any key of a URL (whatever its
outcome) ends the URL's count; a URL whose rows left this keeper (handed over, deleted) is dropped by
the sweep a site at its ceiling gets at most once a second.
"""

from __future__ import annotations

from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.keeper.rows import CurrentConfig, Rows
from prerender_ray.actors.keeper.targets import Targets
from prerender_ray.identity.membership import MembershipView, StaleEpoch
from prerender_ray.queue.discovery import Unrendered, share_of, site_of
from prerender_ray.rpc import Peers, StoreApi


class Discoveries:
    def __init__(self, rows: Rows, conf: CurrentConfig, targets: Targets, store: StoreApi, peers: Peers,
                 view: MembershipView, node: str, log: Any):
        self.rows = rows
        self.conf = conf
        self.targets = targets
        self.store = store
        self.peers = peers
        self.view = view
        self.node = node
        self.log = log
        self.unrendered = Unrendered()

    @property
    def share(self) -> int:
        """This owner's part of ``bots.discovery.maxUnrendered`` under the current membership."""
        return share_of(self.conf.cfg.bots.discovery.max_unrendered, len(self.view.current.names))

    async def discover(self, url: str, deleted_within_ms: int, forwarded: bool = False,
                       epoch: int | None = None) -> dict:
        """A bot miss found ``url`` (canonical): a target unless one exists, within the site's
        ceiling. Answers ``{written}``, ``{written: 0, known: true}`` or ``{written: 0, refused}``."""
        if forwarded and epoch is not None:
            await self.targets.accept(epoch, "discover_target")
        m = self.view.current
        if not forwarded and len(m.names) > 1:
            owner = m.owner(url)
            if owner != self.node:  # the caller's membership view lagged
                try:
                    return await (await self.peers.of(owner)).discover_target(url, deleted_within_ms, True, m.epoch)
                except StaleEpoch:
                    if not await self.targets.moved_past(m.epoch):
                        raise
                    return await self.discover(url, deleted_within_ms)
        if url in self.unrendered:  # discovered already, its render still to come
            return {"written": 0, "known": True}
        now = self.rows.clock.now_ms()
        share = self.share
        refused = self.unrendered.admit(url, share, now)
        if refused is not None and self.unrendered.sweep_due(site_of(url), now):
            self.unrendered.sweep(site_of(url), self._holds)
            refused = self.unrendered.admit(url, share, now)
        if refused is not None:
            [existing] = await self.store.get_targets([url])
            if existing is not None:  # a known URL costs nothing, at the ceiling too
                return {"written": 0, "known": True}
            self.unrendered.refuse(refused)
            metrics.discovery_refused.labels(refused).inc()
            self.log.info("discovery refused", url=url, reason=refused, site=site_of(url),
                          unrendered=self.unrendered.count(site_of(url)), share=share)
            return {"written": 0, "refused": refused}
        try:
            # absent_only: a target put meanwhile (an operator's PUT with its own due) is left alone
            answer = await self.targets.put_targets([{"url": url, "discovered": True}], True, True, deleted_within_ms)
        except BaseException:
            self.unrendered.release(url)
            raise
        if not answer.get("written"):
            self.unrendered.release(url)
            return {"written": 0, "known": True}
        return {"written": answer["written"]}

    def result_for(self, url: str) -> None:
        """A render result for a key of ``url`` was applied: it is not unrendered any more."""
        self.unrendered.release(url)

    def _holds(self, url: str) -> bool:
        row = self.rows.row
        return any(row(key) is not None for key in self.conf.rules.keys_of(url))

    def report(self) -> dict:
        cfg = self.conf.cfg.bots.discovery
        return {"maxUnrendered": cfg.max_unrendered, "perMinute": cfg.per_minute, **self.unrendered.report(self.share)}
