"""The discovery ceiling on the owner keeper, without Ray: real keepers (schedule and lease RocksDBs in
a temp dir), one shared in-memory store, two nodes talking in process (docs/serving.md#discovery)."""

from __future__ import annotations

from prerender_ray import metrics
from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.discovery import CEILING
from prerender_ray.storage.registry import Target
from tests.actors.keeper.conftest import SITE, config
from tests.actors.keeper.test_results import HTML, rendered

BUDGET = {"discovery": {"maxUnrendered": 3}}
TWO = ("node-a", "node-b")


def refused_count(reason: str) -> float:
    return metrics.discovery_refused.labels(reason)._value.get()


async def test_a_site_stops_discovering_at_its_ceiling_until_a_result_comes(keepers) -> None:
    k = keepers(cfg=config(bots=BUDGET))
    await k.load()
    before = refused_count(CEILING)
    answers = [await k.discover_target(f"{SITE}/d/{i}", 0) for i in range(5)]
    assert [a.get("written") for a in answers] == [1, 1, 1, 0, 0]
    assert [a.get("refused") for a in answers[3:]] == [CEILING, CEILING]
    assert k.conf.rules.keys_of(f"{SITE}/d/3")[0] not in {key for key, *_ in await k.store.scan(b"", None, 1000)}
    assert await k.store.get_targets([f"{SITE}/d/3"]) == [None]  # nothing was written for a refused one
    assert refused_count(CEILING) - before == 2
    assert (await k.discover_target("https://other.test/d/0", 0))["written"] == 1  # another site's budget

    status, doc = await k.queue_state()
    assert status == 200 and doc["discovery"]["spent"] == ["shop.test"]
    assert doc["discovery"]["sites"] == {"shop.test": 3, "other.test": 1} and doc["discovery"]["unrenderedPerSite"] == 3

    k.claims.publish()
    [job] = [j for j in await k.claims.claim(20) if j["url"] == f"{SITE}/d/0" and j["deviceType"] == "desktop"]
    assert (await k.results.process(rendered(job["id"], job["url"]), HTML))["outcome"] == "rendered"
    assert (await k.discover_target(f"{SITE}/d/3", 0))["written"] == 1  # the render made room
    assert (await k.queue_state())[1]["discovery"]["sites"]["shop.test"] == 3


async def test_a_known_url_costs_nothing_even_at_the_ceiling(keepers) -> None:
    k = keepers(cfg=config(bots=BUDGET))
    await k.load()
    await k.targets.put_listed(f"{SITE}/sitemap.xml", [f"{SITE}/listed"], [0], [None])
    assert (await k.discover_target(f"{SITE}/listed", 0)) == {"written": 0, "known": True}
    for i in range(3):
        await k.discover_target(f"{SITE}/d/{i}", 0)
    assert (await k.discover_target(f"{SITE}/listed", 0)) == {"written": 0, "known": True}  # not refused
    assert (await k.discover_target(f"{SITE}/d/1", 0)) == {"written": 0, "known": True}
    assert k.discoveries.unrendered.count("shop.test") == 3 and k.discoveries.unrendered.refused[CEILING] == 0


async def test_a_deleted_target_stops_counting(keepers) -> None:
    k = keepers(cfg=config(bots=BUDGET))
    await k.load()
    for i in range(3):
        await k.discover_target(f"{SITE}/d/{i}", 0)
    await k.targets.delete_targets([f"{SITE}/d/0"])
    assert (await k.discover_target(f"{SITE}/d/3", 0))["written"] == 1  # its rows left: swept


async def test_the_ceiling_holds_across_nodes_whichever_node_the_bot_asked(keepers) -> None:
    a = keepers("node-a", members=TWO, cfg=config(bots={"discovery": {"maxUnrendered": 4}}))
    b = keepers("node-b", members=TWO, cfg=config(bots={"discovery": {"maxUnrendered": 4}}))
    await a.load()
    await b.load()
    owners = Ownership(list(TWO))
    urls = [f"{SITE}/d/{i}" for i in range(40)]
    written = 0
    for i, url in enumerate(urls):  # bots spread over both nodes' ingress: each asks its own keeper
        answer = await (a if i % 2 else b).discover_target(url, 0)
        written += bool(answer.get("written"))
    assert written == 4  # a share of 2 on each owner
    for k in (a, b):
        assert k.discoveries.share == 2 and k.discoveries.unrendered.count("shop.test") == 2
        counted = {u for u in urls if k.discoveries.unrendered.release(u)}
        assert all(owners.owner(u) == k.node for u in counted)  # each counted only what it owns


async def target_of(k, url: str) -> Target:
    [data] = await k.store.get_targets([url])
    assert data is not None, url
    return Target.decode(url, data)


async def test_a_discovered_target_is_marked_until_a_sitemap_or_an_operator_confirms_it(keepers) -> None:
    k = keepers(cfg=config(bots=BUDGET))
    await k.load()
    urls = [f"{SITE}/!d{i}" for i in range(3)]
    for url in urls:
        assert (await k.discover_target(url, 0))["written"] == 1
    assert [(await target_of(k, u)).discovered for u in urls] == [True, True, True]
    # a sitemap walk lists the first: its create finds the target held, then reattaches it (a patch)
    sitemap = f"{SITE}/sitemap.xml"
    held = await k.targets.put_listed(sitemap, [urls[0]], [3_600_000], [None], False, True)
    assert [u for u, _ in held["held"]] == [urls[0]]
    await k.targets.patch_targets([[urls[0], {"sitemap_url": sitemap, "render_interval": 3_600_000}]])
    await k.targets.put_targets([{"url": urls[1]}])  # an operator's PUT /render_targets
    # another URL's redirect onto a tracked target leaves it as it is (a verdict of its own keeps the
    # mark: tests/queue/test_targets.py)
    assert await k.targets.suppress(urls[2], "noindex", 200) == {"held": urls[2]}
    first, second, third = [await target_of(k, u) for u in urls]
    assert first.sitemap_url == sitemap and not first.discovered
    assert not second.discovered and third.discovered and not third.suppressed
    await k.targets.patch_targets([[urls[0], {"sitemap_url": None}]])  # the sitemap dropped it later
    assert not (await target_of(k, urls[0])).discovered  # confirmed once: it stays so


async def test_a_discovery_answered_by_another_nodes_keeper_is_marked_there(keepers) -> None:
    a = keepers("node-a", members=TWO, cfg=config(bots=BUDGET))
    b = keepers("node-b", members=TWO, cfg=config(bots=BUDGET))
    await a.load()
    await b.load()
    owners = Ownership(list(TWO))
    url = next(u for u in (f"{SITE}/!f{i}" for i in range(100)) if owners.owner(u) == "node-b")
    assert (await a.discover_target(url, 0))["written"] == 1  # forwarded to its owner
    assert (await target_of(b, url)).discovered
    # a put for a URL another node owns (a redirect's adoption) carries the mark along too
    other = next(u for u in (f"{SITE}/!g{i}" for i in range(100)) if owners.owner(u) == "node-b")
    await a.targets.put_targets([{"url": other, "discovered": True}])
    assert (await target_of(b, other)).discovered
