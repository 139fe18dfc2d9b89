"""What a posted render result does: the reference's decision table as a pure plan.

The keeper of the result's key reads the target rows the plan needs, asks ``plan()`` what to do, and
applies it. The lease is released by the posted ``id`` only, and held when the failure lane says *fast*
so the retry waits for the lease to expire. A result's content is stored under its own key only: a
render that landed on another page of ours makes that page due, for its own grant to render. The result
itself (its metadata, validated) is ``metadata.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

from prerender_ray.decoding import DecodeError, TooLarge, decode
from prerender_ray.identity.urls import UrlError, url_path
from prerender_ray.queue import guard
from prerender_ray.queue.metadata import STORED_HEADERS, Result, resolve_outcome
from prerender_ray.queue.schedule import ScheduleRow, backoff_wait, counted_strikes
from prerender_ray.queue.status_pages import (
    REDIRECT_STATUSES,
    gone_page,
    is_gone_status,
    location_of,
    redirect_page,
    resolved,
)
from prerender_ray.queue.targets import Rules
from prerender_ray.serving.answer import route_label
from prerender_ray.serving.origin_policy import compiled
from prerender_ray.serving.volatile import content_digest
from prerender_ray.storage.pages import Page, PageMeta
from prerender_ray.storage.registry import Target
from prerender_ray.storage.touches import Touch
from prerender_ray.timeutil import minute, positive

# The rendered page's own validators replace the origin's (those of the app shell, which change on a
# deploy only): the ETag is a hash of the decoded rendered bytes, Last-Modified when they last changed.
ORIGIN_VALIDATORS = frozenset({"etag", "last-modified"})
# The reasons the fleet protocol names (docs/fleet-protocol.md#metadata-fields): a plan's detail, a
# metric label, is one of these or "other" (the fleet may send any text; the target keeps it).
REASONS = ("noindex", "canonical-mismatch", "canonical-variant", "http-error", "redirect-loop", "redirect", "error")


@dataclass
class Plan:
    outcome: str  # metric label: rendered, suppressed, auth-failure, transient, failed, redirect, dropped
    detail: str = ""
    release: bool = True
    page: Page | None = None
    page_deletes: list[str] = field(default_factory=list)
    targets: dict[str, Target | None] = field(default_factory=dict)  # url -> new row, None = delete
    rows: list[ScheduleRow] = field(default_factory=list)
    row_deletes: list[str] = field(default_factory=list)
    adopt: tuple[str, int, int | None, bool] | None = None  # (url, due, renderInterval, discovered) put on its owner
    suppress_dest: tuple[str, str | None, int | None] | None = None  # (url, reason, status): created on its owner
    unrouted: str | None = None  # a landed path outside prerender routes (for the tally)
    content_change: str | None = None  # of the stored page: new, changed or unchanged (same bytes)
    touch: Touch | None = None  # instead of ``page``: the stored record is the same but for its times
    route: str = ""  # the stored page's route label (metrics)
    status_pages: list[Page] = field(default_factory=list)  # the verdict as bots get it (status_pages.py)
    guard: guard.Verdict | None = None  # a bad render: refused, or stored as there was no good page
    discovered: bool = False  # the stored page's target is there only by a bot's miss (IndexNow skips it)


def _compared(headers: dict[str, str]) -> dict[str, str]:
    """Headers as a touch compares them: the guard's measure counts bytes a nonce changes, and the
    ETag already says the pages are the same."""
    if guard.MEASURE_HEADER not in headers:
        return headers
    return {k: v for k, v in headers.items() if k != guard.MEASURE_HEADER}


def _domain_ok(url: str | None, domains: list[str]) -> bool:
    if not domains or not url:
        return True
    return compiled(tuple(domains)).url_allowed(url)  # host and port, as the ingress checks them


class Planner:
    def __init__(self, rules: Rules):
        self.rules = rules
        self.cfg = rules.cfg
        self._granted_at: int | None = None  # of the result being planned (see ``plan``)
        self._stored: dict[str, dict[str, str] | None] = {}
        self._seen: tuple[Result, str, bytes | None] | None = None  # the result decoded once: digest, body
        self._guards: dict[int, guard.Rule] = {}  # by id of the route overriding render.guard (0: none)
        self._stored_pages: dict[str, PageMeta | None] = {}

    def destination(self, r: Result) -> str | None:
        """The cache key a redirected result landed on, or None when it is not a redirect."""
        if not r.redirected_to:
            return None
        landed = resolved(self.rules.url_of(r.id), r.redirected_to)  # a relative one: to the page
        if landed is None:
            return None
        try:
            url = self.rules.canonical(landed)
        except UrlError:
            return None
        dest = self.rules.keys.key(url, self.rules.device_of(r.id))
        return None if dest == r.id else dest

    def plan(self, r: Result, target: Target | None, dest_target: Target | None, now: int, *,
             granted_at: int | None = None, stored: dict[str, dict[str, str] | None] | None = None,
             stored_pages: dict[str, PageMeta | None] | None = None) -> Plan:
        """``granted_at``: when the lease this result answers was granted. A strike counts only for a
        grant issued after the target's last strike, so the devices of one URL claimed in one cycle
        cost one strike between them (the next cycle's recheck is granted later and counts again).
        ``stored``: the headers of the pages stored now, by cache key (for their validators);
        ``stored_pages``: their metadata (a render identical to one of them only touches it)."""
        self._granted_at = granted_at
        self._stored = stored or {}
        self._seen = None
        self._stored_pages = stored_pages or {}
        domains = self.cfg.domains
        inspected_non_indexable = r.is_indexable is False
        indexable = r.is_indexable
        if not _domain_ok(r.redirected_to or r.url or self.rules.url_of(r.id), domains):
            indexable = False
        outcome = resolve_outcome(r, indexable)
        dest = self.destination(r)
        if dest is not None:
            landed = self.rules.route_class(self.rules.url_of(dest))
            if outcome == "redirected":
                return self._redirect_lane(r, target, dest, dest_target, landed, inspected_non_indexable, now)
            if outcome == "rendered":
                # A landing outside ``domains`` is no page of ours: kept as an unrouted landing is.
                # One on our site moved there: the source retires and the destination is made due (or
                # adopted), so its own grant renders it. Ours: the reference refiled the content under
                # the destination's key, which this grant never covered (one lease could overwrite any
                # page, leased elsewhere or not).
                if landed == "prerender" and _domain_ok(self.rules.url_of(dest), domains):
                    return self._moved(Plan("redirect", detail="client-side"), r, target, dest, dest_target,
                                       now, render_dest=True)
                plan = self._rendered(r, r.id, target, indexable, now, discard=True)
                plan.unrouted = url_path(self.rules.url_of(dest))
                plan.detail = "landed-unrouted"
                return plan
        if outcome == "rendered":
            return self._rendered(r, r.id, target, indexable, now, discard=False)
        if outcome == "non-indexable":
            status = r.status_code
            if status in (401, 403):
                return self._failure(r.id, target, now, "auth-failure")
            if status in (408, 429) or (status is not None and status >= 500):
                return self._failure(r.id, target, now, "transient")
            plan = self._suppress_source(r, target, now)
            if status is not None and is_gone_status(status):
                code, url = status, target.url if target else self.rules.url_of(r.id)
                self._add_status_pages(plan, url, now, lambda key, exp: gone_page(
                    key, code, content=r.content, headers=r.headers, now=now, expires_at=exp))
            return plan
        # Anything else failed, a "redirected" that canonicalizes to the same key included: it is not a
        # redirect, so it never costs a redirect strike (which retires the target at maxStrikes).
        return self._failure(r.id, target, now, "failed")

    # ---------------------------------------------------------------------------------- branches

    def _rendered(self, r: Result, key: str, target: Target | None, indexable: bool | None, now: int, *,
                  discard: bool) -> Plan:
        url = self.rules.url_of(key)
        interval = self.rules.cadence(url, target.render_interval if target else None)
        # no page stored before this one: its first render; the next lands on the URL's slot
        first = not discard and key in self._stored and self._stored[key] is None
        due = self.rules.after_first_render(url, interval, now) if first else minute(now) + interval
        plan = Plan("rendered", detail="rendered", discovered=target is not None and target.discovered)
        if r.content and not discard:
            plan.guard, measured = self._judged(r, key, target, url)
            if plan.guard is not None and plan.guard.action == "refused":
                return self._refused(key, target, url, now, plan.guard)
            headers = {k: v for k, v in r.headers.items() if k in STORED_HEADERS and k not in ORIGIN_VALIDATORS}
            if r.content_encoding != "identity":
                headers["content-encoding"] = r.content_encoding
            headers["x-harper-rendered"] = "1"
            validators = self.validators(key, r, now)
            headers.update(validators)
            headers.update(measured)
            before = (self._stored.get(key) or {}).get("etag")
            plan.content_change = "new" if before is None else "unchanged" if before == validators["etag"] else "changed"
            plan.route = self._route_label(url)
            plan.page = Page(cache_key=key, status_code=r.status_code or 200, headers=headers,
                             content=r.content, last_cached=now, expires_at=due, is_indexable=indexable)
            if plan.content_change == "unchanged":
                plan.touch = self._touch(plan.page)
                plan.page = None if plan.touch is not None else plan.page
        if target is None:
            plan.row_deletes.append(key)  # a one-off (render-now) or an orphan: rendered once, dropped
            return plan
        plan.rows.append(ScheduleRow(key, due, target.sitemap_url is not None, interval))
        if target.suppressed and indexable is True:
            plan.targets[target.url] = self.rules.reactivated(target)
        elif not target.suppressed and counted_strikes(target.strikes) > 0:
            plan.targets[target.url] = target.patched(strikes=0, struck_at=None)
        return plan

    def _touch(self, page: Page) -> Touch | None:
        """New times for the stored page when ``page`` would store the same record but for them: same
        ETag (the bytes, volatile noise aside), status, headers and indexability. Anything else that
        differs (an x-robots-tag the origin changed, a content-encoding) is a full write."""
        held = self._stored_pages.get(page.cache_key)
        if held is None or (held.status_code, _compared(held.headers), held.is_indexable) != (
                page.status_code, _compared(page.headers), page.is_indexable):
            return None
        return Touch(page.cache_key, page.headers["etag"], page.last_cached, page.expires_at)

    def validators(self, key: str, r: Result, now: int) -> dict[str, str]:
        """ETag from the decoded rendered bytes (volatile noise blanked, ``serving/volatile.py``);
        Last-Modified kept while they stay the same."""
        digest = self._decoded(r)[0]
        self._seen = (r, digest, None)  # the body is not kept past this result
        etag = f'"{digest}"'
        before = self._stored.get(key) or {}
        if before.get("etag") == etag and before.get("last-modified"):
            return {"etag": etag, "last-modified": before["last-modified"]}
        return {"etag": etag, "last-modified": formatdate(now / 1000, usegmt=True)}

    def _decoded(self, r: Result) -> tuple[str, bytes | None]:
        """The digest of the decoded content and the decoded bytes, from one decode per result."""
        assert r.content is not None
        if self._seen is None or self._seen[0] is not r:
            body: bytes | None
            try:
                body = decode(r.content, r.content_encoding, self.cfg.server.max_html_bytes)
                digest = content_digest(body, "identity", None)
            except (DecodeError, TooLarge):  # the ingress checked the stream; stored bytes still name it
                digest, body = content_digest(r.content, "identity", None), None
            self._seen = (r, digest, body)
        return self._seen[1], self._seen[2]

    def _route_label(self, url: str) -> str:
        route = self.rules.router.first_match(url_path(url))
        return route_label(route.path if route is not None else None, self.rules.route_class(url))

    def _guard_rule(self, url: str) -> guard.Rule | None:
        route = self.rules.router.first_match(url_path(url))
        override = route.guard if route is not None else None
        slot = id(route) if override else 0
        rule = self._guards.get(slot)
        if rule is None:
            base = self.cfg.render.guard
            rule = self._guards[slot] = guard.Rule(base.model_copy(update=dict(override)) if override else base)
        return rule if rule.enabled else None

    def _judged(self, r: Result, key: str, target: Target | None,
                url: str) -> tuple[guard.Verdict | None, dict[str, str]]:
        """The guard's verdict on a render (None: fine, or not judged) and the stored measure header."""
        rule = self._guard_rule(url)
        body = self._decoded(r)[1] if rule is not None else None
        if rule is None or body is None:
            return None, {}
        seen = guard.scan(body, rule)
        self._seen = (r, self._seen[1], None) if self._seen is not None else None  # judged: freed
        verdict = guard.judge(rule, seen, self._stored.get(key), self._repeats(target, key))
        suspect = verdict.why if verdict is not None and verdict.action == "stored" else None
        return verdict, {guard.MEASURE_HEADER: guard.measure_header(seen.measure, suspect)}

    def _repeats(self, target: Target | None, key: str) -> int:
        """Refusals of ``key`` in a row: none once a render was stored since (that cleared the strikes)."""
        if target is None or counted_strikes(target.strikes) == 0:
            return 0
        return guard.repeats_of(target.refused, key)

    def _refused(self, key: str, target: Target | None, url: str, now: int, verdict: guard.Verdict) -> Plan:
        """A bad render over a good page: the page stays, the key takes the failure lane, the target
        keeps the refusal (for the console)."""
        plan = self._failure(key, target, now, "bad-render")
        if target is not None:
            record = guard.refusal(key, verdict, now, self._repeats(target, key) + 1)
            plan.targets[target.url] = (plan.targets.get(target.url) or target).patched(refused=record)
        plan.route = self._route_label(url)
        plan.guard = verdict
        return plan

    def _failure(self, key: str, target: Target | None, now: int, label: str) -> Plan:
        """The failure lane: fast retries hold the lease until it expires; then a backoff that never
        comes due sooner than the page's cadence. The cached page is left alone."""
        if target is None:
            return Plan("dropped", detail=label, row_deletes=[key])
        strikes, struck = self._strike(target, now)
        plan = Plan(label, detail="fast", targets={target.url: struck})
        if strikes <= self.cfg.render.failure_retry.fast_retries:
            plan.release = False
            return plan
        cadence = self.rules.cadence(target.url, target.render_interval)
        wait = backoff_wait(cadence, strikes, target.sitemap_url is not None, self.cfg.render.failure_retry)
        plan.detail = "slow"
        plan.rows.append(ScheduleRow(key, minute(now) + wait, target.sitemap_url is not None, cadence))
        return plan

    def _suppress_source(self, r: Result, target: Target | None, now: int) -> Plan:
        url = target.url if target else self.rules.url_of(r.id)
        s = self.rules.suppress(target, url, reason=r.reason, status_code=r.status_code, now=now,
                                strike=self._counts(target))
        plan = Plan("suppressed", detail="non-indexable" if not r.reason else
                    r.reason if r.reason in REASONS else "other")
        if s.deleted:
            plan.targets.update(self._delete_target(target, r.id))
            plan.detail = "deleted"
        else:
            plan.targets[url] = s.target
            plan.rows += s.rows
            plan.page_deletes += self.rules.all_keys(url)
            plan.row_deletes += [k for k in self.rules.all_keys(url) if k not in {row.cache_key for row in s.rows}]
        return plan

    def _redirect_lane(self, r: Result, target: Target | None, dest: str, dest_target: Target | None,
                       landed: str, inspected_non_indexable: bool, now: int) -> Plan:
        status = r.status_code
        if status in (401, 403):
            return self._failure(r.id, target, now, "auth-failure")
        if status in (408, 429) or (status is not None and status >= 500):
            return self._failure(r.id, target, now, "transient")
        plan = self._redirect_verdict(r, target, dest, dest_target, landed, inspected_non_indexable, now)
        location = location_of(self.rules.url_of(r.id), r.redirected_to, self.cfg.domains)
        if status in REDIRECT_STATUSES and location is not None:
            url = target.url if target else self.rules.url_of(r.id)
            self._add_status_pages(plan, url, now, lambda key, exp: redirect_page(
                key, status, location, headers=r.headers, now=now, expires_at=exp))
        return plan

    def _redirect_verdict(self, r: Result, target: Target | None, dest: str, dest_target: Target | None,
                          landed: str, inspected_non_indexable: bool, now: int) -> Plan:
        status = r.status_code
        if landed != "prerender":
            plan = self._redirect_strike(r.id, target, now)
            plan.unrouted = url_path(self.rules.url_of(dest))
            return plan
        dest_url = self.rules.url_of(dest)
        if inspected_non_indexable:
            plan = Plan("redirect", detail="to-non-indexable")
            plan.targets.update(self._delete_target(target, r.id))
            if not _domain_ok(dest_url, self.cfg.domains):
                return plan
            # Ours: a destination with a target is judged by its own render, made due now; this
            # result is another URL's, and its grant no cycle of the destination's (one strike per
            # source retired the destination, pages and all, past maxStrikes). One without a target
            # is created suppressed, as the reference does (its owner creates, never overwrites).
            if dest_target is None:
                plan.suppress_dest = (dest_url, r.reason, status)
            elif not dest_target.suppressed:
                plan.rows.append(self.rules.due_now(dest_target, dest, now))
            return plan
        if status not in (301, 308):
            return self._redirect_strike(r.id, target, now)
        return self._moved(Plan("redirect", detail="permanent"), r, target, dest, dest_target, now,
                           render_dest=False)

    def _moved(self, plan: Plan, r: Result, target: Target | None, dest: str, dest_target: Target | None,
               now: int, *, render_dest: bool) -> Plan:
        """The source moved to ``dest``: it retires, its rows and pages with it (with no target too, a
        render-now one-off, or its row would stay due and be re-granted after every result). A
        destination in ``domains`` without a target is adopted, due now; one with a target is made
        due now when ``render_dest``. Nothing is stored under ``dest``: only its own grant renders it."""
        interval = positive(target.render_interval) if target else None
        plan.targets.update(self._delete_target(target, r.id))
        dest_url = self.rules.url_of(dest)
        if not _domain_ok(dest_url, self.cfg.domains):
            return plan
        if dest_target is None:
            plan.adopt = (dest_url, minute(now), int(interval) if interval else None,
                          target is not None and target.discovered)
        elif render_dest:
            plan.rows.append(self.rules.due_now(dest_target, dest, now))
        return plan

    def _redirect_strike(self, key: str, target: Target | None, now: int) -> Plan:
        if target is None:
            return Plan("redirect", detail="strike-untargeted", row_deletes=[key])
        strikes, struck = self._strike(target, now)
        if strikes >= self.cfg.render.redirects.max_strikes and self._counts(target):
            plan = Plan("redirect", detail="retired")
            plan.targets.update(self._delete_target(target, key))
            return plan
        cadence = self.rules.cadence(target.url, target.render_interval)
        return Plan("redirect", detail="strike", targets={target.url: struck},
                    rows=[ScheduleRow(key, minute(now) + cadence, target.sitemap_url is not None, cadence)])

    def _add_status_pages(self, plan: Plan, url: str, now: int, make: Any) -> None:
        """The verdict on every device key of ``url`` (a verdict is the URL's, as its strikes are),
        served until ``keepFor`` past the later of now and the rechecks just scheduled."""
        sp = self.cfg.render.status_pages
        if not sp.enabled:
            return
        expires = max([now] + [row.next_render_time or now for row in plan.rows]) + sp.keep_for
        plan.status_pages = [make(key, expires) for key in self.rules.keys_of(url)]
        written = {p.cache_key for p in plan.status_pages}
        plan.page_deletes = [k for k in plan.page_deletes if k not in written]

    def _counts(self, target: Target | None) -> bool:
        """Does this result's verdict cost ``target`` a strike? Not when the grant it answers was issued
        before the last strike was taken (that strike came from the same render cycle)."""
        at = self._granted_at
        return target is None or target.struck_at is None or at is None or at > target.struck_at

    def _strike(self, target: Target, now: int) -> tuple[int, Target]:
        """The strike count after this verdict, and the target carrying it."""
        if not self._counts(target):
            return counted_strikes(target.strikes), target
        strikes = counted_strikes(target.strikes) + 1
        return strikes, target.patched(strikes=strikes, struck_at=now)

    def _delete_target(self, target: Target | None, key: str) -> dict[str, Target | None]:
        url = target.url if target else self.rules.url_of(key)
        return {url: None}
