"""Web Bot Auth: a request signed by its agent (HTTP Message Signatures, RFC 9421, as the IETF
webbotauth drafts use them; ``bots.webBotAuth``). Pure: no HTTP (key directories come through an
injected fetch), time through an injected clock (Unix seconds).

A signed request carries ``Signature-Input`` (a label per signature: the covered components and
``created``, ``expires``, ``keyid``, ``tag="web-bot-auth"``), ``Signature`` (the bytes, same label)
and ``Signature-Agent`` (the agent's origin: an sf-string, or a Dictionary member per label as the
later drafts write it). ``keyid`` is the JWK SHA-256 thumbprint (RFC 7638) of an Ed25519 key in the
agent's key directory, ``/.well-known/http-message-signatures-directory`` (a JWKS).

The check is synchronous and CPU-only, so the hit path never waits on the network: it verifies
against keys already held. Directories are fetched in the background, only for the agents the
operator allows (a header naming any other agent costs nothing and keeps nothing), at most once per
``retryAfter`` per agent, kept ``keyTtl`` and then refreshed, the last good copy used meanwhile and
while a refresh fails. State is one entry per allowed agent: a flood of agents or key ids grows nothing.

The library (``http-message-signatures``) builds the signature base and verifies; what the drafts add
is checked here first, explicitly: header sizes, the tag, ``created``/``expires`` against our clock
(the library would read the system clock), the covered components, the agent and the key.
Replay: a signature is accepted from ``created`` up to ``maxAge`` later (and never past ``expires``),
each bound widened by ``skew``. Nonces are optional in the drafts and not tracked: one replica's
memory cannot stop a replay to another replica or node, and a replayed signature only repeats what
the agent asked for within the window.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections import UserString
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import http_sf
from cryptography.exceptions import InvalidSignature as CryptoInvalid
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from http_message_signatures import (
    HTTPMessageSignaturesException,
    HTTPMessageVerifier,
    InvalidSignature,
    MappingKeyResolver,
    algorithms,
)

from prerender_ray.serving.bot_policy import UNCHECKED, UNVERIFIED, VERIFIED
from prerender_ray.serving.origin_policy import origin_of

if TYPE_CHECKING:
    from prerender_ray.config.bots import WebBotAuthConfig

TAG = "web-bot-auth"
DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"
DIRECTORY_TYPE = "application/http-message-signatures-directory+json"
# Hostile input is refused by length before it is parsed.
MAX_INPUT_BYTES = 4096  # Signature-Input
MAX_SIGNATURE_BYTES = 4096  # Signature (8 Ed25519 signatures are about 800 bytes)
MAX_AGENT_BYTES = 2048  # Signature-Agent
MAX_LABELS = 8
MAX_COMPONENTS = 16
MAX_KEYS = 64  # directory entries looked at

# Why a signature did not verify (the metric's outcomes, besides "verified"): a bounded set.
REASONS = ("oversize", "malformed", "bad-tag", "bad-alg", "future", "expired", "too-old", "missing-component",
           "unknown-agent", "no-keys", "unknown-keyid", "wrong-component", "bad-signature", "agent-mismatch")

Fetch = Callable[[str], Awaitable[bytes]]  # an agent origin -> its directory's body; KeyDirectoryError


class KeyDirectoryError(ValueError):
    """A key directory that could not be fetched or used (the agent and why)."""


@dataclass(frozen=True, slots=True)
class Signed:
    """The answer for a request that carries signature headers."""

    state: str  # VERIFIED; UNVERIFIED; UNCHECKED for a signature that is not ours to check (tag, agent)
    reason: str  # "verified" or one of REASONS
    agent: str = ""  # the allowed agent origin it was checked against


@dataclass(frozen=True, slots=True)
class Key:
    public: Ed25519PublicKey
    nbf: int | None = None  # JWK validity, when the directory gives it
    exp: int | None = None


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def thumbprint(jwk: Mapping[str, Any]) -> str:
    """RFC 7638 JWK SHA-256 thumbprint of an OKP key: its required members, sorted, no whitespace."""
    members = {"crv": jwk["crv"], "kty": jwk["kty"], "x": jwk["x"]}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return b64url(hashlib.sha256(canonical.encode("utf-8")).digest())


def public_jwk(key: Ed25519PublicKey) -> dict[str, str]:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return {"kty": "OKP", "crv": "Ed25519", "x": b64url(key.public_bytes(Encoding.Raw, PublicFormat.Raw))}


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_directory(data: bytes, source: str = "key directory") -> dict[str, Key]:
    """The Ed25519 keys of a JWKS, by thumbprint (entries of other types are skipped);
    KeyDirectoryError when there is none."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise KeyDirectoryError(f"{source}: not JSON") from None
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise KeyDirectoryError(f"{source}: no 'keys' array")
    keys: dict[str, Key] = {}
    for jwk in entries[:MAX_KEYS]:
        if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        x = jwk.get("x")
        if not isinstance(x, str) or len(x) != 43:  # 32 bytes, base64url without padding
            continue
        try:
            public = Ed25519PublicKey.from_public_bytes(_b64url_decode(x))
        except ValueError:
            continue
        nbf, exp = jwk.get("nbf"), jwk.get("exp")
        keys[thumbprint(jwk)] = Key(public, nbf if _is_int(nbf) else None, exp if _is_int(exp) else None)
    if not keys:
        raise KeyDirectoryError(f"{source}: no Ed25519 key")
    return keys


def _sf(data: bytes, tltype: str) -> Any:
    """A parsed Structured Field (its typed union is wider than what is read of it here)."""
    return http_sf.parse(data, tltype=tltype)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True)
class _Message:
    """What the library reads of a request: method, absolute URL, header items."""

    method: str
    url: str
    headers: Mapping[str, str]


class _LibraryVerifier(HTTPMessageVerifier):
    def validate_created_and_expires(self, sig_input: Any, max_age: Any = None) -> None:
        return None  # checked before, against the injected clock (the library reads the system clock)


def verify_label(method: str, url: str, headers: Mapping[str, str], label: str, keyid: str,
                 key: Ed25519PublicKey, tag: str | None = None) -> str:
    """The cryptographic step: the signature ``label`` (with ``tag``; without, the only one) of the
    request verifies under ``key``.
    ``verified``, ``bad-signature``, ``wrong-component`` (a covered component the request cannot
    give) or ``malformed``."""
    verifier = _LibraryVerifier(signature_algorithm=algorithms.ED25519,
                                key_resolver=MappingKeyResolver(public_keys={keyid: key}, private_keys={}))
    verifier.require_created = False
    try:
        # without a tag the library selects no label (it is not signed): the message's only signature
        verifier.verify(_Message(method, url, headers), max_age=None, expect_tag=tag,
                        expect_label=label if tag is not None else None)
    except InvalidSignature as e:
        if isinstance(e.__cause__, CryptoInvalid):
            return "bad-signature"
        if isinstance(e.__cause__, HTTPMessageSignaturesException):
            return "wrong-component"
        return "malformed"
    except HTTPMessageSignaturesException:
        return "malformed"
    return "verified"


@dataclass(slots=True)
class _Agent:
    """One allowed agent's keys: the last good copy, when it came, and the refresh in flight."""

    keys: dict[str, Key] | None = None
    bots: frozenset[str] | None = None  # the bot names it verifies (lower case); None: any but the reserved
    fetched: float = 0.0
    tried: float = float("-inf")
    task: asyncio.Task | None = None
    error: str = ""
    fetches: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0})


def agent_origin(value: str) -> str | None:
    """``scheme://host[:port]`` of an agent URL (default port dropped), or None."""
    origin = origin_of(value.strip())
    if origin is None:
        return None
    scheme, host, port = origin
    return f"{scheme}://{host}" if port == {"http": 80, "https": 443}[scheme] else f"{scheme}://{host}:{port}"


class WebBotAuth:
    """The signature check of one replica and the key directories of its allowed agents."""

    def __init__(self, cfg: WebBotAuthConfig, fetch: Fetch, *, clock: Callable[[], float] = time.time,
                 on_fetch: Callable[[str], None] | None = None, reserved: Iterable[str] = ()):
        """``reserved``: bot names verified another way (reverse DNS, ranges): an agent that does not
        name one of them cannot verify it, so a platform that signs for its users' agents cannot make
        one Googlebot."""
        self.agents: dict[str, _Agent] = {}
        for entry in cfg.agents:
            origin = agent_origin(entry.origin)
            if origin is not None:
                bots = None if entry.bots is None else frozenset(b.lower() for b in entry.bots)
                self.agents[origin] = _Agent(bots=bots)
        self.reserved = frozenset(name.lower() for name in reserved)
        self.fetch = fetch
        self.clock = clock
        self.skew = cfg.skew / 1000
        self.max_age = cfg.max_age / 1000
        self.ttl = cfg.key_ttl / 1000
        self.retry_after = cfg.retry_after / 1000
        self.on_fetch = on_fetch  # counts fetch outcomes (ok, failed) where the caller wants them

    # ------------------------------------------------------------------------------------ the check

    def check(self, method: str, url: str, headers: Mapping[str, str], name: str = "") -> Signed | None:
        """None for a request without signature headers; else verified or why not. Never raises.
        ``name``: the bot the request claims (its User-Agent's registry name); a valid signature by an
        agent that does not cover it is ``agent-mismatch``."""
        raw_input, raw_sig = headers.get("signature-input"), headers.get("signature")
        if raw_input is None and raw_sig is None:
            return None
        try:
            return self._check(method, url, headers, raw_input, raw_sig, name.lower())
        except Exception:  # a header shape the parsers did not expect: refused, never an error page
            return Signed(UNVERIFIED, "malformed")

    def covers(self, origin: str, name: str) -> bool:
        """May a signature of the agent at ``origin`` verify the bot ``name`` (lower case)?"""
        agent = self.agents.get(origin)
        if agent is None:
            return False
        return name not in self.reserved if agent.bots is None else name in agent.bots

    def _check(self, method: str, url: str, headers: Mapping[str, str], raw_input: str | None,
               raw_sig: str | None, name: str) -> Signed:
        raw_agent = headers.get("signature-agent")
        if (len(raw_input or "") > MAX_INPUT_BYTES or len(raw_sig or "") > MAX_SIGNATURE_BYTES
                or len(raw_agent or "") > MAX_AGENT_BYTES):
            return Signed(UNVERIFIED, "oversize")
        if not raw_input or not raw_sig:
            return Signed(UNVERIFIED, "malformed")
        try:
            inputs = _sf(raw_input.encode("latin-1"), "dictionary")
        except Exception:
            return Signed(UNVERIFIED, "malformed")
        if len(inputs) > MAX_LABELS:
            return Signed(UNVERIFIED, "oversize")
        ours = [(label, member) for label, member in inputs.items()
                if isinstance(member[1], dict) and member[1].get("tag") == TAG]
        if not ours:  # not a web-bot-auth signature: as if unsigned
            return Signed(UNCHECKED, "bad-tag")
        first: Signed | None = None
        for label, (components, params) in ours:
            answer = self._one(method, url, headers, raw_agent, label, components, params)
            if answer.state == VERIFIED:
                if self.covers(answer.agent, name):
                    return answer
                answer = Signed(UNVERIFIED, "agent-mismatch", answer.agent)
            first = first or answer
        assert first is not None
        return first

    def _one(self, method: str, url: str, headers: Mapping[str, str], raw_agent: str | None, label: str,
             components: Any, params: dict) -> Signed:
        if not isinstance(components, list):
            return Signed(UNVERIFIED, "malformed")
        if len(components) > MAX_COMPONENTS:
            return Signed(UNVERIFIED, "oversize")
        keyid, created, expires, alg = (params.get(k) for k in ("keyid", "created", "expires", "alg"))
        if not isinstance(keyid, str) or not _is_int(created) or not _is_int(expires) or expires < created:
            return Signed(UNVERIFIED, "malformed")
        if alg is not None and alg != "ed25519":
            return Signed(UNVERIFIED, "bad-alg")
        now = self.clock()
        if created > now + self.skew:
            return Signed(UNVERIFIED, "future")
        if expires < now - self.skew:
            return Signed(UNVERIFIED, "expired")
        if created < now - self.max_age - self.skew:
            return Signed(UNVERIFIED, "too-old")
        names = {c[0] for c in components if isinstance(c, tuple)}
        agent_key = next((c[1].get("key") for c in components
                          if isinstance(c, tuple) and c[0] == "signature-agent" and isinstance(c[1], dict)), None)
        if not names & {"@authority", "@target-uri"} or (raw_agent is not None and "signature-agent" not in names):
            return Signed(UNVERIFIED, "missing-component")
        origin = self._agent(raw_agent, label, agent_key)
        agent = self.agents.get(origin) if origin else None
        if agent is None:  # not one the operator allows (no fetch, nothing kept): as if unsigned
            return Signed(UNCHECKED, "unknown-agent")
        assert origin is not None
        if agent.keys is None:
            self._refresh(origin, agent, now)
            return Signed(UNVERIFIED, "no-keys", origin)
        if now - agent.fetched >= self.ttl:
            self._refresh(origin, agent, now)
        key = agent.keys.get(keyid)
        if key is None or (key.nbf is not None and key.nbf > now + self.skew) or \
                (key.exp is not None and key.exp < now - self.skew):
            self._refresh(origin, agent, now, force=True)  # a rotated key: fetched again, rate-limited
            return Signed(UNVERIFIED, "unknown-keyid", origin)
        result = verify_label(method, url, headers, label, keyid, key.public, TAG)
        return Signed(VERIFIED if result == "verified" else UNVERIFIED, result, origin)

    @staticmethod
    def _agent(raw: str | None, label: str, key: object) -> str | None:
        """The agent origin the signature ``label`` names: the Dictionary member its covered
        ``signature-agent`` selects (else the one of its label, else the only one), or the whole field."""
        if raw is None:
            return None
        data = raw.encode("latin-1")
        value: object = None
        try:
            members = _sf(data, "dictionary")
        except Exception:
            members = None
        if members is not None:
            name = key if isinstance(key, str) else label
            member = members.get(name)
            if member is None and key is None and len(members) == 1:
                member = next(iter(members.values()))
            value = member[0] if member is not None else None
        elif key is None:
            try:
                value = _sf(data, "item")[0]
            except Exception:
                return None
        # a string, or a token (``https://agent.example`` unquoted parses as one)
        return agent_origin(str(value)) if isinstance(value, str | UserString) else None

    # ---------------------------------------------------------------------------- key directories

    def start(self) -> None:
        """Fetch every allowed agent's directory now (in the background)."""
        now = self.clock()
        for origin, agent in self.agents.items():
            self._refresh(origin, agent, now)

    def _refresh(self, origin: str, agent: _Agent, now: float, *, force: bool = False) -> None:
        if agent.task is not None or now - agent.tried < self.retry_after:
            return
        if not force and agent.keys is not None and now - agent.fetched < self.ttl:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a plain call): nothing can run in the background
            return
        agent.tried = now
        agent.task = loop.create_task(self._load(origin, agent))

    async def _load(self, origin: str, agent: _Agent) -> None:
        try:
            agent.keys = parse_directory(await self.fetch(origin), f"{origin}{DIRECTORY_PATH}")
            agent.fetched = self.clock()
            agent.error = ""
            outcome = "ok"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the last good copy stays in use
            agent.error = str(e)[:300]
            outcome = "failed"
        finally:
            agent.task = None
        agent.fetches[outcome] += 1
        if self.on_fetch is not None:
            self.on_fetch(outcome)

    async def settle(self) -> None:
        """Wait for the fetches in flight (tests, shutdown)."""
        tasks = [a.task for a in self.agents.values() if a.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        for agent in self.agents.values():
            if agent.task is not None:
                agent.task.cancel()

    def snapshot(self) -> dict[str, Any]:
        return {origin: {"keys": len(a.keys or {}), "fetched": a.fetched or None, "error": a.error, **a.fetches}
                for origin, a in self.agents.items()}
