"""Admin sign-in: ``POST login`` sets a signed, HttpOnly, SameSite=Strict session cookie (or hands a
bearer token to a script), ``POST logout`` revokes it, ``GET session`` says who is signed in.

The token format is in ``prerender_ray.admin.sessions``. Every replica of every node holds the same key (from
``auth.session_secret``, which ``prerender-ray up`` fills with a random value unless the operator set
one, carried in the actor config), so a session made on one node works on all of them and on the
owner a schedule read is proxied to.

Logout revokes the token cluster-wide: the session id goes into a replicated registry row
``x:<sid>`` (kept until the token would have expired). Each replica keeps the revoked ids in memory,
adds its own at once and re-reads the rows every ``REVOCATION_REFRESH_S``, so ``principal`` stays a
synchronous check. A replica that cannot vouch for that list refuses session and bearer tokens (HTTP
Basic does not depend on it): before its first read (a token presented then waits for it, at most
``FIRST_READ_WAIT_S``; the first read starts with the replica) and when its last successful read is
older than ``REVOCATIONS_MAX_AGE_S``, else a signed-out token would be honoured for as long as the
reads kept failing. A replica issues at most ``SESSIONS_PER_ACCOUNT_PER_HOUR`` sessions per account, so
a signed-in viewer looping login and logout cannot grow that list without bound.

Failed sign-ins (login, and wrong HTTP Basic credentials on any route, ``GET session`` included) are
limited per replica to ``auth.maxFailedLoginsPerMinute`` per (client address, account), and to five
times that per address across accounts; past that the client gets 429 with Retry-After. The address
is the TCP peer unless it is one of ``server.trustedProxies`` (``prerender_ray.serving.proxies``), so a
rotated X-Forwarded-For buys nothing, and an IPv6 client counts as its /64, so a rotated source address
buys nothing either; one account's wrong password does not lock out the others behind the same address.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

from prerender_ray import logs, metrics
from prerender_ray.admin.sessions import (
    SESSION_COOKIE,
    Cursors,
    LoginLimiter,
    SessionClaims,
    SessionTokens,
    SignInLimiter,
    TokenError,
)
from prerender_ray.admin.users import Principal
from prerender_ray.api.admin.common import DEADLINE_S, admin_router, answer, ctx_of
from prerender_ray.api.auth import authenticator, client_address, forwarded_https, same_origin
from prerender_ray.api.bodies import bad_request, read_object
from prerender_ray.api.context import NodeContext
from prerender_ray.storage.keys import REVOKED
from prerender_ray.storage.registry import RecordError, decode_json, encode_json
from prerender_ray.timeutil import now_ms

REVOCATION_REFRESH_S = 2.0
# Tokens are refused while the last successful read of the revocations is older than this: a few
# refresh intervals, and more than one read that runs to its deadline (DEADLINE_S).
REVOCATIONS_MAX_AGE_S = 15.0
FIRST_READ_WAIT_S = 5.0  # a token presented before the replica's first read waits this long for it
FAILED_LOGIN_DELAY_S = 0.3
# Each logout writes a revocation row every replica keeps re-reading until the token would have
# expired: sessions issued per account bound those rows (a script reuses its token, or uses Basic).
SESSIONS_PER_ACCOUNT_PER_HOUR = 60
CONSOLE_HEADER = "x-prerender-console"
ADMIN_ROLES = ("admin", "viewer")
log = logs.get("admin")
router = admin_router()


class Sessions:
    """One per replica: verifies session cookies and bearer tokens, signs cursors, limits failures."""

    def __init__(self, ctx: NodeContext):
        self.ctx = ctx
        secret = ctx.cfg.auth.session_secret
        if not secret:
            # Only when the config did not come through `prerender-ray up` (which always sets one).
            secret = secrets.token_urlsafe(32)
            log.warning("no auth.session_secret: sessions and cursors are valid on this replica only")
        self.tokens = SessionTokens(secret, ctx.cfg.auth.session_ttl)
        self.cursors = Cursors(secret)
        self.limiter = SignInLimiter(ctx.cfg.auth.max_failed_logins_per_minute)
        # counts sessions issued per account (a LoginLimiter counts whatever it is told of)
        self.issued = LoginLimiter(SESSIONS_PER_ACCOUNT_PER_HOUR, window_ms=3_600_000)
        self.revoked: dict[str, int] = {}  # sid -> when the token would have expired
        self._refresher: asyncio.Task | None = None
        self.refreshed_at: float | None = None  # time.monotonic() when the last successful read began
        self._first_read = asyncio.Event()
        if self.enabled:
            self._ensure_refresher()  # before the first request, where the replica has a running loop

    @property
    def enabled(self) -> bool:
        return not authenticator(self.ctx).open_to_loopback

    # ------------------------------------------------------------------------------ verification

    def token_of(self, request: Request) -> tuple[str | None, str]:
        """(token, via): a bearer token wins over the cookie."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip(), "bearer"
        cookie = request.cookies.get(SESSION_COOKIE)
        return (cookie, "session") if cookie else (None, "")

    def inspect(self, request: Request, *, revocations: bool = True,
                ) -> tuple[Principal | None, SessionClaims | None, str | None]:
        """(who, claims, why not): why not is None when no token was presented at all. Without
        ``revocations`` (logout) a token is taken whether or not the revoked list can be vouched for."""
        token, via = self.token_of(request)
        if token is None:
            return None, None, None
        self._ensure_refresher()
        try:
            claims = self.tokens.verify(token, now_ms())
        except TokenError as e:
            return None, None, f"session token refused: {e}"
        unknown = self.revocations_unknown() if revocations else None
        if unknown is not None:
            return None, None, unknown
        if claims.sid in self.revoked:
            return None, None, "session was signed out"
        user = authenticator(self.ctx).users.get(claims.user)
        if user is None:
            return None, None, "session user no longer exists"
        if not self.tokens.same_password(claims, user.password_hash):
            return None, None, "session ended: the user's password changed since it was signed in"
        if via == "session" and request.method not in ("GET", "HEAD") and not same_origin(request):
            return None, None, "cross-origin request with a session cookie refused"
        return Principal(user.name, frozenset(user.roles), via), claims, None

    def principal(self, request: Request) -> Principal | None:
        """Used by ``api.auth.Authenticator`` for every route (after ``first_read``)."""
        return self.inspect(request)[0]

    def revocations_unknown(self) -> str | None:
        """Why this replica cannot tell a signed-out token now (None when it can)."""
        if self.refreshed_at is None:
            return ("sign-in state is being loaded on this replica (signed-out sessions not read yet); "
                    "retry in a moment, or use Basic credentials")
        age = time.monotonic() - self.refreshed_at
        if age > REVOCATIONS_MAX_AGE_S:
            return (f"sign-in state cannot be checked: this replica last read the signed-out sessions "
                    f"{age:.0f} s ago (at most {REVOCATIONS_MAX_AGE_S:.0f} s); retry later, or use Basic "
                    "credentials")
        return None

    async def first_read(self, request: Request) -> None:
        """A token presented before this replica first read the revoked sessions waits for that read
        (at most ``FIRST_READ_WAIT_S``), so a replica just started does not turn its admins away."""
        if self.refreshed_at is not None or self.token_of(request)[0] is None:
            return
        self._ensure_refresher()
        try:
            await asyncio.wait_for(self._first_read.wait(), FIRST_READ_WAIT_S)
        except asyncio.TimeoutError:
            pass  # refused by ``inspect``, saying why

    # --------------------------------------------------------------------------- failed sign-ins

    def client_of(self, request: Request) -> str:
        return client_address(request)

    def guard(self, request: Request, user: str | None) -> None:
        """429 while this client is over its budget of failed sign-ins for ``user`` (or overall)."""
        found = self.limiter.retry_after_ms(self.client_of(request), user, now_ms())
        if found is not None:
            wait, scope = found
            what = "for this account from this address" if scope == "account" else "from this address"
            raise too_many(f"Too many failed sign-ins {what}; retry later", wait)

    def issue(self, who: Principal) -> tuple[str, SessionClaims]:
        """A new session for ``who``; 429 past SESSIONS_PER_ACCOUNT_PER_HOUR on this replica."""
        now = now_ms()
        wait = self.issued.retry_after_ms(who.name, now)
        if wait is not None:
            raise too_many(f"Too many sessions issued for this account in an hour (at most "
                           f"{SESSIONS_PER_ACCOUNT_PER_HOUR}); reuse a token, or retry later", wait)
        self.issued.failed(who.name, now)
        user = authenticator(self.ctx).users.get(who.name)
        password_hash = user.password_hash if user is not None else ""
        return self.tokens.issue(who.name, now, secrets.token_urlsafe(16), password_hash)

    def attempt(self, request: Request, user: str | None) -> Callable[[], None]:
        """Counts a sign-in as failed before its password is checked, so sign-ins sent together cannot
        all pass ``guard`` while their checks run; returns what takes the count back when it was right."""
        client, at = self.client_of(request), now_ms()
        self.limiter.failed(client, user, at)
        return lambda: self.limiter.forgive(client, user, at)

    def failed(self, request: Request, user: str | None) -> None:
        """Logs a failed sign-in (``attempt`` counted it)."""
        log.warning("failed sign-in", client=self.client_of(request), user=(user or "")[:64])

    # ------------------------------------------------------------------------------- revocation

    def _ensure_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            try:
                self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())
            except RuntimeError:  # no running loop (never the case inside a request)
                pass

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh_revocations()
            except Exception as e:
                metrics.loop_errors.labels("session-revocations").inc()
                log.error("reading revoked sessions failed", error=repr(e))
            await asyncio.sleep(REVOCATION_REFRESH_S)

    async def refresh_revocations(self) -> None:
        started = time.monotonic()
        store = self.ctx.store.within(DEADLINE_S)
        if store.handle is None:  # a replica without actors (tests): it revoked every session it knows of
            self._read(started)
            return
        now = now_ms()
        found: dict[str, int] = {}
        expired: list[bytes] = []
        start: bytes | None = None
        while True:
            page = await store.scan(REVOKED, start, 1000)
            for k, v in page:
                try:
                    exp = decode_json(v).get("exp")
                except RecordError:
                    continue
                if isinstance(exp, int) and exp > now:
                    found[k[len(REVOKED):].decode()] = exp
                else:
                    expired.append(k)
            if len(page) < 1000:
                break
            start = page[-1][0] + b"\x00"
        # keep ids revoked here whose row has not come back yet
        self.revoked = {**{s: e for s, e in self.revoked.items() if e > now}, **found}
        self._read(started)
        if expired and self.ctx.replica == 0:  # one replica per node tidies up (tombstones replicate)
            await store.apply([(k, None) for k in expired[:1000]])

    def _read(self, started: float) -> None:
        self.refreshed_at = started  # what was read is as old as the scan's start
        self._first_read.set()

    def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None

    async def revoke(self, claims: SessionClaims, by: str) -> None:
        self.revoked[claims.sid] = claims.expires_at
        row = encode_json({"exp": claims.expires_at, "user": claims.user, "revokedAt": now_ms(), "by": by})
        await self.ctx.store.within(DEADLINE_S).apply([(REVOKED + claims.sid.encode(), row)])


def too_many(error: str, wait_ms: int) -> HTTPException:
    seconds = max(1, -(-wait_ms // 1000))
    return HTTPException(429, detail={"error": error, "retryAfterSeconds": seconds},
                         headers={"Retry-After": str(seconds), "cache-control": "no-store"})


def sessions_of(request: Request) -> Sessions:
    return request.app.state.sessions


def cookie_flags(request: Request, max_age: int) -> dict:
    return {"key": SESSION_COOKIE, "max_age": max_age, "path": "/prerender_admin", "httponly": True,
            "samesite": "strict", "secure": forwarded_https(request)}


# -------------------------------------------------------------------------------------- the routes


@router.get("/session")
async def session(request: Request) -> JSONResponse:
    """Who is calling (open to everyone: it is how the console decides to show the login form).
    Basic credentials sent here are a sign-in like any other: a wrong one counts, past the cap 429."""
    ctx, sessions = ctx_of(request), sessions_of(request)
    who = await authenticator(ctx).principal(request)
    _, claims, why_not = sessions.inspect(request)
    body = {"authenticated": who is not None, "username": who.name if who else None,
            "roles": sorted(who.roles) if who else [], "via": who.via if who else None,
            "admin": bool(who and who.has("admin")), "viewer": bool(who and who.has("viewer")),
            "sessionsEnabled": sessions.enabled, "node": ctx.node.name,
            "expiresAt": claims.expires_at if claims and who and who.via != "basic" else None}
    if why_not:
        body["sessionError"] = why_not
    return answer(body)


@router.post("/login")
async def login(request: Request) -> JSONResponse:
    """``{username, password, bearer?}``: a session cookie, or with ``bearer: true`` the token in the
    body (and no cookie) for scripts, which send it as ``Authorization: Bearer <token>``."""
    ctx, sessions = ctx_of(request), sessions_of(request)
    if not sessions.enabled:
        return answer({"error": "No users are configured (auth.users): loopback requests are authorized "
                       "without signing in, and nobody else can sign in", "sessionsEnabled": False}, 501)
    if not same_origin(request):
        return answer({"error": "cross-origin sign-in refused"}, 403)
    body = await read_object(request, 16 * 1024, keys={"username", "password", "bearer"})
    username, password, bearer = body.get("username"), body.get("password"), body.get("bearer", False)
    if not isinstance(username, str) or not username or not isinstance(password, str) or not password:
        raise bad_request("username and password are required (non-empty strings)")
    if not isinstance(bearer, bool):
        raise bad_request("bearer must be true or false")
    who = await authenticator(ctx).sign_in(request, username, password)
    if who is None:
        await asyncio.sleep(FAILED_LOGIN_DELAY_S)
        return answer({"error": "Invalid credentials", "authenticated": False}, 401)
    if not any(who.has(r) for r in ADMIN_ROLES):
        return answer({"error": "This account has neither the admin nor the viewer role",
                       "authenticated": True, "username": who.name}, 403)
    token, claims = sessions.issue(who)
    doc = {"authenticated": True, "username": who.name, "roles": sorted(who.roles),
           "admin": who.has("admin"), "expiresAt": claims.expires_at, "node": ctx.node.name}
    log.info("signed in", user=who.name, client=sessions.client_of(request), bearer=bearer)
    if bearer:
        return answer({**doc, "token": token, "tokenType": "Bearer", "via": "bearer"})
    resp = answer({**doc, "via": "session"})
    resp.set_cookie(value=token, **cookie_flags(request, max(1, sessions.tokens.ttl_ms // 1000)))
    return resp


@router.post("/logout")
async def logout(request: Request) -> JSONResponse:
    """Revokes the presented session (cookie or bearer) on every node and clears the cookie. Always
    200: signing out twice, or with an expired cookie, is not an error."""
    sessions = sessions_of(request)
    # Signing out needs no fresh revocation list: revoking a token twice changes nothing.
    who, claims, _ = sessions.inspect(request, revocations=False)
    revoked = False
    if who is not None and claims is not None:
        try:
            await sessions.revoke(claims, who.name)
            revoked = True
        except Exception as e:
            sessions.revoked[claims.sid] = claims.expires_at  # at least here
            log.error("session revocation not stored", error=repr(e))
            return answer({"error": "the sign-out could not be recorded cluster-wide; retry",
                           "authenticated": False}, 503)
    resp = answer({"authenticated": False, "revoked": revoked})
    flags = cookie_flags(request, 0)
    resp.delete_cookie(flags["key"], path=flags["path"], secure=flags["secure"], httponly=True,
                       samesite="strict")
    return resp
