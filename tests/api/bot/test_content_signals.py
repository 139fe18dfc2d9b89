"""Content signals through the real bot path: a site on 127.0.0.1 serves a robots.txt that says no to
search, AI input and AI training; robots.txt discovery records it (the real walker and store of a
``LocalNode``), the replica's table reads it, and bot requests are served by it with
``bots.contentSignals.applyAsDefaults`` (an operator's class or name policy still wins), or as before
without it. The robots report sets what the site declares against what each class is served."""

from __future__ import annotations

import httpx
import pytest

from prerender_ray.storage.registry import encode_json, robots_key
from tests.localnode import LocalNode
from tests.sitemap_server import SitemapSite

HOST = "127.0.0.1"  # the site; only loopback is ever fetched
ROBOTS = b"""User-agent: *
Allow: /
Content-Signal: search=no, ai-input=no, ai-train=no
"""
PAGE = b"<html><head><title>p</title></head><body>" + b"<p>origin page</p>" * 20 + b"</body></html>"
UA = {"GPTBot": "Mozilla/5.0 (compatible; GPTBot/1.2; +https://openai.com/gptbot)",
      "Googlebot": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
      "CCBot": "CCBot/2.0 (https://commoncrawl.org/faq/)",
      "OAI-SearchBot": "Mozilla/5.0 (compatible; OAI-SearchBot/1.0; +https://openai.com/searchbot)",
      "Twitterbot": "Twitterbot/1.0"}


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    s.put("/robots.txt", ROBOTS, ctype="text/plain")
    s.put("/page", PAGE, ctype="text/html")
    yield s
    s.close()


def start(tmp_path_factory, site: SitemapSite, name: str, bots: dict) -> LocalNode:
    return LocalNode.start(tmp_path_factory.mktemp(name) / "data", {
        "domains": [f"{HOST}:{site.port}", "old.test"],
        "ingress": {"defaultProtocol": "http"},
        "robots": {"fetchTimeoutMs": 5000},
        "bots": bots,
    })


@pytest.fixture(scope="module")
def on(tmp_path_factory, site):
    node = start(tmp_path_factory, site, "on", {
        "classes": {"ai-search": {"serve": "origin"}}, "named": {"CCBot": {"serve": "prerender"}},
        "contentSignals": {"applyAsDefaults": True}})
    yield node
    node.stop()


@pytest.fixture(scope="module")
def off(tmp_path_factory, site):
    node = start(tmp_path_factory, site, "off", {})
    yield node
    node.stop()


def origin(site: SitemapSite) -> str:
    return f"http://{HOST}:{site.port}"


def discover(node: LocalNode, site: SitemapSite) -> None:
    r = httpx.post(f"{node.url}/prerender_admin/robots/discover", json={"domain": origin(site), "walk": False},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["domains"][0]["robots"]["contentSignals"]["default"] == {
        "search": "no", "ai-input": "no", "ai-train": "no"}


def reload(node: LocalNode) -> int:
    """One pass of the replica's table loop (it runs every minute; a test does not wait for it)."""
    return node.run(node.ingress[0].ctx.state.services.signals.reload())


def bot(node: LocalNode, site: SitemapSite, name: str) -> tuple[int, str, str]:
    r = httpx.get(f"{node.url}/p/{origin(site)}/page", timeout=30,
                  headers={"user-agent": UA[name], "x-harper-prerender-debug": "1"})
    return r.status_code, r.headers["x-harper-bot-policy"], r.headers["x-harper-bot-policy-source"]


def report(node: LocalNode, site: SitemapSite) -> dict:
    r = httpx.get(f"{node.url}/prerender_admin/robots", params={"domain": origin(site)}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["robots"]["contentSignals"]


def test_the_site_declares_the_defaults_and_the_operator_policy_wins(on, site) -> None:
    assert bot(on, site, "GPTBot") == (200, "prerender", "default")  # nothing read yet: as before
    assert on.ingress[0].ctx.state.services._signals is not None  # the table's loop runs (option on)
    discover(on, site)
    assert reload(on) == 1
    assert bot(on, site, "GPTBot") == (403, "deny", "signal:ai-train=no")
    assert bot(on, site, "Googlebot") == (403, "deny", "signal:search=no")  # the built-in search entry
    assert bot(on, site, "CCBot") == (200, "prerender", "named")  # bots.named wins
    assert bot(on, site, "OAI-SearchBot") == (200, "origin", "class")  # bots.classes wins
    assert bot(on, site, "Twitterbot") == (200, "prerender", "default")  # no signal concerns social


def test_without_the_option_the_site_declares_and_nothing_changes(off, site) -> None:
    assert off.ingress[0].ctx.state.services._signals is None  # no loop reads the store
    discover(off, site)
    assert reload(off) == 1  # read, and never consulted
    for name in ("GPTBot", "Googlebot", "OAI-SearchBot"):
        assert bot(off, site, name)[:2] == (200, "prerender"), name
    doc = report(off, site)
    assert doc["applyAsDefaults"] is False
    assert {c["class"]: (c["declared"], c["effective"]) for c in doc["classes"]} == {
        "search": ("no", "prerender"), "ai-search": ("no", "prerender"), "ai-training": ("no", "prerender")}


def test_the_report_shows_declared_against_effective_per_class(on, site) -> None:
    discover(on, site)
    doc = report(on, site)
    assert doc["applyAsDefaults"] is True
    assert doc["groups"] == [{"agents": ["*"], "contentSignal": {"search": "no", "ai-input": "no", "ai-train": "no"},
                              "contentUsage": {}}]
    by = {c["class"]: c for c in doc["classes"]}
    assert (by["ai-training"]["declared"], by["ai-training"]["effective"], by["ai-training"]["source"]) == \
        ("no", "deny", "signal:ai-train=no")
    assert by["ai-search"]["operatorPolicy"] == {"serve": "origin", "discover": True}
    assert (by["ai-search"]["effective"], by["ai-search"]["source"]) == ("origin", "class")
    assert (by["search"]["operatorPolicy"], by["search"]["effective"]) == (None, "deny")


def test_a_reload_that_reads_the_same_declarations_keeps_the_table(on, site) -> None:
    """The hit memo and the spread lane hold the table they were made under by identity: a reload
    that reads nothing new (every minute) must not let every entry go."""
    discover(on, site)
    reload(on)
    signals = on.ingress[0].ctx.state.services.signals
    table = signals.sites
    assert origin(site) in table
    reload(on)
    assert signals.sites is table


def test_a_record_written_before_declares_nothing(on) -> None:
    row = {"origin": "http://old.test", "url": "http://old.test/robots.txt", "state": "ok", "status": 200,
           "fetchedAt": 1, "size": 40, "truncated": False, "text": "User-agent: *\nContent-Signal: ai-train=no\n",
           "error": None, "finalUrl": None, "checkedAt": 1,
           "report": {"state": "ok", "sitemaps": [], "conflicts": [], "groups": []}}
    on.ask("store", "apply", [(robots_key("http://old.test"), encode_json(row))])
    r = httpx.get(f"{on.url}/prerender_admin/robots", timeout=10)
    [old] = [d for d in r.json()["domains"] if d["domain"] == "http://old.test"]
    assert old["robots"]["contentSignals"]["groups"] == []
    assert {c["declared"] for c in old["robots"]["contentSignals"]["classes"]} == {None}
    reload(on)
    assert "http://old.test" not in on.ingress[0].ctx.state.services.signals.sites
