"""Web Bot Auth signatures (``prerender_ray.serving.web_bot_auth``): requests signed here with Ed25519
keys the tests generate, the RFC 9421 B.2.6 vector, every refusal, and the key directories of allowed
agents (fetched through an injected fetch: the agent's site is the outside world; the real HTTP
fetcher is tested in tests/api/bot/test_web_bot_auth.py)."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms

from prerender_ray.config.bots import WebBotAuthConfig
from prerender_ray.serving.bot_policy import UNCHECKED, UNVERIFIED, VERIFIED
from prerender_ray.serving.web_bot_auth import (
    REASONS,
    KeyDirectoryError,
    WebBotAuth,
    parse_directory,
    public_jwk,
    thumbprint,
    verify_label,
)

NOW = 1_800_000_000.0
AGENT = "https://agent.test"
URL = "https://shop.test/page?id=1"


class Clock:
    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Msg:
    method: str
    url: str
    headers: dict


def directory(*keys: Ed25519PrivateKey) -> bytes:
    return json.dumps({"keys": [public_jwk(k.public_key()) for k in keys]}).encode()


def kid(key: Ed25519PrivateKey) -> str:
    return thumbprint(public_jwk(key.public_key()))


def sign(key: Ed25519PrivateKey, *, url: str = URL, method: str = "GET", agent: str | None = f'"{AGENT}"',
         created: float = NOW, expires: float | None = NOW + 60, tag: str | None = "web-bot-auth",
         components: tuple[str, ...] = ("@authority", "signature-agent"), label: str = "sig1",
         keyid: str | None = None, extra: dict | None = None) -> dict[str, str]:
    """The headers of a request signed as a web-bot-auth agent does (lower-case names, as the bot path has them)."""
    keyid = keyid or kid(key)
    headers = {"user-agent": "Agent/1.0", **(extra or {})}
    if agent is not None:
        headers["signature-agent"] = agent
    msg = Msg(method, url, headers)
    signer = HTTPMessageSigner(signature_algorithm=algorithms.ED25519,
                               key_resolver=MappingKeyResolver(public_keys={}, private_keys={keyid: key}))
    utc = datetime.timezone.utc
    signer.sign(msg, key_id=keyid, created=datetime.datetime.fromtimestamp(created, utc),
                expires=datetime.datetime.fromtimestamp(expires, utc) if expires is not None else None,
                tag=tag, label=label, covered_component_ids=components)
    return {k.lower(): v for k, v in msg.headers.items()}


class Agents:
    """The agents' sites: their directories by origin, and every fetch asked of them."""

    def __init__(self, **bodies: bytes):
        self.bodies = {f"https://{name.replace('_', '-')}.test": body for name, body in bodies.items()}
        self.asked: list[str] = []

    async def fetch(self, origin: str) -> bytes:
        self.asked.append(origin)
        if origin not in self.bodies:
            raise KeyDirectoryError(f"{origin}: unreachable")
        return self.bodies[origin]


def make(sites: Agents, clock: Clock | None = None, **cfg) -> WebBotAuth:
    cfg.setdefault("agents", [AGENT])
    return WebBotAuth(WebBotAuthConfig(**cfg), sites.fetch, clock=clock or Clock())


async def ready(sites: Agents, clock: Clock | None = None, **cfg) -> WebBotAuth:
    wba = make(sites, clock, **cfg)
    wba.start()
    await wba.settle()
    return wba


# ------------------------------------------------------------------------------------ the library


# RFC 9421 appendix B.2.6 (test-key-ed25519 of B.1.4), copied from the RFC.
RFC_PUBLIC_KEY = b"""-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAJrQLj5P/89iXES9+vFgrIy29clF9CC/oPPsw3c5D0bs=
-----END PUBLIC KEY-----
"""
RFC_HEADERS = {
    "host": "example.com", "date": "Tue, 20 Apr 2021 02:07:55 GMT", "content-type": "application/json",
    "content-digest": "sha-512=:WZDPaVn/7XgHaAy8pmojAkGWoRx2UFChF41A2svX+TaPm+AbwAgBWnrIiYllu7BNNyealdVLvRwEmTHWXvJwew==:",
    "content-length": "18",
    "signature-input": 'sig-b26=("date" "@method" "@path" "@authority" "content-type" "content-length")'
                       ';created=1618884473;keyid="test-key-ed25519"',
    "signature": "sig-b26=:wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==:",
}
RFC_URL = "https://example.com/foo?param=Value&Pet=dog"


def test_the_rfc_9421_ed25519_vector_verifies() -> None:
    key = load_pem_public_key(RFC_PUBLIC_KEY)
    assert verify_label("POST", RFC_URL, RFC_HEADERS, "sig-b26", "test-key-ed25519", key) == "verified"
    altered = {**RFC_HEADERS, "date": "Tue, 20 Apr 2021 02:07:56 GMT"}
    assert verify_label("POST", RFC_URL, altered, "sig-b26", "test-key-ed25519", key) == "bad-signature"
    other = Ed25519PrivateKey.generate().public_key()
    assert verify_label("POST", RFC_URL, RFC_HEADERS, "sig-b26", "test-key-ed25519", other) == "bad-signature"


async def test_the_rfc_vector_is_not_a_web_bot_auth_signature() -> None:
    """It has no tag and no expires: as a bot's signature it is refused, whatever its key."""
    wba = make(Agents())
    assert wba.check("POST", RFC_URL, RFC_HEADERS).reason == "bad-tag"


def test_the_jwk_thumbprint_is_rfc_7638() -> None:
    # RFC 8037 appendix A.3: the thumbprint of the Ed25519 key of A.2
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
    assert thumbprint(jwk) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    assert thumbprint({**jwk, "kid": "ignored", "use": "sig"}) == thumbprint(jwk)


# ---------------------------------------------------------------------------------------- the check


async def test_a_signed_request_of_an_allowed_agent_is_verified() -> None:
    key = Ed25519PrivateKey.generate()
    wba = await ready(Agents(agent=directory(Ed25519PrivateKey.generate(), key)))
    signed = wba.check("GET", URL, sign(key))
    assert (signed.state, signed.reason, signed.agent) == (VERIFIED, "verified", AGENT)
    # the later drafts' form: a Dictionary member per label, selected by the covered component
    headers = sign(key, agent=f'sig1="{AGENT}"', components=("@authority", '"signature-agent";key="sig1"'))
    assert wba.check("GET", URL, headers).reason == "verified"
    # the whole target URI covers the authority too
    assert wba.check("GET", URL, sign(key, components=("@target-uri", "signature-agent"))).reason == "verified"


async def test_a_request_without_signature_headers_is_not_checked() -> None:
    agents = Agents()
    wba = make(agents)
    assert wba.check("GET", URL, {"user-agent": "GPTBot", "signature-agent": f'"{AGENT}"'}) is None
    assert agents.asked == []


def refusals(key: Ed25519PrivateKey, other: Ed25519PrivateKey) -> dict[str, tuple[dict[str, str], str]]:
    """Each refusal: the headers, and the URL they are checked against."""
    good = sign(key)
    return {
        "expired": (sign(key, created=NOW - 200, expires=NOW - 61), URL),
        "future": (sign(key, created=NOW + 61, expires=NOW + 120), URL),
        "too-old": (sign(key, created=NOW - 301 - 60, expires=NOW + 60), URL),  # replayed outside the window
        "bad-signature": (sign(other, keyid=kid(key)), URL),  # signed with another key under this key's id
        "unknown-keyid": (sign(other), URL),
        "wrong-component": (sign(key, components=("@authority", "signature-agent", "x-absent"),
                                  extra={"x-absent": "1"}), URL),  # covers a header the request lacks
        "missing-component": (sign(key, components=("signature-agent", "@path")), URL),
        "bad-tag": (sign(key, tag="other-app"), URL),
        "unknown-agent": (sign(key, agent='"https://stranger.test"'), URL),
        "malformed": (sign(key, expires=None), URL),
        "oversize": ({**good, "signature-input": good["signature-input"] + ", x=()" * 800}, URL),
    }


@pytest.mark.parametrize("reason", ["expired", "future", "too-old", "bad-signature", "unknown-keyid",
                                    "wrong-component", "missing-component", "bad-tag", "unknown-agent", "malformed",
                                    "oversize"])
async def test_each_refusal_is_unverified_with_its_reason(reason) -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    wba = await ready(Agents(agent=directory(key)))
    headers, url = refusals(key, other)[reason]
    if reason == "wrong-component":
        headers.pop("x-absent")
    signed = wba.check("GET", url, headers)
    # a signature that is not a web-bot-auth one, or not by an allowed agent, is as if unsigned
    state = UNCHECKED if reason in ("bad-tag", "unknown-agent") else UNVERIFIED
    assert signed is not None and (signed.state, signed.reason) == (state, reason)
    assert reason in REASONS
    assert wba.check("GET", URL, sign(key)).state == VERIFIED


async def test_a_signature_for_another_host_or_agent_does_not_verify() -> None:
    key = Ed25519PrivateKey.generate()
    wba = await ready(Agents(agent=directory(key), other_agent=directory(key)),
                      agents=[AGENT, "https://other-agent.test"])
    assert wba.check("GET", "https://elsewhere.test/page", sign(key)).reason == "bad-signature"
    headers = sign(key)
    headers["signature-agent"] = '"https://other-agent.test"'  # the signed agent swapped for another allowed one
    assert wba.check("GET", URL, headers).reason == "bad-signature"


async def test_the_skew_is_allowed_and_configurable() -> None:
    key = Ed25519PrivateKey.generate()
    wba = await ready(Agents(agent=directory(key)))
    assert wba.check("GET", URL, sign(key, created=NOW + 59, expires=NOW + 120)).reason == "verified"
    assert wba.check("GET", URL, sign(key, created=NOW - 100, expires=NOW - 59)).reason == "verified"
    strict = await ready(Agents(agent=directory(key)), skew=0)
    assert strict.check("GET", URL, sign(key, created=NOW + 1, expires=NOW + 120)).reason == "future"


@pytest.mark.parametrize("agent, ok", [
    ('"https://agent.test/"', True), ("https://agent.test", True),  # a token, as some agents send it
    ('"https://AGENT.test:443"', True), ('"https://agent.test:8443"', False), ('"http://agent.test"', False),
    ('"not a url"', False), ("sig2=\"https://agent.test\", sig3=\"https://x.test\"", False),
])
async def test_the_agent_is_the_origin_the_header_names(agent, ok) -> None:
    key = Ed25519PrivateKey.generate()
    wba = await ready(Agents(agent=directory(key)))
    signed = wba.check("GET", URL, sign(key, agent=agent))
    assert signed is not None and (signed.reason == "verified") is ok, signed


async def test_several_labels_one_of_which_verifies() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    wba = await ready(Agents(agent=directory(key)))
    bad, good = sign(other, keyid=kid(key), label="a"), sign(key, label="b")
    headers = {**good, "signature-input": f"{bad['signature-input']}, {good['signature-input']}",
               "signature": f"{bad['signature']}, {good['signature']}"}
    assert wba.check("GET", URL, headers).reason == "verified"
    many = ", ".join(f"l{i}=()" for i in range(9))
    assert wba.check("GET", URL, {**good, "signature-input": many, "signature": "l0=:AA==:"}).reason == "oversize"
    components = tuple(f"x-{i}" for i in range(16)) + ("@authority", "signature-agent")
    extra = {f"x-{i}": "1" for i in range(16)}
    assert wba.check("GET", URL, sign(key, components=components, extra=extra)).reason == "oversize"


@pytest.mark.parametrize("header", ["signature-input", "signature", "signature-agent"])
async def test_hostile_headers_are_refused_not_raised(header) -> None:
    key = Ed25519PrivateKey.generate()
    wba = await ready(Agents(agent=directory(key)))
    for value in ("", "(", "\x00\xff", "a=" * 3000, 'sig1=("@authority");tag="web-bot-auth";created=1e99'):
        signed = wba.check("GET", URL, {**sign(key), header: value})
        assert signed is not None and signed.state != VERIFIED, (header, value[:20])


# ----------------------------------------------------------------------------------- key directories


async def test_keys_are_fetched_only_for_allowed_agents_in_the_background() -> None:
    key = Ed25519PrivateKey.generate()
    agents, clock = Agents(agent=directory(key), stranger=directory(key)), Clock()
    wba = make(agents, clock)  # not started: nothing held yet
    first = wba.check("GET", URL, sign(key))
    assert first.reason == "no-keys" and agents.asked == []  # answered before the fetch ran
    assert wba.check("GET", URL, sign(key)).reason == "no-keys"
    await wba.settle()
    assert agents.asked == [AGENT]
    assert wba.check("GET", URL, sign(key)).reason == "verified"
    for _ in range(3):
        assert wba.check("GET", URL, sign(key, agent='"https://stranger.test"')).reason == "unknown-agent"
    await wba.settle()
    assert agents.asked == [AGENT]  # one fetch in all; none for the agent the operator did not allow


async def test_a_missing_directory_is_asked_again_only_after_retry_after() -> None:
    key = Ed25519PrivateKey.generate()
    agents, clock = Agents(), Clock()
    wba = await ready(agents, clock)
    assert agents.asked == [AGENT]
    for _ in range(50):
        assert wba.check("GET", URL, sign(key)).reason == "no-keys"
    await wba.settle()
    assert agents.asked == [AGENT]  # a flood costs no fetch within retryAfter
    clock.now += 61
    agents.bodies[AGENT] = directory(key)
    assert wba.check("GET", URL, sign(key, created=clock.now, expires=clock.now + 60)).reason == "no-keys"
    await wba.settle()
    assert agents.asked == [AGENT, AGENT]
    assert wba.check("GET", URL, sign(key, created=clock.now, expires=clock.now + 60)).reason == "verified"


async def test_the_last_good_copy_is_kept_and_refreshed_after_the_ttl() -> None:
    key, rotated = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    agents, clock = Agents(agent=directory(key)), Clock()
    wba = await ready(agents, clock, key_ttl=3_600_000)
    agents.bodies[AGENT] = b"<html>down for maintenance</html>"
    clock.now += 3_601
    at = {"created": clock.now, "expires": clock.now + 60}
    assert wba.check("GET", URL, sign(key, **at)).reason == "verified"  # stale keys still serve
    await wba.settle()
    assert len(agents.asked) == 2 and "not JSON" in wba.snapshot()[AGENT]["error"]
    assert wba.check("GET", URL, sign(key, **at)).reason == "verified"  # the last good copy
    agents.bodies[AGENT] = directory(rotated)
    clock.now += 61
    at = {"created": clock.now, "expires": clock.now + 60}
    assert wba.check("GET", URL, sign(rotated, **at)).reason == "unknown-keyid"  # asks again
    await wba.settle()
    assert wba.check("GET", URL, sign(rotated, **at)).reason == "verified"
    assert wba.check("GET", URL, sign(key, **at)).reason == "unknown-keyid"  # revoked


async def test_a_flood_of_agents_and_key_ids_costs_no_fetch_and_no_memory() -> None:
    key = Ed25519PrivateKey.generate()
    agents = Agents(agent=directory(key))
    wba = await ready(agents)
    before = wba.snapshot()
    for i in range(2_000):
        wba.check("GET", URL, sign(key, agent=f'"https://a{i}.test"'))
        wba.check("GET", URL, sign(key, keyid=f"k{i}"))
    await wba.settle()
    assert agents.asked == [AGENT]  # the unknown key ids asked once at most per retryAfter: not yet
    assert list(wba.agents) == [AGENT] and wba.snapshot()[AGENT]["keys"] == before[AGENT]["keys"] == 1


def test_a_directory_keeps_its_ed25519_keys_only() -> None:
    key = Ed25519PrivateKey.generate()
    jwk = public_jwk(key.public_key())
    doc = {"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}, {"kty": "OKP", "crv": "X25519", "x": jwk["x"]},
                    {"kty": "OKP", "crv": "Ed25519", "x": "short"}, "junk", {**jwk, "kid": "x", "exp": int(NOW) + 10}]}
    keys = parse_directory(json.dumps(doc).encode())
    assert list(keys) == [kid(key)] and keys[kid(key)].exp == int(NOW) + 10
    for bad in (b"[]", b"{}", b'{"keys": []}', b"\xff", json.dumps({"keys": doc["keys"][:3]}).encode()):
        with pytest.raises(KeyDirectoryError):
            parse_directory(bad)


async def test_a_key_past_its_exp_is_unknown() -> None:
    key = Ed25519PrivateKey.generate()
    body = json.dumps({"keys": [{**public_jwk(key.public_key()), "exp": int(NOW) - 120}]}).encode()
    wba = await ready(Agents(agent=body))
    assert wba.check("GET", URL, sign(key)).reason == "unknown-keyid"


def test_without_a_running_loop_the_check_still_answers() -> None:
    key = Ed25519PrivateKey.generate()
    agents = Agents(agent=directory(key))
    assert make(agents).check("GET", URL, sign(key)).reason == "no-keys"
    assert agents.asked == []
