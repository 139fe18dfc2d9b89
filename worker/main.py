"""The worker loop: claim from every queue host with the fleet's semantics, render a bounded number
of jobs at once, post each result, and shut down cleanly.

Claim cadence follows the reference fleet (docs/fleet-protocol.md#claim-cadence): a claim asks for
``limit`` (= concurrency) jobs; each job waits for a free render slot, and the next claim goes out
right after the last job of the batch has *started*. A job with under 30 s of lease left when its
turn comes is skipped silently (the server re-grants it when the lease expires).

Shutdown (SIGINT/SIGTERM, or ``stop()``): claiming stops at once and claimed jobs not yet started are
abandoned; renders in flight get ``drain_s`` to finish and post; whatever is still running then is
cancelled without posting (a strike for a page that did nothing wrong would be unfair; its lease
expires and the job is granted again); Chromium is closed, hard-killed if it hangs, and reaped. A
second signal skips the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from prerender_ray import logs
from prerender_ray.rpc import wait_for
from prerender_ray.worker import outcome as oc
from prerender_ray.worker.backoff import HostHealth, Timing
from prerender_ray.worker.blocklist import Blocklist
from prerender_ray.worker.chromium import BrowserError, set_subreaper
from prerender_ray.worker.client import QueueClient, cleartext, now_ms
from prerender_ray.worker.egress import EgressGuard
from prerender_ray.worker.egress import switches as egress_switches
from prerender_ray.worker.metrics import WorkerMetrics
from prerender_ray.worker.options import WorkerOptions
from prerender_ray.worker.pool import BrowserPool
from prerender_ray.worker.render import Renderer, RenderOptions

log = logs.get("worker")

LEASE_MARGIN_MS = 5_000  # a render's budget ends this long before its lease does
BIG_HTML = 256 * 1024  # encode pages larger than this off the event loop


class Worker:
    def __init__(self, opts: WorkerOptions, *, metrics: WorkerMetrics | None = None):
        self.opts = opts
        self.metrics = metrics or WorkerMetrics()
        timing = Timing(
            idle_ms=opts.idle_ms,
            min_ms=opts.min_backoff_ms,
            max_ms=opts.max_backoff_ms,
            paused_ms=opts.paused_ms,
            max_idle_ms=opts.max_idle_ms,
        )
        self.health = HostHealth(timing)
        self._wake = asyncio.Event()
        self.client = QueueClient(
            opts.queues,
            user=opts.user,
            password=opts.password,
            worker_id=opts.worker_id,
            concurrency=opts.concurrency,
            health=self.health,
            claim_timeout_s=opts.claim_timeout_s,
            result_timeout_s=opts.result_timeout_s,
            result_retries=opts.result_retries,
            discover=opts.discover,
            metrics=self.metrics,
            wake=self._wake.set,
        )
        self.rules = oc.UrlRules(
            plus_is_space=opts.plus_is_space,
            trailing_slash=opts.trailing_slash,
            canonical_strict=opts.canonical_strict,
        )
        self.pool: BrowserPool | None = None
        self.egress: EgressGuard | None = None  # --public-only
        self.renderer: Renderer | None = None
        self.slots = asyncio.Semaphore(opts.concurrency)
        self.tasks: set[asyncio.Task] = set()
        self._released: set[asyncio.Task] = set()  # tasks whose render slot is already free (posting)
        self.stopping = False
        self._stopped = asyncio.Event()
        self._hurry = False
        self._last_start = 0.0
        self.ready = asyncio.Event()  # set once Chromium is up and claiming begins

    # --------------------------------------------------------------------------------- control

    def stop(self) -> None:
        """Begin a graceful shutdown; a second call skips the drain."""
        if self.stopping:
            if not self._hurry:
                log.warning("second stop: abandoning renders in flight")
            self._hurry = True
        self.stopping = True
        self._stopped.set()
        self._wake.set()

    async def run(self) -> int:
        """Run until ``stop()``; 0 on a clean stop, 1 when Chromium cannot be started at all."""
        for q in cleartext(self.opts.queues):  # as the node's start-up says of its own plain HTTP
            log.warning("queue over plain HTTP off loopback: the credentials and the pages cross the network "
                        "in cleartext", queue=q, hint="use an https URL (a node with server.tls, or a TLS proxy)")
        try:
            from playwright.async_api import async_playwright
        except ImportError:
            log.error("playwright is not installed: pip install 'prerender-ray[render]'")
            return 1
        if self.opts.subreaper and set_subreaper():
            log.debug("subreaper set: orphaned Chromium processes are reaped here")
        if self.opts.metrics_port is not None:
            self.metrics.serve(self.opts.metrics_port, self.opts.metrics_host)
        pw = await async_playwright().start()
        try:
            extra = self.opts.chromium_args
            if self.opts.public_only:
                self.egress = EgressGuard(self.opts.private_hosts,
                                          on_refused=lambda why: self.metrics.egress_refused.labels(why).inc())
                extra += egress_switches(await self.egress.start())
                log.info("public addresses only: Chromium connects through the egress guard",
                         private_hosts=list(self.opts.private_hosts))
            self.pool = BrowserPool(
                pw,
                self.opts.chromium or "/usr/bin/chromium",
                concurrency=self.opts.concurrency,
                extra_args=extra,
                page_reuse=self.opts.page_reuse,
                recycle_pages=self.opts.recycle_pages,
                recycle_minutes=self.opts.recycle_minutes,
                close_grace_s=self.opts.close_grace_s,
                on_event=self._browser_event,
            )
            self.renderer = Renderer(
                self.pool,
                self.rules,
                RenderOptions(
                    budget_ms=self.opts.render_budget_ms,
                    settle_quiet_ms=self.opts.settle_quiet_ms,
                    max_html_bytes=self.opts.max_html_bytes,
                    bypass_header=self.opts.bypass_header,
                    bypass_token=self.opts.bypass_token,
                    honour_status_meta=self.opts.honour_status_meta,
                    blocklist=Blocklist.of(self.opts.block_hosts, defaults=self.opts.block_defaults),
                ),
            )
            self.pool.setup_tab = self.renderer.setup_tab
            try:
                await self.pool.start()
            except BrowserError as e:
                log.error("cannot start Chromium", error=str(e))
                return 1
            log.info(
                "render worker started",
                queues=self.opts.queues,
                concurrency=self.opts.concurrency,
                worker_id=self.opts.worker_id,
                metrics_port=self.opts.metrics_port,
            )
            self.ready.set()
            loops = [
                asyncio.create_task(c, name=n)
                for n, c in (
                    ("claim", self._claim_loop()),
                    ("status", self._status_loop()),
                    ("stats", self._stats_loop()),
                    ("reap", self._reap_loop()),
                    ("parent", self._parent_loop()),
                )
            ]
            await self._stopped.wait()
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._drain()
            return 0
        finally:
            if self.pool is not None:
                await self.pool.close()
            if self.egress is not None:
                await self.egress.close()
            await self.client.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pw.stop(), 10)
            self._log_stats(final=True)
            log.info("render worker stopped")

    async def _drain(self) -> None:
        if self.tasks:
            log.info("draining renders in flight", renders=len(self.tasks), deadline_s=self.opts.drain_s)
            deadline = time.monotonic() + self.opts.drain_s
            while self.tasks and not self._hurry and time.monotonic() < deadline:
                await asyncio.wait(set(self.tasks), timeout=min(0.2, max(0.0, deadline - time.monotonic())))
        if self.tasks:
            log.warning("abandoning renders in flight", renders=len(self.tasks))
            self.metrics.count("abandoned", len(self.tasks))
            self.metrics.skipped.labels("shutdown").inc(len(self.tasks))
            for t in list(self.tasks):
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _browser_event(self, event: str) -> None:
        self.metrics.browser_events.labels(event).inc()
        self.metrics.count(f"browser-{event}")

    # ---------------------------------------------------------------------------------- claims

    async def _claim_loop(self) -> None:
        while not self.stopping:
            try:
                now = now_ms()
                host = self.health.pick(now)
                if host is None:
                    self._wake.clear()
                    wait_s = max(0.01, self.health.wait_ms(now) / 1000)
                    with contextlib.suppress(TimeoutError):
                        await wait_for(self._wake.wait(), wait_s)  # a cancel as it wakes ends the loop
                    continue
                blocked_s = self.pool.unavailable_s() if self.pool is not None else 0.0
                if blocked_s > 0:  # Chromium will not start: claiming would only fail jobs
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await wait_for(self._wake.wait(), blocked_s)
                    continue
                if self.pool is not None and self.pool.needs_launch():
                    try:  # (re)launch before claiming, so a browser that cannot start costs no job
                        await self.pool.start()
                    except BrowserError:
                        continue
                result = await self.client.claim(host, self.opts.limit)
                for i, job in enumerate(result.jobs):
                    if self.stopping:
                        self.metrics.skipped.labels("shutdown").inc(len(result.jobs) - i)
                        break
                    await self._start(job)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the loop survives its own exceptions
                log.error("claim loop error", error=repr(e))
                await asyncio.sleep(1.0)

    async def _start(self, job: oc.Job) -> None:
        await self.slots.acquire()
        started = False
        try:
            if self.stopping:
                self.metrics.skipped.labels("shutdown").inc()
                return
            left = job.lease_left_ms(now_ms())
            if left < self.opts.min_lease_left_ms:
                log.info("job skipped: lease nearly over", key=job.id, lease_left_ms=round(left))
                self.metrics.skipped.labels("lease").inc()
                self.metrics.count("skipped")
                return
            if self.opts.max_rps > 0:
                gap = 1 / self.opts.max_rps - (time.monotonic() - self._last_start)
                if gap > 0:
                    await asyncio.sleep(gap)
            self._last_start = time.monotonic()
            task = asyncio.get_running_loop().create_task(self._job(job), name=f"render {job.id}")
            self.tasks.add(task)
            self.metrics.in_flight.inc()
            started = True
            task.add_done_callback(self._job_done)
        finally:
            if not started:
                self.slots.release()

    def _job_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if task not in self._released:
            self.slots.release()
        self._released.discard(task)
        self.metrics.in_flight.dec()
        if not task.cancelled() and task.exception() is not None:
            log.error("render task failed", error=repr(task.exception()))

    # ------------------------------------------------------------------------------- rendering

    async def _job(self, job: oc.Job) -> None:
        assert self.renderer is not None
        budget = job.render_budget_ms or self.opts.render_budget_ms
        left = job.lease_left_ms(now_ms()) - LEASE_MARGIN_MS
        rendered = await self.renderer.render(job, budget_ms=max(1000.0, min(budget, left)))
        task = asyncio.current_task()
        if task is not None and task not in self._released:  # the page is done: the next job may start
            self._released.add(task)
            self.slots.release()
        await self.deliver(job, rendered.verdict, rendered.html, rendered.render_ms, rendered.summary,
                           rendered.report)

    async def deliver(self, job: oc.Job, verdict: oc.Verdict, html: str | None, render_ms: float,
                      summary: dict[str, int] | None = None, report: dict | None = None) -> str:
        """Encode and post one result with its ``renderSummary`` (and the job's diagnostics report);
        a 413 turns into an error result without content (and without the report)."""
        encoding = self.opts.content_encoding if html else None
        content = None
        if html and encoding:
            if len(html) > BIG_HTML:
                content = await asyncio.to_thread(oc.encode_html, html, encoding)
            else:
                content = oc.encode_html(html, encoding)
        meta = oc.build_metadata(job, verdict, render_ms, encoding, summary, report)
        body, headers = oc.result_body(meta, content)
        result = await self.client.post_result(job, body, headers)
        if result == "too-large":
            verdict = oc.error_verdict(
                "ContentTooLarge",
                f"the encoded page ({len(content or b'')} bytes) is larger than the server accepts",
            )
            meta = oc.build_metadata(job, verdict, render_ms, None, summary)
            body, headers = oc.result_body(meta, None)
            result = await self.client.post_result(job, body, headers)
        self.metrics.results.labels(result).inc()
        self.metrics.rendered(meta["outcome"], meta.get("reason"), render_ms)
        if result != "delivered":
            self.metrics.count(f"result-{result}")
        blocked = (summary or {}).get("blocked", 0)
        if blocked:
            self.metrics.count("blocked-requests", blocked)
            self.metrics.blocked.inc(blocked)
        log.debug(
            "job done",
            key=job.id,
            outcome=meta["outcome"],
            reason=meta.get("reason"),
            render_ms=meta["renderTime"],
            result=result,
            blocked=blocked,
        )
        return result

    # ------------------------------------------------------------------------------ side loops

    async def _status_loop(self) -> None:
        if self.opts.status_interval_s <= 0:
            return
        while not self.stopping:
            try:
                await self.client.poll_status()
            except Exception as e:
                log.warning("queue status poll failed", error=repr(e))
            await asyncio.sleep(self.opts.status_interval_s)

    async def _stats_loop(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.opts.stats_interval_s)
            self._log_stats()

    def _log_stats(self, final: bool = False) -> None:
        now = now_ms()
        open_circuits = sum(1 for s in self.health.hosts.values() if s.circuit_until > now)
        self.metrics.circuits.set(open_circuits)
        self.metrics.hosts.set(len(self.health.hosts))
        chromium = self.pool.current if self.pool else None
        fields: dict[str, Any] = self.metrics.take_window() if not final else dict(self.metrics.total)
        log.info(
            "worker stats" if not final else "worker totals",
            **fields,
            in_flight=len(self.tasks),
            hosts=len(self.health.hosts),
            open_circuits=open_circuits,
            chromium_pid=chromium.pid if chromium else None,
            chromium_renders=chromium.renders if chromium else None,
        )

    async def _reap_loop(self) -> None:
        while not self.stopping:
            await asyncio.sleep(5.0)
            if self.pool is not None:
                self.pool.reap()

    async def _parent_loop(self) -> None:
        if not self.opts.exit_with_parent:
            return
        parent = os.getppid()
        while not self.stopping:
            await asyncio.sleep(1.0)
            if os.getppid() != parent:
                log.warning("parent process exited; stopping")
                self.stop()


async def run_worker(opts: WorkerOptions) -> int:
    """Run a worker in this process until SIGINT/SIGTERM."""
    worker = Worker(opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, worker.stop)
    try:
        return await worker.run()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(args: Any) -> int:
    """``prerender-ray render``: ``args`` from ``options.add_arguments``."""
    import sys

    from prerender_ray.worker.options import from_args

    try:
        opts = from_args(args)
    except ValueError as e:
        print(f"prerender-ray render: {e}", file=sys.stderr)
        return 2
    logs.setup(level=args.log_level, process="render-worker")
    return asyncio.run(run_worker(opts))
