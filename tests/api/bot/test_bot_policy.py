"""Bot policies and verification through the real middleware, in process over ASGI (no Ray): a real
page store in a temp dir, the origin site on 127.0.0.1, a fake resolver (no DNS)."""

from __future__ import annotations

import gzip
import time

import httpx
import pytest

from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.replica import close_replica, open_replica, reconfigure
from prerender_ray.api.context import NodeContext
from prerender_ray.config.loading import parse
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Clock, wrap
from prerender_ray.storage.rocks import PAGES, Store, store_path
from tests.api.origin_site import JS_PAGE

HTML = b"<html><body>" + b"<p>prerendered</p>" * 50 + b"</body></html>"
DEBUG = {"x-harper-prerender-debug": "1"}
GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
UA = {"gptbot": "Mozilla/5.0 (compatible; GPTBot/1.2; +https://openai.com/gptbot)",
      "oai": "Mozilla/5.0 (compatible; OAI-SearchBot/1.0; +https://openai.com/searchbot)",
      "ccbot": "CCBot/2.0 (https://commoncrawl.org/faq/)",
      "twitter": "Twitterbot/1.0", "browser": "Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0"}
# The operator's sentence: prerender for AI search, deny training crawlers, origin for everything else.
OPERATOR = {"default": {"serve": "origin"},
            "classes": {"ai-search": {"serve": "prerender"}, "ai-training": {"serve": "deny"}}}
PEER = "127.0.0.1"  # what httpx's ASGITransport reports as the client


class Resolver:
    """127.0.0.1 is a real Googlebot here, unless ``lie`` (its PTR claims Google, its name resolves elsewhere)."""

    def __init__(self, *, lie: bool = False, real: str = PEER):
        self.asked: list[str] = []
        self.lie = lie
        self.real = real

    async def reverse(self, address: str) -> list[str]:
        self.asked.append(address)
        return ["crawl-1.googlebot.com"] if address == self.real else []

    async def forward(self, host: str) -> list[str]:
        return ["66.249.66.1" if self.lie else self.real]


@pytest.fixture
def make(tmp_path, site):
    primary = Store(store_path(tmp_path, "n1", PAGES))
    now = int(time.time() * 1000)
    key = f"{site.base}/page/cached|desktop"
    page = Page(cache_key=key, status_code=200, content=gzip.compress(HTML), last_cached=now - 5_000,
                expires_at=now + 600_000, headers={"content-type": "text/html", "content-encoding": "gzip"})
    primary.put(key.encode(), wrap(Clock("n1").now(), page.encode()))

    def build(bots: dict, *, resolver: Resolver | None = None, server: dict | None = None):
        cfg = parse({"domains": [f"127.0.0.1:{site.port}"], "server": {"data_dir": str(tmp_path), **(server or {})},
                     "bots": bots}).config
        ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                          data_dir=str(tmp_path), resolver=resolver)
        return create_asgi(ctx), ctx

    yield build  # each test closes its replicas (on its own loop) before this
    primary.close()


async def get(asgi, url: str, ua: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        return await c.get(f"/p/{url}", headers={"user-agent": ua, "accept-encoding": "gzip", **DEBUG, **headers})


def spy_reads(ctx) -> list[str]:
    """Record every cache read of the bot path (the replica's hit path)."""
    state = open_replica(ctx)
    reads: list[str] = []
    look = state.hit.look

    def recording(req, now, *, skip):
        reads.append(req.cache_key)
        return look(req, now, skip=skip)

    state.hit.look = recording  # type: ignore[method-assign]
    return reads


def spy_discovery(ctx) -> list[str]:
    state = open_replica(ctx)
    found: list[str] = []
    state.services.discovery.discover = found.append  # type: ignore[method-assign]
    return found


async def test_prerender_for_ai_search_deny_training_origin_for_the_rest(make, site) -> None:
    asgi, ctx = make(OPERATOR)
    reads = spy_reads(ctx)
    try:
        cached, fresh = f"{site.base}/page/cached", f"{site.base}/page/fresh-1"
        r = await get(asgi, cached, UA["oai"])  # ai-search: the prerendered page
        assert r.status_code == 200 and r.content == HTML and r.headers["x-harper-cache"] == "hit"
        assert (r.headers["x-harper-bot-class"], r.headers["x-harper-bot-policy"]) == ("ai-search", "prerender")
        assert reads == [f"{cached}|desktop"]
        before = len(site.seen)
        for ua in (UA["gptbot"], UA["ccbot"]):  # ai-training: denied, nothing read or fetched
            r = await get(asgi, fresh, ua)
            assert (r.status_code, r.content) == (403, b"Forbidden")
            assert r.headers["x-harper-cache"] == "denied" and r.headers["x-harper-bot-class"] == "ai-training"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            head = await c.head(f"/p/{fresh}", headers={"user-agent": UA["gptbot"]})
            post = await c.post(f"/p/{fresh}", headers={"user-agent": UA["gptbot"]}, content=b"x")
        assert (head.status_code, head.content, head.headers["content-length"]) == (403, b"", "9")
        assert post.status_code == 403  # other methods are denied too, not proxied
        assert len(site.seen) == before and reads == [f"{cached}|desktop"]
        for ua in (GOOGLEBOT, UA["twitter"], UA["browser"]):  # everything else: the origin, cache unread
            r = await get(asgi, cached, ua)
            assert r.status_code == 200 and r.content == JS_PAGE and r.headers["x-harper-cache"] == "policy"
            assert r.headers["x-harper-bot-policy"] == "origin"
        assert reads == [f"{cached}|desktop"] and len(site.seen) == before + 3
    finally:
        await close_replica(ctx)


async def test_the_default_config_prerenders_every_class(make, site) -> None:
    asgi, ctx = make({})
    try:
        for ua in (GOOGLEBOT, *UA.values()):
            r = await get(asgi, f"{site.base}/page/cached", ua)
            assert r.content == HTML and r.headers["x-harper-bot-policy"] == "prerender", ua
    finally:
        await close_replica(ctx)


async def test_discovery_follows_the_policy(make, site) -> None:
    asgi, ctx = make({"named": {"OAI-SearchBot": {"serve": "prerender", "discover": False}},
                      "classes": {"social": {"serve": "origin", "discover": True}}})
    found = spy_discovery(ctx)
    try:
        assert (await get(asgi, f"{site.base}/page/d1", UA["oai"])).content == JS_PAGE
        assert found == []  # a miss of a bot not allowed to discover makes no target
        assert (await get(asgi, f"{site.base}/page/d2", UA["twitter"])).headers["x-harper-cache"] == "policy"
        assert found == [f"{site.base}/page/d2"]  # origin mode may still discover
        assert (await get(asgi, f"{site.base}/page/d3", GOOGLEBOT)).headers["x-harper-cache"] == "miss"
        assert found[-1] == f"{site.base}/page/d3"
    finally:
        await close_replica(ctx)


MARKER = {"harper": "pre-render"}  # the reference's marker for its own test traffic


async def test_the_references_test_marker_lifts_no_policy(make, site) -> None:
    """Before, ``harper: pre-render`` was prerendered and discovered whatever the policy said: anyone
    adding it got pages a deny or requireSignature withheld, and made targets. Now it gets what an
    unidentified client gets, and never discovers."""
    asgi, ctx = make({"default": {"serve": "prerender", "requireSignature": True},
                      "classes": {"other": {"serve": "deny"}}})
    found = spy_discovery(ctx)
    try:
        for ua in (GOOGLEBOT, UA["browser"]):
            r = await get(asgi, f"{site.base}/page/cached", ua, **MARKER)
            assert (r.status_code, r.headers["x-harper-bot-policy"]) == (403, "deny"), ua
        assert found == []
    finally:
        await close_replica(ctx)
    asgi, ctx = make({"default": {"serve": "prerender", "requireSignature": True}, "failedClass": "ai-training",
                      "classes": {"ai-training": {"serve": "deny"}}})
    try:  # other's policy requires a signature: the marker is an unsigned claim
        r = await get(asgi, f"{site.base}/page/cached", UA["browser"], **MARKER)
        assert (r.status_code, r.headers["x-harper-bot-policy-source"]) == (403, "unsigned")
    finally:
        await close_replica(ctx)
    asgi, ctx = make({})  # other is prerendered (and discovers): the marker is prerendered, discovers nothing
    found = spy_discovery(ctx)
    try:
        r = await get(asgi, f"{site.base}/page/cached", UA["browser"], **MARKER)
        assert r.content == HTML and r.headers["x-harper-cache"] == "hit"
        r = await get(asgi, f"{site.base}/page/marked", UA["browser"], **MARKER)
        assert (r.content, r.headers["x-harper-cache"], r.headers["x-harper-bot"]) == (JS_PAGE, "miss", "debug")
        assert found == []  # no target
        await get(asgi, f"{site.base}/page/unmarked", UA["browser"])
        assert found == [f"{site.base}/page/unmarked"]  # where the same client without it discovers
    finally:
        await close_replica(ctx)


async def test_a_deny_status_and_body_are_configurable_and_live(make, site) -> None:
    asgi, ctx = make({"classes": {"ai-training": {"serve": "deny"}}, "denyStatus": 451, "denyBody": "no training"})
    try:
        r = await get(asgi, f"{site.base}/page/cached", UA["gptbot"])
        assert (r.status_code, r.content) == (451, b"no training")
        reconfigure(ctx, parse({"domains": [f"127.0.0.1:{site.port}"], "server": {"data_dir": "x"},
                                "bots": {"classes": {"ai-training": {"serve": "prerender"}}}}).config)
        r = await get(asgi, f"{site.base}/page/cached", UA["gptbot"])
        assert r.status_code == 200 and r.content == HTML  # the new policy, no restart
    finally:
        await close_replica(ctx)


VERIFY = {"verify": {"enabled": True, "deadlineMs": 5000},
          "named": {"Googlebot": {"serve": "prerender"}}, "default": {"serve": "origin"},
          "classes": {"other": {"serve": "deny"}}}


async def test_a_real_googlebot_is_prerendered_and_a_spoofed_one_is_served_as_other(make, site) -> None:
    real = Resolver()
    asgi, ctx = make(VERIFY, resolver=real)
    try:
        r = await get(asgi, f"{site.base}/page/cached", GOOGLEBOT)
        assert r.content == HTML and r.headers["x-harper-bot-verification"] == "verified"
        assert real.asked == [PEER]
        await get(asgi, f"{site.base}/page/cached", GOOGLEBOT)
        assert real.asked == [PEER]  # remembered
    finally:
        await close_replica(ctx)
    for resolver in (Resolver(real="192.0.2.1"), Resolver(lie=True)):  # no PTR for us, or a PTR that lies
        asgi, ctx = make(VERIFY, resolver=resolver)
        try:
            r = await get(asgi, f"{site.base}/page/cached", GOOGLEBOT)
            assert (r.status_code, r.headers["x-harper-bot-verification"]) == (403, "failed")
            assert r.headers["x-harper-bot-class"] == "other"
        finally:
            await close_replica(ctx)


async def test_a_claim_that_is_not_verified_is_served_as_before_and_never_discovers(make, site) -> None:
    """The issue's flood: a Googlebot User-Agent from an address that fails verification, served as
    class `other`, which discovers. It gets the origin's page as before and makes no target; a claim
    still unverified (its lookup hangs) is served as claimed and makes none either."""
    import asyncio

    from prerender_ray import metrics

    class Hanging(Resolver):
        async def reverse(self, address: str) -> list[str]:
            await asyncio.sleep(3600)
            return []

    bots = {"verify": {"enabled": True, "deadlineMs": 5000}, "classes": {"other": {"serve": "prerender"}}}
    for resolver, state in ((Resolver(lie=True), "failed"), (Hanging(), "unverified")):
        if state == "unverified":
            bots = {**bots, "verify": {"enabled": True, "deadlineMs": 20}}
        asgi, ctx = make(bots, resolver=resolver)
        found = spy_discovery(ctx)
        try:
            r = await get(asgi, f"{site.base}/page/spoofed-{state}", GOOGLEBOT)
            assert (r.status_code, r.content, r.headers["x-harper-cache"]) == (200, JS_PAGE, "miss")
            assert r.headers["x-harper-bot-verification"] == state and found == []
            counters = open_replica(ctx).services.counters
            assert counters._pending[(metrics.discovery_refused, (f"{state}-claim",))] == 1
            r = await get(asgi, f"{site.base}/page/believed-{state}", UA["twitter"])  # no method: unchecked
            assert r.content == JS_PAGE and found == [f"{site.base}/page/believed-{state}"]
        finally:
            await close_replica(ctx)


async def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(make, site) -> None:
    resolver = Resolver(real="66.249.66.1")
    asgi, ctx = make(VERIFY, resolver=resolver)
    try:
        r = await get(asgi, f"{site.base}/page/cached", GOOGLEBOT, **{"x-forwarded-for": "66.249.66.1"})
        assert r.status_code == 403 and resolver.asked == [PEER]  # the socket peer was checked
    finally:
        await close_replica(ctx)
    resolver = Resolver(real="66.249.66.1")
    asgi, ctx = make(VERIFY, resolver=resolver, server={"trustedProxies": ["127.0.0.1"]})
    try:
        r = await get(asgi, f"{site.base}/page/cached", GOOGLEBOT, **{"x-forwarded-for": "66.249.66.1"})
        assert r.content == HTML and resolver.asked == ["66.249.66.1"]
    finally:
        await close_replica(ctx)


async def test_a_resolver_that_hangs_never_holds_the_request(make, site) -> None:
    import asyncio

    class Hanging(Resolver):
        async def reverse(self, address: str) -> list[str]:
            await asyncio.sleep(3600)
            return []

    asgi, ctx = make({**VERIFY, "verify": {"enabled": True, "deadlineMs": 20}}, resolver=Hanging())
    try:
        r = await get(asgi, f"{site.base}/page/cached", GOOGLEBOT)
        # unverified-for-now is served as claimed (whileUnverified: claimed)
        assert r.content == HTML and r.headers["x-harper-bot-verification"] == "unverified"
    finally:
        await close_replica(ctx)


async def test_serves_are_counted_per_class_and_missed_urls_are_an_admin_report(make, site) -> None:
    from prerender_ray import metrics

    asgi, ctx = make(OPERATOR)
    try:
        await get(asgi, f"{site.base}/page/cached", UA["oai"])
        await get(asgi, f"{site.base}/page/wanted", UA["oai"])
        await get(asgi, f"{site.base}/page/wanted", UA["oai"])
        await get(asgi, f"{site.base}/page/cached", UA["gptbot"])
        counters = open_replica(ctx).services.counters
        pending = {labels: n for (metric, labels), n in counters._pending.items() if metric is metrics.bot_class_serves}
        assert pending == {("ai-search", "unchecked", "none", "prerender", "hit"): 1,
                           ("ai-search", "unchecked", "none", "prerender", "miss"): 2,
                           ("ai-training", "unchecked", "none", "deny", "denied"): 1}
        ages = {labels: v for (metric, labels), v in counters._observed.items() if metric is metrics.bot_page_age_seconds}
        assert list(ages) == [("ai-search", "OAI-SearchBot")] and 4 <= ages[("ai-search", "OAI-SearchBot")][0] < 60
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://localhost") as c:
            doc = (await c.get("/prerender_admin/bots", params={"limit": 5})).json()
            bad = await c.get("/prerender_admin/bots", params={"limit": "lots"})
        assert bad.status_code == 400
        assert doc["missed"] == {"ai-search": [{"url": f"{site.base}/page/wanted", "count": 2, "firstMs": doc[
            "missed"]["ai-search"][0]["firstMs"], "lastMs": doc["missed"]["ai-search"][0]["lastMs"],
            "lastBot": "OAI-SearchBot"}]}
        assert doc["policies"]["classes"]["ai-training"]["serve"] == "deny"
        ai = doc["classes"]["ai-search"]  # per class: serves by verification and method, misses, Markdown
        assert (ai["serves"], ai["misses"], ai["markdown"]) == (3, 2, 0)
        assert (ai["verification"]["unchecked"], ai["method"]["none"]) == (3, 3)
        assert set(ai["outcomes"]) == {"signature", "dns", "ranges"} and doc["classes"]["ai-training"]["serves"] == 1
        assert doc["policies"]["classes"]["search"]["serve"] == "origin"  # not named: the default
    finally:
        await close_replica(ctx)
