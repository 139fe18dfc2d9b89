"""The queue side of the fleet protocol: claims with the reference fleet's classification
(docs/fleet-protocol.md#claim-status-handling), result posts with its retry rules
(docs/fleet-protocol.md#result-retries), and queue-status polling (our HTTP stand-in for the MQTT
broadcast: docs/fleet-protocol.md#queue-status), all feeding one HostHealth.

One ``httpx.AsyncClient`` per host (keep-alive, HTTP/1.1), Basic auth and ``x-worker-id`` on every
request, and a deadline on every call. Credentials go only to trusted origins: the queues the worker
was given and, with discovery, the nodes they list, never from an https queue to plain http.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from prerender_ray import logs
from prerender_ray.config.base import is_loopback
from prerender_ray.serving.origin_policy import NoCookies
from prerender_ray.worker.backoff import HostHealth, Timing, parse_retry_after, result_retry_delay
from prerender_ray.worker.metrics import WorkerMetrics
from prerender_ray.worker.outcome import Job, parse_jobs

log = logs.get("worker.client")

UNAVAILABLE_STATUSES = frozenset({429, 502, 503, 504})


def now_ms() -> float:
    return time.time() * 1000


@dataclass
class ClaimResult:
    kind: str  # jobs | empty | unavailable | error
    jobs: list[Job] = field(default_factory=list)
    status: int | None = None
    detail: str = ""


class QueueClient:
    def __init__(
        self,
        queues: list[str],
        *,
        user: str = "",
        password: str = "",
        worker_id: str = "",
        concurrency: int = 1,
        timing: Timing | None = None,
        health: HostHealth | None = None,
        claim_timeout_s: float = 30.0,
        result_timeout_s: float = 30.0,
        result_retries: int = 3,
        discover: bool = True,
        metrics: WorkerMetrics | None = None,
        wake: Callable[[], None] | None = None,
    ):
        self.seeds = list(queues)
        self.health = health or HostHealth(timing)
        self.timing = self.health.t
        for q in queues:
            self.health.add(q)
        self.auth = httpx.BasicAuth(user, password) if user else None
        self.headers = {"x-worker-id": worker_id} if worker_id else {}
        self.pool_size = max(2, concurrency + 1)
        self.claim_timeout_s = claim_timeout_s
        self.result_timeout_s = result_timeout_s
        self.result_retries = result_retries
        self.discover = discover
        self.metrics = metrics or WorkerMetrics()
        self.wake = wake or (lambda: None)
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._status_seen: dict[str, float] = {}
        self._status_muted: dict[str, float] = {}  # seed -> until (ms): it has no /queue_status
        self.trusted = set(self.seeds)  # the only origins that get the credentials (+ discovered nodes)
        self._warned: set[tuple[str, str]] = set()  # (event, origin) refused already: one warning each

    def trusts(self, origin: str, named_by: str) -> bool:
        """May ``origin``, named by the queue ``named_by``, get the credentials?"""
        return origin in self.trusted and not downgrade(origin, named_by)

    def _refuse(self, origin: str, event: str, **fields: Any) -> None:
        if (event, origin) not in self._warned:
            self._warned.add((event, origin))
            log.warning(event, **fields)

    def client(self, base: str) -> httpx.AsyncClient:
        c = self._clients.get(base)
        if c is None:
            if base not in self.trusted:  # the one place credentials are attached
                raise ValueError(f"{base!r} is not a trusted queue origin")
            c = httpx.AsyncClient(
                base_url=base,
                auth=self.auth,
                headers=self.headers,
                follow_redirects=False,
                cookies=NoCookies(),  # a queue node's Set-Cookie is never replayed
                timeout=httpx.Timeout(self.claim_timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=self.pool_size, max_keepalive_connections=self.pool_size),
            )
            self._clients[base] = c
        return c

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    def _tracks(self, host: str) -> bool:
        """Hosts we keep health for: the seeds, and with discovery every node we learn of (a callback
        origin only when it is trusted: unlike the reference fleet's side door, a job cannot add one)."""
        return self.discover or host in self.health.hosts

    # ---------------------------------------------------------------------------------- claim

    async def claim(self, host: str, limit: int) -> ClaimResult:
        r = await self._claim(host, limit)
        now = now_ms()
        if r.kind == "jobs":
            self.health.on_jobs(host, now)
            self.metrics.jobs_claimed.inc(len(r.jobs))
        elif r.kind == "empty":
            self.health.on_empty(host, now)
        self.metrics.claims.labels(r.kind).inc()
        return r

    async def _claim(self, host: str, limit: int) -> ClaimResult:
        try:
            resp = await self.client(host).post("/render_queue/claim", json={"limit": limit})
        except httpx.HTTPError as e:
            self.health.open_circuit(host, now_ms())
            log.warning("claim failed", host=host, error=_describe(e))
            return ClaimResult("unavailable", detail=_describe(e))
        if resp.status_code == 200:
            try:
                body = resp.json()
                if not isinstance(body, list):
                    raise ValueError(f"a JSON {type(body).__name__}, not an array")
            except ValueError as e:
                self.health.open_circuit(host, now_ms())
                log.warning("claim answered garbage", host=host, error=str(e)[:200], body=resp.text[:200])
                return ClaimResult("unavailable", status=200, detail="garbage")
            jobs, problems = parse_jobs(body, host)
            for p in problems:
                log.warning("unusable job skipped", host=host, problem=p)
                self.metrics.skipped.labels("malformed").inc()
            return ClaimResult("jobs" if jobs else "empty", jobs, 200)
        if resp.status_code in UNAVAILABLE_STATUSES:
            ra = parse_retry_after(resp.headers.get("retry-after"), now_ms())
            until = self.health.open_circuit(host, now_ms(), ra)
            log.warning(
                "queue unavailable",
                host=host,
                status=resp.status_code,
                retry_in_s=round((until - now_ms()) / 1000, 1),
            )
            return ClaimResult("unavailable", status=resp.status_code)
        self.health.open_circuit(host, now_ms())
        if resp.status_code in (401, 403):  # nothing will render until an operator acts: say so loudly
            log.error("claim refused: the node did not accept this worker's credentials", host=host,
                      status=resp.status_code, hint="give the worker a user with the fleet role "
                      "(--user and --password-env)", body=resp.text[:300])
            return ClaimResult("error", status=resp.status_code, detail=resp.text[:300])
        log.warning("claim refused", host=host, status=resp.status_code, body=resp.text[:300])
        return ClaimResult("error", status=resp.status_code, detail=resp.text[:300])

    # --------------------------------------------------------------------------------- result

    def result_origin(self, job: Job) -> str:
        """Where a job's result goes: its callbackOrigin when that is trusted, else the queue that
        granted the job ("" when it has none).

        The callbackOrigin comes from the claim answer, so a queue (or anything between the worker and
        a plain-http queue) could name any host and have the credentials sent there. Posting to an
        untrusted origin without credentials would get a 401 and lose the render; the granting queue
        is trusted, and a node that does not own the key passes the result on to the owner's keeper
        (api/render_queue.py ``job_result``), so the render lands at the cost of one hop."""
        origin, queue = job.callback_origin, job.granted_by
        if self.trusts(origin, queue):
            return origin
        if not queue:
            return ""
        self._refuse(
            origin,
            "result sent to the queue that granted the job: its callbackOrigin is not trusted with the "
            "credentials",
            callback_origin=origin,
            queue=queue,
            hint="give it with --queue, or let discovery find it in /queue_status (never http under https)",
        )
        return queue

    async def post_result(self, job: Job, body: bytes, headers: dict[str, str]) -> str:
        """POST one result to the job's callback origin, or to the queue that granted the job when the
        worker does not trust that origin (``result_origin``). Returns ``delivered``, ``expired`` (the
        lease ran out: nothing more is sent), ``not-held`` (409), ``too-large`` (413), ``rejected`` (any
        other final answer, or no trusted origin) or ``failed`` (retries exhausted)."""
        host = self.result_origin(job)
        if not host:
            log.error("result not sent: no trusted origin for it", key=job.id, callback_origin=job.callback_origin)
            return "rejected"
        attempts = 1 + self.result_retries
        for attempt in range(1, attempts + 1):
            now = now_ms()
            if not job.held(now):
                log.warning("lease expired; result not sent", key=job.id, attempt=attempt)
                return "expired"
            timeout = min(self.result_timeout_s, max(1.0, job.lease_left_ms(now) / 1000))
            try:
                resp = await self.client(host).post(
                    "/render_queue/job_result",
                    content=body,
                    headers=headers,
                    timeout=httpx.Timeout(timeout, connect=5.0),
                )
            except httpx.HTTPError as e:
                status, ra, text = None, None, _describe(e)
            else:
                status, text = resp.status_code, resp.text[:300]
                ra = parse_retry_after(resp.headers.get("retry-after"), now_ms())
                if status == 204:
                    if self._tracks(host) and self.health.on_result_ok(host, now_ms()):
                        self.wake()
                    return "delivered"
            retriable = status is None or status == 429 or status >= 500
            if status in (409, 413, 400):
                # the job, not the host: no circuit (the reference opens one for any non-204)
                log.warning("result refused", key=job.id, status=status, body=text)
                return {409: "not-held", 413: "too-large"}.get(status, "rejected")
            if self._tracks(host):
                self.health.open_circuit(host, now_ms(), ra)
            if not retriable:
                log.error("failed to send job result", key=job.id, status=status, body=text)
                return "rejected"
            if attempt == attempts:
                log.error(
                    "failed to send job result; retries exhausted", key=job.id, status=status, error=text
                )
                return "failed"
            log.warning(
                "result post failed; retrying", key=job.id, status=status, error=text, attempt=attempt
            )
            self.metrics.results.labels("retried").inc()
            delay = result_retry_delay(self.timing, attempt, self.health.rng) / 1000
            left = job.lease_left_ms(now_ms()) / 1000
            if left <= delay:
                log.warning("lease ends before the next retry; result not sent", key=job.id)
                return "expired"
            await asyncio.sleep(delay)
        return "failed"  # pragma: no cover

    # --------------------------------------------------------------------------------- status

    async def poll_status(self) -> None:
        """Read every node's queue status from the first seed that answers; apply changes (``queued``
        wakes the claim loop) and, with discovery, adopt nodes not yet known."""
        now = now_ms()
        for seed in self.seeds:
            if self._status_muted.get(seed, 0) > now:
                continue
            try:
                resp = await self.client(seed).get("/queue_status", timeout=5.0)
            except httpx.HTTPError:
                continue
            if resp.status_code in (404, 405):
                self._status_muted[seed] = now + 300_000
                continue
            if resp.status_code != 200:
                continue
            try:
                rows = resp.json()
            except ValueError:
                continue
            if isinstance(rows, list):
                self.apply_status(seed, rows)
                return

    def apply_status(self, seed: str, rows: list[Any]) -> None:
        now = now_ms()
        woke = False
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("status"), str):
                continue
            url = row.get("url")
            host = (
                url.rstrip("/") if isinstance(url, str) and url.startswith(("http://", "https://")) else None
            )
            if host is None:
                continue
            if host not in self.health.hosts:
                if not self.discover:
                    continue
                if downgrade(host, seed):
                    self._refuse(host, "node not adopted: an https queue lists it with a plain-http URL",
                                 host=host, queue=seed)
                    continue
                self.health.add(host)
                self.trusted.add(host)
                log.info("queue host discovered", host=host, node=row.get("node"))
            updated = row.get("updatedTime")
            updated = (
                float(updated)
                if isinstance(updated, (int, float)) and not isinstance(updated, bool)
                else None
            )
            key = host
            if updated is not None and self._status_seen.get(key) == updated:
                continue  # already applied: a status is a change, not a heartbeat
            if updated is not None:
                self._status_seen[key] = updated
            woke |= self.health.on_status(host, row["status"], updated, now)
        self.metrics.hosts.set(len(self.health.hosts))
        if woke:
            self.wake()


def cleartext(queues: list[str]) -> list[str]:
    """The queues that would see the credentials in cleartext: plain http to a host off loopback."""
    return [q for q in queues if q.lower().startswith("http:") and not is_loopback(urlsplit(q).hostname)]


def downgrade(origin: str, named_by: str) -> bool:
    """Would the credentials leave TLS: ``origin`` is not https while the queue naming it is?"""
    return named_by.lower().startswith("https:") and not origin.lower().startswith("https:")


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300] if str(e) else type(e).__name__
