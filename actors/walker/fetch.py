"""Fetching one sitemap document: streamed, capped, under one deadline, parsed off the event loop.

The body is never held whole. Raw bytes go to the streaming ``SitemapParser`` (which inflates gzip
itself, so its decompressed-size cap also stops a gzip bomb), in slices handed to a worker thread:
libxml2 and the per-entry work of a 50,000-entry document would otherwise hold the walker's event
loop for a second or more. What a document keeps is its partition (urlset) or its children (index)
and its entries encoded as chunk rows, ready to store.

Fetching follows the reference (one self-identifying User-Agent, the security token header sent even
when empty, the staging IP pinned for every fetch when configured) and does better: a deadline per
document, redirects followed only to http(s) and at most ``MAX_REDIRECTS`` times, gzip by content
whatever the URL or headers say, and any other content encoding refused. Every request (the root,
an index child, each redirect hop) is first checked by the origin policy (``domains``: host and
port), so the token goes only to an allowed origin, and with ``allowAnyDomain`` on a public listener
connects only to a public address (``api/outbound.py``); no cookie is kept between fetches.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import xxhash

from prerender_ray.api.outbound import NonPublicAddress, transport
from prerender_ray.config.model import Config
from prerender_ray.serving.origin_policy import NoCookies, OriginPolicy
from prerender_ray.sitemaps.parser import SitemapEntry, SitemapError, SitemapParser, snippet
from prerender_ray.sitemaps.rules import Canonicalize, Classify, Partition, describe_error, partition_entries
from prerender_ray.storage.registry import ENTRY_CHUNK, encode_entries

MAX_REDIRECTS = 5
FEED_BYTES = 256 * 1024  # raw bytes handed to the parser thread at once (a few ms of work)
_NOT_A_SITEMAP = ("SITEMAP_NOT_SITEMAP", "SITEMAP_NOT_XML", "SITEMAP_MALFORMED")
_ENCODINGS = ("", "identity", "gzip", "x-gzip")  # gzip is inflated by the parser, under its caps


class SitemapFetchError(Exception):
    """A document that could not be fetched or used; ``code`` names the class of problem."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass
class Document:
    """One fetched and parsed sitemap document."""

    url: str
    kind: str  # "urlset" | "sitemapindex"
    status: int
    final_url: str
    entry_count: int = 0
    chunks: list[bytes] = field(default_factory=list)  # entry chunk rows, ENTRY_CHUNK entries each
    partition: Partition | None = None  # urlset only
    children: list[SitemapEntry] = field(default_factory=list)  # sitemapindex only
    size: int = 0  # decompressed bytes
    compressed: bool = False
    digest: str = ""  # of the raw body: an unchanged document need not rewrite its entry rows
    seconds: float = 0.0

    @property
    def is_index(self) -> bool:
        return self.kind == "sitemapindex"


class _Reader:
    """Parser, partition and entry-row encoding for one document; ``feed``/``close`` run in a thread
    (one at a time per document), so nothing here touches the event loop."""

    def __init__(self, cfg: Config, classify: Classify, canonicalize: Canonicalize):
        self.parser = SitemapParser.from_config(cfg.sitemap)
        self.classify, self.canonicalize = classify, canonicalize
        self.partition = Partition()
        self.children: list[SitemapEntry] = []
        self.rows: list[Any] = []
        self.chunks: list[bytes] = []
        self.count = 0
        self.hash = xxhash.xxh64()

    def feed(self, data: bytes) -> bool:
        self.hash.update(data)
        self._take(self.parser.feed(data))
        return self.parser.done

    def close(self) -> None:
        self._take(self.parser.close())
        if self.rows:
            self.chunks.append(encode_entries(self.rows))
            self.rows = []

    def _take(self, entries: list[SitemapEntry]) -> None:
        if not entries:
            return
        self.count += len(entries)
        if self.parser.is_index:
            self.children += entries
            self.rows += [[e.loc, e.lastmod] for e in entries]
        else:
            partition_entries(entries, self.classify, self.canonicalize, into=self.partition)
            self.rows += entries  # tuples: JSON writes [loc, lastmod, changefreq, priority]
        while len(self.rows) >= ENTRY_CHUNK:
            self.chunks.append(encode_entries(self.rows[:ENTRY_CHUNK]))
            del self.rows[:ENTRY_CHUNK]


class Fetcher:
    """One HTTP client per walker; ``fetch`` is safe to run for several documents at once."""

    def __init__(self, cfg: Config, classify: Classify, canonicalize: Canonicalize):
        self.cfg = cfg
        self.classify, self.canonicalize = classify, canonicalize
        self.policy = OriginPolicy(cfg)
        sm, origin = cfg.sitemap, cfg.origin
        self.deadline_s = sm.fetch_timeout_ms / 1000
        self.staging_ip = origin.staging.ip
        self.via = f" (via staging {self.staging_ip})" if self.staging_ip else ""
        token = origin.security_token
        self.headers = {"user-agent": sm.user_agent, token.header: token.value, "accept-encoding": "gzip",
                        "accept": "application/xml, text/xml;q=0.9, */*;q=0.5"}
        connect = min(origin.connect_timeout_ms / 1000, self.deadline_s)
        self.client = httpx.AsyncClient(
            transport=transport(pin=self.staging_ip, public_only=self.policy.public_only), headers=self.headers,
            follow_redirects=False, timeout=httpx.Timeout(self.deadline_s, connect=connect), trust_env=False,
            cookies=NoCookies())

    async def aclose(self) -> None:
        await self.client.aclose()

    async def fetch(self, url: str) -> Document:
        """The parsed document, or ``SitemapFetchError``; never runs past ``sitemap.fetchTimeoutMs``."""
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.deadline_s):
                doc = await self._fetch(url)
        except TimeoutError:
            ms = self.cfg.sitemap.fetch_timeout_ms
            raise SitemapFetchError(f"Sitemap fetch for {url}{self.via} did not finish within {ms} ms",
                                    "SITEMAP_TIMEOUT") from None
        doc.seconds = time.monotonic() - t0
        return doc

    async def _fetch(self, url: str) -> Document:
        response = await self.follow(url)
        try:
            return await self._read(url, response)
        finally:
            await response.aclose()

    async def follow(self, url: str, what: str = "Sitemap", headers: dict | None = None) -> httpx.Response:
        """The first response that is not a redirect, streamed (the caller closes it): every hop is
        asked of the origin policy before it connects, at most ``MAX_REDIRECTS`` are followed."""
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            try:
                request = self.client.build_request("GET", current, headers=headers)
            except httpx.InvalidURL as e:
                raise SitemapFetchError(f"{what} fetch failed for {url}: {e}", "SITEMAP_BAD_URL") from None
            refused = self.policy.request_refusal(request.url.scheme, request.url.raw_host, request.url.port)
            if refused:
                hop = "" if current == url else f" (redirected to {current[:200]})"
                raise SitemapFetchError(f"{what} fetch for {url}{hop} refused: {refused}",
                                        "SITEMAP_HOST_NOT_ALLOWED")
            try:
                response = await self.client.send(request, stream=True)
            except httpx.HTTPError as e:
                raise SitemapFetchError(f"{what} fetch failed for {url}{self.via}: {describe_error(e)}",
                                        type(e).__name__) from None
            except NonPublicAddress as e:
                hop = "" if current == url else f" (redirected to {current[:200]})"
                raise SitemapFetchError(f"{what} fetch for {url}{hop} refused: {e}: {e.detail}",
                                        "SITEMAP_HOST_NOT_ALLOWED") from None
            if not response.is_redirect:
                return response
            try:
                current = self._redirect(url, response)
            finally:
                await response.aclose()
        raise SitemapFetchError(f"{what} fetch for {url} redirected more than {MAX_REDIRECTS} times",
                                "SITEMAP_TOO_MANY_REDIRECTS")

    def _redirect(self, url: str, response: httpx.Response) -> str:
        location = response.headers.get("location", "")
        try:
            target = response.url.join(location)
        except httpx.InvalidURL:
            target = None
        if target is None or target.scheme not in ("http", "https") or not target.host:
            raise SitemapFetchError(f"Sitemap fetch for {url} redirected to a non-http(s) URL "
                                    f"{location[:200]!r}", "SITEMAP_BAD_REDIRECT")
        return str(target)

    async def _read(self, url: str, response: httpx.Response) -> Document:
        status = response.status_code
        if not 200 <= status < 300:
            head = b""
            async for chunk in response.aiter_raw():
                head += chunk
                if len(head) >= 400:
                    break
            raise SitemapFetchError(f"Sitemap fetch failed for {url}{self.via}: {status} "
                                    f"{response.reason_phrase} — {snippet(head)}", f"HTTP_{status}")
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding not in _ENCODINGS:
            raise SitemapFetchError(f"Sitemap fetch for {url} came with content-encoding {encoding!r}; "
                                    "only gzip is accepted", "SITEMAP_BAD_ENCODING")
        reader = _Reader(self.cfg, self.classify, self.canonicalize)
        try:
            pending: list[bytes] = []
            size = 0
            done = False
            async for chunk in response.aiter_raw():
                pending.append(chunk)
                size += len(chunk)
                if size >= FEED_BYTES:
                    done = await asyncio.to_thread(reader.feed, b"".join(pending))
                    pending, size = [], 0
                    if done:
                        break  # the root closed: whatever follows is ignored, as the reference does
            if pending and not done:
                await asyncio.to_thread(reader.feed, b"".join(pending))
            await asyncio.to_thread(reader.close)
        except SitemapError as e:
            raise self._rejected(url, response, reader, e) from None
        except httpx.HTTPError as e:
            raise SitemapFetchError(f"Sitemap fetch failed for {url}{self.via} while reading the body: "
                                    f"{describe_error(e)}", type(e).__name__) from None
        parser = reader.parser
        assert parser.kind is not None  # close() raised otherwise
        return Document(url=url, kind=parser.kind, status=status, final_url=str(response.url),
                        entry_count=reader.count, chunks=reader.chunks,
                        partition=None if parser.is_index else reader.partition, children=reader.children,
                        size=parser.size, compressed=parser.compressed, digest=reader.hash.hexdigest())

    def _rejected(self, url: str, response: httpx.Response, reader: _Reader,
                  e: SitemapError) -> SitemapFetchError:
        if e.code in _NOT_A_SITEMAP:
            ctype = response.headers.get("content-type", "none")
            return SitemapFetchError(
                f"Sitemap fetch for {url}{self.via} returned a non-sitemap response (status "
                f"{response.status_code}, content-type {ctype}): {e} — {snippet(reader.parser.head)}",
                e.code)
        return SitemapFetchError(f"Sitemap {url}{self.via} rejected: {e}", e.code)
