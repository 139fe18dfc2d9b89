"""The admin API's pure parts and the schedule proxy against fake peers (the outside world: a peer
that hangs, answers garbage, errors or is gone). No Ray."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from prerender_ray.admin.explain import Explainer
from prerender_ray.admin.fanout import merge_missed, sum_documents
from prerender_ray.admin.sessions import (
    ADDRESS_FACTOR,
    Cursors,
    LoginLimiter,
    SessionTokens,
    Signer,
    SignInLimiter,
    TokenError,
    client_key,
    derive_key,
)
from prerender_ray.api.admin.common import HeavySlots
from prerender_ray.api.admin.explain import fetch_schedule_from_peer, forwardable
from prerender_ray.config.model import Config
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.identity.urls import UrlError
from tests.support import brotli_bomb

SECRET = "a-test-secret-of-some-length"
T0 = 1_800_000_000_000


# ------------------------------------------------------------------------------------------ tokens


def test_a_session_token_round_trips_and_expires() -> None:
    tokens = SessionTokens(SECRET, 60_000)
    token, claims = tokens.issue("ops", T0, "sid-1")
    assert tokens.verify(token, T0 + 59_999) == claims
    assert claims.expires_at == T0 + 60_000
    with pytest.raises(TokenError, match="expired"):
        tokens.verify(token, T0 + 60_000)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # signature changed
        lambda t: "eyJzdWIiOiJhZG1pbiJ9" + t[t.index(".") :],  # payload swapped
        lambda t: t.replace(".", ""),  # no separator
        lambda t: t + ".x",  # extra part
        lambda t: "",
        lambda t: "not a token at all",
        lambda t: "%%%.%%%",
        lambda t: "A" * 5000,
    ],
)
def test_a_tampered_or_foreign_token_is_refused(mangle) -> None:
    tokens = SessionTokens(SECRET, 60_000)
    token, _ = tokens.issue("ops", T0, "sid-1")
    with pytest.raises(TokenError):
        tokens.verify(mangle(token), T0)


def test_a_token_of_another_deployment_or_purpose_is_refused() -> None:
    token, _ = SessionTokens("another-secret-entirely", 60_000).issue("ops", T0, "s")
    with pytest.raises(TokenError, match="signature"):
        SessionTokens(SECRET, 60_000).verify(token, T0)
    cursor = Cursors(SECRET).issue("pages", "k")
    with pytest.raises(TokenError):  # a cursor is not a session, though both come from one secret
        SessionTokens(SECRET, 60_000).verify(cursor, T0)
    signed_but_incomplete = Signer(derive_key(SECRET, "admin-session/v1")).seal({"sub": "ops"})
    with pytest.raises(TokenError, match="incomplete"):
        SessionTokens(SECRET, 60_000).verify(signed_but_incomplete, T0)


def test_a_token_is_bound_to_a_fingerprint_of_its_users_password_hash() -> None:
    tokens = SessionTokens(SECRET, 60_000)
    token, claims = tokens.issue("ops", T0, "sid-1", "pbkdf2_sha256$1000$c2FsdA==$b2xk")
    assert tokens.verify(token, T0) == claims
    assert tokens.same_password(claims, "pbkdf2_sha256$1000$c2FsdA==$b2xk")
    assert not tokens.same_password(claims, "pbkdf2_sha256$1000$c2FsdA==$bmV3")  # a new password
    assert not SessionTokens("another-secret-entirely", 60_000).same_password(claims, "pbkdf2_sha256$1000$c2FsdA==$b2xk")
    payload = base64.urlsafe_b64decode(token.split(".")[0] + "==").decode()
    assert "b2xk" not in payload and "pbkdf2" not in payload  # the token shows no part of the hash
    older = Signer(derive_key(SECRET, "admin-session/v1")).seal(
        {"sid": "s", "sub": "ops", "iat": T0, "exp": T0 + 60_000})  # issued before tokens had one
    assert not tokens.same_password(tokens.verify(older, T0), "pbkdf2_sha256$1000$c2FsdA==$b2xk")


def test_cursors_are_bound_to_their_listing() -> None:
    cursors = Cursors(SECRET)
    c = cursors.issue("pages\x00https://a/", "https://a/x|desktop")
    assert cursors.read(c, "pages\x00https://a/") == "https://a/x|desktop"
    with pytest.raises(TokenError, match="another list"):
        cursors.read(c, "pages\x00https://b/")
    with pytest.raises(TokenError):
        cursors.read("eyJzIjoicGFnZXMiLCJwIjoiIn0.AAAA", "pages")  # never issued
    with pytest.raises(TokenError):
        Cursors("other-secret-of-enough-length").read(c, "pages\x00https://a/")


def test_failed_logins_are_bounded_per_client_and_window() -> None:
    lim = LoginLimiter(3, window_ms=60_000, max_clients=2)
    for i in range(3):
        assert lim.retry_after_ms("10.0.0.1", T0 + i) is None
        lim.failed("10.0.0.1", T0 + i)
    assert lim.retry_after_ms("10.0.0.1", T0 + 10) == 60_000 - 10
    assert lim.retry_after_ms("10.0.0.2", T0 + 10) is None  # another client is not affected
    assert lim.retry_after_ms("10.0.0.1", T0 + 60_001) is None  # the oldest failure aged out
    lim.failed("10.0.0.2", T0)
    lim.failed("10.0.0.3", T0)
    assert len(lim) == 2  # memory is bounded: the least recent client is forgotten


def test_one_accounts_failures_lock_that_account_only_and_the_address_has_a_looser_cap() -> None:
    lim = SignInLimiter(3, window_ms=60_000)
    for i in range(3):
        assert lim.retry_after_ms("10.0.0.1", "renderer", T0 + i) is None
        lim.failed("10.0.0.1", "renderer", T0 + i)
    assert lim.retry_after_ms("10.0.0.1", "renderer", T0 + 10) == (60_000 - 10, "account")
    assert lim.retry_after_ms("10.0.0.1", "ops", T0 + 10) is None  # the admins behind the same address
    assert lim.retry_after_ms("10.0.0.2", "renderer", T0 + 10) is None
    # guessing across account names from one address stops at ADDRESS_FACTOR x the limit
    for i in range(3 * ADDRESS_FACTOR - 3):
        lim.failed("10.0.0.1", f"guess{i}", T0 + 20)
    assert lim.retry_after_ms("10.0.0.1", "ops", T0 + 30) == (60_000 - 30, "address")
    assert lim.retry_after_ms("10.0.0.2", "ops", T0 + 30) is None
    lim.failed("10.0.0.3", "x" * 10_000, T0)  # an account name is cut before it is kept
    assert lim.retry_after_ms("10.0.0.3", "x" * 10_000, T0) is None


def test_a_failure_counted_before_its_check_is_taken_back_when_the_check_passes() -> None:
    lim = SignInLimiter(3, window_ms=60_000)
    for i in range(3):
        lim.failed("10.0.0.1", "ops", T0 + i)
    assert lim.retry_after_ms("10.0.0.1", "ops", T0 + 3) == (60_000 - 3, "account")
    lim.forgive("10.0.0.1", "ops", T0 + 1)
    assert lim.retry_after_ms("10.0.0.1", "ops", T0 + 3) is None
    lim.forgive("10.0.0.1", "ops", T0 + 1)  # twice, or never counted: nothing more is taken back
    lim.forgive("10.0.0.9", "ops", T0)
    lim.failed("10.0.0.1", "ops", T0 + 4)
    assert lim.retry_after_ms("10.0.0.1", "ops", T0 + 5) == (60_000 - 5, "account")
    for at in (T0, T0 + 2, T0 + 4):
        lim.forgive("10.0.0.1", "ops", at)
    assert len(lim.pairs) == len(lim.addresses) == 0  # nothing is kept for a client without failures


def test_an_ipv6_client_is_keyed_by_its_64_and_an_ipv4_one_by_its_address() -> None:
    assert client_key("203.0.113.9") == "203.0.113.9"
    assert client_key("::ffff:203.0.113.9") == "203.0.113.9"  # IPv4-mapped: the IPv4 client it is
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert client_key("unknown") == "unknown"


def test_rotating_ipv6_addresses_within_one_64_buys_no_fresh_attempts() -> None:
    """Before: the full address was the key, and a host may use any address of its /64 (2^64 of
    them): 1,000 guesses at one account in one second."""
    lim = SignInLimiter(3, window_ms=60_000)
    for i in range(3):
        assert lim.retry_after_ms(f"2001:db8:1:2::{i + 1:x}", "ops", T0 + i) is None
        lim.failed(f"2001:db8:1:2::{i + 1:x}", "ops", T0 + i)
    assert lim.retry_after_ms("2001:db8:1:2:dead:beef::9", "ops", T0 + 10) == (60_000 - 10, "account")
    for i in range(3 * ADDRESS_FACTOR):  # across account names too
        lim.failed(f"2001:db8:1:2::{i + 100:x}", f"guess{i}", T0 + 20)
    assert lim.retry_after_ms("2001:db8:1:2::abcd", "watcher", T0 + 30) == (60_000 - 10, "address")
    assert lim.retry_after_ms("2001:db8:1:3::1", "ops", T0 + 30) is None  # another /64 is not affected
    lim.forgive("2001:db8:1:2::1", "ops", T0)  # a right password from another address of the /64
    assert lim.pairs.retry_after_ms(("2001:db8:1:2::/64", "ops"), T0 + 30) is None
    ipv4 = SignInLimiter(1, window_ms=60_000)
    ipv4.failed("::ffff:203.0.113.9", "ops", T0)
    assert ipv4.retry_after_ms("203.0.113.9", "ops", T0) == (60_000, "account")
    assert ipv4.retry_after_ms("203.0.113.10", "ops", T0) is None  # IPv4 keys on the whole address


def test_failures_from_many_other_clients_do_not_erase_a_lockout() -> None:
    """Before: past ``max_clients`` the least recently failing client was forgotten, lockout or not,
    so failures from 10,000 other addresses gave a locked-out one its guesses back."""
    lim = LoginLimiter(3, window_ms=60_000, max_clients=4)
    for i in range(3):
        lim.failed("10.0.0.1", T0 + i)
    for i in range(100):  # one failure each: none is locked out
        lim.failed(f"10.1.0.{i}", T0 + 10 + i)
    assert len(lim) == 4
    assert lim.retry_after_ms("10.0.0.1", T0 + 200) == 60_000 - 200
    assert lim.retry_after_ms("10.1.0.99", T0 + 200) is None and "10.1.0.99" in lim._fails  # counted
    for client in ("10.2.0.1", "10.2.0.2", "10.2.0.3", "10.2.0.4"):  # only locked-out clients left
        for i in range(3):
            lim.failed(client, T0 + 300 + i)
    assert len(lim) == 4  # the bound still holds: one of the older lockouts went
    assert lim.retry_after_ms("10.2.0.4", T0 + 400) is not None  # and the newest client is counted


# ----------------------------------------------------------------------------------------- explain


def test_the_explainer_in_prefix_mode() -> None:
    x = Explainer(Config.model_validate({"domains": ["shop.test"]})).explain(
        "HTTPS://Shop.Test/a/b/?utm=1&page=2#frag", "Mobile"
    )
    assert x["resolved"] == {
        "deviceType": "mobile",
        "deviceTypeFellBack": False,
        "hostname": "shop.test",
        "canonicalUrl": "https://shop.test/a/b?page=2",
        "cacheKey": "https://shop.test/a/b?page=2|mobile",
    }
    assert x["allowlist"] == {"used": ["page"], "source": "cacheKey.queryParams"}
    assert x["underGlobalAllowlist"]["differs"] is False
    assert x["eligibility"] == {
        "prerendered": True,
        "excludedByPattern": None,
        "domainAllowed": True,
        "domains": ["shop.test"],
    }
    other = Explainer(Config.model_validate({"domains": ["shop.test"]})).explain(
        "https://else.test/search/x", "watch"
    )
    assert other["resolved"]["deviceType"] == "desktop" and other["resolved"]["deviceTypeFellBack"] is True
    assert other["eligibility"]["excludedByPattern"] == "/search/"
    assert other["eligibility"]["prerendered"] is False and other["eligibility"]["domainAllowed"] is False
    on_port = Explainer(Config.model_validate({"domains": ["shop.test"]})).explain("http://shop.test:8080/a")
    assert on_port["eligibility"]["domainAllowed"] is False  # `shop.test` allows the default port only


def test_the_explainer_in_forwarded_mode_shows_a_route_allowlist_that_differs() -> None:
    cfg = Config.model_validate(
        {
            "ingress": {
                "mode": "forwarded",
                "routes": [{"match": "prefix", "path": "/p/", "queryParams": ["color"]}],
            }
        }
    )
    x = Explainer(cfg).explain("https://shop.test/p/1?color=red&page=3", None)
    assert x["ingress"]["routeClass"] == "prerender" and x["ingress"]["route"]["path"] == "/p/"
    assert x["allowlist"] == {"used": ["color"], "source": "ingress.routes[0].queryParams"}
    assert x["resolved"]["canonicalUrl"] == "https://shop.test/p/1?color=red"
    assert x["underGlobalAllowlist"]["canonicalUrl"] == "https://shop.test/p/1?page=3"
    assert x["underGlobalAllowlist"]["differs"] is True
    un = Explainer(cfg).explain("https://shop.test/about?x=1", None)
    assert un["ingress"]["routeClass"] == "unclassified" and un["allowlist"]["used"] == ["*"]


@pytest.mark.parametrize("bad", ["not a url", "/relative", "ftp://x.test/", "https://", "http://a b/"])
def test_the_explainer_refuses_what_is_not_an_absolute_http_url(bad) -> None:
    with pytest.raises(UrlError):
        Explainer(Config()).explain(bad)


def test_cluster_sums_add_counts_and_series_but_not_times() -> None:
    a = {
        "now": {"due": 2, "status": "queued", "leased": 1},
        "coming": {"byHour": [1, 2, 3], "next24h": 6},
        "dueHistogram": {"binMs": 3_600_000, "fromMs": 5, "bins": [1, 1]},
        "flag": True,
    }
    b = {
        "now": {"due": 3, "status": "empty"},
        "coming": {"byHour": [1, 1, 1, 4], "next24h": 7},
        "dueHistogram": {"binMs": 3_600_000, "fromMs": 9, "bins": [0, 2]},
    }
    s = sum_documents([a, b])
    assert s["now"] == {"due": 5, "leased": 1}
    assert s["coming"] == {"byHour": [2, 3, 4, 4], "next24h": 13}
    assert s["dueHistogram"] == {"binMs": 3_600_000, "fromMs": 5, "bins": [1, 3]}
    assert "flag" not in s


def test_missed_urls_of_every_replica_merge_into_one_tally() -> None:
    def row(url: str, count: int, first: int, last: int, bot: str) -> dict:
        return {"url": url, "count": count, "firstMs": first, "lastMs": last, "lastBot": bot}

    a = {"search": [row("/x", 3, 10, 50, "Googlebot"), row("/y", 1, 20, 20, "Bingbot")]}
    b = {"search": [row("/x", 2, 5, 60, "Bingbot"), row("/z", 4, 30, 40, "Googlebot")],
         "social": [row("/s", 1, 1, 1, "facebookexternalhit")]}
    merged = merge_missed([a, b, {}], 2)
    assert merged == {"search": [row("/x", 5, 5, 60, "Bingbot"), row("/z", 4, 30, 40, "Googlebot")],
                      "social": [row("/s", 1, 1, 1, "facebookexternalhit")]}
    assert a["search"][0]["count"] == 3  # the inputs are left as they were


async def test_heavy_slots_refuse_the_third_and_free_on_error() -> None:
    from fastapi import HTTPException

    slots = HeavySlots(2)
    async with slots.slot(), slots.slot():
        with pytest.raises(HTTPException) as e:
            async with slots.slot():
                pass
        assert e.value.status_code == 429 and e.value.headers["Retry-After"] == "1"
    with pytest.raises(RuntimeError):
        async with slots.slot():
            raise RuntimeError("boom")
    assert slots.in_use == 0


# ------------------------------------------------------------------------------ the schedule proxy


class FakePeer:
    """A raw TCP peer: answers each request with ``reply`` (bytes), or never answers."""

    def __init__(self, reply: bytes | None):
        self.reply = reply
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None
        self.tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> FakePeer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for t in self.tasks:
            t.cancel()

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.tasks.add(asyncio.current_task())
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = [
                int(ln.split(b":")[1])
                for ln in head.split(b"\r\n")
                if ln.lower().startswith(b"content-length")
            ]
            body = await reader.readexactly(length[0]) if length else b""
            self.requests.append(head + body)
            if self.reply is None:
                await asyncio.sleep(3600)  # a peer that hangs
            writer.write(self.reply)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def http(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


KEY = "https://shop.test/a|desktop"
CREDS = {"authorization": "Basic b3BzOnB3"}


async def ask(
    port: int,
    *,
    owner: str = "node-b",
    creds: dict | None = None,
    timeout: float = 0.5,
    open_cluster: bool = False,
) -> dict:
    peers = {"node-a": NodeInfo("node-a", "127.0.0.1", 1), "Node-B": NodeInfo("Node-B", "127.0.0.1", port)}
    async with httpx.AsyncClient(trust_env=False) as client:
        return await asyncio.wait_for(
            fetch_schedule_from_peer(
                client,
                peers,
                owner,
                KEY,
                CREDS if creds is None else creds,
                timeout,
                open_cluster=open_cluster,
            ),
            60,
        )


async def test_the_proxy_reads_the_owners_row_with_the_callers_credentials_only() -> None:
    row = {"cacheKey": KEY, "nextRenderTime": 123}
    async with FakePeer(http(200, json.dumps({"node": "node-b", "renderSchedule": row}).encode())) as peer:
        got = await ask(peer.port)
    assert got["row"] == row and got["node"] == "node-b"
    sent = peer.requests[0].decode()
    assert sent.startswith("POST /prerender_admin/schedule ")
    assert "\r\nauthorization: basic b3bzonb3\r\n" in sent.lower()
    assert "cookie" not in sent.lower()
    assert "\r\naccept-encoding: identity\r\n" in sent.lower()
    assert json.loads(sent.split("\r\n\r\n", 1)[1]) == {"cacheKey": KEY}
    async with FakePeer(http(200, b'{"node": "node-b", "renderSchedule": null}')) as peer:
        assert (await ask(peer.port))["row"] is None  # an authoritative "no row"


@pytest.mark.parametrize(
    "reply, error",
    [
        (None, "peer timed out"),
        (http(200, b"<html>surprise</html>", "text/html"), "peer answered garbage: not JSON"),
        (http(200, b'["a list"]'), "peer answered garbage: no renderSchedule"),
        (
            http(200, b'{"renderSchedule": {"cacheKey": "https://other.test/|desktop"}}'),
            "peer answered garbage: renderSchedule is not a row for this key",
        ),
        (
            http(200, b'{"renderSchedule": 5}'),
            "peer answered garbage: renderSchedule is not a row for this key",
        ),
        (http(401, b'{"error": "Authentication required"}'), "peer responded 401"),
        (http(302, b""), "peer responded 302"),
        (http(200, b'{"renderSchedule": null, "pad": "' + b"x" * 300_000 + b'"}'), "peer answered more than"),
        (b"this is not HTTP at all\r\n\r\n", "peer fetch failed"),
        # a 64 MiB brotli bomb is read as the bytes it is, never inflated
        (http(200, brotli_bomb(64)).replace(b"\r\n\r\n", b"\r\ncontent-encoding: br\r\n\r\n", 1),
         "peer answered garbage: not JSON"),
    ],
)
async def test_a_peer_that_hangs_or_answers_garbage_costs_one_field(reply, error) -> None:
    async with FakePeer(reply) as peer:
        got = await ask(peer.port, timeout=0.5)
    assert "row" not in got and got["error"].startswith(error), got


async def test_a_peer_that_is_gone_or_unknown_or_without_credentials() -> None:
    async with FakePeer(None) as peer:
        port = peer.port
    gone = await ask(port)  # nothing listens there any more
    assert gone["error"].startswith("peer fetch failed: ConnectError"), gone
    assert await ask(port, owner="node-z") == {"error": 'unknown node "node-z"'}
    async with FakePeer(http(200, b'{"renderSchedule": null}')) as peer:
        assert await ask(peer.port, creds={}) == {"error": "no forwardable credentials on this request"}
        assert peer.requests == []
        assert (await ask(peer.port, creds={}, open_cluster=True))["row"] is None


async def test_the_schedule_proxy_client_keeps_no_cookie(tmp_path) -> None:
    from prerender_ray.api.admin.explain import _client
    from prerender_ray.api.context import NodeContext
    from prerender_ray.serving.origin_policy import NoCookies

    ctx = NodeContext(cfg=Config(), node=NodeInfo("n1", "127.0.0.1", 1), data_dir=str(tmp_path))
    client = _client(ctx)
    assert isinstance(client.cookies.jar, NoCookies)  # only the caller's own credentials are sent
    await client.aclose()


def test_only_credentials_are_forwarded() -> None:
    headers = httpx.Headers(
        {
            "authorization": "Bearer t",
            "cookie": "a=1; prerender_session=tok; b=2",
            "x-forwarded-for": "1.2.3.4",
            "host": "evil.test",
        }
    )
    assert forwardable(headers) == {"authorization": "Bearer t", "cookie": "prerender_session=tok"}
    assert forwardable(httpx.Headers({"cookie": "other=1"})) == {}


# ------------------------------------------------------------------ the app without Ray (no actors)


@contextlib.asynccontextmanager
async def app_for(config: dict) -> AsyncIterator[httpx.AsyncClient]:
    """The real app of one replica, with no actors behind it (none of these routes reach one)."""
    from prerender_ray.api.app import create_app
    from prerender_ray.api.bot.replica import close_replica
    from prerender_ray.api.context import NodeContext

    cfg = Config.model_validate(config)
    ctx = NodeContext(cfg=cfg, node=NodeInfo("node-a", "127.0.0.1", 1), data_dir="/nonexistent")
    app = create_app(ctx)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        yield client
    await close_replica(ctx)
    app.state.sessions.close()


async def test_with_management_off_every_admin_route_is_404() -> None:
    async with app_for({"management": {"enabled": False}}) as c:
        for method, path in (
            ("GET", "/prerender_admin/"),
            ("GET", "/prerender_admin"),
            ("GET", "/prerender_admin/session"),
            ("POST", "/prerender_admin/login"),
            ("GET", "/prerender_admin/overview"),
            ("GET", "/prerender_admin/static/console.js"),
            ("GET", "/prerender_admin/nothing"),
        ):
            r = await c.request(method, path, json={})
            assert r.status_code == 404 and r.json() == {"error": "Management API is disabled"}, path
            assert r.headers["cache-control"] == "no-store"
            assert r.headers["x-content-type-options"] == "nosniff"


async def test_without_users_loopback_is_admin_and_login_says_why_not() -> None:
    async with app_for({}) as c:
        s = (await c.get("/prerender_admin/session")).json()
        assert s["authenticated"] and s["via"] == "loopback" and s["sessionsEnabled"] is False
        r = await c.post("/prerender_admin/login", json={"username": "a", "password": "b"})
        assert r.status_code == 501 and "auth.users" in r.json()["error"]
        r = await c.get("/prerender_admin/config")
        assert r.status_code == 200 and r.json()["config"]["auth"]["session_secret"] == "<empty>"


async def test_loopback_behind_a_proxy_we_were_not_told_of_is_not_trusted() -> None:
    """With no users, loopback callers are admins: a local reverse proxy relaying a remote client
    (it says so in X-Forwarded-For) must not make that client one, unless it is a trusted proxy
    vouching for a loopback client."""
    async def who(c: httpx.AsyncClient, **headers: str) -> bool:
        return (await c.get("/prerender_admin/session", headers=headers)).json()["authenticated"]

    async with app_for({}) as c:
        assert await who(c)
        assert not await who(c, **{"x-forwarded-for": "203.0.113.9"})
        assert not await who(c, **{"x-forwarded-for": "127.0.0.1"})  # an untrusted proxy's word is nothing
        assert not await who(c, forwarded="for=203.0.113.9")
    async with app_for({"server": {"trustedProxies": ["127.0.0.0/8"]}}) as c:
        assert await who(c) and await who(c, **{"x-forwarded-for": "127.0.0.5"})
        assert not await who(c, **{"x-forwarded-for": "203.0.113.9"})
        assert not await who(c, **{"x-forwarded-for": "127.0.0.5, 203.0.113.9"})


async def test_behind_a_trusted_proxy_an_ipv6_64_shares_one_sign_in_budget() -> None:
    """Over the app: wrong Basic passwords from many addresses of one /64 (as the proxy forwards them)
    reach the cap, 429; a client of another /64 is not affected."""
    from prerender_ray.admin.users import hash_password

    users = [{"name": "ops", "roles": ["admin"], "passwordHash": hash_password("ops-pass", iterations=1000)}]
    config = {"server": {"trustedProxies": ["127.0.0.0/8"]},
              "auth": {"users": users, "maxFailedLoginsPerMinute": 3}}

    async def session(c: httpx.AsyncClient, client: str, password: str) -> httpx.Response:
        return await c.get("/prerender_admin/session", auth=("ops", password),
                           headers={"x-forwarded-for": client})

    async with app_for(config) as c:
        codes = [(await session(c, f"2001:db8:7:7::{i + 1:x}", f"guess{i}")).status_code for i in range(4)]
        assert codes == [200, 200, 200, 429], codes
        r = await session(c, "2001:db8:7:7:1234:5678:9abc:def0", "ops-pass")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1  # even the right password
        r = await session(c, "2001:db8:7:8::1", "ops-pass")
        assert r.status_code == 200 and r.json()["authenticated"] is True, r.text


async def test_a_new_password_ends_the_sessions_made_with_the_old_one() -> None:
    """Before: a token named only its user, so after a password change (a new ``up``) the sessions
    signed in with the old password stayed valid for their 12 h. Replicas of one deployment (one secret)
    with the old hash and then with the new one: the token is honoured by the first, refused by the second."""
    from prerender_ray.admin.users import hash_password

    def config(password: str) -> dict:
        user = {"name": "ops", "roles": ["admin"], "passwordHash": hash_password(password, iterations=1000)}
        return {"auth": {"users": [user], "sessionSecret": SECRET}}

    before = config("old-pass")
    async with app_for(before) as c:
        r = await c.post("/prerender_admin/login", json={"username": "ops", "password": "old-pass", "bearer": True})
        assert r.status_code == 200, r.text[:300]
        bearer = {"authorization": f"Bearer {r.json()['token']}"}
        assert (await c.get("/prerender_admin/config", headers=bearer)).status_code == 200
    async with app_for(before) as c:  # another replica, or a restart: the same hash
        assert (await c.get("/prerender_admin/config", headers=bearer)).status_code == 200
    async with app_for(config("new-pass")) as c:
        r = await c.get("/prerender_admin/config", headers=bearer)
        assert r.status_code == 401 and "password changed" in r.json()["error"], r.text[:300]
        s = (await c.get("/prerender_admin/session", headers=bearer)).json()
        assert s["authenticated"] is False and "password changed" in s["sessionError"]


def test_the_explainer_shows_the_status_a_bot_is_served_and_where_a_redirect_sends_it() -> None:
    from prerender_ray.admin.explain import describe_page, verdict
    from prerender_ray.storage.pages import PageMeta

    meta = PageMeta(cache_key="https://shop.test/a|desktop", status_code=301, expires_at=2_000,
                    headers={"location": "https://shop.test/b"})
    page = describe_page(meta, 1_000, 0)
    assert page is not None and page["location"] == "https://shop.test/b"
    shown = verdict(prerendered=True, target=None, schedule=None, page=page, reliable=True)
    assert shown["wouldServe"] == "cache" and shown["servedStatus"] == 301
    expired = describe_page(meta, 3_000, 0)
    assert verdict(prerendered=True, target=None, schedule=None, page=expired, reliable=True)["servedStatus"] is None
