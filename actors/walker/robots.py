"""Fetching a robots.txt through the sitemap fetcher's client (the origin policy on every hop, no
cookies, one deadline), its body read to a cap, and the row that records it.

The body is decoded as it streams (``Decoder``: gzip or identity as the response says) and reading
stops once ``robots.maxBytes`` are in hand, so a 50 MB robots.txt costs 500 KiB, not 50 MB. Parsing
a full 500 KiB file takes protego a second on a busy core: it runs in a worker thread, never on the
walker's event loop. What a status means (sitemaps/robots.py): 2xx the rules, 4xx allow all, 5xx or
no answer unknown (the last good copy stays in force).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from prerender_ray import metrics
from prerender_ray.actors.walker.fetch import Fetcher, SitemapFetchError
from prerender_ray.decoding import DecodeError, Decoder
from prerender_ray.sitemaps.refresh import daily_refresh_key
from prerender_ray.sitemaps.robots import (
    OK,
    UNAVAILABLE,
    UNREACHABLE,
    ParsedRobots,
    configured_origins,
    report,
    robots_url,
    served_by,
    settle,
)
from prerender_ray.sitemaps.rules import describe_error
from prerender_ray.storage.registry import RecordError, decode_json, encode_json, robots_key
from prerender_ray.timeutil import now_ms

PIECE = 64 * 1024
HEADERS = {"accept": "text/plain, */*;q=0.5"}
# Redirects that cannot end in a file are "unavailable" (RFC 9309 2.3.1.2: allow all); a hop to a
# host ``domains`` does not allow is not the site's answer, only ours: the rules stay unknown.
_UNAVAILABLE_CODES = ("SITEMAP_TOO_MANY_REDIRECTS", "SITEMAP_BAD_REDIRECT")


async def read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """At most about ``max_bytes`` decoded bytes of the body, and whether there were more."""
    coding = response.headers.get("content-encoding", "").strip().lower() or "identity"
    decoder = Decoder("gzip" if coding == "x-gzip" else coding, None, piece=PIECE)  # ValueError: unknown
    out = bytearray()
    async for chunk in response.aiter_raw():
        for piece in decoder.feed(chunk):
            out += piece
            if len(out) > max_bytes:
                return bytes(out), True  # the rest is never read
    decoder.finish()
    return bytes(out), False


async def fetch_robots(fetcher: Fetcher, url: str, *, max_bytes: int, deadline_s: float) -> ParsedRobots:
    """The outcome of one fetch; never raises for anything the origin does."""
    at = now_ms()
    status: int | None = None

    def failed(state: str, error: str, status: int | None = None) -> ParsedRobots:
        metrics.robots_fetches.labels(state).inc()
        return ParsedRobots(url, state, status, at, error=error)

    try:
        async with asyncio.timeout(deadline_s):
            response = await fetcher.follow(url, "robots.txt", HEADERS)
            try:
                status = response.status_code
                if 200 <= status < 300:
                    body, truncated = await read_capped(response, max_bytes)
                elif 400 <= status < 500 and status != 429:  # 429 is "slow down", as a 5xx
                    metrics.robots_fetches.labels(UNAVAILABLE).inc()
                    return ParsedRobots(url, UNAVAILABLE, status, at, final_url=str(response.url))
                else:
                    return failed(UNREACHABLE, f"{status} {response.reason_phrase}", status)
            finally:
                await response.aclose()
    except TimeoutError:
        return failed(UNREACHABLE, f"no complete answer within {deadline_s * 1000:g} ms")
    except SitemapFetchError as e:
        return failed(UNAVAILABLE if e.code in _UNAVAILABLE_CODES else UNREACHABLE, str(e))
    except (ValueError, DecodeError) as e:  # an unknown or corrupt content-encoding
        return failed(UNREACHABLE, f"unreadable body: {e}", status)
    except httpx.HTTPError as e:
        return failed(UNREACHABLE, f"while reading the body: {describe_error(e)}", status)
    metrics.robots_fetches.labels(OK).inc()
    return await asyncio.to_thread(ParsedRobots.from_body, url, body, status=status, max_bytes=max_bytes,
                                   fetched_at=at, truncated=truncated, final_url=str(response.url))


async def settle_and_report(last: ParsedRobots | None, fetched: ParsedRobots, fetcher: Fetcher, limit: int,
                            served: Mapping[str, str]) -> tuple[ParsedRobots, dict]:
    """The copy in force and its report (parsed in a worker thread)."""
    kept = settle(last, fetched)
    return kept, await asyncio.to_thread(report, kept, fetcher.policy, limit, served)


class ConflictGauge:
    """``prerender_robots_conflicts{domain,bot}``: 1 per conflicting bot, back to 0 when it goes. Bots
    come from the registry; domains are capped at ``MAX_DOMAINS`` (``host:*`` lets an admin name any
    port), past which a new domain is only in the report and the log."""

    MAX_DOMAINS = 100

    def __init__(self) -> None:
        self.shown: dict[str, set[str]] = {}

    def update(self, domain: str, bots: set[str]) -> bool:
        if domain not in self.shown and len(self.shown) >= self.MAX_DOMAINS:
            return False
        for bot in self.shown.get(domain, set()) - bots:
            metrics.robots_conflicts.labels(domain, bot).set(0)
        for bot in bots:
            metrics.robots_conflicts.labels(domain, bot).set(1)
        self.shown[domain] = bots
        return True


class Discovery:
    """``discover``: each origin's robots.txt (the stored copy when younger than ``robots.ttl``, else
    fetched and recorded in its ``b:<origin>`` row), and its allowed ``Sitemap:`` lines queued for
    walks, one after another, through the walker's own claim and launch (what POST /sitemaps does).
    A line that is already a child of another sitemap is left to its parent's walk."""

    def __init__(self, walker: Any):
        self.w = walker  # the SitemapWalker: cfg, store, fetcher, log, _sitemaps, _claim, _launch
        self.gauge = ConflictGauge()
        self.queue: list[str] = []
        self.task: asyncio.Task | None = None

    async def discover(self, origins: list[str], refresh: bool = False, walk: bool = True,
                       trigger: str = "robots", new_only: bool = False) -> list[dict]:
        out = []
        for origin in origins:
            doc = await self.one(origin, refresh)
            doc["walks"] = await self.queue_walks(doc["robots"]["sitemaps"], trigger, new_only) if walk else []
            out.append(doc)
        return out

    async def daily(self) -> None:
        """Discovery of every domain on an interval, on the node named by sitemap.node: the first pass
        a minute after start, then every ``robots.discovery.interval``. It walks only sitemaps not
        registered yet (the daily sitemap refresh walks the others), so a restart re-walks nothing."""
        every = self.w.cfg.robots.discovery
        if not every.enabled or daily_refresh_key(self.w.cfg.sitemap, self.w.node) is None:
            return
        self.w.log.info("robots.txt discovery armed", intervalMs=every.interval)
        await asyncio.sleep(60)
        while True:
            try:
                cfg = self.w.cfg
                await self.discover(configured_origins(cfg.domains, cfg.ingress.default_protocol),
                                    trigger="robots-daily", new_only=True)
                await asyncio.sleep(every.interval / 1000)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                metrics.loop_errors.labels("robots-discovery").inc()
                self.w.log.error("robots.txt discovery failed", error=repr(e))
                await asyncio.sleep(60)

    async def one(self, origin: str, refresh: bool) -> dict:
        rb = self.w.cfg.robots
        key = robots_key(origin)
        [raw] = await self.w.store.get([key])
        try:
            row = decode_json(raw) if raw else None
        except RecordError:
            row = None
        checked = row.get("checkedAt") if isinstance(row, dict) else None
        if (isinstance(row, dict) and isinstance(row.get("report"), dict) and isinstance(checked, int)
                and not refresh and now_ms() - checked < rb.ttl):
            self.gauge.update(origin, {c["bot"] for c in row["report"].get("conflicts") or ()})
            return {"domain": origin, "cached": True, "checkedAt": checked, "robots": row["report"]}
        last = ParsedRobots.from_row(row) if isinstance(row, dict) else None
        fetched = await fetch_robots(self.w.fetcher, robots_url(origin), max_bytes=rb.max_bytes,
                                     deadline_s=rb.fetch_timeout_ms / 1000)
        kept, doc = await settle_and_report(last, fetched, self.w.fetcher, rb.max_sitemaps, served_by(self.w.cfg))
        row = {"origin": origin, **kept.to_row(), "checkedAt": fetched.fetched_at, "report": doc}
        await self.w.store.apply([(key, encode_json(row))])
        conflicts = {c["bot"] for c in doc["conflicts"]}
        self.gauge.update(origin, conflicts)
        log = self.w.log.warning if fetched.state != "ok" or doc["sitemapsIgnoredCount"] else self.w.log.info
        log("robots.txt fetched", domain=origin, state=fetched.state, status=fetched.status,
            error=fetched.error, inForce=kept.state, size=kept.size, truncated=kept.truncated,
            sitemaps=len(doc["sitemaps"]), sitemapLines=doc["sitemapLines"],
            ignored=doc["sitemapsIgnoredCount"], overLimit=doc["sitemapsOverLimit"])
        if conflicts:
            self.w.log.warning("robots.txt disallows bots the policy serves", domain=origin,
                               bots=sorted(conflicts)[:20], count=len(conflicts))
        return {"domain": origin, "cached": False, "checkedAt": fetched.fetched_at, "robots": doc}

    async def queue_walks(self, urls: list[str], trigger: str, new_only: bool = False) -> list[dict]:
        rows = await self.w._sitemaps()
        out = []
        for url in urls:
            parent = (rows.get(url) or {}).get("parentUrl")
            if parent:
                out.append({"url": url, "queued": False, "reason": f"walked as a child of {parent}"})
            elif new_only and url in rows:
                out.append({"url": url, "queued": False, "reason": "registered; the daily refresh walks it"})
            elif url in self.queue:
                out.append({"url": url, "queued": True, "reason": "already queued"})
            else:
                self.queue.append(url)
                out.append({"url": url, "queued": True})
        if self.queue and (self.task is None or self.task.done()):
            self.task = asyncio.get_running_loop().create_task(self._drain(trigger))
        return out

    async def _drain(self, trigger: str) -> None:
        """Queued roots one after another, each claimed just in time (a refused one is skipped)."""
        while self.queue:
            root = self.queue.pop(0)
            try:
                check = await self.w._claim(root)
                if not check.allowed:
                    self.w.log.info("robots.txt sitemap not walked", root=root, reason=check.reason)
                    continue
                run = await self.w._launch(root, False, trigger, check)
                await asyncio.shield(run.task)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.w.log.error("robots.txt sitemap walk failed", root=root, error=describe_error(e))

    def close(self) -> list[asyncio.Task]:
        self.queue.clear()
        return [self.task] if self.task is not None else []
