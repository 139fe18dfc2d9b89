"""Web Bot Auth on the bot path: the key directory fetched over real HTTP from an agent's site on
127.0.0.1 (``api/bot/key_directory.py``: size cap, deadline, no redirect off the agent's origin, only
for allowed agents), and signed requests through the real middleware, in process over ASGI."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from prerender_ray import metrics
from prerender_ray.api.app import create_asgi
from prerender_ray.api.bot.key_directory import DirectoryFetcher
from prerender_ray.api.bot.replica import close_replica, open_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.config.bots import WebBotAuthConfig
from prerender_ray.config.loading import parse
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.serving.web_bot_auth import DIRECTORY_PATH, DIRECTORY_TYPE, KeyDirectoryError, WebBotAuth
from tests.api.origin_site import JS_PAGE
from tests.serving.test_web_bot_auth import directory, kid, sign
from tests.sitemap_server import SitemapSite

OAI = "Mozilla/5.0 (compatible; OAI-SearchBot/1.0; +https://openai.com/searchbot)"


@pytest.fixture
def agent_site():
    s = SitemapSite()
    yield s
    s.close()


def origin(site: SitemapSite) -> str:
    return f"http://127.0.0.1:{site.port}"


def fetcher(site: SitemapSite, **cfg) -> DirectoryFetcher:
    return DirectoryFetcher(WebBotAuthConfig(agents=[origin(site)], **cfg))


async def test_the_directory_is_fetched_from_the_agents_well_known_path(agent_site) -> None:
    body = directory(Ed25519PrivateKey.generate())
    agent_site.put(DIRECTORY_PATH, body, ctype=DIRECTORY_TYPE)
    f = fetcher(agent_site)
    try:
        assert await f.fetch(origin(agent_site)) == body
        assert agent_site.headers[DIRECTORY_PATH]["accept"].startswith(DIRECTORY_TYPE)
        agent_site.redirect(DIRECTORY_PATH, agent_site.url("/keys.json"))  # within the origin: followed
        agent_site.put("/keys.json", body, ctype="application/json")
        assert await f.fetch(origin(agent_site)) == body
    finally:
        await f.aclose()


def _unbounded(h: BaseHTTPRequestHandler) -> None:
    """A body with no declared length that never ends before the connection closes."""
    h.send_response(200)
    h.send_header("content-type", DIRECTORY_TYPE)
    h.send_header("connection", "close")
    h.end_headers()
    try:
        for _ in range(1024):
            h.wfile.write(b" " * 1024)
    except (BrokenPipeError, ConnectionResetError):
        pass


@pytest.mark.parametrize("case, error", [
    ("declared-too-large", "larger than maxDirectoryBytes"),
    ("streamed-too-large", "larger than maxDirectoryBytes"),
    ("slow", "not read within"),
    ("redirect-off-origin", "redirected off the agent's origin"),
    ("html", "content-type"),
    ("not-found", "answered 404"),
])
async def test_a_bad_directory_is_refused_within_its_bounds(agent_site, case, error) -> None:
    if case == "declared-too-large":
        agent_site.put(DIRECTORY_PATH, b" " * 5000, ctype=DIRECTORY_TYPE)
    elif case == "streamed-too-large":
        agent_site.handle(DIRECTORY_PATH, _unbounded)
    elif case == "slow":
        agent_site.delayed(DIRECTORY_PATH, b"{}", 3.0)
    elif case == "redirect-off-origin":  # another origin (localhost is loopback too: nothing leaves the host)
        agent_site.redirect(DIRECTORY_PATH, agent_site.url("/keys.json", host="localhost"))
        agent_site.put("/keys.json", directory(Ed25519PrivateKey.generate()), ctype=DIRECTORY_TYPE)
    elif case == "html":
        agent_site.put(DIRECTORY_PATH, b"<html>login</html>", ctype="text/html")
    f = fetcher(agent_site, max_directory_bytes=4096, fetch_timeout_ms=300)
    try:
        t0 = time.monotonic()
        with pytest.raises(KeyDirectoryError, match=error):
            await f.fetch(origin(agent_site))
        assert time.monotonic() - t0 < 2.5  # the deadline, not the agent, ends the slow one
    finally:
        await f.aclose()
    assert "/keys.json" not in agent_site.hits


async def test_only_allowed_agents_are_fetched(agent_site) -> None:
    stranger = SitemapSite()
    key = Ed25519PrivateKey.generate()
    for s in (agent_site, stranger):
        s.put(DIRECTORY_PATH, directory(key), ctype=DIRECTORY_TYPE)
    f = fetcher(agent_site)
    wba = WebBotAuth(WebBotAuthConfig(agents=[origin(agent_site)]), f.fetch)
    try:
        now = time.time()
        url = "https://shop.test/p"
        for _ in range(5):
            signed = wba.check("GET", url, sign(key, agent=f'"{origin(stranger)}"', url=url, created=now))
            assert signed is not None and signed.reason == "unknown-agent"
        assert wba.check("GET", url, sign(key, agent=f'"{origin(agent_site)}"', url=url, created=now)).reason == "no-keys"
        await wba.settle()
        assert wba.check("GET", url, sign(key, agent=f'"{origin(agent_site)}"', url=url, created=now)).reason == "verified"
        assert stranger.hits == {} and agent_site.hits == {DIRECTORY_PATH: 1}
    finally:
        wba.close()
        await f.aclose()
        stranger.close()


# ------------------------------------------------------------------------------------ the bot path


async def test_a_signed_request_is_verified_on_the_bot_path(tmp_path, site, agent_site) -> None:
    key, forger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    agent_site.put(DIRECTORY_PATH, directory(key), ctype=DIRECTORY_TYPE)
    agent = f'"{origin(agent_site)}"'
    bots = {"webBotAuth": {"agents": [origin(agent_site)]}, "verify": {"whileUnverified": "failed"},
            "default": {"serve": "origin"}, "classes": {"other": {"serve": "deny"}}}
    cfg = parse({"domains": [f"127.0.0.1:{site.port}"], "server": {"data_dir": str(tmp_path)}, "bots": bots}).config
    ctx = NodeContext(cfg=cfg, node=NodeInfo(name="n1", host="127.0.0.1", port=1, ray_node_id="x"),
                      data_dir=str(tmp_path))
    asgi = create_asgi(ctx)
    services = open_replica(ctx).services
    page = f"{site.base}/page/signed"

    async def get(headers: dict[str, str]) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            return await c.get(f"/p/{page}", headers={**headers, "user-agent": OAI,
                                                      "x-harper-prerender-debug": "1"})

    def counted(outcome: str) -> float:
        services.counters.flush()
        return metrics.bot_signatures.labels(outcome)._value.get()

    try:
        assert services.web_bot_auth is not None
        await services.web_bot_auth.settle()  # the start-up fetch of the allowed agent's directory
        verified, forged = counted("verified"), counted("bad-signature")
        r = await get(sign(key, agent=agent, url=page, created=time.time()))
        assert r.status_code == 200 and r.content == JS_PAGE
        assert (r.headers["x-harper-bot-verification"], r.headers["x-harper-bot-signature"]) == ("verified", "verified")
        assert r.headers["x-harper-bot-class"] == "ai-search"
        r = await get(sign(forger, agent=agent, url=page, created=time.time(), keyid=kid(key)))  # a forged key id
        # never an error page: unverified, served as a claim that is not verified yet (here: failed, denied)
        assert (r.status_code, r.headers["x-harper-bot-signature"]) == (403, "bad-signature")
        assert (r.headers["x-harper-bot-verification"], r.headers["x-harper-bot-class"]) == ("unverified", "other")
        r = await get({})  # unsigned: no method for this bot, as before
        assert (r.status_code, r.headers["x-harper-bot-verification"]) == (200, "unchecked")
        assert "x-harper-bot-signature" not in r.headers
        assert (counted("verified"), counted("bad-signature")) == (verified + 1, forged + 1)
    finally:
        await close_replica(ctx)
