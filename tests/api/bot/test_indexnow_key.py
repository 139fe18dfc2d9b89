"""IndexNow's key file on a real node (api/bot/middleware.py): ``/<key>.txt`` of each configured host
answers the key as text, in prefix and forwarded mode, to any client; another key, or the key on a
host outside ``indexNow.hosts``, goes its usual way (here: a 404)."""

from __future__ import annotations

import gc
import logging
import sys

import httpx

from prerender_ray.api.bot.replica import opened
from prerender_ray.serving.answer import Reply
from prerender_ray.serving.indexnow import KeyFile
from tests.localnode import LocalNode
from tests.support import post_result, put_target, take, wait_for

KEY = "a1b2c3d4-e5f6"
FWD = "x-forwarded-host"


def _options(site, **more) -> dict:
    return {"domains": [f"127.0.0.1:{site.port}", f"localhost:{site.port}"],
            "indexNow": {"enabled": True, "key": KEY, "hosts": ["127.0.0.1"],
                         "endpoints": ["http://127.0.0.1:9/indexnow"]}, **more}


def test_the_key_file_is_served_in_prefix_mode_and_only_for_the_key(tmp_path, site) -> None:
    d = LocalNode.start(tmp_path / "data", _options(site))
    try:
        r = httpx.get(f"{d.url}/p/{site.base}/{KEY}.txt", timeout=30)
        assert r.status_code == 200 and r.text == KEY
        assert r.headers["content-type"] == "text/plain; charset=utf-8"
        head = httpx.head(f"{d.url}/p/{site.base}/{KEY}.txt", timeout=30)
        assert head.status_code == 200 and head.content == b""
        assert httpx.get(f"{d.url}/p/{site.base}/wrong-key-1234.txt", timeout=30).status_code == 404
        assert site.hits[f"/{KEY}.txt"] == 0  # answered by the node, never fetched
        other = httpx.get(f"{d.url}/p/http://localhost:{site.port}/{KEY}.txt", timeout=30)  # not in hosts
        assert other.status_code == 404 and site.hits[f"/{KEY}.txt"] == 1  # the origin's own answer
    finally:
        d.stop()


def test_a_key_file_request_from_a_bot_the_decision_memo_knows_makes_one_answer(tmp_path, site,
                                                                                 monkeypatch) -> None:
    # Before: the HTTP protocol's look at such a request (BotMiddleware.wire) made the answer to test
    # whether it was ours, and dropped it with its coroutine (never awaited).
    made: list[str] = []
    reply = KeyFile.reply

    def counted(self: KeyFile, method: str) -> Reply:
        made.append(method)
        return reply(self, method)

    monkeypatch.setattr(KeyFile, "reply", counted)
    # no access log, as a replica runs: with one (pytest's capture handlers) the protocol leaves
    # every request to the app (tests/api/bot/test_memo_protocol.py)
    monkeypatch.setattr(logging.getLogger("uvicorn.access"), "hasHandlers", lambda: False)
    unraisable: list[str] = []  # a coroutine dropped unawaited warns in its finalizer (as an error here)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.exc_value)))
    d = LocalNode.start(tmp_path / "data", _options(site))
    try:
        state = opened(d.ingress[0].ctx)
        assert state is not None and state.services.decisions is not None
        wait_for(lambda: state.services.pages.log is not None, what="the replica on the page log")
        used = state.services.decisions.used
        with httpx.Client(base_url=d.url, timeout=30) as c:
            for method in ("GET", "HEAD"):  # who asks is kept in the decision memo
                c.request(method, f"/p/{site.base}/page/known")
            for method in ("GET", "HEAD") * 3:
                r = c.request(method, f"/p/{site.base}/{KEY}.txt")
                assert r.status_code == 200 and r.content == (KEY.encode() if method == "GET" else b"")
        gc.collect()
        assert state.services.decisions.used >= used + 6  # the protocol's look found who asks, each time
        assert unraisable == [] and made == ["GET", "HEAD"] * 3
    finally:
        d.stop()


def test_the_key_file_is_served_in_forwarded_mode_for_configured_hosts_only(tmp_path, site) -> None:
    d = LocalNode.start(tmp_path / "data", _options(site, ingress={"mode": "forwarded", "defaultProtocol": "http"}))
    try:
        r = httpx.get(f"{d.url}/{KEY}.txt", headers={FWD: f"127.0.0.1:{site.port}"}, timeout=30)
        assert r.status_code == 200 and r.text == KEY
        assert httpx.get(f"{d.url}/wrong-key-1234.txt", headers={FWD: f"127.0.0.1:{site.port}"},
                         timeout=30).status_code == 404
        assert httpx.get(f"{d.url}/{KEY}.txt", headers={FWD: f"localhost:{site.port}"}, timeout=30).status_code == 404
        assert httpx.get(f"{d.url}/{KEY}.txt", timeout=30).status_code == 404  # no forwarded host
    finally:
        d.stop()


def test_a_render_posted_to_a_running_node_is_submitted_to_the_endpoint(tmp_path, site) -> None:
    from tests.actors.keeper.test_indexnow import Endpoint

    endpoint = Endpoint().start()
    try:
        d = LocalNode.start(tmp_path / "data", {
            "domains": [f"127.0.0.1:{site.port}"],
            "indexNow": {"enabled": True, "key": KEY, "hosts": ["127.0.0.1"], "flushInterval": "1s",
                         "endpoints": [f"{endpoint.base}/indexnow"]}})
        try:
            url = f"{site.base}/fresh"
            key = put_target(d.url, url)["cacheKeys"][0]
            assert post_result(take(d.url, [key])[key]).status_code == 204
            [sent] = wait_for(endpoint.submissions, timeout=30, what="an IndexNow submission")
            assert sent == {"host": "127.0.0.1", "key": KEY, "keyLocation": f"{site.base}/{KEY}.txt",
                            "urlList": [url]}
        finally:
            d.stop()
    finally:
        endpoint.stop()
