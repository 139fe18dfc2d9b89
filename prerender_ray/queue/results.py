"""What a posted render result does: the reference's decision table as a pure plan.

The keeper of the result's key reads the target rows the plan needs, asks ``plan()`` what to do, and
applies it. The lease is released by the posted ``id`` only (a refile never releases the destination),
and held when the failure lane says *fast* so the retry waits for the lease to expire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

from prerender_ray.decoding import DecodeError, TooLarge, decoded_digest
from prerender_ray.identity.urls import UrlError, url_path
from prerender_ray.queue.schedule import ScheduleRow, backoff_wait, counted_strikes
from prerender_ray.queue.targets import Rules
from prerender_ray.serving.answer import route_label
from prerender_ray.serving.origin_policy import compiled
from prerender_ray.storage.pages import Page
from prerender_ray.storage.registry import Target
from prerender_ray.timeutil import minute, positive

OUTCOMES = ("rendered", "redirected", "non-indexable", "error")
STORED_HEADERS = frozenset(
    {"etag", "last-modified", "link", "x-robots-tag", "retry-after", "cache-control", "content-type", "vary"})
# The rendered page's own validators replace the origin's (those of the app shell, which change on a
# deploy only): the ETag is a hash of the decoded rendered bytes, Last-Modified when they last changed.
ORIGIN_VALIDATORS = frozenset({"etag", "last-modified"})
ENCODINGS = ("gzip", "br", "identity")


class ResultError(ValueError):
    """Metadata the server cannot act on (the HTTP layer answers 400)."""


@dataclass
class Result:
    """A validated job_result: metadata plus the still-encoded content."""

    id: str
    url: str
    status_code: int | None
    headers: dict[str, str]
    content: bytes | None
    outcome: str
    reason: str | None
    redirected_to: str | None
    is_indexable: bool | None
    render_time: float | None
    error: dict | None

    @classmethod
    def parse(cls, meta: Any, content: bytes | None) -> Result:
        """Validate every field this service reads or stores; a value out of range is a
        ``ResultError`` naming the field (a 400: the fleet must not retry it as a lease conflict)."""
        if not isinstance(meta, dict):
            raise ResultError("metadata must be a JSON object")
        key = meta.get("id")
        if not isinstance(key, str) or not key:
            raise ResultError("metadata.id (the claimed job id) is required")
        outcome = meta.get("outcome")
        if outcome is not None and outcome not in OUTCOMES:
            raise ResultError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
        headers = meta.get("headers") or {}
        if not isinstance(headers, dict):
            raise ResultError("metadata.headers must be an object")
        indexable = meta.get("isIndexable")
        if indexable is not None and not isinstance(indexable, bool):
            raise ResultError("metadata.isIndexable must be a boolean")
        error = meta.get("error")
        if error is not None and not isinstance(error, dict):
            raise ResultError("metadata.error must be an object")
        redirected = _text(meta, "redirectedTo", MAX_TEXT)
        return cls(
            id=key,
            url=_text(meta, "url", MAX_TEXT) or "",
            status_code=_status_code(meta.get("statusCode")),
            headers=_headers(headers),
            content=content or None,
            outcome=outcome or "",
            reason=_text(meta, "reason", MAX_REASON),
            redirected_to=redirected or None,
            is_indexable=indexable,
            render_time=_render_time(meta.get("renderTime")),
            error=error,
        )

    @property
    def content_encoding(self) -> str:
        return (self.headers.get("content-encoding") or "identity").strip().lower()


MAX_TEXT = 64 * 1024  # url / redirectedTo: far above any real URL, far below the body cap
MAX_REASON = 200
MAX_HEADER_VALUE = 8192
MAX_RENDER_TIME_MS = 86_400_000  # a day: the render budget is seconds; more is a broken clock


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _status_code(value: Any) -> int | None:
    """An HTTP status: an integer 100-599 (an integral float too, as JSON allows), or absent."""
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or value != int(value) or not 100 <= value <= 599:
        raise ResultError(f"metadata.statusCode must be an integer from 100 to 599, not {_shown(value)}")
    return int(value)


def _render_time(value: Any) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_RENDER_TIME_MS:
        raise ResultError(f"metadata.renderTime must be a number of milliseconds from 0 to "
                          f"{MAX_RENDER_TIME_MS}, not {_shown(value)}")
    return value


def _text(meta: dict, name: str, limit: int) -> str | None:
    value = meta.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ResultError(f"metadata.{name} must be a string")
    if len(value) > limit:
        raise ResultError(f"metadata.{name} is longer than {limit} characters")
    return value


def _headers(headers: dict) -> dict[str, str]:
    """Lower-cased names; a value is text (a number is written out), absent values dropped. Stored
    headers are served back to crawlers, so a control character in one is refused, not stored."""
    out = {}
    for name, value in headers.items():
        if value is None:
            continue
        if isinstance(value, str):
            text = value
        elif _is_number(value) and math.isfinite(value):
            text = str(value)
        else:
            raise ResultError(f"metadata.headers[{_shown(name)}] must be a string")
        low = name.lower()
        if low in STORED_HEADERS or low == "content-encoding":
            if len(text) > MAX_HEADER_VALUE or any(c in text for c in "\r\n\0"):
                raise ResultError(f"metadata.headers[{_shown(name)}] holds a control character or is "
                                  f"longer than {MAX_HEADER_VALUE} characters")
        out[low] = text
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    adopt: tuple[str, int, int | None] | None = None  # (url, due, renderInterval) put on its owner
    suppress_dest: tuple[str, str | None, int | None] | None = None  # (url, reason, status) on its owner
    refile_key: str | None = None  # the destination key a rendered redirect was filed under
    unrouted: str | None = None  # a landed path outside prerender routes (for the tally)
    content_change: str | None = None  # of the stored page: new, changed or unchanged (same bytes)
    route: str = ""  # the stored page's route label (metrics)


def _domain_ok(url: str | None, domains: list[str]) -> bool:
    if not domains or not url:
        return True
    return compiled(tuple(domains)).url_allowed(url)  # host and port, as the ingress checks them


def resolve_outcome(r: Result, indexable: bool | None) -> str:
    """The posted outcome, or the legacy inference for fleets that do not send one."""
    if r.outcome:
        return r.outcome
    if (r.status_code == 200 and r.content) or indexable is True:
        return "rendered"
    if r.redirected_to:
        return "redirected"
    if indexable is False:
        return "non-indexable"
    return "error"


class Planner:
    def __init__(self, rules: Rules):
        self.rules = rules
        self.cfg = rules.cfg
        self._granted_at: int | None = None  # of the result being planned (see ``plan``)
        self._stored: dict[str, dict[str, str] | None] = {}

    def destination(self, r: Result) -> str | None:
        """The cache key a redirected result landed on, or None when it is not a redirect."""
        if not r.redirected_to:
            return None
        try:
            url = self.rules.canonical(r.redirected_to)
        except UrlError:
            return None
        dest = self.rules.keys.key(url, self.rules.device_of(r.id))
        return None if dest == r.id else dest

    def plan(self, r: Result, target: Target | None, dest_target: Target | None, now: int, *,
             granted_at: int | None = None, stored: dict[str, dict[str, str] | None] | None = None) -> Plan:
        """``granted_at``: when the lease this result answers was granted. A strike counts only for a
        grant issued after the target's last strike, so the devices of one URL claimed in one cycle
        cost one strike between them (the next cycle's recheck is granted later and counts again).
        ``stored``: the headers of the pages stored now, by cache key (for their validators)."""
        self._granted_at = granted_at
        self._stored = stored or {}
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
                if landed == "prerender":
                    plan = self._rendered(r, dest, dest_target, indexable, now, discard=False)
                    # The source retires, its rows and pages with it; with no target too (a render-now
                    # one-off), or its row would stay due and be re-granted after every result.
                    plan.targets.update(self._delete_target(target, r.id))
                    plan.refile_key = dest
                    plan.detail = "refiled"
                    return plan
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
            return self._suppress_source(r, target, now)
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
        plan = Plan("rendered", detail="rendered")
        if r.content and not discard:
            headers = {k: v for k, v in r.headers.items() if k in STORED_HEADERS and k not in ORIGIN_VALIDATORS}
            if r.content_encoding != "identity":
                headers["content-encoding"] = r.content_encoding
            headers["x-harper-rendered"] = "1"
            validators = self.validators(key, r, now)
            headers.update(validators)
            before = (self._stored.get(key) or {}).get("etag")
            plan.content_change = "new" if before is None else "unchanged" if before == validators["etag"] else "changed"
            route = self.rules.router.first_match(url_path(url))
            plan.route = route_label(route.path if route is not None else None, self.rules.route_class(url))
            plan.page = Page(cache_key=key, status_code=r.status_code or 200, headers=headers,
                             content=r.content, last_cached=now, expires_at=due, is_indexable=indexable)
        if target is None:
            plan.row_deletes.append(key)  # a one-off (render-now) or an orphan: rendered once, dropped
            return plan
        plan.rows.append(ScheduleRow(key, due, target.sitemap_url is not None, interval))
        if target.suppressed and indexable is True:
            plan.targets[target.url] = self.rules.reactivated(target)
        elif not target.suppressed and counted_strikes(target.strikes) > 0:
            plan.targets[target.url] = target.patched(strikes=0, struck_at=None)
        return plan

    def validators(self, key: str, r: Result, now: int) -> dict[str, str]:
        """ETag from the decoded rendered bytes; Last-Modified kept while they stay the same."""
        assert r.content is not None
        try:
            digest = decoded_digest(r.content, r.content_encoding, self.cfg.server.max_html_bytes)
        except (DecodeError, TooLarge):  # the ingress checked the stream; stored bytes still name it
            digest = decoded_digest(r.content, "identity", None)
        etag = f'"{digest}"'
        before = self._stored.get(key) or {}
        if before.get("etag") == etag and before.get("last-modified"):
            return {"etag": etag, "last-modified": before["last-modified"]}
        return {"etag": etag, "last-modified": formatdate(now / 1000, usegmt=True)}

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
        plan = Plan("suppressed", detail=r.reason or "non-indexable")
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
        if landed != "prerender":
            plan = self._redirect_strike(r.id, target, now)
            plan.unrouted = url_path(self.rules.url_of(dest))
            return plan
        dest_url = self.rules.url_of(dest)
        if inspected_non_indexable:
            plan = Plan("redirect", detail="to-non-indexable")
            plan.targets.update(self._delete_target(target, r.id))
            if _domain_ok(dest_url, self.cfg.domains):
                plan.suppress_dest = (dest_url, r.reason, status)
            return plan
        if status not in (301, 308):
            return self._redirect_strike(r.id, target, now)
        plan = Plan("redirect", detail="permanent")
        interval = positive(target.render_interval) if target else None
        plan.targets.update(self._delete_target(target, r.id))
        if dest_target is None and _domain_ok(dest_url, self.cfg.domains):
            plan.adopt = (dest_url, minute(now), int(interval) if interval else None)
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
