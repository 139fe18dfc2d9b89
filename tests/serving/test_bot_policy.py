"""Bot policies: the config's ``bots`` section to a decision per name, class and verification."""

from __future__ import annotations

import pytest

from prerender_ray.config.loading import parse
from prerender_ray.serving.bot_policy import FAILED, UNCHECKED, UNVERIFIED, VERIFIED, Policies
from prerender_ray.serving.bots import BotRegistry

REGISTRY = BotRegistry()
# The operator's sentence: prerender for AI search, deny training crawlers, origin for everything else.
OPERATOR = {"bots": {"default": {"serve": "origin"}, "classes": {
    "ai-search": {"serve": "prerender"}, "ai-training": {"serve": "deny"}}}}


def policies(raw: dict) -> Policies:
    loaded = parse(raw)
    assert loaded.warnings == []
    return Policies(loaded.config.bots, REGISTRY)


def test_the_default_prerenders_every_bot_and_state_and_only_believed_claims_discover() -> None:
    p = policies({})
    for name in ("Googlebot", "GPTBot", "facebookexternalhit", "AhrefsBot", "other", "SomeBot"):
        for state in (UNCHECKED, VERIFIED, FAILED, UNVERIFIED):
            d = p.decide(name, state)
            assert (d.serve, d.discover) == ("prerender", state in (UNCHECKED, VERIFIED)), (name, state)


def test_googlebot_being_prerendered_is_named_in_the_default_config() -> None:
    assert parse({}).config.bots.classes["search"].serve == "prerender"


@pytest.mark.parametrize(("name", "serve", "cls"), [
    ("OAI-SearchBot", "prerender", "ai-search"), ("Claude-User", "prerender", "ai-search"),
    ("Perplexity-User", "prerender", "ai-search"),
    ("GPTBot", "deny", "ai-training"), ("ClaudeBot", "deny", "ai-training"), ("CCBot", "deny", "ai-training"),
    ("Googlebot", "origin", "search"), ("Twitterbot", "origin", "social"), ("other", "origin", "other"),
    ("UnknownCrawler", "origin", "other"),
])
def test_the_operators_sentence(name: str, serve: str, cls: str) -> None:
    d = policies(OPERATOR).decide(name)
    assert (d.serve, d.bot_class) == (serve, cls)


@pytest.mark.parametrize(("bots", "serve"), [
    ({}, "prerender"),
    ({"default": {"serve": "deny"}}, "deny"),
    ({"classes": {"other": {"serve": "deny"}}}, "deny"),
    ({"classes": {"other": {"serve": "origin", "discover": True}}}, "origin"),
    # requireSignature: an unsigned request is served as the failed class
    ({"default": {"serve": "prerender", "requireSignature": True}, "failedClass": "ai-training",
      "classes": {"ai-training": {"serve": "deny"}}}, "deny"),
])
def test_the_references_test_marker_lifts_no_policy(bots: dict, serve: str) -> None:
    """``harper: pre-render`` (the name ``debug``) anyone can send: before, it was prerendered and
    discovered whatever the policy said (deny, a failed claim, requireSignature). Now it is decided as
    an unidentified client (``other``) is, and never discovers."""
    p = policies({"bots": bots})
    assert p.decide("debug").serve == serve
    for state in (UNCHECKED, VERIFIED, FAILED, UNVERIFIED):
        marked, other = p.decide("debug", state), p.decide("other", state)
        assert (marked.serve, marked.bot_class, marked.source) == (other.serve, other.bot_class, other.source), state
        assert not marked.discover, state


def test_a_named_policy_wins_over_its_class_case_insensitively() -> None:
    p = policies({"bots": {**OPERATOR["bots"], "named": {"googlebot": {"serve": "prerender", "discover": False}}}})
    d = p.decide("Googlebot")
    assert (d.serve, d.discover) == ("prerender", False)
    assert p.decide("Bingbot").serve == "origin"


def test_a_failed_claim_is_served_as_the_failed_class_never_by_its_name() -> None:
    p = policies({"bots": {"default": {"serve": "prerender"}, "named": {"Googlebot": {"serve": "prerender"}},
                           "classes": {"other": {"serve": "deny"}}}})
    assert p.decide("Googlebot", VERIFIED).serve == "prerender"
    failed = p.decide("Googlebot", FAILED)
    assert (failed.serve, failed.bot_class, failed.verification) == ("deny", "other", FAILED)
    # unverified-for-now is served as claimed by default, as failed when configured so
    assert p.decide("Googlebot", UNVERIFIED).serve == "prerender"
    strict = policies({"bots": {"classes": {"other": {"serve": "deny"}}, "verify": {"whileUnverified": "failed"}}})
    assert strict.decide("Googlebot", UNVERIFIED).serve == "deny"


def test_a_deny_answer_is_the_configured_status_and_a_short_text_body() -> None:
    p = policies({"bots": {"denyStatus": 451, "denyBody": "not for training"}})
    reply = p.deny_reply()
    assert (reply.status, reply.body) == (451, b"not for training")
    assert reply.headers["content-type"].startswith("text/plain") and reply.headers["cache-control"] == "no-store"
    reply.headers["x"] = "1"
    assert "x" not in p.deny_reply().headers


@pytest.mark.parametrize("bots", [
    {"classes": {"crawlers": {"serve": "deny"}}},  # not a class
    {"classes": {"search": {"serve": "block"}}},  # not a mode
    {"denyStatus": 200},
    {"denyBody": "x" * 2000},
    {"named": {"x" * 101: {"serve": "deny"}}},
    {"failedClass": "spoofers"},
    {"verify": {"deadlineMs": 0}},
    {"verify": {"dns": {"Googlebot": ["*.google.com"]}}},
    {"verify": {"ranges": {f"Bot{i}": ["/a", "/b"] for i in range(26)}}},  # past 50 files
    {"verify": {"ranges": {"GPTBot": [" "]}}},
    {"verify": {"ranges": {"GPTBot": ["gptbot.json"]}}},  # relative: to which process's directory?
    {"verify": {"cacheSize": 0}},
])
def test_bad_policies_are_config_errors(bots: dict) -> None:
    from prerender_ray.config.loading import ConfigError

    with pytest.raises(ConfigError):
        parse({"bots": bots})


def test_unknown_keys_in_a_policy_are_reported() -> None:
    loaded = parse({"bots": {"classes": {"ai-search": {"serve": "origin", "cache": False}}}})
    assert loaded.warnings == ["bots.classes.ai-search.cache: unknown configuration key; ignored"]
    assert loaded.config.bots.classes["ai-search"].serve == "origin"


def test_policies_are_live_options() -> None:
    from prerender_ray.config.overrides import Overrides, plan

    base = parse({}).config
    result = plan(base, Overrides(), [{"path": "bots.classes", "value": {"ai-training": {"serve": "deny"}}},
                                      {"path": "bots.denyStatus", "value": 451}], [], by="ops", now=1)
    assert result.invalid == [] and result.config is not None
    assert result.config.bots.classes["ai-training"].serve == "deny" and result.config.bots.deny_status == 451
    bad = plan(base, Overrides(), [{"path": "bots.classes", "value": {"ai-training": {"serve": "nope"}}}], [],
               by="ops", now=1)
    assert bad.config is None and bad.invalid[0]["path"] == "bots.classes"
    start_only = plan(base, Overrides(), [{"path": "bots.verify.enabled", "value": True}], [], by="ops", now=1)
    assert "read at start only" in start_only.invalid[0]["reason"]


def test_unknown_bot_names_and_a_toothless_verification_are_findings() -> None:
    from prerender_ray.config.loading import findings

    cfg = parse({"bots": {"named": {"Gogglebot": {"serve": "deny"}, "googlebot": {"serve": "origin"}},
                          "verify": {"enabled": True, "ranges": {"GPTbot": ["/x"], "NoSuchBot": ["/y"]}}}}).config
    found = {f.key: f.message for f in findings(cfg, 1)}
    assert "Gogglebot" in found["bots.named"] and "googlebot" not in found["bots.named"]
    assert "NoSuchBot" in found["bots.verify.ranges"] and "GPTbot" not in found["bots.verify.ranges"]
    assert "spoofers get what real bots get" in found["bots.failed_class"]
    quiet = {f.key for f in findings(parse({}).config, 1)}
    assert not any(k.startswith("bots") for k in quiet)


def test_the_serving_docs_example_is_a_valid_config_with_no_warnings() -> None:
    import yaml

    from tests.support import REPO

    doc = (REPO / "docs/serving.md").read_text()
    start = doc.index("```yaml\nbots:\n  default: {serve: origin}")
    block = doc[start + len("```yaml\n"):doc.index("```", start + 8)]
    loaded = parse(yaml.safe_load(block))
    assert loaded.warnings == []
    p = Policies(loaded.config.bots, REGISTRY)
    assert [p.decide(n).serve for n in ("OAI-SearchBot", "GPTBot", "Twitterbot", "Googlebot")] == \
        ["prerender", "deny", "origin", "prerender"]
    assert p.decide("Googlebot", FAILED).serve == "origin"
