"""The admin API over real HTTP on two nodes (a ``LocalCluster``: each node's real actors and app, in
this process, without Ray): every route with each role (admin, viewer, fleet, anonymous), sessions
and bearer tokens across nodes, bad input that changes nothing, the schedule proxy to the owner that
answers, and (one more replica of node-a's app, over ASGI) peers that hang, answer garbage or are
gone, and the heavy-read cap."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from prerender_ray.admin.sessions import SESSION_COOKIE
from prerender_ray.admin.users import hash_password
from prerender_ray.identity.nodes import Ownership
from prerender_ray.storage.pages import Page
from tests.localcluster import LocalCluster
from tests.sitemap_server import SitemapSite, urlset
from tests.support import brotli_bomb, wait_for, write_page

PASSWORDS = {"ops": "ops-pass", "watcher": "watch-pass", "renderer": "fleet-pass"}
ROLE = {"ops": "admin", "watcher": "viewer", "renderer": "fleet", None: None}
FUTURE = int(time.time() * 1000) + 20 * 86_400_000
TWO = Ownership(["node-a", "node-b"])
SITE_HOST = "admin-sitemaps.test"


def owned_by(node: str, prefix: str, n: int = 1) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        url = f"https://shop.test/{prefix}/{i}"
        if TWO.owner(url) == node:
            out.append(url)
        i += 1
    return out


A_URL, B_URL = owned_by("node-a", "a")[0], owned_by("node-b", "b")[0]


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.server.shutdown()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    users = [
        {"name": n, "roles": [ROLE[n]], "passwordHash": hash_password(p, iterations=1000)}
        for n, p in PASSWORDS.items()
    ]
    d = LocalCluster.start(
        tmp_path_factory.mktemp("admin") / "data",
        {
            "domains": ["shop.test", f"{SITE_HOST}:*"],
            "origin": {"staging": {"ip": "127.0.0.1"}},
            "auth": {"users": users, "maxFailedLoginsPerMinute": 3},
            "render": {"reconcile": {"startDelay": "1h"}},
            "management": {"pageSize": 5},
            "sitemap": {"fetchTimeoutMs": 5000},
        },
        names=("node-a", "node-b"),
    )
    yield d
    d.stop()


def auth(who: str | None) -> dict:
    return {"auth": (who, PASSWORDS[who])} if who else {}


def call(method: str, base: str, path: str, who: str | None = "ops", **kw) -> httpx.Response:
    return httpx.request(method, f"{base}/prerender_admin/{path}", timeout=30, **auth(who), **kw)


def put_target(base: str, url: str, **fields: object) -> dict:
    r = httpx.put(f"{base}/render_targets", json={"url": url, **fields}, timeout=30, **auth("ops"))
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def targets(node):
    put_target(node.urls["node-a"], A_URL, nextRenderTime=FUTURE)
    put_target(node.urls["node-a"], B_URL, nextRenderTime=FUTURE)
    for url in owned_by("node-b", "due", 3):
        put_target(node.urls["node-a"], url, nextRenderTime=1)
    return {"a": A_URL, "b": B_URL}


# ------------------------------------------------------------------------------------------ roles

ROUTES = [  # method, path, body, the roles that may, the answers we accept from them
    ("GET", "overview", None, {"viewer", "admin"}, {200}),
    ("GET", "config", None, {"viewer", "admin"}, {200}),
    ("GET", "queue-state", None, {"viewer", "admin"}, {200, 503}),
    ("GET", "queue-state?scope=cluster", None, {"viewer", "admin"}, {200, 503}),
    ("POST", "explain", {"url": A_URL}, {"viewer", "admin"}, {200}),
    ("POST", "schedule", {"cacheKey": f"{A_URL}|desktop"}, {"viewer", "admin"}, {200}),
    ("GET", "sitemaps", None, {"viewer", "admin"}, {200}),
    ("GET", "robots", None, {"viewer", "admin"}, {200}),
    ("POST", "sitemap", {"url": "https://shop.test/none.xml"}, {"viewer", "admin"}, {404}),
    ("GET", "pages?prefix=https://shop.test/", None, {"viewer", "admin"}, {200}),
    ("GET", "page-content?cacheKey=https://shop.test/none|desktop", None, {"viewer", "admin"}, {404}),
    ("GET", "unrouted", None, {"viewer", "admin"}, {200}),
    ("GET", "bots", None, {"viewer", "admin"}, {200}),
    ("POST", "queue", {"scope": "node-b", "paused": None}, {"admin"}, {200}),
    ("POST", "revalidate", {"url": "https://shop.test/never-a-target"}, {"admin"}, {409}),
    ("POST", "reconcile", None, {"admin"}, {200, 202}),
    ("POST", "robots/discover", {"domain": "evil.test"}, {"admin"}, {400}),  # refused before any fetch
    ("POST", "config-override", {"set": [{"path": "queue.ready.sitemapBoost", "value": 2}], "dryRun": True},
     {"admin"}, {200}),
    ("GET", "no-such-route", None, {"viewer", "admin"}, {404}),
    ("GET", "explain", None, {"viewer", "admin"}, {405}),
]


@pytest.mark.parametrize("who", ["ops", "watcher", "renderer", None])
def test_every_route_checks_the_callers_role(node, targets, who) -> None:
    role = ROLE[who]
    for base in node.urls.values():
        for method, path, body, allowed, ok in ROUTES:
            r = call(method, base, path, who, json=body)
            assert r.headers["cache-control"] == "no-store", (path, r.headers)
            assert r.headers["x-content-type-options"] == "nosniff", (path, r.headers)  # errors too
            assert r.headers["content-type"].startswith("application/json"), path
            if role is None:
                assert r.status_code == 401, (path, r.text)
                assert r.json()["authenticated"] is False
                assert r.headers["www-authenticate"].startswith("Basic")
            elif role in allowed or (role == "admin" and "viewer" in allowed):
                assert r.status_code in ok, (who, base, path, r.text)
            else:
                assert r.status_code == 403, (who, path, r.text)
                assert r.json()["authenticated"] is True
    # open to everyone: who am I, sign in and out, the console page
    r = call("GET", node.url, "session", who)
    assert r.status_code == 200 and r.json()["authenticated"] is (who is not None)
    assert call("POST", node.url, "logout", who).status_code == 200
    assert httpx.get(f"{node.url}/prerender_admin/", timeout=10).status_code == 200


def test_the_console_is_one_self_contained_page_with_a_strict_policy(node) -> None:
    r = httpx.get(f"{node.url}/prerender_admin", timeout=10)
    assert r.status_code == 308 and r.headers["location"] == "/prerender_admin/"
    assert r.headers["x-content-type-options"] == "nosniff"
    page = httpx.get(f"{node.url}/prerender_admin/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    # nothing is loaded from anywhere else
    assert sorted(re.findall(r'(?:src|href|action)="([^"]*)"', page.text)) == [
        "static/console.css",
        "static/console.js",
    ]
    for name, ctype in (("console.js", "text/javascript"), ("console.css", "text/css")):
        r = httpx.get(f"{node.url}/prerender_admin/static/{name}", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith(ctype)
        assert "https://" not in r.text and "http://" not in r.text.replace("http://www.w3.org/2000/svg", "")
    assert httpx.get(f"{node.url}/prerender_admin/static/../admin.py", timeout=10).status_code in (404, 401)


# --------------------------------------------------------------------------------------- sessions


def login(base: str, who: str, password: str | None = None, **extra: object) -> httpx.Response:
    return httpx.post(
        f"{base}/prerender_admin/login",
        timeout=30,
        json={"username": who, "password": password or PASSWORDS[who], **extra},
    )


def test_a_session_cookie_is_signed_httponly_strict_and_works_on_every_node(node) -> None:
    r = login(node.url, "watcher")
    assert r.status_code == 200, r.text
    assert r.json()["username"] == "watcher" and r.json()["admin"] is False and "token" not in r.json()
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    for flag in ("HttpOnly", "SameSite=strict", "Path=/prerender_admin", "Max-Age=43200"):
        assert flag.lower() in cookie.lower(), cookie
    token = r.cookies[SESSION_COOKIE]
    for base in node.urls.values():  # one key for the whole deployment
        jar = {SESSION_COOKIE: token}
        s = httpx.get(f"{base}/prerender_admin/session", cookies=jar, timeout=10).json()
        assert s["authenticated"] and s["via"] == "session" and s["username"] == "watcher"
        assert httpx.get(f"{base}/prerender_admin/overview", cookies=jar, timeout=30).status_code == 200
        assert (
            httpx.post(
                f"{base}/prerender_admin/queue",
                cookies=jar,
                json={"scope": "all", "paused": True},
                timeout=10,
            ).status_code
            == 403
        )  # a viewer's session may not act
    # a tampered cookie is nobody
    bad = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    r = httpx.get(f"{node.url}/prerender_admin/overview", cookies={SESSION_COOKIE: bad}, timeout=10)
    assert r.status_code == 401 and r.json()["authenticated"] is False
    s = httpx.get(f"{node.url}/prerender_admin/session", cookies={SESSION_COOKIE: bad}, timeout=10).json()
    assert s["authenticated"] is False and "signature" in s["sessionError"]


def test_a_bearer_token_for_scripts_and_a_logout_that_holds_on_every_node(node) -> None:
    r = login(node.urls["node-b"], "ops", bearer=True)
    assert r.status_code == 200 and "set-cookie" not in r.headers
    token = r.json()["token"]
    bearer = {"authorization": f"Bearer {token}"}
    for base in node.urls.values():
        assert httpx.get(f"{base}/prerender_admin/config", headers=bearer, timeout=10).status_code == 200
    out = httpx.post(f"{node.url}/prerender_admin/logout", headers=bearer, timeout=10)
    assert out.status_code == 200 and out.json()["revoked"] is True
    assert httpx.get(f"{node.url}/prerender_admin/config", headers=bearer, timeout=10).status_code == 401
    wait_for(
        lambda: (
            httpx.get(f"{node.urls['node-b']}/prerender_admin/config", headers=bearer, timeout=10).status_code
            == 401
        ),
        timeout=30,
        what="the revocation on node-b",
    )
    assert httpx.post(f"{node.url}/prerender_admin/logout", timeout=10).json() == {
        "authenticated": False,
        "revoked": False,
    }


def test_sign_in_refusals(node) -> None:
    assert login(node.url, "renderer").status_code == 403  # a fleet account cannot use the console
    for body in (
        {"username": "ops"},
        {"username": "", "password": "x"},
        {"username": 5, "password": "x"},
        {"username": "ops", "password": "x", "bearer": "yes"},
    ):
        r = httpx.post(f"{node.url}/prerender_admin/login", json=body, timeout=10)
        assert r.status_code == 400, (body, r.text)
    r = httpx.post(
        f"{node.url}/prerender_admin/login",
        json={"username": "ops", "password": PASSWORDS["ops"]},
        headers={"origin": "https://evil.test"},
        timeout=10,
    )
    assert r.status_code == 403 and "set-cookie" not in r.headers
    # a cross-origin write is refused before its session cookie is looked at
    token = login(node.url, "ops").cookies[SESSION_COOKIE]
    r = httpx.post(
        f"{node.url}/prerender_admin/queue",
        cookies={SESSION_COOKIE: token},
        headers={"origin": "https://evil.test"},
        json={"scope": "all", "paused": True},
        timeout=10,
    )
    assert r.status_code == 403 and "cross-site" in r.json()["error"], r.text
    assert call("GET", node.url, "overview").json()["control"]["cluster"] is None  # nothing was paused


def test_failed_sign_ins_are_rate_limited_per_client(node) -> None:
    """From 127.0.0.2, so the other tests (127.0.0.1) are not locked out."""
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
    base = node.urls["node-b"]
    codes = [
        other.post(
            f"{base}/prerender_admin/login", json={"username": "ops", "password": f"no{i}"}
        ).status_code
        for i in range(3)
    ]
    assert codes == [401, 401, 401]
    r = other.post(f"{base}/prerender_admin/login", json={"username": "ops", "password": PASSWORDS["ops"]})
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1  # even the right password now
    r = other.get(f"{base}/prerender_admin/overview", auth=("ops", PASSWORDS["ops"]))
    assert r.status_code == 429  # Basic credentials share the budget
    assert call("GET", base, "overview").status_code == 200  # another client is not affected
    other.close()


def test_the_session_route_is_no_free_password_oracle(node) -> None:
    """GET session is open to everyone, but Basic credentials sent to it are a sign-in like any other:
    a wrong one counts in the same limiter, and past it the answer is 429. From 127.0.0.3."""
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"), timeout=30)
    url = f"{node.urls['node-b']}/prerender_admin/session"
    answers = [other.get(url, auth=("ops", f"guess{i}")) for i in range(4)]
    assert [r.status_code for r in answers] == [200, 200, 200, 429], [r.text for r in answers]
    assert [r.json()["authenticated"] for r in answers[:3]] == [False] * 3
    assert int(answers[3].headers["retry-after"]) >= 1
    assert other.get(url, auth=("ops", PASSWORDS["ops"])).status_code == 429  # even the right password now
    assert other.post(f"{node.urls['node-b']}/prerender_admin/login",
                      json={"username": "ops", "password": PASSWORDS["ops"]}).status_code == 429  # one budget
    assert other.get(url).json()["authenticated"] is False  # without credentials it still answers
    other.close()


# ------------------------------------------------------------------------------------- bad input


BAD_QUEUE = [
    ({"scope": "node-x", "paused": True}, "unknown scope"),
    ({"scope": 5, "paused": True}, "scope must be"),
    ({"scope": "", "paused": True}, "scope must be"),
    ({"scope": "node-a", "paused": "yes"}, "paused must be"),
    ({"scope": "node-a", "paused": 1}, "paused must be"),
    ({"scope": "node-a"}, "paused must be"),
    ({"scope": "all", "paused": None}, "cannot be deleted"),
]


def test_bad_input_is_a_clear_400_and_changes_nothing(node, targets) -> None:
    base = node.url
    for body, message in BAD_QUEUE:
        r = call("POST", base, "queue", json=body)
        assert r.status_code == 400 and message in r.json()["error"], (body, r.text)
    assert "knownScopes" in call("POST", base, "queue", json=BAD_QUEUE[0][0]).json()
    for bad in (
        {},
        {"url": ""},
        {"url": 5},
        {"url": "not a url"},
        {"url": "/relative"},
        {"url": "ftp://shop.test/"},
        {"url": A_URL, "deviceType": 3},
    ):
        r = call("POST", base, "explain", json=bad)
        assert r.status_code == 400, (bad, r.text)
    assert call("POST", base, "explain", content=b"{not json").status_code == 400
    assert call("POST", base, "explain", json=["a list"]).status_code == 400
    for path in (
        "pages?limit=0",
        "pages?limit=6",
        "pages?limit=abc",
        "pages?cursor=garbage",
        "pages?cursor=eyJzIjoicGFnZXMiLCJwIjoieiJ9.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "queue-state?scope=galaxy",
        "page-content",
        "page-content?cacheKey=",
    ):
        r = call("GET", base, path)
        assert r.status_code == 400, (path, r.text)
    for body in (
        {"url": "https://shop.test/s.xml", "limit": 0},
        {"url": "https://shop.test/s.xml", "limit": 6},
        {"url": "https://shop.test/s.xml", "offset": -1},
        {"url": "https://shop.test/s.xml", "limit": "5"},
        {"url": "nope"},
        {},
    ):
        assert call("POST", base, "sitemap", json=body).status_code == 400, body
    for body in ({}, {"cacheKey": ""}, {"cacheKey": "no-delimiter"}, {"cacheKey": f"{A_URL}|watch"}):
        assert call("POST", base, "schedule", json=body).status_code == 400, body
    for body in ({"url": "nope"}, {"url": A_URL, "deviceType": "watch"}):
        assert call("POST", base, "revalidate", json=body).status_code == 400, body
    r = call("POST", base, "revalidate", json={"url": "https://shop.test/no-target-here"})
    assert r.status_code == 409 and r.json()["cacheKeys"]
    o = call("GET", base, "overview").json()
    assert o["control"]["cluster"] is None and all(n["override"] is None for n in o["nodes"])
    row = call("POST", base, "schedule", json={"cacheKey": f"{A_URL}|desktop"}).json()["renderSchedule"]
    assert row["nextRenderTime"] == FUTURE  # revalidate refusals did not touch it


# -------------------------------------------------------------------------------- overview, queue


def test_the_overview_shows_every_node_its_status_and_the_backlog(node, targets) -> None:
    def ready() -> dict | None:
        o = call("GET", node.url, "overview").json()
        ok = o["backlog"]["due"] is not None and o["backlog"]["due"] >= 3 and not o["backlog"]["partial"]
        return o if ok and o["counts"] is not None else None

    o = wait_for(ready, timeout=60, what="an overview with the due rows and counts")
    names = [n["name"] for n in o["nodes"]]
    assert names == ["node-a", "node-b"]
    for n in o["nodes"]:
        assert n["member"] and n["answered"] and n["live"]["phase"] == "live"
        assert n["status"] in ("queued", "empty", "paused") and n["url"].startswith("http://127.0.0.1:")
        assert n["reconcile"]["enabled"] is True and n["intent"] == {"paused": False, "source": "default"}
    assert o["nodes"][0]["isThisNode"] and not o["nodes"][1]["isThisNode"]
    assert len(o["backlog"]["histogram"]["bins"]) == 24
    assert sum(o["backlog"]["histogram"]["bins"]) == o["backlog"]["next24h"]
    assert o["counts"]["targets"] >= 5 and o["leases"]["capacity"] > 0
    b = [n for n in o["nodes"] if n["name"] == "node-b"][0]
    assert b["live"]["due"] >= 6  # the due rows (3 URLs x 2 devices) live on node-b's keeper


def test_the_cluster_queue_state_sums_every_node(node, targets) -> None:
    r = call("GET", node.url, "queue-state?scope=cluster")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["complete"] is True and doc["unanswered"] == [] and set(doc["nodes"]) == {"node-a", "node-b"}
    parts = [call("GET", base, "queue-state").json() for base in node.urls.values()]
    assert doc["now"]["held"] == sum(p["now"]["held"] for p in parts)
    assert len(doc["coming"]["byHour"]) == 24 and len(doc["dueHistogram"]["bins"]) == 48


# ------------------------------------------------------------------------------- explain, proxy


def test_explain_on_the_owner_reads_its_own_row(node, targets) -> None:
    r = call(
        "POST",
        node.url,
        "explain",
        json={"url": A_URL.replace("https://shop.test", "HTTPS://Shop.Test") + "?utm=1#x"},
    )
    assert r.status_code == 200, r.text
    x = r.json()
    assert x["resolved"]["canonicalUrl"] == A_URL and x["resolved"]["cacheKey"] == f"{A_URL}|desktop"
    assert x["residency"] == {
        "queriedNode": "node-a",
        "scheduleOwnedBy": "node-a",
        "scheduleReadIsAuthoritative": True,
        "scheduleAuthoritative": True,
        "scheduleSource": "local (owner)",
        "peerError": None,
    }
    assert x["rows"]["renderSchedule"]["nextRenderTime"] == FUTURE
    assert x["rows"]["renderTarget"]["url"] == A_URL and x["rows"]["prerenderedPage"] is None
    assert x["verdict"] == {
        "reliable": True,
        "wouldServe": "origin-or-render",
        "servedStatus": None,
        "scheduled": True,
        "recurring": True,
        "suppressed": False,
    }


@pytest.mark.parametrize("how", ["basic", "session", "bearer"])
def test_explain_asks_the_owner_with_the_callers_credentials(node, targets, how) -> None:
    kw: dict = {}
    if how == "basic":
        kw = auth("watcher")
    elif how == "session":
        kw = {"cookies": {SESSION_COOKIE: login(node.url, "watcher").cookies[SESSION_COOKIE]}}
    else:
        kw = {
            "headers": {"authorization": f"Bearer {login(node.url, 'watcher', bearer=True).json()['token']}"}
        }
    r = httpx.post(
        f"{node.url}/prerender_admin/explain", json={"url": B_URL, "deviceType": "mobile"}, timeout=30, **kw
    )
    assert r.status_code == 200, r.text
    x = r.json()
    assert x["residency"] == {
        "queriedNode": "node-a",
        "scheduleOwnedBy": "node-b",
        "scheduleReadIsAuthoritative": False,
        "scheduleAuthoritative": True,
        "scheduleSource": "owner node-b",
        "peerError": None,
    }
    assert x["rows"]["renderSchedule"]["cacheKey"] == f"{B_URL}|mobile"
    assert x["rows"]["renderSchedule"]["nextRenderTime"] == FUTURE


def test_explain_on_the_other_node_asks_node_a(node, targets) -> None:
    x = call("POST", node.urls["node-b"], "explain", json={"url": A_URL}).json()
    assert (
        x["residency"]["scheduleSource"] == "owner node-a" and x["residency"]["scheduleAuthoritative"] is True
    )
    assert x["rows"]["renderSchedule"]["nextRenderTime"] == FUTURE


async def test_the_owner_rechecks_the_forwarded_credentials(node, targets) -> None:
    """The owner answers only what the caller may read: a fleet account or a forged cookie is refused
    there, and with no credentials at all (loopback is not trusted once users exist) the proxy is not
    even tried. Either way the row is unknown, never "absent"."""
    from prerender_ray.api.admin.explain import fetch_schedule_from_peer
    from prerender_ray.identity.nodes import NodeInfo

    peers = {"node-b": NodeInfo("node-b", "127.0.0.1", urlsplit(node.urls["node-b"]).port)}
    fleet = "Basic " + base64.b64encode(b"renderer:" + PASSWORDS["renderer"].encode()).decode()
    async with httpx.AsyncClient() as client:

        async def ask(creds: dict) -> dict:
            return await fetch_schedule_from_peer(client, peers, "node-b", f"{B_URL}|desktop", creds, 10.0)

        assert await ask({"authorization": fleet}) == {"error": "peer responded 403"}
        assert await ask({"cookie": f"{SESSION_COOKIE}=forged.token"}) == {"error": "peer responded 401"}
        assert await ask({}) == {"error": "no forwardable credentials on this request"}
        ok = await ask({"authorization": "Basic " + base64.b64encode(b"watcher:watch-pass").decode()})
        assert ok["row"]["nextRenderTime"] == FUTURE and ok["node"] == "node-b"


# ---------------------------------------------------------------------------- actions on the queue


def test_revalidate_makes_the_key_due_now_on_its_owner(node, targets) -> None:
    r = call("POST", node.url, "revalidate", json={"url": B_URL, "deviceType": "desktop"})
    assert r.status_code == 200, r.text
    assert r.json()["scheduleOwnedBy"] == "node-b" and r.json()["cacheKeys"] == [f"{B_URL}|desktop"]
    row = call("POST", node.urls["node-b"], "schedule", json={"cacheKey": f"{B_URL}|desktop"}).json()[
        "renderSchedule"
    ]
    assert row["nextRenderTime"] <= int(time.time() * 1000) and row["overdue"] is True
    other = call("POST", node.urls["node-b"], "schedule", json={"cacheKey": f"{B_URL}|mobile"}).json()
    assert other["renderSchedule"]["nextRenderTime"] == FUTURE  # one device only


def test_pause_a_node_from_another_node_then_inherit(node, targets) -> None:
    r = call("POST", node.url, "queue", json={"scope": "node-b", "paused": True})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["appliedOn"] == "node-b" and doc["local"] == {
        "status": "paused",
        "paused": True,
        "source": "node",
    }
    assert doc["updatedBy"] == "ops"
    claim = httpx.post(
        f"{node.urls['node-b']}/render_queue/claim",
        json={"limit": 5},
        auth=("renderer", "fleet-pass"),
        timeout=15,
    )
    assert claim.status_code == 200 and claim.json() == []

    def shown() -> bool:
        b = [n for n in call("GET", node.url, "overview").json()["nodes"] if n["name"] == "node-b"][0]
        return b["override"] is not None and b["override"]["paused"] is True and b["status"] == "paused"

    wait_for(shown, timeout=30, what="node-b paused in the overview")
    r = call("POST", node.url, "queue", json={"scope": "node-b", "paused": None})
    assert r.status_code == 200 and r.json()["inherited"] is True and r.json()["local"]["paused"] is False


def test_a_cluster_pause_reaches_every_node(node, targets) -> None:
    r = call("POST", node.urls["node-b"], "queue", json={"scope": "all", "paused": True})
    assert r.status_code == 200 and r.json()["appliesRemotelyWithinMs"] == 60_000

    def all_paused() -> bool:
        o = call("GET", node.url, "overview").json()
        return o["control"]["cluster"]["paused"] is True and all(n["live"]["paused"] for n in o["nodes"])

    wait_for(all_paused, timeout=30, what="every node paused")
    assert call("POST", node.url, "queue", json={"scope": "all", "paused": False}).status_code == 200
    wait_for(
        lambda: not any(n["live"]["paused"] for n in call("GET", node.url, "overview").json()["nodes"]),
        timeout=30,
        what="every node running again",
    )


def test_reconcile_starts_once_and_reports_its_pass(node, targets) -> None:
    r = call("POST", node.urls["node-b"], "reconcile")
    assert r.status_code in (200, 202), r.text
    assert r.json()["node"] == "node-b" and "THIS node" in r.json()["ownerScopeNote"]

    def finished() -> dict | None:
        o = call("GET", node.url, "overview").json()
        return o["reconcile"].get("node-b", {}).get("lastRun")

    run = wait_for(finished, timeout=60, what="node-b's reconcile pass")
    assert run["node"] == "node-b" and run["missing"] == 0 and run["owned"] >= 1


# ------------------------------------------------------------------------------- pages, sitemaps


def test_pages_are_browsed_with_signed_cursors_and_shown_as_text(node) -> None:
    keys = [f"https://shop.test/pages/{i:02d}|desktop" for i in range(7)]
    for k in keys:
        write_page(node["node-a"], k, f"<html><script>alert('{k}')</script></html>".encode())
    seen, cursor = [], None
    for _ in range(3):
        params = {"prefix": "https://shop.test/pages/"} | ({"cursor": cursor} if cursor else {})
        r = call("GET", node.url, "pages", params=params)
        assert r.status_code == 200, r.text
        doc = r.json()
        seen += [p["cacheKey"] for p in doc["pages"]]
        cursor = doc["nextCursor"]
        if not cursor:
            break
    assert seen == keys
    p = call("GET", node.url, "pages", params={"prefix": "https://shop.test/pages/", "limit": 1}).json()
    assert p["pages"][0]["fresh"] is True and p["pages"][0]["deviceType"] == "desktop" and p["truncated"]
    other = call(
        "GET", node.url, "pages", params={"prefix": "https://shop.test/other/", "cursor": p["nextCursor"]}
    )
    assert other.status_code == 400  # a cursor belongs to its listing
    r = call("GET", node.url, "page-content", params={"cacheKey": keys[0]}, who="watcher")
    assert r.status_code == 200
    assert (
        r.headers["content-type"] == "text/plain; charset=utf-8"
        and r.headers["x-content-type-options"] == "nosniff"
    )
    assert r.text == f"<html><script>alert('{keys[0]}')</script></html>"
    assert "sandbox" in r.headers["content-security-policy"]
    x = call("POST", node.url, "explain", json={"url": "https://shop.test/pages/00"}).json()
    assert x["rows"]["prerenderedPage"]["fresh"] is True and x["verdict"]["wouldServe"] == "cache"
    assert x["verdict"]["servedStatus"] == 200 and x["rows"]["prerenderedPage"]["location"] is None


def test_the_pages_total_agrees_with_what_the_listing_shows(node) -> None:
    """Before: ``total`` was an overview's table-count snapshot (per replica, refreshed only by the
    overview, absent before one), so it said 200 beside a listing of 202 pages."""
    call("GET", node.url, "overview")  # the snapshot the total used to come from
    for i in range(3):
        write_page(node["node-a"], f"https://shop.test/total/{i}|desktop", b"<html>t</html>")
    for _ in range(4):  # each ingress replica in turn, whichever answers
        seen, totals, cursor = 0, set(), None
        while True:
            r = call("GET", node.url, "pages", params={"cursor": cursor} if cursor else {})
            assert r.status_code == 200, r.text
            doc = r.json()
            seen += len(doc["pages"])
            totals.add(doc["total"])
            cursor = doc["nextCursor"]
            if not cursor:
                break
        assert totals == {seen}


def test_the_bots_view_merges_every_replica_of_every_node(node) -> None:
    """Before: the view showed the tallies of the one ingress replica that answered, as if they were
    the node's: the misses the other replica and the other node saw were missing."""
    urls = [f"https://shop.test/botsmiss/{i}" for i in range(8)]
    for base in node.urls.values():
        for url in urls:  # a connection each: the kernel spreads them over the node's replicas
            r = httpx.get(f"{base}/p/{url}", headers={"user-agent": "Googlebot/2.1"}, timeout=30)
            assert r.status_code in (200, 502, 504), r.text  # the origin: whatever it answers
    doc = call("GET", node.url, "bots", params={"limit": 1000}, who="watcher").json()
    counts = {m["url"]: m["count"] for rows in doc["missed"].values() for m in rows if "/botsmiss/" in m["url"]}
    assert counts == dict.fromkeys(urls, 2)  # one miss of each URL on each node
    replicas = node.config.get("server", {}).get("replicas", 2)
    assert doc["asked"] == doc["answered"] == 2 * replicas and not doc["partial"], doc["replicas"]
    assert set(doc["replicas"]) == {f"{n}/{i}" for n in ("node-a", "node-b") for i in range(replicas)}


def test_page_content_never_decodes_a_stored_page_past_the_cap(node) -> None:
    key = "https://shop.test/pages/bomb|desktop"
    now = int(time.time() * 1000)
    page = Page(cache_key=key, status_code=200,
                headers={"content-type": "text/html", "content-encoding": "br"},
                last_cached=now, expires_at=now + 3_600_000, content=brotli_bomb(64))  # 64 MiB of zeros
    node["node-a"].ask("store", "apply", [], [(key.encode(), page.encode())])
    r = call("GET", node.url, "page-content", params={"cacheKey": key}, who="watcher")
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert "decodes to more than 20971520 bytes" in r.json()["error"]


def test_sitemaps_and_one_sitemaps_entries_with_their_state(node, site) -> None:
    locs = [f"https://shop.test/sm/{i}" for i in range(7)] + ["https://shop.test/search/x", "not a url"]
    site.put("/sitemap.xml", urlset(*locs))
    root = site.url("/sitemap.xml", host=SITE_HOST)
    r = httpx.post(
        f"{node.url}/sitemaps", json={"url": root, "background": False}, timeout=300, **auth("ops")
    )
    assert r.status_code == 200, r.text
    write_page(node["node-a"], "https://shop.test/sm/0|desktop", b"<html>0</html>")
    listing = wait_for(
        lambda: [s for s in call("GET", node.url, "sitemaps").json()["sitemaps"] if s["url"] == root],
        timeout=30,
        what="the root in the listing",
    )
    assert listing[0]["refresh"]["state"] == "completed"
    first = call("POST", node.url, "sitemap", json={"url": root}).json()
    assert first["sitemap"]["entryCount"] == 9 and first["limit"] == 5 and first["nextOffset"] == 5
    assert first["targetCount"]["count"] == 7
    states = {e["loc"]: e["state"] for e in first["entries"]}
    assert states["https://shop.test/sm/0"] == "cached" and states["https://shop.test/sm/1"] == "scheduled"
    # a scheduled entry says when its first render is due (its owner's schedule row)
    [scheduled] = [e for e in first["entries"] if e["loc"] == "https://shop.test/sm/1"]
    explained = call("POST", node.url, "explain", json={"url": "https://shop.test/sm/1"}).json()
    due = explained["rows"]["renderSchedule"]["nextRenderTime"]  # read from the owner, wherever it is
    assert isinstance(scheduled["nextRenderTime"], int) and scheduled["nextRenderTime"] == due
    rest = call("POST", node.url, "sitemap", json={"url": root, "offset": 5}).json()
    by_loc = {e["loc"]: e for e in rest["entries"]}
    assert by_loc["https://shop.test/search/x"]["state"] == "filtered"
    assert by_loc["not a url"]["state"] == "invalid" and rest["nextOffset"] is None


def test_config_is_redacted_and_unrouted_is_an_honest_empty_report(node) -> None:
    r = call("GET", node.url, "config", who="watcher")
    text = r.text
    doc = r.json()
    assert doc["config"]["auth"]["session_secret"].startswith("<set: ")
    assert all(u["password_hash"] == "<set>" for u in doc["config"]["auth"]["users"])
    assert "pbkdf2" not in text
    assert any(w["key"] == "origin.security_token.value" for w in doc["warnings"])
    u = call("GET", node.url, "unrouted").json()
    assert u["enabled"] is False and u["perReplica"] is True  # prefix mode tallies nothing
    assert u["report"]["unclassified"] == [] and u["report"]["passthrough"] == []


# ------------------------------------------- in process: peers that hang, lie or vanish; the cap


class OnTheClusterLoop:
    """An httpx client whose requests are sent from the cluster's loop, where the app and node-a's
    parts live, and awaited from the test's."""

    def __init__(self, cluster: LocalCluster, client: httpx.AsyncClient, app: object = None):
        self.cluster, self.client, self.app = cluster, client, app

    async def get(self, *args, **kw) -> httpx.Response:
        return await self.cluster.arun(self.client.get(*args, **kw), 90)

    async def post(self, *args, **kw) -> httpx.Response:
        return await self.cluster.arun(self.client.post(*args, **kw), 90)


@pytest.fixture
def local(node, targets):
    """One more replica of node-a's app, with node-a's real actors, and a membership that names a
    fake node-z (the outside world) as the owner of some URLs. It runs on the cluster's loop (its
    bot path opened there), as node-a's own replicas do."""
    from prerender_ray.api.app import create_app
    from prerender_ray.api.bot.replica import close_replica, open_replica
    from prerender_ray.api.context import NodeContext
    from prerender_ray.config.model import Config
    from prerender_ray.identity.nodes import NodeInfo

    a = node["node-a"]

    async def make() -> tuple:
        ctx = NodeContext(
            cfg=Config.model_validate(a.config),
            node=NodeInfo("node-a", "127.0.0.1", urlsplit(a.url).port),
            data_dir=str(a.data_dir),
            keeper=a.handles["keeper"],
            leases=a.handles["leases"],
            store=a.handles["store"],
            replica=9,
            lookup=node.lookup,
        )
        app = create_app(ctx)
        open_replica(ctx)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 4242)),
            base_url="http://node-a.local",
            auth=("ops", PASSWORDS["ops"]),
            timeout=60,
        )
        return ctx, app, client

    async def close() -> None:
        await client.aclose()
        await close_replica(ctx)
        app.state.sessions.close()
        http = ctx.admin_http
        if http is not None:
            await http.aclose()

    ctx, app, client = node.run(make())
    yield ctx, OnTheClusterLoop(node, client, app)
    node.run(close())


def with_fake_owner(ctx, port: int) -> str:
    from prerender_ray.identity.nodes import NodeInfo

    names = ["node-a", "node-z"]
    ctx.ownership.update(names)
    ctx.peers = {"node-a": ctx.node, "node-z": NodeInfo("node-z", "127.0.0.1", port)}
    return next(
        u for u in (f"https://shop.test/z/{i}" for i in range(1000)) if Ownership(names).owner(u) == "node-z"
    )


@pytest.mark.parametrize("peer", ["hangs", "garbage", "gone"])
async def test_explain_survives_an_owner_that_hangs_lies_or_is_gone(local, peer) -> None:
    from tests.api.admin.test_common import FakePeer, http

    ctx, client = local
    reply = {"hangs": None, "garbage": http(200, b"<html>not json</html>", "text/html"), "gone": None}[peer]
    async with FakePeer(reply) as fake:
        port = fake.port
        if peer != "gone":
            url = with_fake_owner(ctx, port)
            r = await client.post("/prerender_admin/explain", json={"url": url})
    if peer == "gone":
        url = with_fake_owner(ctx, port)
        r = await client.post("/prerender_admin/explain", json={"url": url})
    assert r.status_code == 200, r.text
    res = r.json()["residency"]
    assert res["scheduleOwnedBy"] == "node-z" and res["scheduleAuthoritative"] is False
    assert res["scheduleSource"] == "local (not owner)"
    expected = {"hangs": "peer timed out", "garbage": "peer answered garbage", "gone": "peer fetch failed"}[
        peer
    ]
    assert res["peerError"].startswith(expected), res


async def test_a_third_heavy_read_on_a_replica_gets_429(local) -> None:
    ctx, client = local
    from prerender_ray.api.admin.common import heavy

    slots = heavy(ctx)
    slots.in_use = slots.size  # two heavy reads in flight on this replica
    try:
        for path in (
            "/prerender_admin/pages",
            "/prerender_admin/page-content?cacheKey=x",
            "/prerender_admin/queue-state?scope=cluster",
            "/prerender_admin/overview",
        ):
            r = await client.get(path)
            assert r.status_code == 429 and r.headers["retry-after"] == "1", (path, r.text)
        r = await client.post("/prerender_admin/sitemap", json={"url": "https://shop.test/s.xml"})
        assert r.status_code == 429
        assert (await client.get("/prerender_admin/config")).status_code == 200  # light reads are not capped
    finally:
        slots.in_use = 0
    assert (await client.get("/prerender_admin/pages")).status_code == 200


HOLD_S = 30.0  # how long a held password check waits for the test


class HeldSignIns:
    """PBKDF2 for one password (or any starting with ``prefix``) waits until ``release`` (at most
    HOLD_S), so sign-ins sent together are all in flight at once; ``guarded`` counts the sign-ins that
    reached the limiter (``Sessions.guard``), ``entered`` the checks that started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, prefix: bytes):
        from prerender_ray.api.admin.session import Sessions

        self.release, self.entered, self.guarded = threading.Event(), [], 0
        real_check, real_guard = hashlib.pbkdf2_hmac, Sessions.guard

        def check(hash_name: str, password: bytes, *rest: object) -> bytes:
            if password.startswith(prefix):
                self.entered.append(password)
                self.release.wait(HOLD_S)
            return real_check(hash_name, password, *rest)  # type: ignore[arg-type]

        def guard(sessions: Sessions, *args: object) -> None:
            self.guarded += 1
            real_guard(sessions, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(hashlib, "pbkdf2_hmac", check)
        monkeypatch.setattr(Sessions, "guard", guard)

    async def answers(self, calls: list) -> list[int]:
        """Sends ``calls`` together; once every one has reached the limiter, lets the checks finish."""
        sent = asyncio.gather(*calls)
        try:
            deadline = time.monotonic() + HOLD_S
            while self.guarded < len(calls) and time.monotonic() < deadline and not sent.done():
                await asyncio.sleep(0.01)
        finally:
            self.release.set()
        return [r.status_code for r in await sent]


async def test_parallel_wrong_sign_ins_cannot_all_pass_the_limiter(local, monkeypatch) -> None:
    """A sign-in counts as failed before its password is checked (and is taken back when it was right):
    twenty wrong passwords sent at once, with the limit at 3, get three checks and seventeen 429s."""
    ctx, client = local
    held = HeldSignIns(monkeypatch, b"parallel-")
    codes = await held.answers([
        client.post("/prerender_admin/login", json={"username": "ops", "password": f"parallel-{i}"}, auth=None)
        for i in range(20)
    ])
    assert sorted(codes) == [401] * 3 + [429] * 17, codes
    assert len(held.entered) == 3


async def test_parallel_sign_ins_with_the_right_password_share_one_check(local, monkeypatch) -> None:
    """The same credentials checked at once (a fleet's workers starting together behind one address)
    share one check and one count: none is refused, and PBKDF2 runs once."""
    ctx, client = local
    held = HeldSignIns(monkeypatch, PASSWORDS["ops"].encode())
    codes = await held.answers([client.get("/prerender_admin/config") for _ in range(20)])  # Basic ops
    assert codes == [200] * 20
    assert len(held.entered) == 1
    assert (await client.post("/prerender_admin/login", auth=None,
                              json={"username": "ops", "password": "wrong"})).status_code == 401  # not locked


async def test_sessions_issued_per_account_are_bounded(local) -> None:
    """Each logout writes a replicated revocation row, kept until the token would have expired and
    re-read by every replica: a viewer looping login and logout would grow that list without bound. A
    replica issues at most SESSIONS_PER_ACCOUNT_PER_HOUR sessions per account; past that, 429."""
    from prerender_ray.api.admin.session import SESSIONS_PER_ACCOUNT_PER_HOUR

    ctx, client = local
    watcher = {"username": "watcher", "password": PASSWORDS["watcher"], "bearer": True}
    for _ in range(SESSIONS_PER_ACCOUNT_PER_HOUR):
        r = await client.post("/prerender_admin/login", json=watcher, auth=None)
        assert r.status_code == 200, r.text
        out = await client.post("/prerender_admin/logout", auth=None,
                                headers={"authorization": f"Bearer {r.json()['token']}"})
        assert out.json()["revoked"] is True
    r = await client.post("/prerender_admin/login", json=watcher, auth=None)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
    assert "sessions" in r.json()["error"] and "token" not in r.json()
    r = await client.post("/prerender_admin/login", json={**watcher, "password": "wrong"}, auth=None)
    assert r.status_code == 401  # the password is checked first: the 429 tells nobody else anything
    ops = {"username": "ops", "password": PASSWORDS["ops"]}
    assert (await client.post("/prerender_admin/login", json=ops, auth=None)).status_code == 200  # per account


class Revocations:
    """The replica's reads of the revoked sessions, failing on demand (a store it cannot reach)."""

    def __init__(self, sessions: object):
        self.sessions, self.failures, self.failing = sessions, 0, False
        real = sessions.refresh_revocations  # type: ignore[attr-defined]

        async def refresh() -> None:
            if self.failing:
                self.failures += 1
                raise RuntimeError("the store cannot be reached")
            await real()

        sessions.refresh_revocations = refresh  # type: ignore[attr-defined]

    async def until_failed(self, times: int = 1) -> None:
        seen = self.failures
        for _ in range(200):
            if self.failures >= seen + times:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the revocations were not read again")


async def bearer_token(client, who: str = "ops") -> dict:
    r = await client.post("/prerender_admin/login", json={"username": who, "password": PASSWORDS[who],
                                                          "bearer": True}, auth=None)
    assert r.status_code == 200, r.text
    return {"authorization": f"Bearer {r.json()['token']}"}


async def test_a_token_is_refused_until_the_replica_has_read_the_revocations(local, monkeypatch) -> None:
    """Before: ``revoked`` starts empty at replica start and stayed so while its reads failed, and every
    signed token was honoured meanwhile: a signed-out one too. Now a token waits for the first read
    (FIRST_READ_WAIT_S) and is refused (401, saying why) if it does not come; Basic goes on working."""
    from prerender_ray.api.admin import session as mod

    ctx, client = local
    sessions = client.app.state.sessions
    bearer = await bearer_token(client)
    reads = Revocations(sessions)

    async def as_at_start() -> None:  # on the cluster's loop, where the refresher runs
        sessions.close()
        sessions.revoked, sessions.refreshed_at, sessions._first_read = {}, None, asyncio.Event()
        reads.failing = True
        sessions._ensure_refresher()

    await client.cluster.arun(as_at_start(), 10)
    monkeypatch.setattr(mod, "FIRST_READ_WAIT_S", 0.2)
    r = await client.get("/prerender_admin/config", headers=bearer, auth=None)
    assert r.status_code == 401 and "sign-in state is being loaded" in r.json()["error"], r.text[:300]
    s = (await client.get("/prerender_admin/session", headers=bearer, auth=None)).json()
    assert s["authenticated"] is False and "being loaded" in s["sessionError"], s
    assert (await client.get("/prerender_admin/config")).status_code == 200  # Basic needs no revocations
    # the first read comes: a token presented meanwhile waits for it, and is served
    monkeypatch.setattr(mod, "FIRST_READ_WAIT_S", 10.0)
    await reads.until_failed()
    reads.failing = False
    r = await client.get("/prerender_admin/config", headers=bearer, auth=None)
    assert r.status_code == 200, r.text


async def test_a_token_is_refused_while_the_revocations_cannot_be_read(local) -> None:
    """Before: ``refreshed_at`` was recorded but never looked at, so a replica whose reads kept failing
    honoured signed-out tokens for as long as they did. Past REVOCATIONS_MAX_AGE_S without a good read
    tokens are refused (Basic is not); signing out still works; a good read lets tokens in again."""
    from prerender_ray.api.admin.session import REVOCATIONS_MAX_AGE_S

    ctx, client = local
    sessions = client.app.state.sessions
    bearer = await bearer_token(client)
    assert (await client.get("/prerender_admin/config", headers=bearer, auth=None)).status_code == 200
    reads = Revocations(sessions)
    reads.failing = True
    await reads.until_failed()  # no good read is still in flight
    sessions.refreshed_at = time.monotonic() - REVOCATIONS_MAX_AGE_S - 1
    r = await client.get("/prerender_admin/config", headers=bearer, auth=None)
    assert r.status_code == 401 and "sign-in state cannot be checked" in r.json()["error"], r.text[:300]
    assert (await client.get("/prerender_admin/config")).status_code == 200  # Basic
    other = await bearer_token(client)  # a sign-in needs no revocations; its token waits as the others
    out = await client.post("/prerender_admin/logout", headers=other, auth=None)
    assert out.status_code == 200 and out.json()["revoked"] is True, out.text  # signing out still works
    reads.failing = False
    for _ in range(100):  # the next good read (every REVOCATION_REFRESH_S)
        r = await client.get("/prerender_admin/config", headers=bearer, auth=None)
        if r.status_code == 200:
            break
        await asyncio.sleep(0.1)
    assert r.status_code == 200, r.text
    r = await client.get("/prerender_admin/config", headers=other, auth=None)
    assert r.status_code == 401 and "signed out" in r.json()["error"], r.text[:300]


async def test_unrouted_peeks_at_this_replicas_tally(local) -> None:
    from prerender_ray.api.bot.replica import open_replica

    ctx, client = local
    tally = open_replica(ctx).services.unrouted
    for path in ("/search/shoes", "/search/hats", "/cart"):
        tally.record("passthrough", path, 1_000)
    doc = (await client.get("/prerender_admin/unrouted")).json()
    assert doc["available"] is True and doc["replica"] == 9
    rows = doc["report"]["passthrough"]
    assert sum(r["count"] for r in rows) == 3 and rows[0]["count"] >= rows[-1]["count"]
    again = (await client.get("/prerender_admin/unrouted")).json()
    assert again["report"] == doc["report"]  # a peek, not a drain


# ------------------------------------------------------------------------------- live config


def route_of(base: str, url: str) -> dict | None:
    r = call("POST", base, "explain", json={"url": url})
    assert r.status_code == 200, r.text
    return r.json()["ingress"]["route"]


def classes(base: str) -> list[dict]:
    r = call("GET", base, "queue-state")
    assert r.status_code == 200, r.text
    return r.json()["classes"]


def test_live_overrides_reach_every_node_and_reclassify_the_rows_held(node, targets) -> None:
    due = owned_by("node-b", "due", 3)
    live_route = {"match": "prefix", "path": "/due/", "renderInterval": 3_600_000}
    body = {"set": [{"path": "ingress.routes", "value": [live_route], "note": "hourly for /due/"},
                    {"path": "render.defaultInterval", "value": "12h"}]}
    dry = call("POST", node.urls["node-b"], "config-override", json={**body, "dryRun": True})
    assert dry.status_code == 200 and dry.json()["applied"] is False, dry.text
    assert {c["path"] for c in dry.json()["changes"]} == {"ingress.routes", "render.defaultInterval"}
    assert call("GET", node.url, "config").json()["overrides"]["rows"] == []  # a dry run writes nothing

    r = call("POST", node.urls["node-b"], "config-override", json=body)
    assert r.status_code == 200 and r.json()["applied"] is True, r.text
    for base in node.urls.values():  # every replica routes with it, every keeper holds the rows by it
        wait_for(lambda b=base: (route_of(b, due[0]) or {}).get("path") == "/due/", timeout=30,
                 what="the live route on every node")
        cfg = call("GET", base, "config").json()
        assert cfg["config"]["render"]["default_interval"] == 12 * 3_600_000
        assert {row["path"] for row in cfg["overrides"]["rows"]} == {"ingress.routes", "render.defaultInterval"}
    # node-b owns the /due/ rows: its keeper moved them to the new route's class, in memory
    wait_for(lambda: any("/due/" in c["route"] and c["rows"] == 2 * len(due) for c in classes(node.urls["node-b"])),
             timeout=30, what="the /due/ rows reclassified on their owner")
    # a schedule written now takes the route's cadence
    fresh = owned_by("node-b", "due", 4)[-1]
    put_target(node.urls["node-a"], fresh)
    sched = call("POST", node.urls["node-b"], "schedule", json={"cacheKey": f"{fresh}|desktop"}).json()
    assert sched["renderSchedule"]["effectiveInterval"] == 3_600_000

    cleared = call("POST", node.url, "config-override", json={"clear": ["ingress.routes", "render.defaultInterval"]})
    assert cleared.status_code == 200, cleared.text
    for base in node.urls.values():
        wait_for(lambda b=base: route_of(b, due[0]) is None, timeout=30, what="the file's routes again")
    wait_for(lambda: not any("/due/" in c["route"] for c in classes(node.urls["node-b"])), timeout=30,
             what="the rows back in the file's classes")


@pytest.mark.parametrize("entries, reason", [
    ({"set": [{"path": "server.port", "value": 1}]}, "read at start only"),
    ({"set": [{"path": "no.such", "value": 1}]}, "unknown option"),
    ({"set": [{"path": "render.defaultInterval", "value": -1}]}, "greater than 0"),
    ({"set": [{"path": "ingress.routes", "value": [{"match": "bogus", "path": "/x"}]}]}, "dropped"),
    ({"set": [{"path": "queue.ready.sitemapBoost", "value": 3}], "clear": ["queue.ready.sitemapBoost"]},
     "set and cleared"),
])
def test_a_bad_override_is_a_400_and_writes_nothing(node, entries, reason) -> None:
    before = call("GET", node.url, "config").json()["overrides"]["rows"]
    r = call("POST", node.url, "config-override", json=entries)
    assert r.status_code == 400 and r.json()["applied"] is False, r.text
    assert any(reason in i["reason"] for i in r.json()["invalid"]), r.text
    assert call("GET", node.url, "config").json()["overrides"]["rows"] == before


def test_an_override_request_with_nothing_to_do_is_a_400(node) -> None:
    for body in ({}, {"set": [], "clear": []}, {"set": "x"}, {"set": [], "dryRun": "yes"}):
        r = call("POST", node.url, "config-override", json=body)
        assert r.status_code == 400, (body, r.text)
