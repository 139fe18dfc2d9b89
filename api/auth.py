"""Who is calling: HTTP Basic (the fleet, scripts), signed session cookies and bearer tokens (admins),
or loopback when no users are configured. Every route states the role it needs, and a browser's
cross-site request that may change state is refused before anyone is asked (docs/security.md, "Browsers")."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

from prerender_ray.admin.users import LOOPBACK, Principal, decoy_hash, iterations_of, spend, verify_password
from prerender_ray.api.context import NodeContext
from prerender_ray.config.base import is_loopback
from prerender_ray.config.service import User
from prerender_ray.serving.proxies import Proxies

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # change nothing; a page cannot read a cross-site answer
_VERIFIED_TTL_S = 300.0  # PBKDF2 is deliberately slow; remember good credentials for a while


class Authenticator:
    def __init__(self, users: list[User]):
        self.users = {u.name: u for u in users if u.password_hash}
        self._verified: dict[tuple[str, bytes], float] = {}
        self._checking: dict[tuple[str, bytes], asyncio.Future[Principal | None]] = {}
        # as dear as the dearest user, so no user's answer is slower than a name that is none
        self._decoy = decoy_hash(u.password_hash for u in self.users.values()) if self.users else None
        self._dearest = (iterations_of(self._decoy) or 0) if self._decoy else 0

    @property
    def open_to_loopback(self) -> bool:
        return not self.users

    def check_password(self, name: str, password: str) -> Principal | None:
        """PBKDF2, slow on purpose: call it off the event loop. A wrong password costs what the dearest
        user's check does, for a name that is not a user (the decoy) and for a user whose hash is
        cheaper (the difference spent after its check), login and Basic alike: timing tells neither
        the names nor their hashes apart."""
        user = self.users.get(name)
        encoded = user.password_hash if user is not None else self._decoy
        if encoded is None:
            return None
        if not verify_password(password, encoded):
            if user is not None:
                spend(self._dearest - (iterations_of(encoded) or 0))
            return None
        if user is None:
            return None
        return Principal(name, frozenset(user.roles), "basic")

    async def verify(self, name: str, password: str,
                     attempt: Callable[[], Callable[[], None]] | None = None) -> Principal | None:
        """Credentials verified within ``_VERIFIED_TTL_S`` at once; any others by PBKDF2 off the event
        loop (which also serves bots), a wrong password included: it is never remembered. ``attempt()``
        counts the check as a failed sign-in before it starts and returns what takes that back when the
        password was right. The same credentials checked at once share one check, and one count."""
        key = (name, hashlib.sha256(password.encode()).digest())
        seen = self._verified.get(key)
        user = self.users.get(name)
        if seen is not None and user is not None and time.monotonic() - seen <= _VERIFIED_TTL_S:
            return Principal(name, frozenset(user.roles), "basic")
        check = self._checking.get(key)
        if check is None:
            forgive = attempt() if attempt is not None else None
            check = self._checking[key] = asyncio.ensure_future(self._check(key, password, forgive))
        return await asyncio.shield(check)  # a caller that goes away leaves the check to the others

    async def _check(self, key: tuple[str, bytes], password: str,
                     forgive: Callable[[], None] | None) -> Principal | None:
        try:
            who = await asyncio.to_thread(self.check_password, key[0], password)
        finally:
            del self._checking[key]
        if who is not None:
            if forgive is not None:
                forgive()
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified[key] = time.monotonic()
        return who

    async def sign_in(self, request: Request, name: str | None, password: str) -> Principal | None:
        """Checks a name and password (None: a Basic header that does not decode) within the failed
        sign-in limiter: 429 past ``auth.maxFailedLoginsPerMinute``; a wrong one counts."""
        sessions = getattr(request.app.state, "sessions", None)  # api.admin.session.Sessions
        if sessions is None:
            return await self.verify(name, password) if name is not None else None
        sessions.guard(request, name)
        if name is None:
            sessions.attempt(request, name)
            who = None
        else:
            who = await self.verify(name, password, lambda: sessions.attempt(request, name))
        if who is None:
            sessions.failed(request, name)
        return who

    async def principal(self, request: Request) -> Principal | None:
        """Who is calling; Basic credentials are a sign-in (``sign_in``) on any route that looks."""
        basic = basic_credentials(request)
        if basic is not None:
            return await self.sign_in(request, *basic)
        sessions = getattr(request.app.state, "sessions", None)
        if sessions is not None:
            await sessions.first_read(request)
            found = sessions.principal(request)
            if found is not None:
                return found
        if self.open_to_loopback and from_loopback(request):
            if not loopback_host(request):
                # DNS rebinding: a page whose name now resolves to 127.0.0.1 reaches us from loopback,
                # and its browser sends its own name as Host (and Origin).
                host = request.headers.get("host", "")[:100]
                raise HTTPException(403, detail={
                    "error": f"Host {host!r} is not a loopback name: with no users configured (auth.users) "
                             "only requests to 127.0.0.1, [::1] or localhost are authorized"})
            return LOOPBACK
        return None


def basic_credentials(request: Request) -> tuple[str | None, str] | None:
    """(user, password) of an HTTP Basic header; user None when it does not decode; None without one."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        name, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None, ""
    return name, password


def proxies_of(ctx: NodeContext) -> Proxies:
    proxies = ctx.proxies
    if proxies is None:
        proxies = ctx.proxies = Proxies(ctx.cfg.server.trusted_proxies)
    return proxies


def _peer_and_forwarded(request: Request) -> tuple[str | None, str | None, Proxies]:
    forwarded = ",".join(request.headers.getlist("x-forwarded-for")) or None
    return request.client.host if request.client else None, forwarded, proxies_of(request.app.state.ctx)


def client_address(request: Request) -> str:
    """The caller's address: the TCP peer, or behind a trusted proxy the client it forwards for
    (uvicorn's own proxy-header rewriting is off: it trusted any loopback peer)."""
    peer, forwarded, proxies = _peer_and_forwarded(request)
    return proxies.client(peer, forwarded)


def from_loopback(request: Request) -> bool:
    """The caller is on this host: a loopback address, not relayed by a proxy we were not told of
    (a local reverse proxy must not make every client behind it loopback)."""
    peer, forwarded, proxies = _peer_and_forwarded(request)
    if proxies.hides_client(peer, forwarded) or request.headers.get("forwarded"):
        return False
    return is_loopback(proxies.client(peer, forwarded))


def loopback_host(request: Request) -> bool:
    """The Host header names a loopback address (127.0.0.0/8, [::1]) or localhost, with any port."""
    host = request.headers.get("host", "").lower()
    name = host[:host.find("]") + 1] if host.startswith("[") else host.partition(":")[0]
    return is_loopback(name)


def forwarded_https(request: Request) -> bool:
    """The client's scheme was https: ours, or the one a trusted proxy forwards."""
    if request.url.scheme == "https":
        return True
    peer, _, proxies = _peer_and_forwarded(request)
    proto = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return proxies.trusts(peer) and proto == "https"


def same_origin(request: Request) -> bool:
    """True unless the request names an Origin (or, without one, a Referer) on another host:port."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return True  # scripts and non-browser clients; browsers send Origin on every cross-site POST
    if origin == "null":
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    # Behind a proxy that rewrites Host, the forwarded host names the site (a browser cannot set it
    # on a cross-site request without a preflight, so it cannot be used to forge a same origin).
    hosts = {request.headers.get(h, "").lower() for h in ("host", "x-forwarded-host")} - {""}
    return parts.netloc.lower() in hosts and parts.scheme in ("http", "https")


def cross_site(request: Request) -> bool:
    """A browser sent this for a page of another site: its Origin (``null`` included) is not ours, or
    its Sec-Fetch-Site says so. Workers, curl and the fleet send neither header."""
    if request.headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
        return True
    return "origin" in request.headers and not same_origin(request)


def authenticator(ctx: NodeContext) -> Authenticator:
    auth = ctx.authenticator
    if auth is None:
        auth = ctx.authenticator = Authenticator(list(ctx.cfg.auth.users))
    return auth


def require(*roles: str) -> Callable[[Request], Any]:
    """A dependency: 403 for a browser's cross-site request that may change state, 401 when nobody is
    signed in, 403 when the caller has none of ``roles``."""

    async def dependency(request: Request) -> Principal:
        ctx: NodeContext = request.app.state.ctx
        if request.method not in SAFE_METHODS and cross_site(request):
            # Basic credentials a browser remembers, and loopback, are ambient: an evil page's form
            # post would carry them (text/plain can smuggle a JSON body past any preflight).
            raise HTTPException(403, detail={"error": "cross-site request refused: a browser sent it for a "
                                             "page of another origin (Origin or Sec-Fetch-Site)"})
        who = await authenticator(ctx).principal(request)  # 429 past auth.maxFailedLoginsPerMinute
        if who is None:
            # The console signs in with its own form: no challenge, or the browser would prompt.
            challenge = None if request.headers.get("x-prerender-console") else {
                "WWW-Authenticate": 'Basic realm="prerender-ray"'}
            sessions = getattr(request.app.state, "sessions", None)
            why = sessions.inspect(request)[2] if sessions is not None else None  # a token, refused
            raise HTTPException(401, detail={"error": f"Authentication required: {why}" if why else
                                             "Authentication required", "authenticated": False},
                                headers=challenge)
        if not any(who.has(r) for r in roles):
            raise HTTPException(403, detail={"error": f"This account lacks the {' or '.join(roles)} role",
                                             "authenticated": True, "user": who.name})
        return who

    return dependency
