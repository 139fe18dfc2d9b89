"""Fetching a signature agent's key directory (Web Bot Auth; ``prerender_ray.serving.web_bot_auth``).

Only for the agents ``bots.webBotAuth.agents`` allows (the caller never asks for another), with the
rules of every outbound fetch: GET, no cookies kept, no proxy from the environment, no content coding,
the body read to ``maxDirectoryBytes`` and no further, one deadline for the whole fetch
(``fetchTimeoutMs``). A redirect is followed only within the agent's own origin (at most
``MAX_REDIRECTS``): the keys that verify an agent come from that agent.
"""

from __future__ import annotations

import asyncio

import httpx

from prerender_ray.config.bots import WebBotAuthConfig
from prerender_ray.serving.origin_policy import NoCookies
from prerender_ray.serving.web_bot_auth import DIRECTORY_PATH, DIRECTORY_TYPE, KeyDirectoryError, agent_origin

MAX_REDIRECTS = 3
_JSON_TYPES = (DIRECTORY_TYPE, "application/json", "application/jwk-set+json")


class DirectoryFetcher:
    """One HTTP client per replica; ``fetch(origin)`` is the ``Fetch`` the signature check is given."""

    def __init__(self, cfg: WebBotAuthConfig, user_agent: str = "prerender-ray"):
        self.max_bytes = cfg.max_directory_bytes
        self.deadline_s = cfg.fetch_timeout_ms / 1000
        self.client = httpx.AsyncClient(
            follow_redirects=False, trust_env=False, cookies=NoCookies(), timeout=self.deadline_s,
            headers={"accept": f"{DIRECTORY_TYPE}, application/json;q=0.5", "accept-encoding": "identity",
                     "user-agent": user_agent})

    async def aclose(self) -> None:
        await self.client.aclose()

    async def fetch(self, origin: str) -> bytes:
        url = f"{origin}{DIRECTORY_PATH}"
        try:
            async with asyncio.timeout(self.deadline_s):
                return await self._fetch(origin, url)
        except TimeoutError:
            raise KeyDirectoryError(f"{url}: not read within {self.deadline_s:g} s") from None
        except httpx.HTTPError as e:
            raise KeyDirectoryError(f"{url}: {type(e).__name__}: {str(e)[:200]}") from None

    async def _fetch(self, origin: str, url: str) -> bytes:
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            async with self.client.stream("GET", current) as r:
                if r.is_redirect:
                    target = r.url.join(r.headers.get("location", ""))
                    if agent_origin(str(target)) != origin:
                        raise KeyDirectoryError(f"{url}: redirected off the agent's origin, to "
                                                f"{str(target)[:200]!r}")
                    current = str(target)
                    continue
                if r.status_code != 200:
                    raise KeyDirectoryError(f"{url}: answered {r.status_code}")
                ctype = r.headers.get("content-type", "").partition(";")[0].strip().lower()
                if ctype not in _JSON_TYPES:
                    raise KeyDirectoryError(f"{url}: content-type {ctype[:80]!r}, not {DIRECTORY_TYPE}")
                coding = r.headers.get("content-encoding", "identity").strip().lower()
                if coding not in ("", "identity"):
                    raise KeyDirectoryError(f"{url}: content-encoding {coding[:40]!r}")
                data = bytearray()
                async for chunk in r.aiter_raw():
                    data += chunk
                    if len(data) > self.max_bytes:  # the rest is never read
                        raise KeyDirectoryError(f"{url}: larger than maxDirectoryBytes ({self.max_bytes})")
                return bytes(data)
        raise KeyDirectoryError(f"{url}: redirected more than {MAX_REDIRECTS} times")
