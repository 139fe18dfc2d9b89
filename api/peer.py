"""Peer page fetch (docs/serving.md#peer-page-fetch): ``GET /prerender_peer/page?key=<cache key>`` hands this
node's stored page to another node, and ``PeerClient`` asks the owner of a URL for it.

A node serves bots from its own copy of the replicated page store; a page that has not replicated yet
(or does not decode) is fetched from the URL's owner with a short deadline before falling back to the
origin. Fail closed: without ``peerRescue.enabled`` and a non-empty token and header the endpoint
answers 404 (its existence is not revealed) and the client never asks. The endpoint never proxies
onward and applies no freshness check: the caller decides whether the page may be served.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from prerender_ray.admin.users import same_secret
from prerender_ray.api.bot.pages import UnreadablePage
from prerender_ray.api.context import NodeContext
from prerender_ray.config.model import PeerRescue
from prerender_ray.jsonbody import parse_json
from prerender_ray.serving.origin_policy import NoCookies
from prerender_ray.storage.pages import PageMeta

PATH = "/prerender_peer/page"
META_HEADER = "x-prerender-page"
router = APIRouter()


def active(rescue: PeerRescue) -> bool:
    return bool(rescue.enabled and rescue.token and rescue.header.strip())


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
    unreadable 410."""
    ctx: NodeContext = request.app.state.ctx
    rescue = ctx.cfg.peer_rescue
    if not active(rescue):
        return _error(404, "Not Found")
    if not same_secret(request.headers.get(rescue.header.strip().lower()), rescue.token):
        return _error(403, "peer token required")
    if request.method != "GET":
        return _error(405, "GET only")
    key = request.query_params.get("key")
    if not key:
        return _error(400, "key is required")
    from prerender_ray.api.bot.middleware import serving_of

    reader = serving_of(ctx).pages
    try:
        found = reader.get_after_miss(key)
    except UnreadablePage as e:
        return _error(410, str(e))
    if found is None:
        return _error(404, "no page for this key")
    return Response(bytes(found.body), status_code=200, media_type="application/octet-stream",
                    headers={META_HEADER: page_metadata(found.meta)})


# ------------------------------------------------------------------------------------------ client


@dataclass(slots=True)
class PeerPage:
    owner: str
    meta: PageMeta
    body: bytes


def parse_metadata(raw: str | None, key: str) -> PageMeta | None:
    """The owner's page metadata, or None when missing or malformed."""
    try:
        doc = parse_json(raw or "", what="page metadata")  # depth-bounded: ValueError, never RecursionError
        headers = parse_json(doc.get("headers") or "{}", what="page headers")
        status = doc["statusCode"]
        if not isinstance(status, int) or isinstance(status, bool) or not isinstance(headers, dict):
            return None
        ints = {f: doc.get(f) for f in ("lastCached", "expiresAt")}
        if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in ints.values()):
            return None
        indexable = doc.get("isIndexable")
        return PageMeta(cache_key=key, status_code=status,
                        headers={str(k): str(v) for k, v in headers.items()},
                        last_cached=ints["lastCached"], expires_at=ints["expiresAt"],
                        is_indexable=indexable if isinstance(indexable, bool) else None)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class PeerClient:
    """Fetches a page from its owner node; every failure is a reason string, never an exception."""

    def __init__(self, rescue: PeerRescue, max_bytes: int):
        self.rescue = rescue
        self.max_bytes = max_bytes
        self.timeout_s = rescue.timeout_ms / 1000
        self._client: httpx.AsyncClient | None = None

    @property
    def active(self) -> bool:
        return active(self.rescue)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # No content decoding: the bytes must arrive exactly as the owner stored them.
            self._client = httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False, trust_env=False,
                                             headers={"accept-encoding": "identity"}, cookies=NoCookies())
        return self._client

    async def fetch(self, owner: str, base_url: str, key: str) -> PeerPage | str:
        headers = {self.rescue.header.strip(): self.rescue.token}
        url = f"{base_url}{PATH}?key={quote(key, safe='')}"
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._http().stream("GET", url, headers=headers) as r:
                    if r.status_code != 200:
                        return f"peer responded {r.status_code}"
                    meta = parse_metadata(r.headers.get(META_HEADER), key)
                    if meta is None:
                        return "peer response missing page metadata"
                    chunks, size = [], 0
                    async for chunk in r.aiter_raw():
                        size += len(chunk)
                        if size > self.max_bytes:
                            return "peer page is over the size cap"
                        chunks.append(chunk)
        except TimeoutError:
            return "peer timed out"
        except httpx.HTTPError as e:
            return f"peer fetch failed: {type(e).__name__}: {e}"
        return PeerPage(owner, meta, b"".join(chunks))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
