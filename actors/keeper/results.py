"""The keeper's result apply: one posted render result, at most once per grant.

The plan (what the result does to targets, pages and schedule rows) is pure
(``prerender_ray.queue.results``); this part checks the grant, reads the rows the plan needs, writes
what it says (rows of keys another node owns go to that node's keeper) and releases the lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prerender_ray import metrics
from prerender_ray.actors.keeper.claims import Claims
from prerender_ray.actors.keeper.rows import CurrentConfig, Rows
from prerender_ray.actors.keeper.targets import Targets
from prerender_ray.batching import GroupCommit
from prerender_ray.identity.membership import MembershipView, StaleEpoch, never_moved, unchecked
from prerender_ray.queue import diagnostics
from prerender_ray.queue.metadata import Result, resolve_outcome
from prerender_ray.queue.results import Plan
from prerender_ray.queue.schedule import ScheduleRow
from prerender_ray.rpc import KeeperApi, LeaseApi, Peers, StoreApi
from prerender_ray.serving.framing import encode_page
from prerender_ray.sitemaps.rules import sample_text
from prerender_ray.storage import history
from prerender_ray.storage.registry import Target, target_key
from prerender_ray.storage.touches import touch_key


class ResultBusy(RuntimeError):
    """Not applied and not acknowledged: the fleet's retry comes back later (503)."""


RESULT_BATCH = 64  # results applied in one group at most (bytes are bounded by the ingress's batches)
# Under load, a group waits this long for more results before it is applied: a group costs four actor
# calls whatever it holds. bench_results at 32 connections, interleaved runs: 4-4.3 results a group and
# 3.9-5.3 ms of CPU a result without it; 13-14 and 1.8-2.0 ms at 20 ms (8-9 and 2.4-2.9 at 10, 15 and
# 2.1-2.4 at 40), and the most results a second. Bot hits beside it (bench_serving row (f), with a
# feeder that does not take the service's cores) kept their tail: p99 13.6-16.9 ms against 11.2-21.7.
# A render takes seconds; its 204 comes later under load (a post's p50 185-200 ms against 106-145).
RESULT_LINGER_S = 0.020
RELEASE_GRACE_MS = 5_000  # a released key is not offered again at once (the lease table's grace)


class Results:
    def __init__(self, rows: Rows, claims: Claims, targets: Targets, conf: CurrentConfig, leases: LeaseApi,
                 store: StoreApi, peers: Peers, view: MembershipView, node: str, log: Any):
        self.rows = rows
        self.claims = claims
        self.targets = targets
        self.conf = conf
        self.leases = leases
        self.store = store
        self.peers = peers
        self.view = view
        self.node = node
        self.log = log
        # the membership protocol (Handoff.accept / fetch_membership), wired by the keeper
        self.accept: Callable[[int, str], Awaitable[None]] = unchecked
        self.moved_past: Callable[[int], Awaitable[bool]] = never_moved
        self.on_result: Callable[[str], None] = lambda url: None  # a URL had a result (discovery's count)
        # a URL's stored content changed, and whether only a bot's miss made its target (IndexNow)
        self.on_changed: Callable[[str, bool], None] = lambda url, discovered: None
        self._batch: GroupCommit[tuple[Result, dict, str | None], Any] = GroupCommit(
            self._flush, max_batch=RESULT_BATCH, linger_s=RESULT_LINGER_S)

    async def _keeper_of(self, url: str) -> KeeperApi | None:
        owner = self.view.current.owner(url)
        return None if owner == self.node else await self.peers.of(owner)

    async def process(self, meta: dict, content: bytes | None, forwarded: bool = False,
                      worker: str | None = None, epoch: int | None = None) -> dict:
        """Apply one render result, at most once per grant (see ``process_many``). Raises on failure:
        the lease is then held and the grant stays open for the fleet's retry."""
        [answer] = await self.process_many([(meta, content, worker)], forwarded, epoch)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def process_many(self, items: list[tuple[dict, bytes | None, str | None]],
                           forwarded: bool = False, epoch: int | None = None) -> list[dict | BaseException]:
        """Apply render results ([meta, content, worker] each), each at most once per grant; one
        answer per item, in order: its outcome, or the exception that failed it (its lease is then
        held, its grant open for the fleet's retry).

        Results that arrive together (from every replica, while the last batch was applied) share
        one call to the lease table to begin them, one store read, one store write and one call to
        finish them (``GroupCommit``): a result costs a fraction of an actor hop under load, where it
        cost five. The lease table checks and marks each key's latest grant first: a second result
        for an answered grant (a replay, or a retry after a lost 204) and a result from another worker
        than the latest grant's (the key was re-granted: the late result of a previous holder) are
        acknowledged and change nothing, neither the new lease nor the schedule, strikes or page."""
        if forwarded and epoch is not None:  # a forwarder on an older membership is refused, not obeyed
            await self.accept(epoch, "process_result")
        answers: list[Any] = [None] * len(items)
        local: list[tuple[int, Result, dict, str | None]] = []
        forwards = []
        m = self.view.current
        for i, (meta, content, worker) in enumerate(items):
            try:
                r = Result.parse(meta, content)
                owner = None if forwarded else await self._keeper_of(self.conf.rules.url_of(r.id))
            except Exception as e:
                answers[i] = e
                continue
            if owner is not None:  # the sender's membership view lagged ours: the owner decides (one hop)
                forwards.append((i, self._forward(owner, meta, content, worker, m.epoch)))
            else:
                local.append((i, r, meta, worker))
        done = await asyncio.gather(*(self._batch.submit(item[1:]) for item in local),
                                    *(call for _, call in forwards), return_exceptions=True)
        for i, answer in zip([item[0] for item in local] + [i for i, _ in forwards], done):
            answers[i] = answer
        return answers

    async def _forward(self, owner: KeeperApi, meta: dict, content: bytes | None, worker: str | None,
                       epoch: int) -> dict:
        """A result for a key another node owns, under our ``epoch``; refused as stale, our view is
        refreshed and the result routed again (here, or to the owner the newer membership names)."""
        try:
            return await owner.process_result(meta, content, True, worker, epoch)
        except StaleEpoch:
            if not await self.moved_past(epoch):
                raise
            return await self.process(meta, content, False, worker)

    async def _flush(self, batch: list[tuple[Result, dict, str | None]]) -> list[Any]:
        """One group of results: begun together, then applied in waves of results that share no
        URL (two results for one target, its desktop and mobile page say, must not both plan from
        one read of it), each wave one store read and one store write, finished together."""
        answers: list[Any] = [None] * len(batch)
        metrics.result_group_size.observe(len(batch))
        checks = await self.leases.begin_results([[r.id, worker] for r, _, worker in batch])
        admitted: list[tuple[int, int]] = []
        for i, ((r, _, worker), (verdict, granted_at)) in enumerate(zip(batch, checks)):
            if verdict == "unknown":
                answers[i] = {"refused": f"no lease was granted for {r.id!r}"}
            elif verdict == "answering":  # a replay racing the first: it may yet fail, so not acknowledged
                answers[i] = ResultBusy(f"a result for {r.id!r} is being applied; ask again")
            elif verdict == "moved":  # its key went to another node with the grant: answered there
                answers[i] = ResultBusy(f"the grant of {r.id!r} was handed to its new owner; ask again")
            elif verdict != "apply":
                metrics.results_ignored.labels(verdict).inc()
                self.log.info("render result ignored", key=r.id, why=verdict, worker=worker)
                answers[i] = {"ignored": verdict}
            else:
                admitted.append((i, granted_at))
        finished: list[tuple[int, int, Plan]] = []
        try:
            waves = self._waves(batch, admitted)
        except Exception as e:  # nothing applied: every admitted grant reopens
            waves = []
            await self.leases.abandon_results([[batch[i][0].id, granted_at] for i, granted_at in admitted])
            for i, _ in admitted:
                answers[i] = e
        for wave in waves:
            now = self.rows.clock.now_ms()
            try:
                plans = await self._plan_wave([(batch[i][0], granted_at, dest) for i, granted_at, dest in wave],
                                              now)
                await self.apply_many([(plan, self._history(batch[i][0], plan, batch[i][1], batch[i][2], now))
                                       for (i, _, _), plan in zip(wave, plans)])
            except Exception as e:
                try:
                    await self.leases.abandon_results([[batch[i][0].id, granted_at] for i, granted_at, _ in wave])
                except Exception as e2:
                    self.log.warning("could not reopen the grants of failed results", error=repr(e2),
                                     keys=[batch[i][0].id for i, _, _ in wave][:10])
                for i, _, _ in wave:
                    answers[i] = e
                continue
            finished += [(i, granted_at, plan) for (i, granted_at, _), plan in zip(wave, plans)]
        if finished:
            try:
                await self.leases.finish_results([[batch[i][0].id, not plan.release, granted_at]
                                                  for i, granted_at, plan in finished])
            except Exception as e:  # applied, not acknowledged: a retry gets 503 (its grant stays marked
                # as being answered) until the lease runs out and the key is rendered afresh
                for i, _, _ in finished:
                    answers[i] = e
                return answers
        now = self.rows.clock.now_ms()
        for i, _, plan in finished:
            answers[i] = await self._after(batch[i][0], plan, batch[i][2], now)
        return answers

    def _waves(self, batch: list[tuple[Result, dict, str | None]],
               admitted: list[tuple[int, int]]) -> list[list[tuple[int, int, str | None]]]:
        """[index, granted_at, redirect destination key] per admitted result, in waves."""
        rules, planner = self.conf.rules, self.conf.planner
        waves: list[tuple[set[str], list[tuple[int, int, str | None]]]] = []
        for i, granted_at in admitted:
            r = batch[i][0]
            dest = planner.destination(r)
            urls = {rules.url_of(r.id)} | ({rules.url_of(dest)} if dest else set())
            wave = next((w for w in waves if not w[0] & urls), None)
            if wave is None:
                waves.append(wave := (set(), []))
            wave[0].update(urls)
            wave[1].append((i, granted_at, dest))
        return [w for _, w in waves]

    async def _plan_wave(self, wave: list[tuple[Result, int, str | None]], now: int) -> list[Plan]:
        """Each result's plan ([result, granted_at, destination] each), from one read of the targets
        and stored pages they all need."""
        rules, planner = self.conf.rules, self.conf.planner
        urls, keys = [], []
        for r, _, dest in wave:
            urls += [rules.url_of(r.id)] + ([rules.url_of(dest)] if dest else [])
            if r.content:  # the stored page: an identical render keeps its validators, touches its times
                keys.append(r.id)
        targets, stored = await self.store.targets_and_metas(urls, keys)
        found, metas = dict(zip(urls, targets)), dict(zip(keys, stored))
        plans = []
        for r, granted_at, dest in wave:
            url = rules.url_of(r.id)
            target = Target.decode(url, b) if (b := found.get(url)) else None
            dest_target = None
            if dest:
                dest_url = rules.url_of(dest)
                dest_target = Target.decode(dest_url, b) if (b := found.get(dest_url)) else None
            mine = {r.id: metas[r.id]} if r.content and r.id in metas else None
            plans.append(planner.plan(r, target, dest_target, now, granted_at=granted_at,
                                      stored={k: m.headers if m is not None else None for k, m in mine.items()}
                                      if mine is not None else None, stored_pages=mine))
        return plans

    async def _after(self, r: Result, plan: Plan, worker: str | None, now: int) -> dict:
        """What follows an applied, finished result: its grace, a diagnosis asked meanwhile, metrics."""
        if plan.release:
            self.claims.note_released(r.id, now + RELEASE_GRACE_MS)
        self.on_result(self.conf.rules.url_of(r.id))
        if plan.page is not None and plan.content_change in ("new", "changed"):  # not a freshness touch
            self.on_changed(self.conf.rules.url_of(plan.page.cache_key), plan.discovered)
        if not self.claims.diagnose.answered(r.id) and self.claims.diagnose.waiting(r.id, now):
            # asked while this render was in flight: its reschedule must not push the diagnosis back
            try:
                await self.targets.render_now(r.id)
            except Exception as e:
                self.log.warning("diagnostics render not made due", key=r.id, error=repr(e)[:300])
        metrics.render_outcomes.labels(plan.outcome, plan.detail).inc()
        if plan.content_change is not None:
            metrics.render_content.labels(plan.route, plan.content_change).inc()
        if plan.guard is not None:
            metrics.render_guard.labels(plan.route, plan.guard.why, plan.guard.action).inc()
        if r.render_time is not None:
            sc = f"{r.status_code // 100}xx" if r.status_code else "none"
            metrics.render_seconds.labels(sc).observe(r.render_time / 1000)
        self.rows.flow("results", 1)
        name = (r.error or {}).get("name")  # the fleet's: any JSON, of any length the metadata cap allows
        self.log.info("render result", key=r.id, outcome=plan.outcome, detail=plan.detail,
                      status=r.status_code, error=None if name is None else sample_text(str(name)), worker=worker)
        return {"outcome": plan.outcome, "detail": plan.detail}

    def _history(self, r: Result, plan: Plan, meta: dict, worker: str | None, now: int) -> list:
        """The render-history item of this result (and its diagnostics report when it carries one):
        ``[cache key, entry, report]``. The new fields are dropped, never raised, when malformed."""
        try:
            summary, problems = diagnostics.parse_summary(meta.get("renderSummary"))
            report, more = diagnostics.parse_report(meta.get("diagnostics"))
            problems += more
            if problems:
                metrics.diagnostics_dropped.inc()
                self.log.warning("render diagnostics dropped in part", key=r.id, problems=problems[:10],
                                 worker=worker)
            entry = history.entry(now, render_ms=r.render_time, outcome=resolve_outcome(r, r.is_indexable),
                                  verdict=f"{plan.outcome}/{plan.detail}" if plan.detail else plan.outcome,
                                  reason=r.reason, status_code=r.status_code, summary=summary, worker=worker)
            record = None
            if report is not None:
                heading = {k: entry.get(k) for k in ("at", "renderMs", "outcome", "statusCode", "worker")}
                record = history.encode({**heading, **report})
            return [r.id, history.encode(entry), record]
        except Exception as e:  # diagnostics never cost a result
            self.log.error("render history not kept", key=r.id, error=repr(e)[:300])
            return []

    async def apply(self, plan: Plan, record: list | None = None) -> None:
        await self.apply_many([(plan, record)])

    async def apply_many(self, plans: list[tuple[Plan, list | None]]) -> None:
        """Write what each plan says: registry, pages and the render history (``record``, see
        ``_history``) in one store call for them all, rows through the funnel here or at their owner,
        then the follow-ups (a redirect's destination adopted or suppressed). A deleted target's keys
        lose their history, the result's own record included. The plans share no URL (``_waves``)."""
        rules = self.conf.rules
        registry: list = []
        pages: list = []
        items: list = []
        local_rows: list[ScheduleRow] = []
        local_deletes: list[str] = []
        foreign: dict[str, tuple[list, list]] = {}
        m = self.view.current

        def route_row(key: str, row: ScheduleRow | None) -> None:
            owner = m.owner(rules.url_of(key))  # the one key parser, any layout
            if owner == self.node:
                (local_rows.append(row) if row else local_deletes.append(key))
            else:
                rows, deletes = foreign.setdefault(owner, ([], []))
                (rows.append(row) if row else deletes.append(key))

        for plan, record in plans:
            forgotten: list[str] = []
            kept = {p.cache_key for p in plan.status_pages}  # a retired target's tombstones stay
            for url, target in plan.targets.items():
                if target is None:
                    registry.append((target_key(url), None))
                    for key in rules.all_keys(url):
                        if key not in kept:
                            pages.append((key.encode(), None))
                        route_row(key, None)
                        forgotten.append(key)
                else:
                    registry.append((target_key(url), target.encode()))
            if plan.page is not None:
                pages.append((plan.page.cache_key.encode(), encode_page(plan.page)))
            if plan.touch is not None:  # the page stays as stored (and replicated); only its times move
                pages.append((touch_key(plan.touch.cache_key), plan.touch.encode()))
            pages += [(k.encode(), None) for k in plan.page_deletes]
            pages += [(p.cache_key.encode(), p.encode()) for p in plan.status_pages]
            for row in plan.rows:
                route_row(row.cache_key, row)
            for key in plan.row_deletes:
                route_row(key, None)
            items += [[key, None, None] for key in forgotten]
            if record and record[0] not in forgotten:
                items.append(record)
        if registry or pages or items:
            await self.store.apply(registry, pages, items or None)
        self.rows.write(local_rows)
        self.rows.delete(local_deletes)
        for owner, (rows, deletes) in foreign.items():
            await self._rows_to(owner, rows, deletes, m.epoch)
        for plan, _ in plans:
            await self._follow_up(plan)

    async def _rows_to(self, owner: str, rows: list[ScheduleRow], deletes: list[str], epoch: int) -> None:
        """Schedule writes for keys ``owner`` owns under ``epoch``. Refused as stale: refresh, and
        route each again under the newer membership (ours through the funnel, others onward)."""
        try:
            await (await self.peers.of(owner)).apply_rows(rows, deletes, epoch)
            return
        except StaleEpoch:
            if not await self.moved_past(epoch):
                raise
        m = self.view.current
        url_of = self.conf.rules.url_of
        again: dict[str, tuple[list, list]] = {}
        for row in rows:
            again.setdefault(m.owner(url_of(row.cache_key)), ([], []))[0].append(row)
        for key in deletes:
            again.setdefault(m.owner(url_of(key)), ([], []))[1].append(key)
        for node, (r, d) in again.items():
            if node == self.node:
                self.rows.write(r)
                self.rows.delete(d)
            else:
                await self._rows_to(node, r, d, m.epoch)

    async def _follow_up(self, plan: Plan) -> None:
        if plan.adopt is not None:
            url, due, interval, discovered = plan.adopt
            item = {"url": url, "nextRenderTime": due, "renderInterval": interval,
                    **({"discovered": True} if discovered else {})}
            keeper = await self._keeper_of(url)
            await (self.targets.put_targets([item]) if keeper is None else keeper.put_targets([item]))
        if plan.suppress_dest is not None:
            url, reason, status = plan.suppress_dest
            keeper = await self._keeper_of(url)
            await (self.targets.suppress(url, reason, status) if keeper is None
                   else keeper.suppress(url, reason, status))
