"""The peer client (docs/serving.md#peer-page-fetch): asks the owner of a URL for a page this node has not
received yet, through the owner's ``GET /prerender_peer/page`` (``api/peer.py``, which this module's
path, header and switch also serve).

Fail closed: without ``peerRescue.enabled`` and a non-empty token and header the client never asks.
Every failure is a reason string, never an exception: the caller falls back to the origin.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from prerender_ray.config.service import PeerRescue
from prerender_ray.jsonbody import parse_json
from prerender_ray.serving.origin_policy import NoCookies
from prerender_ray.storage.pages import PageMeta

PATH = "/prerender_peer/page"
META_HEADER = "x-prerender-page"
NOT_HELD = "peer responded 404"  # the owner has no page for the key: the usual answer for an uncached URL


def active(rescue: PeerRescue) -> bool:
    return bool(rescue.enabled and rescue.token and rescue.header.strip())


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
                    if r.status_code == 404:
                        return NOT_HELD
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
