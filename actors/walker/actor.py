"""SitemapWalker: one per node; runs sitemap walks in the background and records their progress.

A walk runs as a task of the walker of the node that was asked (walker/walk.py does the walking).
Its progress row ``r:<root>`` (state, node, runId, counts, updatedAt after every document) is written
through the node store, so it is replicated and readable on any node. The claim on a root is
advisory, as in the reference: a running row younger than ``sitemap.staleRunMs`` refuses a second
walk; an older one is taken over, and the walk whose row was taken stops at its next document.
Ray restarts a dead walker (max_restarts=-1): at start it resumes every run whose row still says
running on this node (only one walker per node exists, so such a run is dead), refresh-all jobs
included (their row ``r:all`` keeps the roots left). The daily refresh is a timer in the walker of
``sitemap.node``, and so is robots.txt discovery (walker/robots.py) when it is on. Deleting a
sitemap cascades to its descendants, their targets, rows and pages (walker/cascade.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import ray

from prerender_ray import logs, metrics
from prerender_ray.actors.common import (
    Handles,
    bulk_gc,
    controller_membership,
    follow_overrides,
    read_overrides,
    untraced,
)
from prerender_ray.actors.keeper.client import KeeperClient
from prerender_ray.actors.store.actor import StoreClient
from prerender_ray.actors.store.everywhere import urls_of_sitemap
from prerender_ray.actors.walker.cascade import Cascade
from prerender_ray.actors.walker.fetch import Fetcher
from prerender_ray.actors.walker.robots import Discovery
from prerender_ray.actors.walker.walk import (
    STORE_DEADLINE_S,
    Walk,
    WalkAborted,
    WalkEnv,
)
from prerender_ray.compiled import CompiledConfig
from prerender_ray.config.model import Config
from prerender_ray.config.overrides import LiveConfig
from prerender_ray.identity.membership import Membership, MembershipView
from prerender_ray.identity.nodes import NodeInfo, Ownership
from prerender_ray.sitemaps.refresh import (
    ClaimCheck,
    check_refresh_claim,
    daily_refresh_key,
    next_daily_refresh,
)
from prerender_ray.sitemaps.robots import configured_origins
from prerender_ray.sitemaps.rules import canonicalizer, describe_error
from prerender_ray.storage.keys import SITEMAP, SITEMAP_RUN
from prerender_ray.storage.registry import (
    RecordError,
    decode_json,
    encode_json,
    sitemap_run_key,
)
from prerender_ray.timeutil import now_ms

ALL = "all"  # the refresh-all job's row: r:all (a root URL always has a scheme, so never "all")
SCAN_PAGE = 1000


@dataclass
class Run:
    root: str
    walk: Walk
    run_id: str
    trigger: str
    started_at: int = field(default_factory=now_ms)
    task: asyncio.Task | None = None
    taken_over_from: str | None = None
    cancel_reason: str | None = None


class SitemapWalker:
    """The shell, plain: ``SitemapWalkerActor`` is what Ray places. ``fetch_membership`` answers for
    the controller (``controller_membership``), ``lookup`` finds other nodes' keepers and stores (Ray's
    named actors unless given); the LocalNode and LocalCluster harnesses pass their own."""

    def __init__(self, config: dict, node: dict, data_dir: str, store: Any, keeper: Any,
                 fetch_membership: Any = controller_membership, lookup: Any = None):
        untraced(self)
        self._fetch_membership = fetch_membership
        bulk_gc()
        cfg = Config.model_validate(config)
        self.cfg = cfg
        self.info = NodeInfo(**node)
        self.node = self.info.name
        logs.setup(self.node, level=cfg.logging.level, json_lines=cfg.logging.json_lines,
                   process="sitemapper")
        self.log = logs.get("sitemaps")
        self.store = StoreClient(store, STORE_DEADLINE_S)
        self.keepers = Handles("keeper", own=(self.node, KeeperClient(keeper)), wrap=KeeperClient, lookup=lookup)
        self.stores = Handles("store", own=(self.node, self.store), wrap=_store_client, lookup=lookup)
        self.ownership = Ownership([self.node])  # the walks' router: follows ``view``
        self.view = MembershipView.alone(self.info)
        self.view.listen(self._changed)
        classify = CompiledConfig(cfg).router.classify
        self.fetcher = Fetcher(cfg, classify, canonicalizer(cfg))
        self.env = WalkEnv(cfg, self.node, self.store, self.ownership.owner, self.keepers.get, self.fetcher,
                           classify, self.log, self._sole_owner, self.sitemap_urls)
        self.runs: dict[str, Run] = {}
        self.all_task: asyncio.Task | None = None
        self.next_daily: int | None = None
        loop = asyncio.get_running_loop()
        self.live = LiveConfig(cfg)  # the file's config, and live overrides on top of it
        self.robots = Discovery(self)
        self.cascade = Cascade(self)
        self._tasks = [loop.create_task(self._startup()), loop.create_task(self._daily()),
                       loop.create_task(self._overrides_syncer()), loop.create_task(self.robots.daily())]

    # ----------------------------------------------------------------------------- live config

    async def apply_overrides(self, raw: bytes | None) -> bool:
        """New walks classify and key entries with the live routes (walks running keep theirs)."""
        cfg = self.live.changed(raw, self.log)
        if cfg is None:
            return False
        classify = CompiledConfig(cfg).router.classify
        self.cfg = cfg
        self.fetcher.cfg, self.fetcher.classify, self.fetcher.canonicalize = cfg, classify, canonicalizer(cfg)
        self.env = dataclasses.replace(self.env, cfg=cfg, classify=classify)
        self.log.info("live config applied", overrides=self.live.names())
        return True

    async def _overrides_syncer(self) -> None:
        await read_overrides(self.store, self.apply_overrides, self.log)
        await follow_overrides(self.store, self.apply_overrides, self.log)

    # --------------------------------------------------------------------------------- cluster

    def _sole_owner(self) -> str | None:
        """A single node owns every URL: a walk's batch needs no grouping by owner."""
        names = self.ownership.names
        return names[0] if len(names) == 1 else None

    async def set_membership(self, wire: dict) -> dict:
        """A push from the controller (``Membership.to_wire``): applied if its epoch is newer."""
        changed = self.view.offer(Membership.from_wire(wire))
        await self.keepers.renew(list(self.ownership.names))
        await self.stores.renew(list(self.ownership.names))
        return {"changed": changed, "epoch": self.view.epoch}

    def _changed(self, before: Membership, after: Membership) -> None:
        self.ownership.update(list(after.names))
        self.log.info("membership", epoch=after.epoch, nodes=list(after.names))

    async def sitemap_urls(self, sitemap: str, limit: int) -> tuple[list[str], int]:
        """The targets attributed to ``sitemap`` across the cluster (``actors/store/everywhere.py``)."""
        return await urls_of_sitemap(sitemap, limit, node=self.node, names=self.ownership.names,
                                     replicas=self.cfg.cluster.replicas, local=self.store, store_of=self.stores.get,
                                     deadline_s=STORE_DEADLINE_S)

    async def _startup(self) -> None:
        """Learn the membership (a restarted walker missed the pushes), then resume dead runs."""
        try:
            self.view.offer(await self._fetch_membership())
        except Exception as e:
            self.log.warning("membership unknown at start; this node only until the controller pushes it",
                             error=repr(e))
        for attempt in range(30):
            try:
                await self._resume()
                return
            except Exception as e:  # the store may still be starting
                if attempt == 29:
                    metrics.loop_errors.labels("sitemap-resume").inc()
                    self.log.error("could not resume sitemap walks", error=repr(e))
                await asyncio.sleep(1)

    async def _resume(self) -> None:
        mine: dict[str, dict] = {}
        for k, v in await self._scan(SITEMAP_RUN):
            try:
                row = decode_json(v)
            except RecordError:
                continue
            if row.get("state") == "running" and row.get("node") == self.node:
                mine[k[len(SITEMAP_RUN):].decode()] = row
        job = mine.pop(ALL, None)
        left: list[str] = []
        if job is not None:
            roots = [r for r in job.get("roots") or [] if isinstance(r, str)]
            got = job.get("done")
            done = got if isinstance(got, int) else 0
            left = roots[done:]
            self.log.warning("resuming a refresh-all after a restart", roots=len(left))
            self.all_task = asyncio.get_running_loop().create_task(
                self._run_all(left, bool(job.get("revalidate")), str(job.get("trigger") or "resumed"),
                              done=done, total=roots))
        for root, row in mine.items():
            if root in left or root in self.runs:
                continue
            self.log.warning("resuming a sitemap walk after a restart", root=root)
            note = f"Resuming the refresh of {root} after a restart of this walker"
            await self._launch(root, bool(row.get("revalidate")), "resumed", ClaimCheck(True, warning=note))

    # ------------------------------------------------------------------------------------ runs

    async def _claim(self, root: str) -> ClaimCheck:
        run = self.runs.get(root)
        if run is not None:
            ago = max(0, round((now_ms() - run.started_at) / 1000))
            reason = f"a refresh on {self.node} is already running (started {ago}s ago)"
            return ClaimCheck(False, reason=reason)
        try:
            [raw] = await self.store.get([sitemap_run_key(root)])
            row: Any = decode_json(raw) if raw else None
        except Exception as e:  # a guard that cannot read must not block the work
            row = e
        if isinstance(row, dict) and row.get("state") == "running" and row.get("node") == self.node:
            # Only this walker runs walks on this node, and it has no task for the root: it died.
            return ClaimCheck(True, warning=f"Taking over the refresh of {root} left by a restart of "
                                            "this walker")
        return check_refresh_claim(root, row, now_ms=now_ms(), stale_run_ms=self.cfg.sitemap.stale_run_ms)

    async def _launch(self, root: str, revalidate: bool, trigger: str, check: ClaimCheck) -> Run:
        run = Run(root, Walk(self.env, root, revalidate=revalidate, progress=self._progress),
                  run_id=secrets.token_hex(8), trigger=trigger)
        if check.warning:  # a takeover (or an unreadable row): the row says which
            self.log.warning(check.warning, root=root)
            run.taken_over_from = check.warning
        self.runs[root] = run
        try:
            await self._write(run, "running")
        except Exception:
            self.runs.pop(root, None)
            raise
        run.task = asyncio.get_running_loop().create_task(self._run(run))
        return run

    async def _run(self, run: Run) -> dict:
        metrics.sitemap_walks_running.inc()
        try:
            result = await run.walk.run()
        except WalkAborted as e:
            metrics.sitemap_walks.labels("aborted").inc()
            self.log.warning("sitemap walk stopped", root=run.root, reason=str(e))
            return {"url": run.root, "state": "aborted", "error": str(e), **run.walk.result.as_dict()}
        except asyncio.CancelledError:
            if run.cancel_reason:  # deleted: say so; on shutdown the row stays running, to be resumed
                await self._quiet_write(run, "failed", error=run.cancel_reason, finishedAt=now_ms())
            raise
        except Exception as e:
            metrics.sitemap_walks.labels("failed").inc()
            error = describe_error(e)
            self.log.error("sitemap walk failed", root=run.root, error=error)
            await self._quiet_write(run, "failed", error=error, finishedAt=now_ms())
            return {"url": run.root, "state": "failed", "error": error, **run.walk.result.as_dict()}
        finally:
            metrics.sitemap_walks_running.dec()
            if self.runs.get(run.root) is run:
                del self.runs[run.root]
        done = now_ms()
        await self._quiet_write(run, "completed", finishedAt=done, lastRefreshed=done)
        metrics.sitemap_walks.labels("completed").inc()
        doc = result.as_dict()
        self.log.info("sitemap walk completed", root=run.root, ms=done - run.started_at,
                      **{k: doc[k] for k in ("sitemapsProcessed", "created", "updated", "skipped",
                                             "duplicates", "removed", "deferred", "invalid")},
                      failed=len(doc["failed"]))
        return {"url": run.root, "state": "completed", **doc}

    def _row(self, run: Run, state: str, **extra: Any) -> bytes:
        row = {"root": run.root, "state": state, "node": self.node, "runId": run.run_id,
               "trigger": run.trigger, "revalidate": run.walk.revalidate, "startedAt": run.started_at,
               "updatedAt": now_ms(),
               "current": run.walk.current, "takenOverFrom": run.taken_over_from,
               **run.walk.result.as_dict(), **extra}
        return encode_json(row)

    async def _write(self, run: Run, state: str, **extra: Any) -> None:
        await self.store.apply([(sitemap_run_key(run.root), self._row(run, state, **extra))])

    async def _quiet_write(self, run: Run, state: str, **extra: Any) -> None:
        try:
            await self._write(run, state, **extra)
        except Exception as e:
            self.log.warning("sitemap progress write failed", root=run.root, error=repr(e))

    async def _progress(self, walk: Walk) -> None:
        """After each document: stop if another walker took the run over, else bump the row."""
        run = self.runs.get(walk.root)
        if run is None or run.walk is not walk:
            raise WalkAborted("the run is no longer registered")
        try:
            [raw] = await self.store.get([sitemap_run_key(walk.root)])
            row = decode_json(raw) if raw else {}
        except Exception:
            row = {}
        if row.get("runId") not in (None, run.run_id):
            raise WalkAborted(f"taken over by a walk on {row.get('node') or 'another node'}")
        await self._quiet_write(run, "running")

    # ---------------------------------------------------------------------------------- refresh

    async def start(self, url: str, revalidate: bool = False) -> dict:
        """Background walk of one root: the claim is taken before answering."""
        check = await self._claim(url)
        if not check.allowed:
            metrics.sitemap_walks.labels("refused").inc()
            return {"url": url, "started": False, "reason": check.reason}
        await self._launch(url, revalidate, "manual", check)
        return {"url": url, "started": True}

    async def refresh(self, url: str, revalidate: bool = False) -> dict:
        """Blocking walk of one root: the result document (a refused claim is answered, not waited)."""
        check = await self._claim(url)
        if not check.allowed:
            metrics.sitemap_walks.labels("refused").inc()
            return {"url": url, "state": "refused", "started": False, "reason": check.reason}
        run = await self._launch(url, revalidate, "manual", check)
        assert run.task is not None
        return await asyncio.shield(run.task)

    async def start_all(self, revalidate: bool = False) -> dict:
        """Refresh-all in the background: roots only; one root is claimed now, several sequentially."""
        roots = await self._roots()
        if len(roots) == 1:
            return {"sitemaps": [await self.start(roots[0], revalidate)]}
        if roots:
            if self.all_task is not None and not self.all_task.done():
                reason = f"a refresh-all is already running on {self.node}"
                return {"sitemaps": [{"url": r, "started": False, "reason": reason} for r in roots]}
            self.all_task = asyncio.get_running_loop().create_task(self._run_all(roots, revalidate, "manual"))
        return {"sitemaps": [{"url": r, "started": True} for r in roots]}

    async def refresh_all(self, revalidate: bool = False) -> list[dict]:
        out = []
        for root in await self._roots():
            out.append(await self.refresh(root, revalidate))
        return out

    async def _run_all(self, roots: list[str], revalidate: bool, trigger: str, *, done: int = 0,
                       total: list[str] | None = None) -> None:
        """Roots one after another, each claimed just in time (a refused one is skipped)."""
        everything = total or roots
        started = now_ms()

        async def mark(state: str, n: int, **extra: Any) -> None:
            row = {"state": state, "node": self.node, "trigger": trigger, "revalidate": revalidate,
                   "roots": everything, "done": n, "startedAt": started, "updatedAt": now_ms(), **extra}
            try:
                await self.store.apply([(sitemap_run_key(ALL), encode_json(row))])
            except Exception as e:
                self.log.warning("refresh-all row write failed", error=repr(e))

        await mark("running", done)
        for i, root in enumerate(roots, start=done + 1):
            try:
                check = await self._claim(root)
                if not check.allowed:
                    self.log.info("refresh-all skips a root", root=root, reason=check.reason)
                else:
                    run = await self._launch(root, revalidate, trigger, check)
                    await asyncio.shield(run.task)  # type: ignore[arg-type]
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.log.error("refresh-all root failed", root=root, error=describe_error(e))
            await mark("running", i)
        finished = now_ms()
        await mark("completed", len(everything), finishedAt=finished, lastRefreshed=finished)

    async def _daily(self) -> None:
        """The daily refresh of every root, on the node named by sitemap.node only."""
        sm = self.cfg.sitemap
        if daily_refresh_key(sm, self.node) is None:
            return
        self.log.info("daily sitemap refresh armed", at=sm.refresh_time, timezone=sm.timezone)
        while True:
            try:
                self.next_daily = fire = next_daily_refresh(sm.refresh_time, sm.timezone, now_ms())
                while (left := fire - now_ms()) > 0:
                    await asyncio.sleep(min(left / 1000, 60))  # short naps follow wall-clock jumps
                if self.all_task is not None and not self.all_task.done():
                    self.log.info("daily sitemap refresh skipped: a refresh-all is running")
                    continue
                self.all_task = asyncio.get_running_loop().create_task(
                    self._run_all(await self._roots(), False, "daily"))
                await asyncio.shield(self.all_task)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                metrics.loop_errors.labels("sitemap-daily").inc()
                self.log.error("daily sitemap refresh failed", error=repr(e))
                await asyncio.sleep(60)

    # ------------------------------------------------------------------------------ robots.txt

    async def discover_robots(self, origins: list[str] | None = None, refresh: bool = False,
                              walk: bool = True) -> dict:
        """robots.txt of each origin (None: every ``domains`` entry), its sitemaps queued for walks."""
        if origins is None:
            origins = configured_origins(self.cfg.domains, self.cfg.ingress.default_protocol)
        return {"node": self.node, "domains": await self.robots.discover(origins, refresh, walk)}

    # ----------------------------------------------------------------------------------- reads

    async def _scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        start: bytes | None = None
        while True:
            page = await self.store.scan(prefix, start, SCAN_PAGE)
            out += page
            if len(page) < SCAN_PAGE:
                return out
            start = page[-1][0] + b"\x00"

    async def _sitemaps(self) -> dict[str, dict]:
        rows = {}
        for k, v in await self._scan(SITEMAP):
            try:
                rows[k[len(SITEMAP):].decode()] = decode_json(v)
            except (RecordError, UnicodeDecodeError):
                continue
        return rows

    async def _roots(self) -> list[str]:
        """Rows with no parentUrl (rows from before parentUrl existed count as roots)."""
        return sorted(url for url, row in (await self._sitemaps()).items() if not row.get("parentUrl"))

    # ---------------------------------------------------------------------------------- delete

    async def delete(self, url: str) -> dict:
        """The cascade (``Cascade.delete``, walker/cascade.py)."""
        return await self.cascade.delete(url)

    # ---------------------------------------------------------------------------------- status

    async def status(self) -> dict:
        return {"live": True, "pid": os.getpid(), "node": self.node,
                "running": [{"root": r.root, "runId": r.run_id, "current": r.walk.current,
                             "startedAt": r.started_at} for r in self.runs.values()],
                "refreshAllRunning": self.all_task is not None and not self.all_task.done(),
                "nextDailyRefresh": self.next_daily}

    async def close(self) -> None:
        """Stop walks without marking them: their rows stay running and the next start resumes them."""
        tasks = [*self._tasks, *self.robots.close(),
                 *(r.task for r in self.runs.values() if r.task is not None)]
        if self.all_task is not None:
            tasks.append(self.all_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.fetcher.aclose()


def _store_client(handle: Any) -> StoreClient:
    return StoreClient(handle, STORE_DEADLINE_S)


SitemapWalkerActor = ray.remote(SitemapWalker)
