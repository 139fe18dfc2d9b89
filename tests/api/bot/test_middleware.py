"""The bot path end to end (docs/serving.md): a node's real ingress over HTTP without Ray
(``tests.localnode``), pages produced the way the fleet produces them (claim, post a result), and a real origin site
on 127.0.0.1 that can be slow, huge, broken or redirecting."""

from __future__ import annotations

import concurrent.futures
import gzip
import time

import brotli
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.api.bot.middleware import _request_headers
from prerender_ray.decoding import decoded_digest
from tests.api.origin_site import JS_PAGE, OriginSite
from tests.localnode import LocalNode
from tests.support import (
    CLUSTER_SERIES,
    FEATURE_SERIES,
    brotli_bomb,
    dashboard_series,
    exposed_series,
    post_result,
    put_target,
    schedule,
    take,
    wait_for,
)

DEBUG = {"x-harper-prerender-debug": "1"}
RN_TOKEN = "render-now-token"
HTML = b"<!doctype html><html><head><title>rendered</title></head><body>" + b"<p>content</p>" * 40 + b"</body></html>"


@pytest.fixture(scope="module")
def other():
    """A second allowed origin, on another port of the same host."""
    s = OriginSite().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def canary():
    """An origin on another 127.0.0.1 port that `domains` does not allow: it must never be asked."""
    s = OriginSite().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory, site, other):
    d = LocalNode.start(tmp_path_factory.mktemp("bot") / "data", {
        "domains": [f"127.0.0.1:{site.port}", f"127.0.0.1:{other.port}", f"site.test:{site.port}"],
        "origin": {"connectTimeoutMs": 1000, "readTimeoutMs": 1500, "maxBodyBytes": 1024 * 1024,
                   "securityToken": {"value": "s3cret"}, "staging": {"ip": "127.0.0.1"},
                   "ignoredHeaders": ["X-Secret-Internal"]},
        "renderNow": {"enabled": True, "token": RN_TOKEN, "timeoutMs": 2500, "pollIntervalMs": 50},
        "page": {"swrTtl": 5000},
    })
    yield d
    d.stop()

ETAG = f'"{decoded_digest(HTML, "identity", None)}"'  # the rendered page's own validator


def bot(node, url: str, method: str = "GET", **kw) -> httpx.Response:
    return httpx.request(method, f"{node.url}/p/{url}", timeout=30, **kw)


def cache_status(node, url: str, **headers: str) -> str | None:
    return bot(node, url, headers={**DEBUG, **headers}).headers.get("x-harper-cache")


def render(node, url: str, html: bytes | None = HTML, *, encoding: str = "gzip", extra: dict | None = None,
           wait: bool = True, **meta) -> list[str]:
    """Put ``url`` due now, claim its jobs and post a result for each, as the fleet does; then wait
    until the ingress serves it from cache."""
    keys = put_target(node.url, url, nextRenderTime=1)["cacheKeys"]
    jobs = take(node.url, keys)
    headers = {"content-type": "text/html; charset=utf-8", **(extra or {})}
    if html is not None and encoding != "identity":
        headers["content-encoding"] = encoding
    for key in keys:
        assert post_result(jobs[key], html=html, encoding=encoding, headers=headers, **meta).status_code == 204
    if wait:
        wait_for(lambda: cache_status(node, url) == "hit", what=f"a cache hit for {url}")
    return keys


def target_of(node, url: str) -> dict | None:
    r = httpx.get(f"{node.url}/render_targets", params={"url": url}, timeout=15)
    return r.json() if r.status_code == 200 else None


# ------------------------------------------------------------------------------------ cache hits


def test_a_rendered_page_is_served_from_cache_as_stored(node, site) -> None:
    url = f"{site.base}/page/hit"
    render(node, url, extra={"etag": '"r1"', "link": "</app.js>; rel=preload", "x-robots-tag": "all"})
    r = bot(node, url, headers={"accept-encoding": "gzip", **DEBUG})
    assert r.status_code == 200 and r.content == HTML  # httpx decodes the gzip it was sent
    h = r.headers
    assert h["content-encoding"] == "gzip" and h["etag"] == ETAG and h["x-robots-tag"] == "all"  # not "r1": the page's
    assert h["x-harper-rendered"] == "1" and h["vary"] == "Accept-Encoding, Accept, x-device-type"  # markdown.enabled
    assert h["link"] == f'<{url}>; rel="alternate"; type="text/markdown"'  # ours: the stored one is not served
    assert int(h["age"]) >= 0 and int(h["content-length"]) == len(gzip.compress(HTML))
    assert h["x-harper-cache"] == "hit" and h["x-harper-source"] == "cache"
    assert h["x-harper-cache-key"] == f"{url}|desktop" and h["x-harper-url"] == url
    assert h["x-harper-device-type"] == "desktop" and h["x-harper-route-class"] == "prerender"
    assert h["x-harper-cache-timestamp"].endswith("Z") and "x-harper-indexable" not in h  # none posted
    plain = bot(node, url)  # no debug header: no debug headers
    assert not [k for k in plain.headers if k.startswith("x-harper-") and k != "x-harper-rendered"]
    mobile = bot(node, url, headers={"x-device-type": "MOBILE", **DEBUG})
    assert mobile.headers["x-harper-cache-key"] == f"{url}|mobile" and mobile.headers["x-harper-cache"] == "hit"


def test_content_coding_follows_accept_encoding_with_q_values(node, site) -> None:
    url = f"{site.base}/page/codings"
    render(node, url, extra={"etag": '"c1"'})
    for accept, coding in [("gzip", "gzip"), ("br", "br"), ("gzip;q=0, br;q=0", None), ("identity", None),
                           ("%%garbage;;q=zz, ,", None), ("br;q=0.5, gzip;q=0.9", "gzip"), ("*", "gzip")]:
        with httpx.stream("GET", f"{node.url}/p/{url}", headers={"accept-encoding": accept}) as r:
            raw = b"".join(r.iter_raw())
        assert r.status_code == 200, accept
        assert r.headers.get("content-encoding") == coding, accept
        assert int(r.headers["content-length"]) == len(raw)
        decoded = {"gzip": gzip.decompress, "br": brotli.decompress, None: bytes}[coding](raw)
        assert decoded == HTML, accept
        assert r.headers["etag"] == (ETAG if coding == "gzip" else f"W/{ETAG}"), accept  # re-coded: weak


def test_conditional_requests_get_a_304_with_only_the_allowed_headers(node, site) -> None:
    url = f"{site.base}/page/conditional"
    render(node, url, extra={"etag": '"v1"', "last-modified": "Wed, 01 Jan 2025 00:00:00 GMT",
                             "cache-control": "max-age=60"})
    lm = bot(node, url).headers["last-modified"]  # when the rendered bytes last changed: at this render
    assert lm != "Wed, 01 Jan 2025 00:00:00 GMT"
    for inm in [ETAG, f"W/{ETAG}", f'"nope", W/{ETAG}', "*"]:
        r = bot(node, url, headers={"if-none-match": inm, "accept-encoding": "gzip", **DEBUG})
        assert r.status_code == 304 and r.content == b"", inm
        assert "content-type" not in r.headers and "x-harper-rendered" not in r.headers
        assert r.headers["etag"] == ETAG and r.headers["cache-control"] == "max-age=60"
        assert r.headers["x-harper-cache"] == "hit"  # debug headers survive the downgrade
    assert bot(node, url, headers={"if-none-match": '"other"', "if-modified-since": lm}).status_code == 200
    assert bot(node, url, headers={"if-none-match": 'garbage"""'}).status_code == 200
    assert bot(node, url, headers={"if-modified-since": lm}).status_code == 304
    assert bot(node, url, headers={"if-modified-since": "Tue, 31 Dec 2024 00:00:00 GMT"}).status_code == 200
    assert bot(node, url, headers={"if-none-match": '"v1"'}).status_code == 200  # the shell's, not the page's
    assert bot(node, url, headers={"if-modified-since": "not a date"}).status_code == 200


def test_head_gets_the_headers_of_get_and_no_body(node, site) -> None:
    url = f"{site.base}/page/head"
    render(node, url)
    get = bot(node, url, headers={"accept-encoding": "br"})
    head = bot(node, url, "HEAD", headers={"accept-encoding": "br"})
    assert head.status_code == 200 and head.content == b""
    for name in ("content-encoding", "content-length", "content-type", "vary"):
        assert head.headers[name] == get.headers[name]


def _no_accept_encoding() -> httpx.Client:
    client = httpx.Client(timeout=30)
    del client.headers["accept-encoding"]  # httpx's default names gzip and br
    return client


def test_a_br_page_is_decoded_for_a_bot_that_sends_no_accept_encoding(node, site) -> None:
    url = f"{site.base}/page/br-plain"
    render(node, url, encoding="br")
    with _no_accept_encoding() as client, client.stream("GET", f"{node.url}/p/{url}", headers=DEBUG) as r:
        raw = b"".join(r.iter_raw())
    assert r.request.headers.get("accept-encoding") is None
    assert r.status_code == 200 and r.headers["x-harper-cache"] == "hit"
    assert "content-encoding" not in r.headers and raw == HTML


def test_a_stored_bomb_is_never_decoded_for_a_bot(node, site) -> None:
    """A page stored before results were checked (or under a larger cap) that decodes past
    server.maxHtmlBytes: a bot that cannot take br gets the origin's page, not 64 MiB of zeros."""
    from prerender_ray.serving.framing import encode_page
    from prerender_ray.storage.pages import Page

    url = f"{site.base}/page/stored-bomb"
    key = bot(node, url, headers=DEBUG).headers["x-harper-cache-key"]
    now = int(time.time() * 1000)
    bomb = brotli_bomb(64)
    page = Page(cache_key=key, status_code=200,
                headers={"content-type": "text/html", "content-encoding": "br"},
                last_cached=now, expires_at=now + 3_600_000, content=bomb)
    node.ask("store", "apply", [], [(key.encode(), encode_page(page))])
    wait_for(lambda: cache_status(node, url, **{"accept-encoding": "br"}) == "hit", what="the stored page")
    with httpx.stream("GET", f"{node.url}/p/{url}", headers={"accept-encoding": "br"}) as r:
        assert b"".join(r.iter_raw()) == bomb  # sent as stored: nothing decoded
    with _no_accept_encoding() as client:
        r = client.get(f"{node.url}/p/{url}", headers=DEBUG)
    assert r.status_code == 200 and r.headers["x-harper-cache"] == "unreadable"
    assert r.content == JS_PAGE  # the origin's answer


def test_a_page_is_swr_after_expiry_then_the_origin_serves(node, site) -> None:
    url = f"{site.base}/page/expiring"
    render(node, url)
    r = httpx.post(f"{node.url}/render_targets", json={"action": "revalidate", "urls": [url]}, timeout=15)
    assert r.status_code == 200
    wait_for(lambda: cache_status(node, url) == "swr", what="the swr window")
    wait_for(lambda: cache_status(node, url) == "stale", timeout=30, what="the end of the swr window")
    r = bot(node, url, headers=DEBUG)
    assert r.headers["x-harper-source"] == "origin" and r.content == JS_PAGE


def test_stored_non_200_and_non_indexable_pages_are_served_as_stored(node, site) -> None:
    url = f"{site.base}/page/stored-404"
    render(node, url, b"<html>gone</html>", status=404, wait=False)
    wait_for(lambda: bot(node, url, headers=DEBUG).headers.get("x-harper-cache") == "hit")
    r = bot(node, url, headers=DEBUG)
    assert r.status_code == 404 and r.content == b"<html>gone</html>" and "age" not in r.headers
    url = f"{site.base}/page/not-indexable"
    render(node, url, isIndexable=False)  # serving ignores it: docs/serving.md#what-is-served-when
    assert bot(node, url, headers=DEBUG).headers["x-harper-indexable"] == "false"


def test_a_not_found_verdict_is_served_with_its_status_and_rendered_body(node, site) -> None:
    url = f"{site.base}/page/status-404"
    view = b"<html><body><h1>No such product</h1></body></html>"
    keys = render(node, url, view, wait=False, outcome="non-indexable", status=404, reason="http-error",
                  isIndexable=False)
    wait_for(lambda: cache_status(node, url) == "hit", what="the status page")
    assert target_of(node, url)["state"] == "suppressed"  # scheduling as before: a recheck
    for key in keys:
        device = key.rsplit("|", 1)[1]
        r = bot(node, url, headers={"x-device-type": device, "if-none-match": "*", **DEBUG})
        assert r.status_code == 404 and r.content == view  # never a 304: validators are a 200's
        assert r.headers["x-harper-indexable"] == "false" and "age" not in r.headers

    def counted() -> bool:
        return 'prerender_status_pages_served_total{status="404"}' in httpx.get(f"{node.url}/metrics").text

    wait_for(counted, what="the served-status metric")


def test_a_redirect_verdict_is_served_as_a_redirect_and_outlives_its_retired_target(node, site) -> None:
    url = f"{site.base}/page/status-moved"
    render(node, url, None, wait=False, outcome="redirected", status=301, reason="redirect",
           redirectedTo="/page/status-moved-here")
    wait_for(lambda: cache_status(node, url) == "hit", what="the redirect page")
    assert target_of(node, url) is None  # a permanent redirect retires the source...
    r = bot(node, url, headers=DEBUG)
    assert r.status_code == 301 and r.headers["location"] == f"{site.base}/page/status-moved-here"
    assert r.content == b"" and r.headers["x-harper-source"] == "cache"  # ...and its tombstone answers
    wait_for(lambda: target_of(node, f"{site.base}/page/status-moved-here") is not None, what="the adoption")
    # A Location on a host outside `domains` is never served: the bot gets the origin.
    off = f"{site.base}/page/status-off-site"
    render(node, off, None, wait=False, outcome="redirected", status=302, reason="redirect",
           redirectedTo="https://elsewhere.test/x")
    wait_for(lambda: target_of(node, off)["strikes"] == 1, what="the redirect strike")
    r = bot(node, off, headers=DEBUG)
    assert r.status_code == 200 and r.headers["x-harper-source"] == "origin"


def test_a_suppressed_page_is_not_served_and_not_rediscovered(node, site) -> None:
    url = f"{site.base}/page/suppressed"
    keys = render(node, url)
    r = httpx.post(f"{node.url}/render_targets", json={"action": "revalidate", "urls": [url]}, timeout=15)
    assert r.status_code == 200
    jobs = take(node.url, keys)
    for key in keys:
        assert post_result(jobs[key], outcome="non-indexable", reason="noindex", html=None,
                           isIndexable=False).status_code == 204
    assert target_of(node, url)["state"] == "suppressed"
    wait_for(lambda: cache_status(node, url) == "miss", what="the deleted page")
    r = bot(node, url, headers=DEBUG)
    assert r.status_code == 200 and r.headers["x-harper-source"] == "origin"
    control = f"{site.base}/page/control-after-suppressed"
    bot(node, control)
    wait_for(lambda: target_of(node, control) is not None, what="the control's discovery")
    assert target_of(node, url)["state"] == "suppressed"  # the miss did not revive it


# ------------------------------------------------------------------------------------ the origin


def test_a_miss_relays_the_origin_with_only_the_allowed_headers(node, site) -> None:
    url = f"{site.base}/page/relay"
    r = bot(node, url, headers={"accept-encoding": "gzip", **DEBUG})
    assert r.status_code == 200 and r.content == JS_PAGE
    h = r.headers
    assert h["content-encoding"] == "gzip" and h["etag"] == '"o1"' and h["cache-control"] == "max-age=60"
    assert "set-cookie" not in h and "x-custom-origin" not in h and "age" not in h
    assert h["x-harper-cache"] == "miss" and h["x-harper-source"] == "origin"
    plain = bot(node, url, headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.content == JS_PAGE
    # validators are answered here, against the origin's full answer
    r = bot(node, url, headers={"if-none-match": '"o1"'})
    assert r.status_code == 304 and "if-none-match" not in site.last("/page/relay").headers


def test_the_origin_gets_our_headers_and_not_the_bots_secrets(node, site) -> None:
    r = bot(node, f"{site.base}/echo/headers", headers={
        "user-agent": "Googlebot/2.1", "cookie": "a=1", "authorization": "Bearer x", "x-custom": "yes",
        "referer": "https://ref.example/", "x-device-type": "mobile", "x-secret-internal": "no",
        "x-harper-render-now": "wrong", "x-harper-renderer-bypass": "spoof", "if-none-match": '"zz"', **DEBUG})
    assert r.status_code == 200
    sent = r.json()["headers"]
    assert sent["user-agent"].startswith("Mozilla/5.0 (Linux; Android 11; Pixel 5)")  # the mobile UA
    assert sent["x-harper-renderer-bypass"] == "s3cret" and sent["accept-encoding"] == "gzip"
    assert sent["x-custom"] == "yes" and sent["referer"] == "https://ref.example/"
    for dropped in ("cookie", "authorization", "x-secret-internal", "x-harper-render-now",
                    "x-harper-prerender-debug", "if-none-match"):
        assert dropped not in sent, dropped
    assert r.json()["method"] == "GET"


def test_redirects_and_errors_are_relayed_not_followed(node, site) -> None:
    r = bot(node, f"{site.base}/moved", headers=DEBUG)
    assert r.status_code == 301 and r.headers["location"] == "/page/target" and "set-cookie" not in r.headers
    assert site.hits["/page/target"] == 0
    r = bot(node, f"{site.base}/error")
    assert r.status_code == 500 and r.content == b"origin broke" and r.headers["retry-after"] == "30"
    assert bot(node, f"{site.base}/nowhere").status_code == 404


@pytest.mark.parametrize("path, status, kind", [
    ("/hang", 504, "origin-timeout"),
    ("/drip", 504, "origin-timeout"),
    ("/huge", 502, "origin-too-large"),
    ("/huge-declared", 502, "origin-too-large"),
    ("/huge-digits", 502, "origin-protocol"),  # h11 refuses a length int() cannot read
    ("/cut", 502, "origin-protocol"),
    ("/big-head", 502, "origin-head-too-large"),
])
def test_a_misbehaving_origin_gets_a_bounded_answer(node, site, path, status, kind) -> None:
    t0 = time.monotonic()
    r = bot(node, f"{site.base}{path}")
    assert r.status_code == status and r.json()["reason"] == kind
    assert time.monotonic() - t0 < 20  # bounded by the deadlines (1 s connect, 1.5 s per read, 4 s in all)
    assert httpx.get(f"{node.url}/healthz", timeout=10).status_code == 200


def test_a_burst_of_misses_for_one_key_makes_one_origin_fetch(node, site) -> None:
    url = f"{site.base}/slow/burst"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: bot(node, url), range(8)))
    assert [a.status_code for a in answers] == [200] * 8 and all(a.content == JS_PAGE for a in answers)
    assert site.hits["/slow/burst"] == 1


def test_head_on_a_miss_fetches_with_get_and_sends_no_body(node, site) -> None:
    r = bot(node, f"{site.base}/page/head-miss", "HEAD", headers={"accept-encoding": "gzip"})
    assert r.status_code == 200 and r.content == b"" and int(r.headers["content-length"]) > 0
    assert site.last("/page/head-miss").method == "GET"


def test_other_methods_are_proxied_with_their_body(node, site) -> None:
    r = bot(node, f"{site.base}/echo/post", "POST", content=b"a=1&b=2",
            headers={"content-type": "application/x-www-form-urlencoded", **DEBUG})
    assert r.status_code == 200
    echoed = r.json()
    assert echoed["method"] == "POST" and echoed["body"] == "a=1&b=2"
    assert r.headers["x-harper-cache"] == "bypass" and "x-harper-cache-key" not in r.headers


def test_staging_pins_the_connection_and_keeps_the_host(node, site) -> None:
    url = f"http://site.test:{site.port}/echo/staging"
    r = bot(node, url, headers={"x-harper-staging": "1", **DEBUG})
    assert r.status_code == 200 and r.json()["headers"]["host"] == f"site.test:{site.port}"
    assert r.headers["x-harper-origin"] == "staging"
    assert bot(node, url).status_code in (502, 504)  # site.test does not resolve without the pin


# ------------------------------------------------------------------------------------- discovery


def test_an_indexable_miss_becomes_a_target_for_the_default_devices(node, site) -> None:
    for path in ("/noindex", "/data.json", "/nowhere-404", "/search/q"):  # never candidates
        bot(node, f"{site.base}{path}")
    url = f"{site.base}/page/discovered"
    assert bot(node, url).status_code == 200
    wait_for(lambda: target_of(node, url) is not None, what="the discovered target")
    target = target_of(node, url)
    assert target["state"] is None and target["renderInterval"] is None
    for device in ("desktop", "mobile"):  # deviceTypes.default, whatever device asked
        assert schedule(node.url, f"{url}|{device}") is not None
    assert schedule(node.url, f"{url}|tablet") is None
    for path in ("/noindex", "/data.json", "/nowhere-404", "/search/q"):
        assert target_of(node, f"{site.base}{path}") is None, path


AGENT = {"accept": "text/markdown", "user-agent": "Mozilla/5.0 (compatible; ClaudeBot/1.0)"}


def test_an_agents_miss_gets_the_origins_answer_and_queues_the_page_for_its_markdown(node, site) -> None:
    """Without ``render.onMiss``: the origin's HTML, as any bot's miss (its shell is never converted),
    and the page discovered, so that once rendered the agent gets it as Markdown."""
    url = f"{site.base}/page/agent-first"
    r = bot(node, url, headers={**DEBUG, **AGENT})
    assert r.status_code == 200 and r.content == JS_PAGE and r.headers["x-harper-cache"] == "miss"
    wait_for(lambda: target_of(node, url) is not None, timeout=10, what="the agent's miss discovered")
    render(node, url)
    r = bot(node, url, headers=AGENT)
    assert r.headers["content-type"] == "text/markdown; charset=utf-8" and "content" in r.text
    assert r.headers["x-markdown-tokens"] == str(-(-len(r.content) // 4))


def test_an_origin_answering_an_agent_markdown_still_has_the_page_queued(node, site) -> None:
    """An origin that converts for an Accept naming Markdown (``Vary: Accept``) has an HTML page to
    render: the agent gets the origin's Markdown as today, and the page is discovered."""
    url = f"{site.base}/negotiates/agent"
    r = bot(node, url, headers=AGENT)
    assert r.status_code == 200 and r.headers["content-type"] == "text/markdown" and r.text == "# JS page\n"
    wait_for(lambda: target_of(node, url) is not None, timeout=10, what="the negotiated page discovered")


def test_a_miss_does_not_revive_a_target_deleted_a_moment_ago(node, site) -> None:
    """What the origin served may predate the delete (a 301's result retires its source while a bot's
    miss is in flight): discovery leaves a target deleted in the last two minutes deleted."""
    url = f"{site.base}/page/retired-a-moment-ago"
    put_target(node.url, url)
    assert httpx.delete(f"{node.url}/render_targets", params={"url": url}, timeout=30).status_code == 200
    assert bot(node, url).status_code == 200
    control = f"{site.base}/page/control-after-retired"
    bot(node, control)
    wait_for(lambda: target_of(node, control) is not None, what="the control's discovery")
    assert target_of(node, url) is None


# ------------------------------------------------------------------------------------ render-now


def test_render_now_waits_for_the_render_and_serves_it(node, site) -> None:
    url = f"{site.base}/page/render-now"
    key = f"{url}|desktop"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(bot, node, url, headers={"x-harper-render-now": RN_TOKEN, **DEBUG})
        job = take(node.url, [key])[key]
        assert post_result(job, html=b"<html>rendered now</html>").status_code == 204
        r = pending.result(timeout=30)
    assert r.status_code == 200 and r.content == b"<html>rendered now</html>"
    assert r.headers["x-harper-render-now"] == "hit" and r.headers["x-harper-source"] == "rendered"


def test_render_now_falls_back_to_the_origin_after_its_timeout(node, site) -> None:
    url = f"{site.base}/page/render-now-late"
    r = bot(node, url, headers={"x-harper-render-now": RN_TOKEN, **DEBUG})
    assert r.status_code == 200 and r.content == JS_PAGE
    assert r.headers["x-harper-render-now"] == "timeout" and r.headers["x-harper-source"] == "origin"
    wrong = bot(node, f"{site.base}/page/render-now-wrong", headers={"x-harper-render-now": "nope", **DEBUG})
    assert wrong.status_code == 200 and "x-harper-render-now" not in wrong.headers


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("target, status, reason", [
    ("ftp://127.0.0.1/x", 400, "scheme"),
    ("127.0.0.1/x", 400, "relative"),
    ("http://127.0.0.1:99999/x", 400, None),
    ("https://not-allowed.example/x", 403, "host-not-allowed"),
])
def test_bad_targets_are_a_json_4xx(node, target, status, reason) -> None:
    r = bot(node, target)
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    assert r.json()["error"]
    if reason:
        assert r.json()["reason"] == reason


def test_a_bot_reaches_only_the_ports_and_names_domains_allows(node, site, canary) -> None:
    """An anonymous request for another port of an allowed host (a Redis, an admin port...) is refused
    before any connection, GET or POST, under another name for the host or as an IPv6 literal."""
    seen = len(site.seen)
    for method, url, origin in [
        ("GET", f"http://127.0.0.1:{canary.port}/page/canary", f"127.0.0.1:{canary.port}"),
        ("POST", f"http://127.0.0.1:{canary.port}/echo/post", f"127.0.0.1:{canary.port}"),
        ("GET", f"http://localhost:{site.port}/page/by-name", f"localhost:{site.port}"),
        ("POST", f"http://localhost:{site.port}/echo/by-name", f"localhost:{site.port}"),
        ("GET", f"http://[::1]:{site.port}/page/v6", f"[::1]:{site.port}"),
    ]:
        r = bot(node, url, method, content=b"a=1" if method == "POST" else None)
        assert r.status_code == 403 and r.json()["reason"] == "host-not-allowed", (url, r.text)
        host = origin.rpartition(":")[0]
        assert r.json()["error"] == f"{origin} is not allowed by domains; add '{origin}' or '{host}:*'"
    assert canary.seen == [] and len(site.seen) == seen  # nothing fetched, so no token sent anywhere


def test_a_cookie_one_origin_sets_is_never_sent_on_a_later_fetch(node, site, other) -> None:
    r = bot(node, f"{site.base}/page/sets-cookie")  # set-cookie: session=1 (path /page)
    assert r.status_code == 200 and "set-cookie" not in r.headers and site.hits["/page/sets-cookie"] == 1
    for origin, path in ((site, "/page/cookie-same-port"), (other, "/page/cookie-other-port")):
        r = bot(node, f"{origin.base}{path}", headers={"user-agent": "Mozilla/5.0 (compatible; bingbot/2.0)"})
        assert r.status_code == 200 and "cookie" not in origin.last(path).headers, path


def test_unknown_paths_are_a_plain_404_and_the_fleet_api_still_routes(node) -> None:
    r = httpx.get(f"{node.url}/not/a/bot/path", timeout=10)
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    assert httpx.post(f"{node.url}/render_queue/claim", json={"limit": 1}, timeout=15).status_code == 200


def test_bot_analytics_and_serve_outcomes_are_metrics(node, site) -> None:
    bot(node, f"{site.base}/page/metrics", headers={"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1)"})

    def seen() -> bool:
        text = httpx.get(f"{node.url}/metrics", timeout=10).text
        return ('prerender_bot_requests_total{bot="Googlebot",device="desktop"}' in text
                and 'prerender_bot_serves_total{bot="Googlebot",cache_status="miss",source="origin"}' in text)

    wait_for(seen, what="the bot metrics")


def test_every_series_the_grafana_dashboard_queries_exists_on_a_running_node(node, site) -> None:
    """A single node emits all but the cluster's series (tests/actors/test_cluster.py checks those)."""
    render(node, f"{site.base}/dash/page")  # a claim and a result, then a cache hit
    bot(node, f"{site.base}/dash/miss")  # an origin fetch
    md = bot(node, f"{site.base}/dash/page", headers={"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1)",
                                                      "accept": "text/markdown"})
    assert md.headers["content-type"].startswith("text/markdown"), md.headers  # a conversion
    queried = dashboard_series() - CLUSTER_SERIES - FEATURE_SERIES
    assert len(queried) >= 15
    exposed: set[str] = set()

    def scraped() -> bool:  # the bot path flushes its counters every few seconds
        exposed.update(exposed_series(node.url))
        return queried <= exposed

    try:
        wait_for(scraped, timeout=20, what="every queried series")
    finally:
        assert queried <= exposed, sorted(queried - exposed)


def _joined_before(scope: dict) -> dict[str, str]:
    """``_request_headers`` as it was (a string rebuilt per repeat: quadratic), the oracle."""
    out: dict[str, str] = {}
    for k, v in scope["headers"]:
        name, value = k.decode("latin-1"), v.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def test_request_headers_join_repeated_fields_in_order_keeping_the_first_place() -> None:
    raw = [(b"accept", b"text/html"), (b"x-a", b"1"), (b"accept", b"text/markdown"), (b"X-A", b"\xe9"),
           (b"x-a", b""), (b"x-a", b"3")]
    got = _request_headers({"headers": raw})
    assert list(got.items()) == [("accept", "text/html, text/markdown"), ("x-a", "1, , 3"), ("X-A", "\xe9")]
    assert _request_headers({"headers": []}) == {}


_NAMES = st.sampled_from([b"a", b"A", b"accept", b"x-forwarded-for", b"\xff"])
_VALUES = st.binary(max_size=6) | st.sampled_from([b"", b" ", b"gzip", b", ", b"\x80\xff"])


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=40))
@settings(max_examples=400, deadline=None)
def test_request_headers_answer_as_before(raw: list[tuple[bytes, bytes]]) -> None:
    got = _request_headers({"headers": raw})
    assert list(got.items()) == list(_joined_before({"headers": raw}).items())


def test_request_headers_join_100k_repeats_of_one_field() -> None:
    # Before, each repeat copied everything joined so far (100,000 repeats: 1.1 s of a blocked loop,
    # 34 times as many distinct fields). Now one join per name; no test times it (the protocol refuses
    # a head past its cap with a 431: tests/api/test_connections.py).
    n = 100_000
    assert _request_headers({"headers": [(b"x-a", b"12345678")] * n}) == {"x-a": ", ".join(["12345678"] * n)}
