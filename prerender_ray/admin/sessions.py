"""Admin sessions, signed list cursors and the failed-login limiters. Pure: the standard library only
(``hmac``, ``hashlib``, ``ipaddress``); times are passed in (epoch milliseconds).

A session token is ``<payload>.<signature>``, both base64url without padding: the payload is compact
JSON ``{"sid", "sub", "iat", "exp", "pwf"}`` and the signature is HMAC-SHA256 over the payload text with
a key derived from the deployment's session secret (one secret per deployment, carried to every replica
of every node in the actor config: ``auth.sessionSecret`` / ``auth.sessionSecretEnv``, else a random
key made by ``prerender-ray up``). The same token is the session cookie and a bearer token for scripts;
roles are never in the token, they are looked up in the config on every request. ``pwf`` binds the
token to the user's password hash as it was at sign-in: a short HMAC of it under another key derived
from the same secret (never the hash itself), so a new password ends the sessions made with the old one.

Cursors for paged admin lists are signed with a key derived from the same secret for another purpose,
so a cursor issued by one replica or node is accepted by every other one, and a cursor that was never
issued (or was issued for another list) is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass

SESSION_COOKIE = "prerender_session"
TOKEN_MAX_CHARS = 4096
_SEP = "."
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)


class TokenError(ValueError):
    """A token or cursor that is malformed, not signed by this deployment, or expired."""


def derive_key(secret: str | bytes, purpose: str) -> bytes:
    """A key for one purpose; the secret itself never signs anything."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    return hmac.new(raw, b"prerender-ray/" + purpose.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in _B64_CHARS for c in text):
        raise TokenError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as e:
        raise TokenError("not base64url") from e


_B64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class Signer:
    """Signs small JSON documents; ``open`` returns the document only when the signature is ours."""

    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError("signing key too short")
        self._key = key

    def _mac(self, payload: str) -> bytes:
        return hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest()

    def seal(self, doc: dict) -> str:
        payload = _b64(_COMPACT.encode(doc).encode("ascii"))
        return f"{payload}{_SEP}{_b64(self._mac(payload))}"

    def open(self, token: object) -> dict:
        if not isinstance(token, str) or not token or len(token) > TOKEN_MAX_CHARS:
            raise TokenError("missing or oversized token")
        payload, sep, sig = token.partition(_SEP)
        if not sep or _SEP in sig:
            raise TokenError("malformed token")
        if not hmac.compare_digest(_unb64(sig), self._mac(payload)):
            raise TokenError("bad signature")
        try:
            doc = json.loads(_unb64(payload))
        except (ValueError, UnicodeDecodeError) as e:  # signed by us, so this means a format change
            raise TokenError("unreadable payload") from e
        if not isinstance(doc, dict):
            raise TokenError("unreadable payload")
        return doc


# ------------------------------------------------------------------------------------------ sessions


@dataclass(frozen=True)
class SessionClaims:
    sid: str
    user: str
    issued_at: int
    expires_at: int
    password: str = ""  # the fingerprint of the user's password hash at sign-in (``pwf``)

    def as_dict(self) -> dict:
        return {"sid": self.sid, "sub": self.user, "iat": self.issued_at, "exp": self.expires_at,
                "pwf": self.password}


class SessionTokens:
    def __init__(self, secret: str | bytes, ttl_ms: int):
        self._signer = Signer(derive_key(secret, "admin-session/v1"))
        self._fingerprints = derive_key(secret, "admin-session-password/v1")
        self.ttl_ms = int(ttl_ms)

    def fingerprint(self, password_hash: str) -> str:
        """A short keyed hash of a user's password hash: equal while the password is unchanged, and
        telling nothing of the hash to whoever reads a token (its payload is only signed)."""
        return _b64(hmac.new(self._fingerprints, password_hash.encode(), hashlib.sha256).digest()[:12])

    def issue(self, user: str, now: int, sid: str, password_hash: str = "") -> tuple[str, SessionClaims]:
        claims = SessionClaims(sid, user, now, now + self.ttl_ms, self.fingerprint(password_hash))
        return self._signer.seal(claims.as_dict()), claims

    def same_password(self, claims: SessionClaims, password_hash: str) -> bool:
        """The token was issued while the user had this password hash."""
        return hmac.compare_digest(claims.password, self.fingerprint(password_hash))

    def verify(self, token: object, now: int) -> SessionClaims:
        doc = self._signer.open(token)
        sid, user, iat, exp = doc.get("sid"), doc.get("sub"), doc.get("iat"), doc.get("exp")
        pwf = doc.get("pwf", "")  # absent from a token issued before there was one: it matches no user
        if not (isinstance(sid, str) and sid and isinstance(user, str) and user
                and type(iat) is int and type(exp) is int and isinstance(pwf, str)):
            raise TokenError("incomplete claims")
        if exp <= now:
            raise TokenError("session expired")
        if iat > now + 60_000:  # issued in the future by more than clock skew allows
            raise TokenError("session issued in the future")
        return SessionClaims(sid, user, iat, exp, pwf)


# ------------------------------------------------------------------------------------------- cursors


class Cursors:
    """Opaque, signed list positions bound to the list they came from (``scope``)."""

    def __init__(self, secret: str | bytes):
        self._signer = Signer(derive_key(secret, "admin-cursor/v1"))

    def issue(self, scope: str, position: str) -> str:
        return self._signer.seal({"s": scope, "p": position})

    def read(self, token: object, scope: str) -> str:
        doc = self._signer.open(token)
        if doc.get("s") != scope:
            raise TokenError("cursor belongs to another list")
        position = doc.get("p")
        if not isinstance(position, str):
            raise TokenError("incomplete cursor")
        return position


# ------------------------------------------------------------------------------------- login limiter


class LoginLimiter:
    """At most ``limit`` failed logins per client in any ``window_ms``; past that the client is refused
    until its oldest failure in the window ages out. Memory is bounded: at most ``max_clients`` clients
    are tracked. Past that the least recently failing client without a live lockout is forgotten first,
    so failures from many other clients do not erase a lockout (a locked-out client goes only when
    every tracked one is locked out, which takes ``max_clients`` x ``limit`` failures in one window)."""

    def __init__(self, limit: int, window_ms: int = 60_000, max_clients: int = 10_000):
        self.limit = max(1, int(limit))
        self.window_ms = window_ms
        self.max_clients = max(1, max_clients)
        self._fails: OrderedDict[Hashable, deque[int]] = OrderedDict()

    def _recent(self, client: Hashable, now: int) -> deque[int] | None:
        fails = self._fails.get(client)
        if fails is None:
            return None
        while fails and fails[0] <= now - self.window_ms:
            fails.popleft()
        if not fails:
            del self._fails[client]
            return None
        return fails

    def _locked(self, fails: deque[int], now: int) -> bool:
        return len(fails) >= self.limit and fails[0] > now - self.window_ms

    def retry_after_ms(self, client: Hashable, now: int) -> int | None:
        """None while the client may try; else how long until it may try again."""
        fails = self._recent(client, now)
        if fails is None or len(fails) < self.limit:
            return None
        return max(1, fails[0] + self.window_ms - now)

    def failed(self, client: Hashable, now: int) -> None:
        fails = self._recent(client, now)
        if fails is None:
            fails = self._fails[client] = deque(maxlen=self.limit)
        fails.append(now)
        self._fails.move_to_end(client)
        self._evict(now, client)

    def _evict(self, now: int, keep: Hashable) -> None:
        # Each client is looked at once at most: a locked-out one (and ``keep``, the one failing now,
        # which must be counted) goes to the back, the first other one is forgotten.
        for _ in range(len(self._fails)):
            if len(self._fails) <= self.max_clients:
                return
            oldest, fails = next(iter(self._fails.items()))
            if oldest == keep or self._locked(fails, now):
                self._fails.move_to_end(oldest)
            else:
                del self._fails[oldest]
        while len(self._fails) > self.max_clients:  # every other one is locked out: the first goes
            del self._fails[next(k for k in self._fails if k != keep)]

    def forgive(self, client: Hashable, at: int) -> None:
        """Takes back the failure counted at ``at`` (a sign-in counted before its check, which passed)."""
        fails = self._fails.get(client)
        if fails is not None and at in fails:
            fails.remove(at)
            if not fails:
                del self._fails[client]

    def __len__(self) -> int:
        return len(self._fails)


IPV6_PREFIX = 64  # an IPv6 host is handed (at least) a /64 and may use any address in it


def client_key(address: str) -> str:
    """The limiter's key for a client address: an IPv4 address as it is (an IPv4-mapped IPv6 one as
    IPv4), an IPv6 address as its /64, so rotating source addresses within one buys no fresh
    attempts; anything else (``unknown``) as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))


ADDRESS_FACTOR = 5  # the per-address cap across accounts, in multiples of the per-account limit
ACCOUNT_CHARS = 64  # of an account name kept as a key (a name is whatever a client sends)


class SignInLimiter:
    """Failed sign-ins counted per (address, account), plus a looser cap per address across accounts.
    An address is an IPv4 address or an IPv6 /64 (``client_key``).

    One account's wrong password (a fleet worker with a stale secret) locks that account from that
    address only; the admins behind the same address (one proxy, one NAT) go on signing in. Guessing
    across many account names from one address still stops at ``ADDRESS_FACTOR`` x ``limit``.
    A refused attempt is not counted: a locked account cannot drag its address over the cap."""

    def __init__(self, limit: int, window_ms: int = 60_000, max_clients: int = 10_000):
        self.pairs = LoginLimiter(limit, window_ms, max_clients)
        self.addresses = LoginLimiter(max(1, int(limit)) * ADDRESS_FACTOR, window_ms, max_clients)

    @staticmethod
    def _pair(address: str, account: str | None) -> tuple[str, str]:
        return address, (account or "")[:ACCOUNT_CHARS]

    def retry_after_ms(self, address: str, account: str | None, now: int) -> tuple[int, str] | None:
        """None while (address, account) may try; else (ms to wait, "account" | "address")."""
        address = client_key(address)
        wait = self.pairs.retry_after_ms(self._pair(address, account), now)
        if wait is not None:
            return wait, "account"
        wait = self.addresses.retry_after_ms(address, now)
        return None if wait is None else (wait, "address")

    def failed(self, address: str, account: str | None, now: int) -> None:
        address = client_key(address)
        self.pairs.failed(self._pair(address, account), now)
        self.addresses.failed(address, now)

    def forgive(self, address: str, account: str | None, at: int) -> None:
        address = client_key(address)
        self.pairs.forgive(self._pair(address, account), at)
        self.addresses.forgive(address, at)
