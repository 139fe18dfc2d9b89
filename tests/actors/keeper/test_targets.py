"""The keeper's target writes without Ray: new pages first, and a sitemap's lastmod making stale pages
due (docs/queue.md#first-render, docs/sitemaps.md#lastmod)."""

from __future__ import annotations

from prerender_ray.identity.nodes import Ownership
from prerender_ray.queue.targets import paced_due
from prerender_ray.storage.pages import Page
from prerender_ray.storage.registry import Target
from prerender_ray.timeutil import DAY_MS, HOUR_MS, minute, now_ms
from tests.actors.keeper.conftest import SITE, config
from tests.actors.keeper.test_claims import put_due


async def test_a_new_target_is_claimable_at_once_behind_older_overdue_work(keepers) -> None:
    k = keepers()
    await k.load()
    overdue = await put_due(k, "/old/1", "/old/2", due=minute(now_ms()) - HOUR_MS)
    await k.targets.put_targets([{"url": SITE + "/new"}])
    assert all(k.rows.row(key).next_render_time <= now_ms() for key in k.conf.rules.keys_of(SITE + "/new"))
    k.claims.publish()
    order = [j["url"] for j in await k.claims.claim(10)]
    assert order == [u for u in overdue for _ in range(2)] + [SITE + "/new"] * 2  # the older work first


async def test_a_re_put_of_a_target_does_not_make_it_due_again(keepers) -> None:
    k = keepers()
    await k.load()
    [url] = await put_due(k, "/p", due=now_ms() + 30 * DAY_MS)
    await k.targets.put_targets([{"url": url}])
    dues = {k.rows.row(key).next_render_time for key in k.conf.rules.keys_of(url)}
    assert len(dues) == 1 and minute(now_ms()) < dues.pop() < now_ms() + DAY_MS  # its staggered slot


async def test_staggered_first_renders_are_spread_over_the_cadence(keepers) -> None:
    k = keepers(cfg=config(render={"firstRender": "staggered"}))
    await k.load()
    await k.targets.put_targets([{"url": f"{SITE}/p/{i}"} for i in range(40)])
    dues = {k.rows.row(f"{SITE}/p/{i}|desktop").next_render_time for i in range(40)}
    assert len(dues) > 30 and min(dues) >= minute(now_ms())


def stored_page(k, key: str, at: int) -> None:
    page = Page(cache_key=key, status_code=200, headers={"content-type": "text/html"}, content=b"<html>x</html>",
                last_cached=at, expires_at=at + DAY_MS, is_indexable=True)
    k.store.pages[key.encode()] = page.encode()


async def test_a_lastmod_newer_than_a_page_makes_it_due_paced_and_is_counted(keepers) -> None:
    k = keepers()
    await k.load()
    later = now_ms() + 20 * DAY_MS
    stale, fresh, unrendered = await put_due(k, "/stale", "/fresh", "/unrendered", due=later)
    lastmod = now_ms() - HOUR_MS
    for key in k.conf.rules.keys_of(stale):
        stored_page(k, key, lastmod - 1)
    for key in k.conf.rules.keys_of(fresh):
        stored_page(k, key, lastmod + 1)
    now = now_ms()
    answer = await k.targets.lastmod_due([stale, fresh, unrendered, SITE + "/no-target"], [lastmod] * 4, HOUR_MS)
    assert answer == {"due": 1, "rows": 2}
    for key in k.conf.rules.keys_of(stale):
        assert k.rows.row(key).next_render_time in {paced_due(key, now, HOUR_MS), paced_due(key, now_ms(), HOUR_MS)}
    assert all(k.rows.row(key).next_render_time == later
               for url in (fresh, unrendered) for key in k.conf.rules.keys_of(url))
    again = await k.targets.lastmod_due([stale], [lastmod], HOUR_MS)
    assert again == {"due": 0, "rows": 0}  # due within the window already: never delayed or rewritten


async def test_a_patch_never_brings_back_a_target_deleted_after_it_was_read(keepers, monkeypatch) -> None:
    """A sitemap walk patches targets it saw seconds before; a redirect's result may have retired one
    meanwhile. Deleted between the patch's read and its write: it stays deleted. Written meanwhile:
    read and patched again, the other write kept."""
    k = keepers()
    await k.load()
    gone, moved = SITE + "/retired", SITE + "/rewritten"
    await k.targets.put_targets([{"url": gone}, {"url": moved}])
    read = k.store.get_targets
    calls = 0

    async def racing(urls: list[str]) -> list:
        nonlocal calls
        found = await read(urls)
        calls += 1
        if calls == 1:  # between the read and the write: a delete, and another writer's change
            await k.targets.delete_targets([gone])
            await k.targets.put_targets([{"url": moved, "renderInterval": 7 * DAY_MS}])
        return found

    monkeypatch.setattr(k.store, "get_targets", racing)
    answer = await k.targets.patch_targets([[gone, {"sitemap_url": SITE + "/s.xml"}],
                                            [moved, {"sitemap_url": SITE + "/s.xml"}]])
    assert answer == {"patched": 1}
    [left, kept] = await read([gone, moved])
    assert left is None
    target = Target.decode(moved, kept)
    assert (target.sitemap_url, target.render_interval) == (SITE + "/s.xml", 7 * DAY_MS)


async def test_listed_urls_sent_to_a_node_that_does_not_own_them_are_created_only_on_their_owner(keepers) -> None:
    """A sitemap walk whose membership lagged sends node-a URLs that node-b owns, create-only: node-a
    forwards them with that condition, so node-b creates the absent ones and hands back the one it
    holds with its render clock kept; node-a keeps no row of them."""
    two = ("node-a", "node-b")
    a, b = keepers("node-a", members=two), keepers("node-b", members=two)
    await a.load()
    await b.load()
    on_b = [u for u in (f"{SITE}/l/{i}" for i in range(40)) if Ownership(list(two)).owner(u) == "node-b"][:4]
    [held] = await put_due(b, on_b[0].removeprefix(SITE), due=now_ms() + 30 * DAY_MS)
    dues = {key: b.rows.row(key).next_render_time for key in b.conf.rules.keys_of(held)}
    answer = await a.targets.put_listed(f"{SITE}/sitemap.xml", on_b, [DAY_MS] * 4, [None] * 4, False, True)
    assert answer["written"] == 3 and [u for u, _ in answer["held"]] == [held]
    keys = [key for u in on_b for key in b.conf.rules.keys_of(u)]
    assert [key for key in keys if b.rows.row(key) is None] == [] and [key for key in keys if a.rows.row(key)] == []
    assert {key: b.rows.row(key).next_render_time for key in dues} == dues
