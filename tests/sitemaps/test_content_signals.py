"""Content signals in robots.txt: Content-Signal (Cloudflare's policy) and Content-Usage (IETF aipref,
draft-ietf-aipref-attach-05 / vocab-07) lines per user-agent group, hostile files, the record
round trip (a record written before declares nothing), and the policies they default."""

from __future__ import annotations

import json

from prerender_ray.config.loading import parse as parse_config
from prerender_ray.serving.bot_policy import FAILED, Policies
from prerender_ray.serving.bots import BotRegistry
from prerender_ray.sitemaps import content_signals as cs
from prerender_ray.sitemaps.robots import ParsedRobots, settle, signals_report

CLOUDFLARE = b"""# As a condition of accessing this website, you agree to abide by the content signals.
User-Agent: *
Content-Signal: ai-train=no, search=yes, ai-input=yes
Allow: /
"""
# draft-ietf-aipref-attach-05, section 4.4's example, plus a group of our own
AIPREF = b"""User-Agent: *
Allow: /
Disallow: /never/
Content-Usage: train-ai=n
Content-Usage: /ai-ok/ train-ai=y

User-Agent: ExampleBot
User-Agent: GPTBot
Allow: /
Content-Usage: train-ai=y
"""


def robots(body: bytes) -> ParsedRobots:
    return ParsedRobots.from_body("https://shop.test/robots.txt", body, max_bytes=500 * 1024)


def test_content_signal_lines_per_group() -> None:
    s = robots(CLOUDFLARE + b"\nUser-agent: Googlebot\nContent-Signal: search=no\n").signals
    assert s.for_token("CCBot") == {"search": True, "ai-input": True, "ai-train": False}
    assert s.for_token("googlebot") == {"search": False}  # its own group, not the * one (RFC 9309 2.2.1)
    assert cs.declared_view(s)["default"] == {"search": "yes", "ai-input": "yes", "ai-train": "no"}


def test_content_usage_follows_the_aipref_drafts() -> None:
    s = robots(AIPREF).signals
    assert s.for_token("SomeBot") == {"ai-train": False}
    assert s.for_token("GPTBot") == {"ai-train": True}
    assert s.path_rules == 1  # /ai-ok/ is narrower than the site: counted, never applied
    [star, own] = s.to_row()["groups"]
    assert star == {"agents": ["*"], "contentSignal": {}, "contentUsage": {"train-ai": "n"}}
    assert own["agents"] == ["examplebot", "gptbot"]


def test_a_no_wins_and_what_states_nothing_is_ignored() -> None:
    cases = {
        "Content-Signal: ai-train=yes\nContent-Usage: train-ai=n": {"ai-train": False},  # both formats: no wins
        "Content-Signal: search=yes, search=no": {"search": False},
        "Content-Usage: train-ai=y, search=n, future-use=n": {"ai-train": True, "search": False},
        "Content-Usage: train-ai;allow=n, train-ai=y": {"ai-train": True},  # parameters ignored, last value
        'Content-Usage: train-ai="n"': {},  # a string, not a token: unknown (vocab-07 7)
        "Content-Usage: Train-AI=n": {},  # not a dictionary (keys are lower case): all unknown
        "Content-Usage: train-ai=n, (": {},
        "Content-Usage: train-ai=\u00e9": {},  # not ASCII
        "Content-Signal: ai-train=maybe, AI-INPUT=NO, foo=no": {"ai-input": False},
        "Content-Signal: / search=no": {"search": False},  # the root path is the site
        "Content-Signal:": {},
        "content-signal : search=no # a comment, ai-train=no": {"search": False},
    }
    for lines, want in cases.items():
        got = robots(f"User-agent: *\n{lines}\n".encode()).signals.for_token("x")
        assert got == want, lines


def test_lines_before_any_group_count_for_every_bot() -> None:
    s = robots(b"Content-Signal: ai-train=no\nUser-agent: GPTBot\nDisallow: /x\n").signals
    assert s.for_token("CCBot") == {"ai-train": False}
    assert s.for_token("GPTBot") == {}  # it has a group of its own, which declares nothing


def test_hostile_files_are_bounded_and_never_break_the_rules() -> None:
    many = b"User-agent: *\nDisallow: /private/\n" + b"Content-Signal: ai-train=no\n" * 10_000
    r = robots(many)
    assert r.signals.ignored == 10_000 - cs.MAX_LINES and r.signals.for_token("x") == {"ai-train": False}
    assert r.allows("GPTBot", "/private/x") is False and r.allows("GPTBot", "/") is True
    long_line = b"User-agent: *\nContent-Signal: search=no," + b" x=y," * 10_000 + b"\n"
    assert robots(long_line).signals.for_token("x") == {} and robots(long_line).signals.ignored == 1
    groups = b"".join(b"User-agent: bot%d\nContent-Signal: search=no\n" % i for i in range(500))
    assert len(robots(groups).signals.groups) == cs.MAX_GROUPS
    agents = b"".join(b"User-agent: %d" % i + b"a" * 5000 + b"\n" for i in range(100)) + b"Content-Usage: search=n\n"
    [g] = robots(agents).signals.groups
    assert len(g.agents) == cs.MAX_AGENTS and all(len(a) <= cs.MAX_AGENT for a in g.agents)
    for junk in (bytes(range(256)) * 50, b"\x00Content-Signal: search=no", b"Content-Usage: " + b"(" * 900,
                 b"Content-Signal: =,=,=," * 100, b"\xff\xfe" + "Content-Usage: train-ai=n".encode("utf-16")):
        robots(junk)  # never raises
    assert robots(b"Content-Signal: \x00search=no\n").rules is not None


def test_the_record_round_trip_and_an_old_record() -> None:
    r = robots(CLOUDFLARE + AIPREF)
    back = ParsedRobots.from_row(json.loads(json.dumps(r.to_row())))
    assert back.signals == r.signals and back.signals.for_token("ccbot") == {
        "search": True, "ai-input": True, "ai-train": False}
    old = r.to_row()
    del old["signals"]  # as a record was written before declarations were kept
    assert not ParsedRobots.from_row(old).signals and ParsedRobots.from_row(old).text == r.text
    for bad in ("x", 3, {"groups": "x"}, {"groups": [1, {"agents": 5, "contentSignal": {"search": True}}]},
                {"groups": [{"agents": ["*"], "contentUsage": {"train-ai": "no"}}], "pathRules": -1}):
        assert not ParsedRobots.from_row({**old, "signals": bad}).signals.for_token("x")
    unreachable = ParsedRobots("https://shop.test/robots.txt", "unreachable", 503)
    assert settle(r, unreachable).signals == r.signals  # the last good copy keeps its declarations


def policies(bots: dict) -> Policies:
    loaded = parse_config({"bots": bots})
    assert loaded.warnings == []
    return Policies(loaded.config.bots, BotRegistry())


ON = {"contentSignals": {"applyAsDefaults": True}}
SITE = robots(b"User-agent: *\nContent-Signal: search=no, ai-input=yes, ai-train=no\n"
              b"User-agent: CCBot\nContent-Usage: train-ai=y\n").signals


def test_signals_default_the_class_policies_only_when_asked() -> None:
    off = policies({"default": {"serve": "origin"}})
    assert off.decide("GPTBot", site=SITE).serve == "origin"
    on = policies({"default": {"serve": "origin"}, **ON})
    d = on.decide("GPTBot", site=SITE)
    assert (d.serve, d.discover, d.source) == ("deny", False, "signal:ai-train=no")
    assert on.decide("CCBot", site=SITE).serve == "prerender"  # its own group says yes
    assert on.decide("OAI-SearchBot", site=SITE).source == "signal:ai-input=yes"
    g = on.decide("Googlebot", site=SITE)  # the built-in search entry is no operator policy
    assert (g.serve, g.source) == ("deny", "signal:search=no")
    assert on.decide("Twitterbot", site=SITE).serve == "origin"  # social: no signal concerns it
    assert on.decide("GPTBot").serve == "origin"  # a site that declares nothing
    assert on.decide("GPTBot", FAILED, SITE).source == "failed"  # a spoof is served as failedClass


def test_an_operator_policy_wins_over_the_site() -> None:
    p = policies({"classes": {"ai-training": {"serve": "origin"}, "search": {"serve": "prerender"}},
                  "named": {"OAI-SearchBot": {"serve": "origin"}}, **ON,
                  "contentSignals": {"applyAsDefaults": True, "allowed": {"serve": "prerender", "discover": False}}})
    assert (p.decide("GPTBot", site=SITE).serve, p.decide("GPTBot", site=SITE).source) == ("origin", "class")
    assert p.decide("Googlebot", site=SITE).source == "class"
    assert p.decide("OAI-SearchBot", site=SITE).source == "named"
    d = p.decide("PerplexityBot", site=SITE)
    assert (d.serve, d.discover, d.source) == ("prerender", False, "signal:ai-input=yes")


def test_the_report_sets_what_is_declared_against_what_is_served() -> None:
    cfg = parse_config({"bots": {"classes": {"search": {"serve": "origin"}}, **ON}}).config
    doc = signals_report(SITE, cfg)
    by = {c["class"]: c for c in doc["classes"]}
    assert doc["applyAsDefaults"] is True and doc["default"]["ai-train"] == "no"
    assert (by["search"]["declared"], by["search"]["effective"], by["search"]["source"]) == ("no", "origin", "class")
    assert by["search"]["operatorPolicy"] == {"serve": "origin", "discover": True}
    assert (by["ai-training"]["declared"], by["ai-training"]["effective"]) == ("no", "deny")
    assert by["ai-training"]["bots"] == [{"bot": "CCBot", "declared": "yes", "effective": "prerender",
                                          "source": "signal:ai-train=yes"}]
    assert (by["ai-search"]["declared"], by["ai-search"]["effective"]) == ("yes", "prerender")
    off = signals_report(SITE, parse_config({}).config)
    assert {c["class"]: c["effective"] for c in off["classes"]} == {
        "search": "prerender", "ai-search": "prerender", "ai-training": "prerender"}
    assert signals_report(cs.Signals(), cfg)["classes"][0]["declared"] is None
