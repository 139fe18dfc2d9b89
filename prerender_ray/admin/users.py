"""Users, roles and passwords: salted PBKDF2 hashes, constant-time checks, loopback-only default."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from typing import Iterable, Mapping

from prerender_ray.admin.sessions import derive_key
from prerender_ray.config.service import Auth

ITERATIONS = 200_000
PREFIX = "pbkdf2_sha256"


def hash_password(password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"{PREFIX}${iterations}${b64(salt)}${b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    try:
        scheme, iterations, salt, digest = encoded.split("$")
        if scheme != PREFIX:
            return False
        calc = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
        return hmac.compare_digest(calc, base64.b64decode(digest))
    except (ValueError, TypeError):
        return False


def iterations_of(encoded: str) -> int | None:
    """The PBKDF2 rounds a stored hash costs to check (None: not one of ours)."""
    try:
        return int(encoded.split("$")[1])
    except (IndexError, ValueError):
        return None


def spend(iterations: int) -> None:
    """PBKDF2 rounds that check nothing: a wrong password for a cheaper user is made to cost what the
    dearest user's does, so its answer is no faster than a name that is no user."""
    if iterations > 0:
        hashlib.pbkdf2_hmac("sha256", b"", bytes(16), iterations)


def decoy_hash(likes: Iterable[str]) -> str:
    """A hash that costs what the dearest of ``likes`` (the users' hashes) costs to check and that no
    password matches (its digest is random): checked for a name that is not a user, so the time of
    the answer does not tell them apart, whichever user it is compared with."""
    counts = [n for like in likes if (n := iterations_of(like)) is not None]
    iterations = max(1, min(max(counts, default=ITERATIONS), 1_000_000))
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"{PREFIX}${iterations}${b64(bytes(16))}${b64(secrets.token_bytes(32))}"


def same_secret(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison that never matches an empty secret."""
    if not given or not expected:
        return False
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(expected.encode()).digest())


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str]
    via: str  # "basic" | "bearer" | "session" | "loopback"

    def has(self, role: str) -> bool:
        # admin may do everything a viewer or the fleet may do.
        return role in self.roles or "admin" in self.roles


LOOPBACK = Principal("loopback", frozenset({"admin", "viewer", "fleet"}), "loopback")


def resolve_password_hashes(auth: Auth, env: Mapping[str, str] | None = None) -> list[dict]:
    """Users with their password as a hash only: a ``passwordEnv`` is read (where the CLI runs) and
    hashed at the cost ``hash-password`` gives (``ITERATIONS``; a cheaper one would tell the user apart
    by the time of its answer), so plain passwords never travel to the actors or sit in a file or a log.
    With a configured session secret the salt is derived from it and the user's name: a new ``up`` with
    the same password makes the same hash, and a session (bound to its user's hash) outlives it."""
    env = os.environ if env is None else env
    out = []
    for u in auth.users:
        if u.password_hash:
            h = u.password_hash
        elif env.get(u.password_env):
            secret = auth.session_secret
            salt = derive_key(secret, f"password-salt/{u.name}")[:16] if secret else None
            h = hash_password(env[u.password_env], salt=salt)
        else:
            continue  # cannot sign in; config loading already warned
        out.append({"name": u.name, "password_hash": h, "roles": list(u.roles)})
    return out
