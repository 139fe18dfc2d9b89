"""The keeper's parts without Ray: a real schedule RocksDB and lease table in a temp dir, an in-memory
node store, other nodes' keepers in this process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from prerender_ray.actors.keeper.keeper import Keeper
from prerender_ray.config.loading import parse
from prerender_ray.config.model import Config
from tests.actors.keeper.doubles import LocalPeers, MemoryStore, make_keeper

SITE = "https://shop.test"


def config(**sections: dict) -> Config:
    raw: dict = {"domains": ["shop.test"], **sections}
    return parse(raw, {}).config


@pytest.fixture
async def keepers(tmp_path: Path) -> AsyncIterator[Callable[..., Keeper]]:
    """Make keepers that share one store (replication is immediate here) and one peer map; each is
    closed at the end."""
    made: list[Keeper] = []
    store, peers = MemoryStore(), LocalPeers()

    def make(node: str = "node-a", members: tuple[str, ...] = (), cfg: Config | None = None, **kw: Any) -> Keeper:
        k = make_keeper(tmp_path, cfg or config(), node, store=store, peers=peers, members=members, **kw)
        made.append(k)
        return k

    yield make
    for k in made:
        await close(k)


async def close(keeper: Keeper) -> None:
    """What a process exit does to a keeper (closing twice is harmless)."""
    keeper.tasks.cancel()  # every task of its parts, none awaited
    keeper.handoff.close()
    keeper.claims.close()
    keeper.rows.db.close()
    keeper.leases.db.close()  # type: ignore[attr-defined]
