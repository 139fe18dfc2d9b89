"""Reads of a URL's target from a node that holds no copy, over HTTP on three nodes with two copies of
each URL (a ``LocalCluster``): the URL's first holder cut off or gone, the read is answered by the
second; both gone, a 503 that names them. The asking node is one more replica of a non-holder's app
(over ASGI, on the cluster's loop), whose look-up of a holder's store hangs or fails as Ray's would
for a node cut off or dead; every other part is the nodes' real one."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httpx
import pytest

from prerender_ray.identity.nodes import Ownership
from tests.localcluster import LocalCluster
from tests.support import put_target, wait_for

NAMES = ("node-a", "node-b", "node-c")
REPLICAS = 2
LATER = 2**50


class CutOff:
    """What a caller sees of a store on a node cut off: a call that never answers."""

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        async def never(*args, **kw):
            await asyncio.Event().wait()

        return never


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = LocalCluster.start(tmp_path_factory.mktemp("holders") / "data", {
        "domains": ["shop.test"],
        "cluster": {"replicas": REPLICAS},
        "render": {"reconcile": {"startDelay": "1h"}},
    }, names=NAMES)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def held(cluster):
    """A target that node-c does not hold, once it is on both its holders' stores."""
    owners = Ownership(list(NAMES))
    url = next(u for u in (f"https://shop.test/p/{i}" for i in range(1000)) if "node-c" not in owners.holders(u, REPLICAS))
    holders = owners.holders(url, REPLICAS)
    put_target(cluster.url, url, nextRenderTime=LATER)

    def everywhere() -> bool:
        from prerender_ray.actors.store.actor import StoreClient

        async def both() -> bool:
            got = [await StoreClient(await cluster.lookup("store", n), 5).get_targets([url]) for n in holders]
            return all(g[0] is not None for g in got)

        return cluster.run(both())

    wait_for(everywhere, timeout=30, what=f"{url} on {holders}")
    return url, holders


@pytest.fixture
def asker(cluster):
    """One more replica of node-c's app, with node-c's real actors; ``faults[node]`` makes that node's
    store ``"hangs"`` (cut off) or ``"gone"`` (not placed) to this replica."""
    from prerender_ray.actors.common import ActorNotPlaced
    from prerender_ray.api.app import create_app
    from prerender_ray.api.context import NodeContext
    from prerender_ray.config.model import Config
    from prerender_ray.identity.nodes import NodeInfo
    from prerender_ray.rpc import Local

    c = cluster["node-c"]
    faults: dict[str, str] = {}

    async def lookup(kind: str, node: str):
        fault = faults.get(node) if kind == "store" else None
        if fault == "gone":
            raise ActorNotPlaced(f"no store on {node}")
        if fault == "hangs":
            return Local(CutOff())
        return await cluster.lookup(kind, node)

    async def make() -> tuple:
        ctx = NodeContext(cfg=Config.model_validate(c.config), node=NodeInfo("node-c", "127.0.0.1", urlsplit(c.url).port),
                          data_dir=str(c.data_dir), keeper=c.handles["keeper"], leases=c.handles["leases"],
                          store=c.handles["store"], replica=9, lookup=lookup)
        ctx.ownership.update(list(NAMES))
        app = create_app(ctx)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 4242)),
                                   base_url="http://localhost", timeout=60)  # loopback with no users: a loopback Host
        return ctx, app, client

    ctx, app, client = cluster.run(make())

    async def get(url: str) -> httpx.Response:
        return await cluster.arun(client.get("/render_targets", params={"url": url}), 60)

    yield ctx, faults, get

    async def close() -> None:
        await client.aclose()
        app.state.sessions.close()

    cluster.run(close())


@pytest.mark.parametrize("fault", ["hangs", "gone"])
async def test_a_non_holder_reads_the_second_holder_when_the_first_is_cut_off_or_gone(asker, held, fault) -> None:
    ctx, faults, get = asker
    url, (first, second) = held
    assert not ctx.holds(url) and ctx.read_order(url) == (first, second)
    faults[first] = fault
    r = await get(url)
    assert r.status_code == 200, r.text
    assert r.json()["url"] == url


async def test_no_holder_answering_is_a_503_that_names_them(asker, held) -> None:
    ctx, faults, get = asker
    url, (first, second) = held
    faults.update({first: "gone", second: "gone"})
    r = await get(url)
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json() == {"error": "no node that holds this URL answered; retry", "url": url,
                        "holders": {first: "ActorNotPlaced", second: "ActorNotPlaced"}, "node": "node-c"}
