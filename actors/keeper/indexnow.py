"""IndexNow submissions from the keeper: the URLs whose rendered content changed, batched per host and
posted to each configured endpoint (``prerender_ray.serving.indexnow`` holds the pure parts).

The keeper that applies a result is the owner of its URL, and a result is applied once per grant, so
one node submits a URL once per change: no other node sees that result. Each endpoint has its own
queue, rate limit and retries, so a slow or failing endpoint delays no other.

Every request follows the rules of each outbound fetch: POST to a configured endpoint only (checked
on the URL the client is about to connect to), no redirect followed (a 3xx is a failure, not
retried), no cookie kept, no proxy from the environment, one deadline for the whole request, and at
most ``ANSWER_BYTES`` of the answer read. A timeout, a connection error, 429 or 5xx is tried again
after a doubling backoff, at most ``maxAttempts`` times; then the batch is dropped and counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from prerender_ray import logs, metrics
from prerender_ray.config.outputs import IndexNow
from prerender_ray.rpc import wait_for
from prerender_ray.serving.indexnow import Pending, RateLimit, backoff_s, host_of, retryable, submission
from prerender_ray.serving.origin_policy import NoCookies
from prerender_ray.tasks import Tasks

log = logs.get("indexnow")
ANSWER_BYTES = 4096  # an endpoint's answer is read this far (its status is what counts), then closed


class Endpoint:
    """One endpoint: its queue of changed URLs, its rate limit, its submissions."""

    def __init__(self, url: str, cfg: IndexNow, client: httpx.AsyncClient, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[None]]):
        self.url = url
        self.target = httpx.URL(url)
        self.cfg = cfg
        self.client = client
        self.clock, self.sleep = clock, sleep
        self.pending = Pending(cfg.max_queued)
        self.limit = RateLimit(cfg.min_interval / 1000)
        self.wake = asyncio.Event()  # a host's batch is full: flush before the interval ends

    def add(self, url: str, origin: str) -> None:
        dropped = self.pending.add(url, origin)
        metrics.indexnow_urls.labels("queued").inc()
        if dropped:
            metrics.indexnow_urls.labels("dropped-queue-full").inc(dropped)
        if self.pending.full(self.cfg.batch_size):
            self.wake.set()

    async def flush(self) -> None:
        """Submit everything queued now, one origin's batch at a time."""
        while (batch := self.pending.take(self.cfg.batch_size)) is not None:
            await self.submit(*batch)

    async def submit(self, origin: str, urls: list[str]) -> bool:
        body = submission(origin, self.cfg.key, urls)
        for attempt in range(1, self.cfg.max_attempts + 1):
            wait = self.limit.wait_s(self.clock())
            if wait > 0:
                await self.sleep(wait)
            self.limit.spent(self.clock())
            outcome = await self.post(body)
            metrics.indexnow_requests.labels(outcome).inc()
            if outcome == "ok":
                metrics.indexnow_urls.labels("sent").inc(len(urls))
                return True
            if outcome not in ("unavailable", "timeout", "error"):
                break  # the endpoint refused this batch (or redirected): another try would too
            if attempt < self.cfg.max_attempts:
                await self.sleep(backoff_s(self.cfg.retry_backoff / 1000, attempt))
        log.warning("indexnow submission dropped", endpoint=self.url, origin=origin, urls=len(urls),
                    outcome=outcome)
        metrics.indexnow_urls.labels("dropped-failed").inc(len(urls))
        return False

    async def post(self, body: bytes) -> str:
        """One request; its outcome: ok, redirect, rejected (4xx), unavailable (429, 5xx), timeout, error."""
        request = self.client.build_request("POST", self.target, content=body,
                                            headers={"content-type": "application/json; charset=utf-8"})
        if (request.url.scheme, request.url.raw_host, request.url.port) != (
                self.target.scheme, self.target.raw_host, self.target.port):
            return "refused"  # only ever a configured endpoint
        try:
            async with asyncio.timeout(self.cfg.timeout_ms / 1000):
                response = await self.client.send(request, stream=True)
                try:
                    read = 0
                    async for chunk in response.aiter_raw():
                        read += len(chunk)
                        if read >= ANSWER_BYTES:
                            break  # the rest is never read
                finally:
                    await response.aclose()
        except (TimeoutError, httpx.TimeoutException):
            return "timeout"
        except httpx.HTTPError:
            return "error"
        status = response.status_code
        if status in (200, 202):
            return "ok"
        if 300 <= status < 400:
            return "redirect"
        return "unavailable" if retryable(status) else "rejected"

    async def run(self) -> None:
        interval = self.cfg.flush_interval / 1000
        while True:
            try:
                try:
                    await wait_for(self.wake.wait(), interval)  # a close's cancel as a batch fills ends it
                except TimeoutError:
                    pass
                self.wake.clear()
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the loop outlives one bad flush
                metrics.loop_errors.labels("indexnow").inc()
                log.error("indexnow flush failed", endpoint=self.url, error=repr(e)[:300])
                await asyncio.sleep(interval)


class Notifier:
    """``changed(url, discovered)`` for each URL whose content a result changed; the loops submit them."""

    def __init__(self, cfg: IndexNow, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.cfg = cfg
        self.hosts = frozenset(cfg.hosts)
        self.client = httpx.AsyncClient(follow_redirects=False, trust_env=False, cookies=NoCookies(),
                                        timeout=cfg.timeout_ms / 1000,
                                        headers={"user-agent": "prerender-ray", "accept-encoding": "identity"})
        self.endpoints = [Endpoint(url, cfg, self.client, clock, sleep) for url in cfg.endpoints]
        self.tasks: list[asyncio.Task] = []

    def changed(self, url: str, discovered: bool = False) -> None:
        """``discovered``: only a bot's miss made the URL's target; anyone can send misses, and the key
        vouches for the operator's pages, so it goes only with ``includeDiscovered``."""
        if discovered and not self.cfg.include_discovered:
            return
        origin = host_of(url, self.hosts)
        if origin is None:  # not a host the operator submits
            return
        for endpoint in self.endpoints:
            endpoint.add(url, origin)

    async def flush(self) -> None:
        await asyncio.gather(*(e.flush() for e in self.endpoints))

    def start(self, tasks: Tasks) -> None:
        """The endpoints' loops, as tasks of ``tasks`` (the keeper's: its close ends them)."""
        self.tasks = [tasks.spawn(e.run()) for e in self.endpoints]

    async def close(self) -> None:
        for t in self.tasks:  # the keeper's close has awaited them by now (``Tasks.close``)
            t.cancel()
        await self.client.aclose()
