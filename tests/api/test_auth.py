"""Roles over real HTTP: fleet, viewer, admin, anonymous (with users configured, loopback is not trusted)."""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from prerender_ray.admin.users import ITERATIONS, hash_password, resolve_password_hashes
from prerender_ray.api.auth import Authenticator
from prerender_ray.config.service import Auth, User
from tests.localnode import LocalNode

USERS = {"ops": ("admin", "ops-pass"), "watcher": ("viewer", "watch-pass"), "renderer": ("fleet", "fleet-pass")}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("RENDERER_PASSWORD", USERS["renderer"][1])
    users = [
        {"name": "ops", "roles": ["admin"], "passwordHash": hash_password(USERS["ops"][1], iterations=1000)},
        {"name": "watcher", "roles": ["viewer"], "passwordEnv": "WATCHER_PASSWORD"},
        {"name": "renderer", "roles": ["fleet"], "passwordEnv": "RENDERER_PASSWORD"},
    ]
    mp.setenv("WATCHER_PASSWORD", USERS["watcher"][1])
    d = LocalNode.start(tmp_path_factory.mktemp("auth") / "data", {"auth": {"users": users}})
    mp.undo()
    yield d
    d.stop()


def as_user(name: str | None, password: str | None = None) -> dict:
    if name is None:
        return {}
    return {"auth": (name, password if password is not None else USERS[name][1])}


ROUTES = [  # method, path, json, the roles that may
    ("POST", "/render_queue/claim", {"limit": 1}, {"fleet", "admin"}),
    ("POST", "/render_queue/pause", None, {"fleet", "admin"}),
    ("GET", "/queue_status", None, {"fleet", "viewer", "admin"}),
    ("GET", "/prerender_admin/queue-state", None, {"viewer", "admin"}),
    ("PUT", "/render_targets", {"url": "https://auth.example/a"}, {"admin"}),
    ("GET", "/render_targets?url=https://auth.example/a", None, {"viewer", "admin"}),
]


@pytest.mark.parametrize("who", ["ops", "watcher", "renderer", None])
def test_every_route_checks_the_callers_role(node, who) -> None:
    role = USERS[who][0] if who else None
    for method, path, body, allowed in ROUTES:
        r = httpx.request(method, node.url + path, json=body, timeout=15, **as_user(who))
        if role is None:
            assert r.status_code == 401, (path, r.text)
            assert r.json()["authenticated"] is False
            assert r.headers["www-authenticate"].startswith("Basic")
        elif role in allowed:
            assert r.status_code in (200, 404), (who, path, r.text)
        else:
            assert r.status_code == 403, (who, path, r.text)
            assert r.json()["authenticated"] is True
    httpx.post(node.url + "/render_queue/resume", **as_user("ops"))


def test_a_fleet_credential_never_lifts_an_admins_pause(node) -> None:
    admin, fleet = as_user("ops"), as_user("renderer")
    r = httpx.post(node.url + "/prerender_admin/queue", json={"scope": "node-a", "paused": True}, **admin)
    assert r.status_code == 200, r.text
    r = httpx.post(node.url + "/render_queue/resume", **fleet)
    assert r.status_code == 409 and "paused by ops through the admin API" in r.json()["error"]
    assert httpx.get(node.url + "/queue_control", **admin).json()[0]["paused"] is True
    assert httpx.post(node.url + "/render_queue/pause", **fleet).status_code == 200  # already paused
    r = httpx.post(node.url + "/render_queue/resume", **admin)  # an admin may, on either route
    assert r.status_code == 200 and r.json()["inherited"] is True
    assert httpx.post(node.url + "/render_queue/pause", **fleet).status_code == 200  # the fleet's own
    r = httpx.post(node.url + "/render_queue/resume", **fleet)
    assert r.status_code == 200 and r.json()["local"]["paused"] is False


def test_a_wrong_password_or_garbage_credentials_are_401(node) -> None:
    assert httpx.post(node.url + "/render_queue/claim", json={}, **as_user("renderer", "nope")).status_code == 401
    r = httpx.post(node.url + "/render_queue/claim", json={}, headers={"authorization": "Basic !!!"})
    assert r.status_code == 401
    assert httpx.get(node.url + "/healthz").status_code == 200  # probes stay open


BASIC_ROUTES = [  # method, path, what a wrong password gets: FastAPI's require(), the fleet's own path
    ("GET", "/queue_status", 401),
    ("POST", "/render_queue/claim", 401),
    ("GET", "/prerender_admin/session", 200),  # open to everyone: it says who is calling
]


def from_address(ip: str) -> httpx.Client:
    """Another client address: each test's wrong passwords count in the limiter for it alone."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=ip), timeout=30)


def iterations(encoded: str) -> int:
    return int(encoded.split("$")[1])


def test_a_password_from_the_environment_is_hashed_as_hash_password_does() -> None:
    """Before: 50,000 rounds against hash-password's 200,000, so such a user answered faster."""
    auth = Auth.model_validate({"users": [{"name": "w", "roles": ["viewer"], "passwordEnv": "W_PW"}]})
    (user,) = resolve_password_hashes(auth, {"W_PW": "watch-pass"})
    assert iterations(user["password_hash"]) == ITERATIONS == iterations(hash_password("x"))


def test_with_a_session_secret_a_password_from_the_environment_hashes_the_same_at_each_up() -> None:
    """Sessions are bound to their user's password hash: a passwordEnv hashed with a fresh random salt
    at each ``up`` would sign that user out at every deployment, password changed or not."""
    def hashed(password: str, secret: str = "") -> str:
        auth = Auth.model_validate({"users": [{"name": "w", "roles": ["viewer"], "passwordEnv": "W_PW"}],
                                    "sessionSecret": secret})
        return resolve_password_hashes(auth, {"W_PW": password})[0]["password_hash"]

    same = hashed("watch-pass", "a-configured-secret-of-length")
    assert same == hashed("watch-pass", "a-configured-secret-of-length")
    assert same != hashed("new-pass", "a-configured-secret-of-length")
    assert same != hashed("watch-pass", "another-configured-secret")
    assert hashed("watch-pass") != hashed("watch-pass")  # no secret: a random salt (and a random key)


def test_the_decoy_costs_what_the_dearest_user_does() -> None:
    """Before: the decoy took the first user's rounds, so a dearer user after it answered slower than a
    name that is no user (measured: ~20 ms against ~82 ms)."""
    users = [User(name=n, roles=["admin"], password_hash=hash_password("p", iterations=k))
             for n, k in (("cheap", 1000), ("dear", 3000), ("middle", 2000))]
    decoy = Authenticator(users)._decoy
    assert decoy is not None and iterations(decoy) == 3000
    assert Authenticator(users[:1]).check_password("nobody", "p") is None


def counted_rounds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The PBKDF2 rounds of each ``hashlib.pbkdf2_hmac`` call from now on, in order."""
    rounds: list[int] = []
    real = hashlib.pbkdf2_hmac

    def counted(hash_name: str, password: bytes, salt: bytes, iterations: int, *rest: int) -> bytes:
        rounds.append(iterations)
        return real(hash_name, password, salt, iterations, *rest)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    return rounds


def test_a_right_password_costs_its_own_hash_and_a_wrong_one_the_dearest(monkeypatch) -> None:
    users = [User(name=n, roles=["admin"], password_hash=hash_password("p", iterations=k))
             for n, k in (("cheap", 1000), ("dear", 3000))]
    auth = Authenticator(users)
    rounds = counted_rounds(monkeypatch)
    spent = {}
    for name, password in (("cheap", "p"), ("cheap", "x"), ("dear", "p"), ("dear", "x"), ("nobody", "p")):
        rounds.clear()
        principal = auth.check_password(name, password)
        assert (principal is not None) == (password == "p" and name != "nobody")
        spent[name, password] = sum(rounds)
    assert spent == {("cheap", "p"): 1000, ("cheap", "x"): 3000, ("dear", "p"): 3000, ("dear", "x"): 3000,
                     ("nobody", "p"): 3000}


@pytest.mark.parametrize("method, path, code", BASIC_ROUTES)
def test_an_unknown_name_costs_the_pbkdf2_a_known_one_does(node, monkeypatch, method, path, code) -> None:
    """No timing oracle for user names: a wrong password runs as many PBKDF2 rounds for "nobody" and for
    a user hashed cheaper (ops, at 1,000: its check, then the difference) as for the dearest user
    (watcher, from the environment, at ITERATIONS)."""
    rounds = counted_rounds(monkeypatch)
    spent = {}
    with from_address("127.0.0.5") as client:
        for name in ("ops", "watcher", "nobody"):
            rounds.clear()
            assert client.request(method, node.url + path, json={}, auth=(name, "wrong")).status_code == code
            spent[name] = list(rounds)
    assert spent == {"ops": [1000, ITERATIONS - 1000], "watcher": [ITERATIONS], "nobody": [ITERATIONS]}


HOLD_S = 5.0  # how long a held check waits for the test before it gives up


@pytest.mark.parametrize("method, path, code", BASIC_ROUTES)
def test_a_password_is_checked_off_the_event_loop(node, monkeypatch, method, path, code) -> None:
    """While one wrong password is being checked, the replica answers another request: the check is
    held until the test has that answer, which it could not get if PBKDF2 ran on the event loop (the
    check would then give up after HOLD_S, and say so)."""
    entered, release, released = threading.Event(), threading.Event(), []
    real = hashlib.pbkdf2_hmac

    def held(hash_name: str, password: bytes, *rest: object) -> bytes:
        if password == b"held-guess":
            entered.set()
            released.append(release.wait(HOLD_S))
        return real(hash_name, password, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", held)
    with from_address("127.0.0.6") as client, ThreadPoolExecutor(1) as pool:
        guess = pool.submit(client.request, method, node.url + path, json={}, auth=("ops", "held-guess"))
        try:
            assert entered.wait(HOLD_S), "the check never started"
            other = httpx.get(node.url + "/healthz", timeout=30)
        finally:
            release.set()
        assert other.status_code == 200
        assert guess.result(timeout=30).status_code == code
    assert released == [True], "the other request was answered only after the check gave up"


@pytest.fixture(scope="module")
def open_node(tmp_path_factory):
    """No users configured: every loopback caller is an admin."""
    d = LocalNode.start(tmp_path_factory.mktemp("open") / "data", {})
    yield d
    d.stop()


CROSS_SITE = [  # what a browser adds to a request an evil page makes it send
    {"origin": "https://evil.test"},
    {"origin": "null"},  # a sandboxed frame, a data: URL, a redirect across sites
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site"},
    {"origin": "https://evil.test", "sec-fetch-site": "cross-site"},
]


def forged(base: str, method: str, path: str, body: dict, headers: dict, **kw) -> httpx.Response:
    """What an HTML form posts: enctype text/plain can carry a JSON body, and no preflight is made."""
    return httpx.request(method, base + path, content=json.dumps(body),
                         headers={"content-type": "text/plain", **headers}, timeout=15, **kw)


def paused_rows(base: str, **kw) -> list[dict]:
    r = httpx.get(base + "/queue_control", timeout=15, **kw)
    assert r.status_code == 200, r.text
    return [row for row in r.json() if row.get("paused") is not None]


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_a_cross_site_browser_request_is_refused_with_basic_credentials(node, headers) -> None:
    """A browser that once answered the Basic prompt keeps sending those credentials: an evil page's
    form post carries them, and is refused before anything changes; so is the fleet's fast path."""
    url = f"https://auth.example/csrf/{len(headers)}"
    for method, path, body in (("PUT", "/render_targets", {"url": url}),
                               ("POST", "/prerender_admin/queue", {"paused": True}),
                               ("POST", "/prerender_admin/reconcile", {}),
                               ("POST", "/render_queue/claim", {"limit": 1}),
                               ("POST", "/render_queue/pause", {})):
        r = forged(node.url, method, path, body, headers, **as_user("ops"))
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert "cross-site" in r.json()["error"], r.text
    target = httpx.get(node.url + "/render_targets", params={"url": url}, timeout=15, **as_user("ops"))
    assert target.status_code == 404, target.text
    assert paused_rows(node.url, **as_user("ops")) == []
    # reads are not refused (a browser cannot read a cross-site answer; a link may point here)
    r = httpx.get(node.url + "/queue_status", headers=headers, timeout=15, **as_user("ops"))
    assert r.status_code == 200, r.text


def test_same_origin_and_header_less_callers_are_served_as_before(node) -> None:
    """The console (its own Origin, Sec-Fetch-Site same-origin) and workers, curl, the fleet (neither)."""
    for i, headers in enumerate(({"origin": node.url, "sec-fetch-site": "same-origin"},
                                 {"origin": node.url}, {"sec-fetch-site": "none"}, {})):
        url = f"https://auth.example/same/{i}"
        r = forged(node.url, "PUT", "/render_targets", {"url": url}, headers, **as_user("ops"))
        assert r.status_code == 200, (headers, r.text)
        r = httpx.get(node.url + "/render_targets", params={"url": url}, timeout=15, **as_user("ops"))
        assert r.status_code == 200, r.text
    r = httpx.post(node.url + "/render_queue/claim", json={"limit": 1}, timeout=15, **as_user("renderer"))
    assert r.status_code in (200, 204), r.text


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_a_cross_site_request_to_a_loopback_admin_is_refused(open_node, headers) -> None:
    """With no users every loopback caller is an admin, no credentials needed: a page in a browser on
    the node's host must not get to post to it."""
    for method, path, body in (("POST", "/prerender_admin/queue", {"paused": True}),
                               ("PUT", "/render_targets", {"url": "https://open.example/csrf"})):
        r = forged(open_node.url, method, path, body, headers)
        assert r.status_code == 403, (path, r.status_code, r.text)
    assert paused_rows(open_node.url) == []
    r = httpx.get(open_node.url + "/render_targets", params={"url": "https://open.example/csrf"}, timeout=15)
    assert r.status_code == 404, r.text


def test_a_same_origin_or_header_less_loopback_admin_is_served_as_before(open_node) -> None:
    for headers in ({"origin": open_node.url, "sec-fetch-site": "same-origin"}, {}):
        r = forged(open_node.url, "POST", "/prerender_admin/queue", {"paused": True}, headers)
        assert r.status_code == 200, r.text
        assert paused_rows(open_node.url) != []
        r = forged(open_node.url, "POST", "/prerender_admin/queue", {"paused": None}, headers)
        assert r.status_code == 200, r.text
        assert paused_rows(open_node.url) == []


def test_a_loopback_admin_answers_only_to_a_loopback_host(open_node) -> None:
    """DNS rebinding: a page of rebind.evil.test whose name now resolves to 127.0.0.1 reaches the node
    from loopback, same-origin as far as its browser knows (Host and Origin both name evil.test)."""
    port = open_node.url.rsplit(":", 1)[1]
    evil = f"rebind.evil.test:{port}"
    for method, path in (("GET", "/prerender_admin/config"), ("GET", "/prerender_admin/session"),
                         ("GET", "/queue_control")):
        r = httpx.request(method, open_node.url + path, headers={"host": evil}, timeout=15)
        assert r.status_code == 403, (path, r.status_code, r.text[:200])
        assert "Host" in r.json()["error"] and "rebind.evil.test" in r.json()["error"], r.text
    r = forged(open_node.url, "POST", "/prerender_admin/queue", {"paused": True},
               {"host": evil, "origin": f"http://{evil}", "sec-fetch-site": "same-origin"})
    assert r.status_code == 403, r.text
    assert paused_rows(open_node.url) == []
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"127.3.2.1:{port}",
                 f"[::1]:{port}", "localhost", "127.0.0.1"):
        r = httpx.get(open_node.url + "/prerender_admin/config", headers={"host": host}, timeout=15)
        assert r.status_code == 200, (host, r.text[:200])
    for host in (f"localhost.evil.test:{port}", f"127.0.0.1.evil.test:{port}", f"0.0.0.0:{port}", ""):
        r = httpx.get(open_node.url + "/prerender_admin/config", headers={"host": host}, timeout=15)
        assert r.status_code == 403, (host, r.text[:200])


def test_with_users_the_host_is_not_checked(node) -> None:
    """Signed-in callers name a host of their own choosing (a proxy, a DNS name): only loopback's
    ambient authority is tied to a loopback Host."""
    r = httpx.get(node.url + "/prerender_admin/config", headers={"host": "admin.example:443"}, timeout=15,
                  **as_user("ops"))
    assert r.status_code == 200, r.text[:200]


def test_the_failed_sign_in_limiter_keys_on_the_peer_and_the_account(node) -> None:
    """Last in this module (it locks "renderer" for a minute). From 127.0.0.1 with no trusted proxies:
    a rotated X-Forwarded-For buys no fresh attempts, and the fleet's wrong password locks the fleet
    account only, not the admins behind the same address."""
    claim = node.url + "/render_queue/claim"
    codes = [httpx.post(claim, json={}, auth=("mallory", "guess"), timeout=15,
                        headers={"x-forwarded-for": f"198.51.100.{i}"}).status_code for i in range(11)]
    assert codes == [401] * 10 + [429], codes
    stale = [httpx.post(claim, json={}, **as_user("renderer", "stale"), timeout=15).status_code for _ in range(10)]
    assert set(stale) <= {401, 429} and stale[-1] == 429, stale  # an earlier test failed it once too
    r = httpx.post(claim, json={}, **as_user("renderer"), timeout=15)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text  # even the right password now
    assert "for this account" in r.json()["error"]
    assert httpx.get(node.url + "/prerender_admin/queue-state", **as_user("ops"), timeout=15).status_code == 200
    assert httpx.get(node.url + "/queue_status", **as_user("watcher"), timeout=15).status_code == 200
