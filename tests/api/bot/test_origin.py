"""The origin client on its own, against a real origin site on 127.0.0.1: request collapsing and the
empty-allowlist refusal (the rest is exercised end to end in test_bot.py)."""

from __future__ import annotations

import asyncio

import pytest

from prerender_ray.api.bot.origin import OriginClient, OriginError
from prerender_ray.config.model import Config
from tests.api.origin_site import JS_PAGE, OriginSite


@pytest.fixture(scope="module")
def site():
    s = OriginSite().start()
    yield s
    s.stop()


def client(**cfg) -> OriginClient:
    return OriginClient(Config.model_validate({"origin": {"readTimeoutMs": 3000}, **cfg}))


async def test_concurrent_fetches_of_one_key_share_one_request(site) -> None:
    c = client()
    url = f"{site.base}/slow/collapse"
    try:
        answers = await asyncio.gather(*(c.collapsed("k", lambda: c.fetch("GET", url, [], reason="miss"))
                                         for _ in range(6)))
        assert [a.body for a, _ in answers] == [JS_PAGE] * 6
        assert sum(leader for _, leader in answers) == 1 and site.hits["/slow/collapse"] == 1
        assert c.inflight == 0
        _, leader = await c.collapsed("k", lambda: c.fetch("GET", url, [], reason="miss"))
        assert leader and site.hits["/slow/collapse"] == 2  # collapsing is for concurrent misses only
    finally:
        await c.aclose()


async def test_a_waiter_that_gives_up_does_not_cancel_the_shared_fetch(site) -> None:
    c = client()
    url = f"{site.base}/slow/abandoned"
    try:
        first = asyncio.ensure_future(c.collapsed("k", lambda: c.fetch("GET", url, [], reason="miss")))
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(c.collapsed("k", lambda: c.fetch("GET", url, [], reason="miss")))
        await asyncio.sleep(0.05)
        first.cancel()  # the bot that started it hung up
        answer, leader = await second
        assert answer.status == 200 and not leader and site.hits["/slow/abandoned"] == 1
    finally:
        await c.aclose()


async def test_an_empty_allowlist_is_refused_off_loopback_unless_any_domain_is_allowed(site) -> None:
    closed = client(server={"host": "0.0.0.0"})
    with pytest.raises(OriginError) as e:
        await closed.fetch("GET", f"{site.base}/page/x", [], reason="miss")
    assert e.value.status == 403 and e.value.kind == "refused"
    await closed.aclose()
    for open_one in (client(domains=["127.0.0.1:*"], server={"host": "0.0.0.0"}), client(),
                     client(allowAnyDomain=True)):  # a loopback listener: only this machine asks
        assert (await open_one.fetch("GET", f"{site.base}/page/x", [], reason="miss")).status == 200
        await open_one.aclose()


async def test_any_domain_off_loopback_never_connects_to_our_own_network(site) -> None:
    # Before: allowAnyDomain on a public listener fetched whatever a bot named, loopback, the node's
    # network and the cloud's metadata address included, and relayed the answer (and sent the token).
    c = client(server={"host": "0.0.0.0"}, allowAnyDomain=True)
    token = [("x-harper-renderer-bypass", "s3cret")]
    try:
        before = len(site.seen)
        for url in [f"{site.base}/page/x", f"http://localhost:{site.port}/page/x", f"http://[::1]:{site.port}/page/x",
                    f"http://[::ffff:127.0.0.1]:{site.port}/page/x"]:
            with pytest.raises(OriginError) as e:
                await c.fetch("GET", url, token, reason="miss")
            assert e.value.status == 403 and e.value.kind == "refused", url
            assert "does not resolve to public addresses only" in str(e.value)
        assert len(site.seen) == before  # nothing reached the origin: no request, no token
    finally:
        await c.aclose()


async def test_the_client_checks_every_fetch_against_domains_before_it_connects(site) -> None:
    """Defence in depth behind the ingress decision: host and port as httpx will connect to them."""
    c = client(domains=[f"127.0.0.1:{site.port}"])
    token = [("x-harper-renderer-bypass", "s3cret")]
    try:
        before = len(site.seen)
        for url, origin in [("http://127.0.0.1:6379/page/x", "127.0.0.1:6379"),
                            (f"http://localhost:{site.port}/page/x", f"localhost:{site.port}"),
                            (f"http://[::1]:{site.port}/page/x", f"[::1]:{site.port}"),
                            ("http://127.0.0.1/page/x", "127.0.0.1")]:
            with pytest.raises(OriginError) as e:
                await c.fetch("POST", url, token, reason="bypass", body=b"a=1")
            assert e.value.status == 403 and e.value.kind == "refused"
            assert f"{origin} is not allowed by domains" in str(e.value)
        assert len(site.seen) == before
        assert (await c.fetch("GET", f"{site.base}/page/x", token, reason="miss")).status == 200
    finally:
        await c.aclose()


async def test_no_cookie_is_kept_from_one_fetch_to_the_next(site) -> None:
    c = client()
    try:
        await c.fetch("GET", f"{site.base}/page/cookie", [], reason="miss")  # set-cookie: session=1
        await c.fetch("GET", f"{site.base}/page/cookie-again", [], reason="miss")
        assert "cookie" not in site.last("/page/cookie-again").headers
    finally:
        await c.aclose()


async def test_a_bots_header_goes_to_the_origin_as_the_bytes_it_came_as(site) -> None:
    # the ingress decodes a bot's header bytes as latin-1; httpx would encode text as ASCII, so one
    # byte over 127 made every miss a 500
    c = client()
    try:
        odd = "\u00e9t\u00e9".encode().decode("latin-1")  # the UTF-8 bytes of "été", as the ingress holds them
        answer = await c.fetch("GET", f"{site.base}/page/odd-header", [("x-odd", odd), ("user-agent", "Bot \u2603")],
                               reason="miss")
        assert answer.status == 200
        seen = site.last("/page/odd-header").headers
        assert seen["x-odd"] == odd  # the site decodes latin-1: the same bytes arrived
        assert seen["user-agent"] == "Bot \u2603".encode().decode("latin-1")  # not latin-1 text: sent as UTF-8
    finally:
        await c.aclose()
