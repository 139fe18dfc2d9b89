"""What a Web Bot Auth signature is good for: a policy that requires one (``requireSignature``), and
the bot names an agent's signature may verify (``bots.webBotAuth.agents[].bots``)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from prerender_ray.config.bots import WebBotAuthConfig
from prerender_ray.config.loading import parse
from prerender_ray.serving.bot_policy import UNCHECKED, UNVERIFIED, VERIFIED, Policies
from prerender_ray.serving.bots import BotRegistry
from prerender_ray.serving.class_stats import ClassStats
from prerender_ray.serving.verification import reserved_names
from prerender_ray.serving.web_bot_auth import REASONS, WebBotAuth
from tests.serving.test_web_bot_auth import AGENT, URL, Agents, Clock, directory, kid, sign

REGISTRY = BotRegistry()


async def ready(key: Ed25519PrivateKey, agents: list, reserved: set[str] | None = None) -> WebBotAuth:
    wba = WebBotAuth(WebBotAuthConfig(agents=agents), Agents(agent=directory(key)).fetch, clock=Clock(),
                     reserved=reserved or ())
    wba.start()
    await wba.settle()
    return wba


def policies(bots: dict) -> Policies:
    loaded = parse({"bots": bots})
    assert loaded.warnings == []
    return Policies(loaded.config.bots, REGISTRY)


# ----------------------------------------------------------------------------- requireSignature


def test_a_named_policy_that_requires_a_signature_serves_anything_else_as_a_failed_claim() -> None:
    p = policies({"named": {"ChatGPT-User": {"serve": "prerender", "requireSignature": True}},
                  "classes": {"other": {"serve": "deny"}}})
    signed = p.decide("ChatGPT-User", VERIFIED, signed=True)
    assert (signed.serve, signed.bot_class, signed.source, signed.discover) == ("prerender", "ai-search", "named", True)
    # unsigned, whether unchecked, verified another way, or not known yet (even with whileUnverified: claimed)
    for state in (UNCHECKED, VERIFIED, UNVERIFIED):
        d = p.decide("ChatGPT-User", state)
        assert (d.serve, d.bot_class, d.source, d.verification) == ("deny", "other", "unsigned", UNVERIFIED), state
    # another bot of the class is not concerned
    assert p.decide("OAI-SearchBot").source == "default"


def test_a_class_that_requires_a_signature_and_its_unsigned_claims_never_discover() -> None:
    p = policies({"classes": {"ai-search": {"serve": "prerender", "requireSignature": True}}})
    assert p.decide("OAI-SearchBot", VERIFIED, signed=True).source == "class"
    d = p.decide("OAI-SearchBot")
    assert (d.serve, d.bot_class, d.discover, d.withheld) == ("prerender", "other", False, "unverified-claim")
    # a named policy without the requirement wins over its class's
    p = policies({"classes": {"ai-search": {"requireSignature": True}}, "named": {"OAI-SearchBot": {}}})
    assert p.decide("OAI-SearchBot").source == "named"


# ------------------------------------------------------------------------ the bots an agent covers


async def test_an_agent_that_names_its_bots_verifies_only_those() -> None:
    key = Ed25519PrivateKey.generate()
    wba = await ready(key, [{"origin": AGENT, "bots": ["ChatGPT-User"]}])
    assert wba.check("GET", URL, sign(key), "ChatGPT-User").state == VERIFIED
    assert wba.check("GET", URL, sign(key), "chatgpt-user").state == VERIFIED  # names are case-insensitive
    other = wba.check("GET", URL, sign(key), "OAI-SearchBot")
    assert (other.state, other.reason, other.agent) == (UNVERIFIED, "agent-mismatch", AGENT)
    # a forged signature stays what it is: the mismatch is only said of a valid one
    forged = sign(Ed25519PrivateKey.generate(), keyid=kid(key))
    assert wba.check("GET", URL, forged, "OAI-SearchBot").reason == "bad-signature"
    assert "agent-mismatch" in REASONS


async def test_a_plain_agent_verifies_any_bot_but_one_verified_another_way() -> None:
    key = Ed25519PrivateKey.generate()
    reserved = reserved_names(parse({}).config.bots.verify)
    assert {"Googlebot", "Bingbot"} <= reserved
    wba = await ready(key, [AGENT], reserved)
    assert wba.check("GET", URL, sign(key), "ChatGPT-User").state == VERIFIED
    assert wba.check("GET", URL, sign(key), "other").state == VERIFIED
    googlebot = wba.check("GET", URL, sign(key), "Googlebot")  # a platform that signs for its users' agents
    assert (googlebot.state, googlebot.reason) == (UNVERIFIED, "agent-mismatch")
    # unless the operator names it for that agent
    named = await ready(key, [{"origin": AGENT, "bots": ["Googlebot"]}], reserved)
    assert named.check("GET", URL, sign(key), "Googlebot").state == VERIFIED


def test_class_stats_are_bounded_by_their_constant_sets() -> None:
    stats = ClassStats({"signature": ("verified", "expired")})
    stats.served("ai-search", VERIFIED, "signature", "miss", True)
    stats.served("made-up", "weird", "carrier-pigeon", "hit", False)
    stats.verified("ai-search", "signature", "expired")
    stats.verified("ai-search", "signature", "anything")
    stats.verified("ai-search", "telepathy", "verified")  # no such method: nothing kept
    snap = stats.snapshot()
    assert snap["ai-search"] == {"serves": 1, "verification": {"unchecked": 0, "verified": 1, "failed": 0,
                                                               "unverified": 0},
                                 "method": {"signature": 1, "dns": 0, "ranges": 0, "none": 0},
                                 "outcomes": {"signature": {"verified": 0, "expired": 1, "other": 1}},
                                 "markdown": 1, "misses": 1}
    assert snap["other"]["verification"]["other"] == 1 and snap["other"]["method"]["other"] == 1
    assert set(snap) == set(stats.classes) and "made-up" not in snap
