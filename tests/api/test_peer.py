"""Peer page fetch (docs/serving.md#peer-page-fetch): the endpoint's checks in order, and the client that
asks an owner node for a page, against a real node over HTTP."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading

import httpx
import pytest

from prerender_ray.api.bot.peer import META_HEADER, PeerClient, parse_metadata
from prerender_ray.api.peer import PEER_FAILURES_PER_MINUTE
from prerender_ray.config.service import PeerRescue
from prerender_ray.decoding import decoded_digest
from tests.localnode import LocalNode
from tests.support import claim, free_port, post_result, put_target, wait_for

TOKEN = "peer-secret"
PATH = "/prerender_peer/page"
URL = "https://peer.example/catalog/item?page=2"  # a key with "?" and "|" round-trips encoded
KEY = f"{URL}|desktop"
HTML = b"<html><body>owner's copy</body></html>"

ETAG = f'"{decoded_digest(HTML, "identity", None)}"'  # stored for the rendered bytes


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("peer") / "data", {
        "domains": ["peer.example"], "peerRescue": {"enabled": True, "token": TOKEN, "timeoutMs": 800},
    })
    keys = put_target(d.url, URL, nextRenderTime=1)["cacheKeys"]
    jobs: dict[str, dict] = {}

    def granted() -> bool:
        jobs.update({j["id"]: j for j in claim(d.url, 25)})
        return all(k in jobs for k in keys)

    wait_for(granted, what="the page's jobs")
    for key in keys:
        assert post_result(jobs[key], html=HTML, headers={"content-type": "text/html", "content-encoding": "gzip",
                                                          "etag": '"p1"'}).status_code == 204
    wait_for(lambda: peer_get(d, KEY).status_code == 200, what="the page on the endpoint")
    yield d
    d.stop()


def peer_get(node, key: str | None, token: str | None = TOKEN, method: str = "GET") -> httpx.Response:
    headers = {"x-harper-peer-token": token} if token is not None else {}
    params = {"key": key} if key is not None else {}
    return httpx.request(method, f"{node.url}{PATH}", params=params, headers=headers, timeout=10)


def test_the_endpoint_returns_the_stored_bytes_and_metadata(node) -> None:
    r = peer_get(node, KEY)
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert gzip.decompress(r.content) == HTML  # as stored: still gzip, no content-encoding header
    assert "content-encoding" not in r.headers
    meta = json.loads(r.headers[META_HEADER])
    assert meta["statusCode"] == 200 and isinstance(meta["headers"], str)  # nested as a JSON string
    assert json.loads(meta["headers"])["etag"] == ETAG
    assert meta["lastCached"] <= meta["expiresAt"]


@pytest.mark.parametrize("token, method, key, status", [
    (None, "GET", KEY, 403),
    ("wrong", "GET", KEY, 403),
    ("x" * 500, "GET", KEY, 403),  # another length: compared as digests, never raises
    ("", "GET", KEY, 403),
    (TOKEN, "POST", KEY, 405),
    (TOKEN, "GET", None, 400),
    (TOKEN, "GET", "https://peer.example/none|desktop", 404),
])
def test_the_endpoint_checks_token_method_key_and_record_in_that_order(node, token, method, key, status) -> None:
    assert peer_get(node, key, token, method).status_code == status


def test_an_address_that_sent_ten_wrong_tokens_in_a_minute_waits_and_others_do_not(node) -> None:
    """Guessing the token is bounded per address; the address's own good token waits too (its guesses are
    not tested), every other address is answered as before."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10) as guesser:
        def ask(token: str) -> httpx.Response:
            return guesser.get(f"{node.url}{PATH}", params={"key": KEY}, headers={"x-harper-peer-token": token})

        assert [ask(f"guess-{i}").status_code for i in range(PEER_FAILURES_PER_MINUTE)] == \
            [403] * PEER_FAILURES_PER_MINUTE
        refused = ask(TOKEN)
        assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
        assert "too many wrong peer tokens" in refused.json()["error"]
    assert peer_get(node, KEY).status_code == 200  # 127.0.0.1
    assert peer_get(node, KEY, token="wrong").status_code == 403


async def test_the_client_fetches_a_page_from_its_owner(node) -> None:
    client = PeerClient(PeerRescue(enabled=True, token=TOKEN, timeout_ms=5000), 1024 * 1024)
    try:
        got = await client.fetch("node-a", node.url, KEY)
        assert not isinstance(got, str), got
        assert got.owner == "node-a" and got.meta.status_code == 200 and got.meta.cache_key == KEY
        assert gzip.decompress(got.body) == HTML and got.meta.headers["etag"] == ETAG
        assert await client.fetch("node-a", node.url, "https://peer.example/none|desktop") == "peer responded 404"
        wrong = PeerClient(PeerRescue(enabled=True, token="nope", timeout_ms=5000), 1024)  # answers, not speed
        assert await wrong.fetch("node-a", node.url, KEY) == "peer responded 403"
        await wrong.aclose()
        small = PeerClient(PeerRescue(enabled=True, token=TOKEN, timeout_ms=5000), 10)
        assert await small.fetch("node-a", node.url, KEY) == "peer page is over the size cap"
        await small.aclose()
    finally:
        await client.aclose()


async def test_a_peer_that_hangs_costs_the_deadline_and_an_unreachable_one_is_a_reason() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    client = PeerClient(PeerRescue(enabled=True, token=TOKEN, timeout_ms=300), 1024)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await client.fetch("b", f"http://127.0.0.1:{listener.getsockname()[1]}", KEY) == "peer timed out"
        assert loop.time() - t0 < 5
        reason = await client.fetch("c", f"http://127.0.0.1:{free_port()}", KEY)
        assert reason.startswith("peer fetch failed: ConnectError")
    finally:
        await client.aclose()
        listener.close()
        for s in held:
            s.close()


def test_owner_metadata_is_validated() -> None:
    ok = json.dumps({"statusCode": 200, "headers": '{"etag":"\\"e\\""}', "lastCached": 1, "expiresAt": 2})
    meta = parse_metadata(ok, KEY)
    assert meta is not None and meta.headers == {"etag": '"e"'} and meta.expires_at == 2
    for bad in (None, "", "{", "[]", '{"headers": "{}"}', '{"statusCode": "200"}', '{"statusCode": true}',
                '{"statusCode": 200, "headers": "[1]"}', '{"statusCode": 200, "lastCached": "soon"}'):
        assert parse_metadata(bad, KEY) is None, bad
    assert not PeerClient(PeerRescue(enabled=True, token=""), 1).active
    assert not PeerClient(PeerRescue(enabled=False, token="t"), 1).active


async def test_the_client_keeps_no_cookie_a_peer_sets() -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                seen.append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(b"HTTP/1.1 404 Not Found\r\nset-cookie: sid=1; Path=/\r\n"
                             b"content-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = PeerClient(PeerRescue(enabled=True, token=TOKEN, timeout_ms=2000), 1024)
    try:
        assert await client.fetch("b", base, KEY) == "peer responded 404"
        assert await client.fetch("b", base, KEY) == "peer responded 404"
    finally:
        await client.aclose()
        server.close()
    assert len(seen) == 2 and b"cookie" not in seen[1].lower()
