"""Peer page fetch (docs/serving.md#peer-page-fetch): ``GET /prerender_peer/page?key=<cache key>`` hands this
node's stored page to another node (the client that asks is ``api/bot/peer.py``).

A node serves bots from its own copy of the replicated page store; a page that has not replicated yet
(or does not decode) is fetched from the URL's owner with a short deadline before falling back to the
origin. Fail closed: without ``peerRescue.enabled`` and a non-empty token and header the endpoint
answers 404 (its existence is not revealed). The endpoint never proxies onward and applies no
freshness check: the caller decides whether the page may be served.

The token faces the internet on every node's port, so guessing it is bounded: a client address (an
IPv4 address, an IPv6 /64) that sent ``PEER_FAILURES_PER_MINUTE`` wrong tokens within a minute is
answered 429 with ``Retry-After``, its token not looked at, until the oldest of them ages out (per
replica, as the admin sign-in limit). A peer with the right token never fails, so never waits.
"""

from __future__ import annotations

import json
import math

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from prerender_ray.admin.sessions import LoginLimiter, client_key
from prerender_ray.admin.users import same_secret
from prerender_ray.api.auth import client_address
from prerender_ray.api.bot.pages import UnreadablePage
from prerender_ray.api.bot.peer import META_HEADER, PATH, active
from prerender_ray.api.bot.replica import open_replica
from prerender_ray.api.context import NodeContext
from prerender_ray.storage.pages import PageMeta
from prerender_ray.timeutil import now_ms

router = APIRouter()

PEER_FAILURES_PER_MINUTE = 10  # wrong peer tokens a client address may send a minute (per replica)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def page_metadata(meta: PageMeta) -> str:
    """The x-prerender-page value; ``headers`` is nested as a JSON string, as the reference does."""
    doc = {"statusCode": meta.status_code, "headers": json.dumps(meta.headers, separators=(",", ":")),
           "lastCached": meta.last_cached, "expiresAt": meta.expires_at, "isIndexable": meta.is_indexable}
    return json.dumps({k: v for k, v in doc.items() if v is not None}, separators=(",", ":"))


@router.api_route(PATH, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                  include_in_schema=False)
async def peer_page(request: Request) -> Response:
    """Checks in the reference's order: inactive 404, token 403, method 405, key 400, record 404,
    unreadable 410; before the token, a client that sent too many wrong ones 429."""
    ctx: NodeContext = request.app.state.ctx
    rescue = ctx.cfg.peer_rescue
    if not active(rescue):
        return _error(404, "Not Found")
    failures = ctx.peer_failures
    if failures is None:
        failures = ctx.peer_failures = LoginLimiter(PEER_FAILURES_PER_MINUTE)
    client, now = client_key(client_address(request)), now_ms()
    wait = failures.retry_after_ms(client, now)
    if wait is not None:
        return JSONResponse({"error": "too many wrong peer tokens from this address; retry later"},
                            status_code=429, headers={"Retry-After": str(math.ceil(wait / 1000))})
    if not same_secret(request.headers.get(rescue.header.strip().lower()), rescue.token):
        failures.failed(client, now)
        return _error(403, "peer token required")
    if request.method != "GET":
        return _error(405, "GET only")
    key = request.query_params.get("key")
    if not key:
        return _error(400, "key is required")
    reader = open_replica(ctx).services.pages
    try:
        found = await reader.read(key)
        meta = found.meta if found is not None else None
    except UnreadablePage as e:
        return _error(410, str(e))
    if found is None or meta is None:
        return _error(404, "no page for this key")
    return Response(bytes(found.body), status_code=200, media_type="application/octet-stream",
                    headers={META_HEADER: page_metadata(meta)})
