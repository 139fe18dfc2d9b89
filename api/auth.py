"""Who is calling: HTTP Basic (the fleet, scripts), signed session cookies and bearer tokens (admins),
or loopback when no users are configured. Every route states the role it needs."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request

from prerender_ray.auth import LOOPBACK, Principal, is_loopback, verify_password
from prerender_ray.config import User

from .context import NodeContext

_VERIFIED_TTL_S = 300.0  # PBKDF2 is deliberately slow; remember good credentials for a while


class Authenticator:
    def __init__(self, users: list[User]):
        self.users = {u.name: u for u in users if u.password_hash}
        self._verified: dict[tuple[str, bytes], float] = {}

    @property
    def open_to_loopback(self) -> bool:
        return not self.users

    def check_password(self, name: str, password: str) -> Principal | None:
        user = self.users.get(name)
        if user is None:
            return None
        key = (name, hashlib.sha256(password.encode()).digest())
        seen = self._verified.get(key)
        now = time.monotonic()
        if seen is None or now - seen > _VERIFIED_TTL_S:
            if not verify_password(password, user.password_hash):
                return None
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified[key] = now
        return Principal(name, frozenset(user.roles), "basic")

    def principal(self, request: Request) -> Principal | None:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "basic" and value:
            try:
                name, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return self.check_password(name, password)
        sessions = getattr(request.app.state, "sessions", None)
        if sessions is not None:
            found = sessions.principal(request)
            if found is not None:
                return found
        if self.open_to_loopback and request.client and is_loopback(request.client.host):
            return LOOPBACK
        return None


def authenticator(ctx: NodeContext) -> Authenticator:
    auth = ctx.extras.get("authenticator")
    if auth is None:
        auth = ctx.extras["authenticator"] = Authenticator(list(ctx.cfg.auth.users))
    return auth


def require(*roles: str) -> Callable[[Request], Any]:
    """A dependency: 401 when nobody is signed in, 403 when the caller has none of ``roles``."""

    async def dependency(request: Request) -> Principal:
        ctx: NodeContext = request.app.state.ctx
        sessions = getattr(request.app.state, "sessions", None)  # api.admin_session.Sessions
        basic = request.headers.get("authorization", "")[:6].lower() == "basic "
        if sessions is not None and basic:
            sessions.guard(request)  # 429 past auth.maxFailedLoginsPerMinute failed sign-ins
        who = authenticator(ctx).principal(request)
        if who is None:
            if sessions is not None and basic:
                sessions.failed(request, None)
            # The console signs in with its own form: no challenge, or the browser would prompt.
            challenge = None if request.headers.get("x-prerender-console") else {
                "WWW-Authenticate": 'Basic realm="prerender-ray"'}
            raise HTTPException(401, detail={"error": "Authentication required", "authenticated": False},
                                headers=challenge)
        if not any(who.has(r) for r in roles):
            raise HTTPException(403, detail={"error": f"This account lacks the {' or '.join(roles)} role",
                                             "authenticated": True, "user": who.name})
        return who

    return dependency
