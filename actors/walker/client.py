"""Typed calls to a node's SitemapWalker actor (``actors/walker/actor.py`` defines each), each under a
deadline: what the sitemap and robots routes ask of a walker, and what the controller does to it."""

from __future__ import annotations

from prerender_ray.actors.client import MEMBERSHIP_DEADLINE_S, NodeActorClient
from prerender_ray.rpc import call

DEADLINE_S = 30.0  # a start answers once the walk's claim is taken; a blocking walk passes its own


class WalkerClient(NodeActorClient):
    async def start(self, url: str, revalidate: bool = False) -> dict:
        return await call(self.handle.start.remote(url, revalidate), self.deadline_s)

    async def start_all(self, revalidate: bool = False) -> dict:
        return await call(self.handle.start_all.remote(revalidate), self.deadline_s)

    async def refresh(self, url: str, revalidate: bool = False) -> dict:
        """Blocking: the walk's result document (give it the walk's deadline with ``within``)."""
        return await call(self.handle.refresh.remote(url, revalidate), self.deadline_s)

    async def refresh_all(self, revalidate: bool = False) -> list[dict]:
        return await call(self.handle.refresh_all.remote(revalidate), self.deadline_s)

    async def delete(self, url: str) -> dict:
        return await call(self.handle.delete.remote(url), self.deadline_s)

    async def discover_robots(self, origins: list[str] | None = None, refresh: bool = False,
                              walk: bool = True) -> dict:
        return await call(self.handle.discover_robots.remote(origins, refresh, walk), self.deadline_s)

    async def set_membership(self, wire: dict) -> dict:
        return await call(self.handle.set_membership.remote(wire), MEMBERSHIP_DEADLINE_S)
