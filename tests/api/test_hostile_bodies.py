"""No route answers 500 to any body, and a refused body changes nothing (issue 19 items 7, 10; issue 22
item 4). Over real HTTP, in forwarded mode with a catch-all prerender route and the bot's headers on
every request, so it also shows our own routes are never proxied to the origin."""

from __future__ import annotations

import httpx
import pytest

from prerender_ray.admin.users import hash_password
from tests.api.origin_site import OriginSite
from tests.localnode import LocalNode

OPS, FLEET = ("ops", "ops-pass"), ("renderer", "fleet-pass")
TARGET = "http://127.0.0.1:1/hostile"  # in the catch-all route; never a target after this module's bodies

ROUTES = [  # method, path, credentials
    ("POST", "/render_queue/claim", FLEET),
    ("POST", "/render_queue/job_result", FLEET),
    ("POST", "/sitemaps", OPS),
    ("PUT", "/render_targets", OPS),
    ("POST", "/render_targets", OPS),
    ("POST", "/prerender_admin/login", None),
    ("POST", "/prerender_admin/explain", OPS),
    ("POST", "/prerender_admin/schedule", OPS),
    ("POST", "/prerender_admin/sitemap", OPS),
    ("POST", "/prerender_admin/queue", OPS),
    ("POST", "/prerender_admin/revalidate", OPS),
    ("POST", "/prerender_admin/reconcile", OPS),
    ("POST", "/prerender_admin/config-override", OPS),
    ("POST", "/prerender_admin/robots/discover", OPS),
]
HIDDEN = ('{"set": [{"path": "render.defaultInterval", "value": ["\u2200", ' + "[" * 900 + "]" * 900
          + ', "\u2200"]}], "dryRun": true}')
BODIES = {
    "nested 10 KB": b"[" * 10240 + b"]" * 10240,
    "nested 1 MB": b"[" * (512 * 1024) + b"]" * (512 * 1024),
    "nested objects": b'{"url": ' * 5000 + b"1" + b"}" * 5000,
    "array": b"[]",
    "number": b"5",
    "string": b'"https://x.example/sitemap.xml"',
    "null": b"null",
    "invalid utf-8": b'{"url": "\xff\xfe"}',
    "lone surrogate": b'{"url": "https://x.example/\\ud800", "limit": 1}',  # no UTF-8 encoder takes it
    "huge number": b'{"limit": 1' + b"0" * 5000 + b"}",
    # a typo for "url": it used to start a refresh of every root
    "unknown key": b'{"sitemap": "https://x.example/sitemap.xml", "url": "' + TARGET.encode() + b'"}',
    # json.loads also reads UTF-16/32: "\u2200" holds a '"' byte there, which hid the brackets from the
    # depth scan (depth 1 scanned, 900 parsed: a RecursionError in the config override's deepcopy)
    **{f"hidden nesting in {codec}": HIDDEN.encode(codec) for codec in ("utf-16-le", "utf-16-be", "utf-16",
                                                                         "utf-32-le", "utf-32-be")},
}


@pytest.fixture(scope="module")
def site():
    s = OriginSite().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory, site):
    users = [{"name": name, "roles": [role], "passwordHash": hash_password(password, iterations=1000)}
             for (name, password), role in ((OPS, "admin"), (FLEET, "fleet"))]
    d = LocalNode.start(tmp_path_factory.mktemp("hostile") / "data", {
        "domains": [f"127.0.0.1:{site.port}"],
        "ingress": {"mode": "forwarded", "routes": [{"match": "prefix", "path": "/"}]},
        "auth": {"users": users},
        "render": {"reconcile": {"startDelay": "1h"}},
    })
    yield d
    d.stop()


def bot(site: OriginSite) -> dict[str, str]:
    """What a CDN in front of us forwards for a crawler: every request here looks like a bot's."""
    return {"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1)", "x-forwarded-host": f"127.0.0.1:{site.port}",
            "x-forwarded-proto": "http"}


def test_every_json_route_answers_hostile_bodies_with_a_4xx_json_error_and_changes_nothing(node, site) -> None:
    with httpx.Client(base_url=node.url, timeout=30) as c:
        for method, path, who in ROUTES:
            for name, body in BODIES.items():
                headers = {**bot(site), "content-type": "application/json"}
                if path.endswith("job_result"):
                    headers["x-metadata-size"] = str(len(body))
                r = c.request(method, path, content=body, headers=headers, auth=who)
                assert 400 <= r.status_code < 500, (method, path, name, r.status_code, r.text[:200])
                assert isinstance(r.json().get("error"), str), (path, name, r.text[:200])
                if name == "unknown key" and not path.endswith("job_result"):  # metadata: the id is missing
                    assert "'sitemap'" in r.json()["error"] and "sitemap" in r.json()["unknownKeys"], (path, r.text)
        assert site.seen == []  # none of it reached the origin
        assert c.get("/sitemap_refresh", params={"root": "all"}, auth=OPS).status_code == 404  # no walk started
        assert c.get("/sitemaps", auth=OPS).json()["sitemaps"] == []
        assert c.get("/render_targets", params={"url": TARGET}, auth=OPS).status_code == 404
        overview = c.get("/prerender_admin/overview", auth=OPS).json()
        assert overview["control"]["cluster"] is None  # nothing paused
        assert c.get("/prerender_admin/config", auth=OPS).json()["overrides"]["rows"] == []


def test_the_accepted_keys_are_named_and_a_known_body_still_works(node, site) -> None:
    r = httpx.post(f"{node.url}/sitemaps", json={"sitemap": "https://x.example/s.xml", "revalidat": True},
                   auth=OPS, timeout=30)
    assert r.status_code == 400, r.text
    doc = r.json()
    assert doc["unknownKeys"] == ["revalidat", "sitemap"] and doc["acceptedKeys"] == ["background", "revalidate",
                                                                                       "url"]
    assert "accepted: background, revalidate, url" in doc["error"]
    r = httpx.post(f"{node.url}/prerender_admin/config-override", auth=OPS, timeout=30,
                   json={"set": [{"path": "render.defaultInterval", "value": "2h", "nots": "typo"}], "dryRun": True})
    assert r.status_code == 400 and r.json()["unknownKeys"] == ["nots"], r.text
    r = httpx.post(f"{node.url}/render_queue/claim", json={"limit": 5}, auth=FLEET, timeout=30)  # the fleet's body
    assert r.status_code == 200 and r.json() == []



@pytest.mark.parametrize("value", [10**300, 2**63, 2**53])
@pytest.mark.parametrize("field", ["renderInterval", "nextRenderTime"])
def test_a_huge_number_that_parses_is_a_400_in_a_numeric_field(node, field, value) -> None:
    """2**63 and up was a 500 from the keeper; past 2**53 the JS fleet could not hold it exactly."""
    r = httpx.put(f"{node.url}/render_targets", json={"url": TARGET, field: value}, auth=OPS, timeout=30)
    assert r.status_code == 400 and "must be <= 9007199254740991" in r.json()["error"], r.text
    assert httpx.get(f"{node.url}/render_targets", params={"url": TARGET}, auth=OPS, timeout=30).status_code == 404
    r = httpx.post(f"{node.url}/prerender_admin/sitemap", json={"url": "http://127.0.0.1:1/s.xml", "offset": value},
                   auth=OPS, timeout=30)
    assert r.status_code == 400, r.text


def test_an_admin_route_is_ours_even_under_a_catch_all_route_in_forwarded_mode(node, site) -> None:
    """/render_targets was missing from the hand-written reserved list: a bot-looking PUT was proxied
    to the origin (anonymous, it even reached it with its body)."""
    url = f"http://127.0.0.1:{site.port}/page/reserved"
    r = httpx.put(f"{node.url}/render_targets", json={"url": url}, headers=bot(site), timeout=30)
    assert r.status_code == 401 and r.json()["authenticated"] is False
    r = httpx.put(f"{node.url}/render_targets", json={"url": url}, headers=bot(site), auth=OPS, timeout=30)
    assert r.status_code == 200 and r.json()["url"] == url, r.text
    for path in ("/sitemaps", "/sitemap_refresh?root=all", "/queue_control"):
        r = httpx.get(f"{node.url}{path}", headers=bot(site), auth=OPS, timeout=30)
        assert r.status_code in (200, 404) and r.headers["content-type"].startswith("application/json"), path
    assert site.seen == []  # the origin's request log is empty
    page = httpx.get(f"{node.url}/page/elsewhere", headers={**bot(site), "x-harper-prerender-debug": "1"}, timeout=30)
    assert page.headers.get("x-harper-route", "").startswith("prefix /")  # the catch-all itself still routes
    assert [s.path for s in site.seen] == ["/page/elsewhere"]



MANY_DIGITS = "1" * 5000  # past int()'s 4,300-digit limit
SAMPLES = {"superscript": "\u00b2", "double minus": "--5", "5000 digits": MANY_DIGITS}
BAD_INTEGERS = {  # id: method, path, credentials, what to send, the error's start
    **{f"claim limit {k}": ("POST", "/render_queue/claim", FLEET, {"json": {"limit": v}}, "limit must be an integer")
       for k, v in SAMPLES.items()},
    **{f"target renderInterval {k}": ("PUT", "/render_targets", OPS, {"json": {"url": TARGET, "renderInterval": v}},
                                      "renderInterval must be an integer") for k, v in SAMPLES.items()},
    **{f"bots ?limit {k}": ("GET", "/prerender_admin/bots", OPS, {"params": {"limit": v}}, "limit must be an integer")
       for k, v in SAMPLES.items() if k != "double minus"},
    "pages ?limit superscript": ("GET", "/prerender_admin/pages", OPS, {"params": {"limit": "\u00b2"}},
                                 "limit must be an integer"),
    **{f"x-metadata-size {n} digits": ("POST", "/render_queue/job_result", FLEET,
                                       {"content": b'{"id": "x"}', "headers": {"x-metadata-size": "1" * n}},
                                       "x-metadata-size must be a positive integer") for n in (4301, 5000)},
    "revalidate within 9*400 days": ("POST", "/render_targets", OPS,
                                     {"json": {"action": "revalidate", "all": True, "within": "9" * 400 + "d"}},
                                     "within: not a duration"),
    **{f"override a duration of 9*400{unit}": ("POST", "/prerender_admin/config-override", OPS, {"json": {
        "set": [{"path": "render.defaultInterval", "value": "9" * 400 + unit}]}}, "Nothing was written")
       for unit in ("d", "ms")},
}


@pytest.mark.parametrize("method, path, who, request_args, error", BAD_INTEGERS.values(), ids=BAD_INTEGERS.keys())
def test_a_malformed_integer_is_a_400_naming_it(node, method, path, who, request_args, error) -> None:
    """str.isdigit takes "\u00b2" and "--5" passed lstrip("-"); int() then refused them, as it refuses
    more than 4,300 digits, and 9*400 days is an infinite float: each was a 500."""
    r = httpx.request(method, f"{node.url}{path}", auth=who, timeout=30, **request_args)
    assert r.status_code == 400 and r.json()["error"].startswith(error), r.text[:300]
    assert httpx.get(f"{node.url}/render_targets", params={"url": TARGET}, auth=OPS, timeout=30).status_code == 404
    assert httpx.get(f"{node.url}/prerender_admin/overview", auth=OPS, timeout=30).json()["control"]["cluster"] is None
    assert httpx.get(f"{node.url}/prerender_admin/config", auth=OPS, timeout=30).json()["overrides"]["rows"] == []


def test_the_integers_accepted_before_still_are(node) -> None:
    for limit in (3, 3.0, "3", " 3 ", "-2", "0003", "0" * 4299 + "3", "9" * 4300):  # -2 -> 1, 9*4300 -> the max
        r = httpx.post(f"{node.url}/render_queue/claim", json={"limit": limit}, auth=FLEET, timeout=30)
        assert r.status_code == 200 and isinstance(r.json(), list), (limit, r.text[:200])
    for limit in ("7", " 7", "0007"):
        r = httpx.get(f"{node.url}/prerender_admin/bots", params={"limit": limit}, auth=OPS, timeout=30)
        assert r.status_code == 200, (limit, r.text[:200])
    for size in ("11", "011"):  # read as the metadata's size: refused for its missing id, not the size
        r = httpx.post(f"{node.url}/render_queue/job_result", content=b'{"id": "x"}', auth=FLEET, timeout=30,
                       headers={"x-metadata-size": size})
        assert r.status_code == 400 and not r.json()["error"].startswith("x-metadata-size"), (size, r.text[:200])
    r = httpx.post(f"{node.url}/render_targets", auth=OPS, timeout=30,
                   json={"action": "revalidate", "all": True, "within": "1.5h"})
    assert r.status_code == 200 and r.json()["within"] == 5_400_000, r.text[:300]
