"""Scheduling rules for targets: what a put, a suppression, a revalidation or a delete writes.

Pure: each rule returns the target row and the schedule rows to write; the keeper applies them (it is
the only writer of schedule rows). Cadence is route > stored > default. A new target's first render is
due now (``render.firstRender: now``) and the render after it lands on the URL's slot (``next_slot``),
or the first render is jittered over the cadence (``staggered``, the reference); all device variants
of a URL share one slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from prerender_ray.config.model import Config
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.routes import Router
from prerender_ray.identity.urls import url_path
from prerender_ray.queue.schedule import ScheduleRow, counted_strikes
from prerender_ray.storage.keys import TARGET
from prerender_ray.storage.registry import SUPPRESSED, Target
from prerender_ray.timeutil import fnv1a32, initial_render_time, jittered_minute, minute, next_slot, positive


def _target_head(sitemap_url: str | None, node_part: str) -> str:
    """``Target.encode``'s fields before ``render_interval`` with a leading comma (cut off once the
    record is closed): sitemap_url first, then scheduler_node."""
    sitemap_part = f',"sitemap_url":{_json_str(sitemap_url)}' if sitemap_url is not None else ""
    return sitemap_part + node_part


Held = Callable[[str], int | None]  # a key's current due time, or None when no row is held
_NO_DELIMITER = "\n"  # never in a canonical URL (escaped), so the whole URL seeds the jitter


@dataclass
class Suppression:
    target: Target | None  # None: the target is deleted (strikes reached the maximum)
    rows: list[ScheduleRow] = field(default_factory=list)
    deleted: bool = False


class Rules:
    """The scheduling rules of one config; build once per config."""

    def __init__(self, cfg: Config, *, router: Router | None = None, keys: KeyFormat | None = None):
        self.cfg = cfg
        self.router = router or Router(cfg)  # shared when built by CompiledConfig
        self.keys = keys or KeyFormat.from_config(cfg)
        self.supported = tuple(cfg.device_types.supported)
        self.default_devices = tuple(cfg.device_types.default)
        self.first_now = cfg.render.first_render == "now"

    # -------------------------------------------------------------------------------- identity

    def devices(self, url: str) -> tuple[str, ...]:
        """Devices scheduled for a URL: its route's deviceTypes, else deviceTypes.default."""
        route = self.router.first_match(url_path(url))
        if route is not None and route.mode == "prerender" and route.device_types:
            return route.device_types
        return self.default_devices

    def keys_of(self, url: str) -> list[str]:
        return [self.keys.key(url, d) for d in self.devices(url)]

    def all_keys(self, url: str) -> list[str]:
        """Every supported device's key: deletes must not leave a row behind after a config change."""
        return [self.keys.key(url, d) for d in self.supported]

    def canonical(self, url: str) -> str:
        """The URL half of a key for any spelling of ``url`` (its route's query allowlist);
        raises ``UrlError``. Sitemap entries, discovery, redirects and the API all key with this."""
        return self.keys.canonicalize(url, self.router.allowlist_for(url))

    def route_class(self, canonical_url: str) -> str:
        return self.router.classify(url_path(canonical_url)).route_class

    def url_of(self, key: str) -> str:
        return self.keys.url_of(key)

    def device_of(self, key: str) -> str:
        return self.keys.parse(key).get("deviceType", "")

    # ------------------------------------------------------------------------------------ cadence

    def cadence(self, url: str, stored: object = None) -> int:
        """route > stored > default; junk stored values fall through."""
        return self.router.render_interval(url_path(url), stored)

    def route_cadence(self, url: str) -> int:
        """What a row without a carried cadence is scored with: route > default (no stored read)."""
        return self.router.render_interval(url_path(url), None)

    # -------------------------------------------------------------------------------------- rules

    def put(self, url: str, *, now: int, sitemap_url: str | None = None, render_interval: object = None,
            next_render_time: object = None, node: str | None = None,
            held: Held | None = None, discovered: bool = False) -> tuple[Target, list[ScheduleRow]]:
        """(Re)activation: a fresh row (suppression and strikes cleared) and one schedule row per device,
        due at ``next_render_time`` when it is a positive number, else as ``first_due`` says.
        ``discovered``: a bot's miss made it; any other put confirms the URL (the mark is cleared)."""
        stored = positive(render_interval)
        target = Target(url=url, sitemap_url=sitemap_url or None, scheduler_node=node,
                        render_interval=int(stored) if stored else None, discovered=discovered)
        _, rows = self.put_many([url], [sitemap_url], [render_interval], [next_render_time], now=now, node=node,
                                held=held, discovered=[discovered])
        return target, [ScheduleRow(*r) for r in rows]

    def put_many(self, urls: Sequence[str], sitemap_urls: Sequence[str | None], intervals: Sequence[object],
                 dues: Sequence[object], *, now: int, node: str | None,
                 routes: dict[str, Any] | None = None, held: Held | None = None,
                 discovered: Sequence[bool] | None = None) -> tuple[list[list[bytes]], list[tuple]]:
        """``put`` for a batch (a sitemap ingests a million): the target records as registry writes
        ``[key, record]`` (lists: they go to the store, and Ray pickles every tuple of an argument) and
        the schedule rows as plain tuples in ``ScheduleRow`` order. The records are ``Target.encode``'s
        bytes, built from a prefix per sitemap instead of a ``Target`` per URL. ``routes``, when given,
        receives each URL's route under its first row's key (the keeper ranks the rows by it).

        Without an explicit due: with ``firstRender: now`` a new URL is due this minute; ``held`` (the
        current due time of a key, or None) tells a re-put apart, which keeps the staggered slot unless
        it is due sooner already (a re-put never makes a page due again). A new target is the proxy for
        "no cached page": a caller that knows every URL is new (a sitemap create) passes no ``held``.
        ``staggered`` jitters every put over the cadence, as the reference does. ``discovered``: which
        URLs a bot's miss made (``Target.discovered``); None, none of them."""
        router, keys_of, default_devices = self.router, self.keys.key, self.default_devices
        default_interval = self.cfg.render.default_interval
        heads: dict[str | None, str] = {}
        appends = self.keys.appends
        suffixes: dict[tuple[str, ...], Any] = {}  # devices -> their key suffixes
        node_part = f',"scheduler_node":{_json_str(node)}' if node is not None else ""
        registry: list[list[bytes]] = []
        rows: list[tuple] = []
        add_target, add_row = registry.append, rows.append
        first_now, now_min = self.first_now, minute(now)
        marks: Any = repeat(False) if discovered is None else discovered
        for url, sitemap_url, interval, explicit, mark in zip(urls, sitemap_urls, intervals, dues, marks):
            sitemap_url = sitemap_url or None
            head = heads.get(sitemap_url)
            if head is None:
                head = heads[sitemap_url] = _target_head(sitemap_url, node_part)
            if interval is not None and (type(interval) is not int or interval <= 0):
                stored = positive(interval)
                interval = int(stored) if stored else None
            route = router.first_match(url_path(url))
            if route is not None and route.mode == "prerender":
                cadence = route.render_interval or interval or default_interval
                devices = route.device_types or default_devices
            else:
                cadence = interval or default_interval
                devices = default_devices
            if explicit is not None and (type(explicit) is not int or explicit <= 0):
                explicit = positive(explicit)
            ends: Any = None
            if appends:
                ends = suffixes.get(devices)
                if ends is None:
                    ends = suffixes[devices] = self.keys.suffixes(devices)
            current = None
            if held is not None and first_now and not explicit and devices:
                current = held(url + ends[0] if appends else keys_of(url, devices[0]))
            if explicit:
                due = int(explicit)
            elif first_now and current is None:
                due = now_min
            else:
                if type(cadence) is int and cadence > 0 and _NO_DELIMITER not in url:
                    due = jittered_minute(url, cadence, now)  # _jittered, its checks settled here
                else:
                    due = self._jittered(url, cadence, now)
                if current is not None and current < due:
                    due = current
            body = head if interval is None else f'{head},"render_interval":{interval}'
            if mark:
                body += ',"discovered":1'
            add_target([TARGET + url.encode(), f"{{{body[1:]}}}".encode()])
            sitemap = sitemap_url is not None
            if appends:
                for end in ends:
                    add_row((url + end, due, sitemap, cadence))
            else:
                for d in devices:
                    add_row((keys_of(url, d), due, sitemap, cadence))
            if routes is not None and devices:
                routes[rows[-len(devices)][0]] = route
        return registry, rows

    def restore_row(self, target: Target, key: str, now: int) -> ScheduleRow:
        """Reconcile: a missing row comes back jittered (a mass repair must not be a herd)."""
        cadence = self.cadence(target.url, target.render_interval)
        due = self._jittered(target.url, cadence, now)
        return ScheduleRow(key, due, target.sitemap_url is not None, cadence)

    def _jittered(self, url: str, cadence: int, now: int) -> int:
        """The first render of every device of ``url``, seeded by the URL itself. With the default key
        shape (url first, ``|``) this is the reference's "text before the first delimiter" of the key;
        seeding by the key would put every URL on one minute when the device comes first in the key
        (seed ``desktop``) or the delimiter occurs in URLs (``::`` in ``https://[::1]/``)."""
        return initial_render_time(url, cadence, now, default_interval=self.cfg.render.default_interval,
                                   delimiter=_NO_DELIMITER)

    def after_first_render(self, url: str, cadence: int, now: int) -> int:
        """When the render after a page's first is due: with ``firstRender: now`` the URL's next slot
        (``next_slot``: the first render came at once, so the cadence from it would put a new sitemap's
        re-renders in one herd a cadence later); staggered, the cadence from now (its first render
        already was on its slot)."""
        if not self.first_now:
            return minute(now) + cadence
        return next_slot(url, cadence, now)

    def lastmod_due(self, target: Target, lastmod: int, cached: Sequence[int | None], now: int, within: int,
                    held: Held) -> list[ScheduleRow]:
        """A sitemap says ``target`` changed at ``lastmod``: each device whose page was last cached
        before it is due within ``within`` (paced as a revalidation, never delayed). ``cached``: each
        of ``keys_of(target.url)``'s page times, None without a page (a page never rendered is due on
        its own; a suppressed target keeps its recheck, so the suppression rules stay as they are)."""
        if target.suppressed:
            return []
        rows = []
        for key, at in zip(self.keys_of(target.url), cached):
            if at is None or at >= lastmod:
                continue
            due = paced_due(key, now, within)
            current = held(key)
            if current is None or current > due:
                rows.append(ScheduleRow(key, due, target.sitemap_url is not None, None))
        return rows

    def due_now(self, target: Target | None, key: str, now: int, *, carry_cadence: bool = True) -> ScheduleRow:
        """Admin revalidate and render-now: one key due this minute."""
        if target is None:
            return ScheduleRow(key, minute(now), False, None)
        interval = self.cadence(target.url, target.render_interval) if carry_cadence else None
        return ScheduleRow(key, minute(now), target.sitemap_url is not None, interval)

    def revalidate(self, target: Target, now: int) -> list[ScheduleRow]:
        """Bulk revalidate: every device due now, cadence left to config (filed as absent)."""
        return [ScheduleRow(k, minute(now), target.sitemap_url is not None, None) for k in self.keys_of(target.url)]

    def revalidate_paced(self, target: Target, now: int, within: int,
                         held: Callable[[str], int | None]) -> list[ScheduleRow]:
        """A paced revalidation: every device due within ``within`` ms of ``now`` (``paced_due``),
        never later than it is due already (``held``: the key's current due time, or None)."""
        rows = []
        for key in self.keys_of(target.url):
            due = paced_due(key, now, within)
            current = held(key)
            if current is None or current > due:
                rows.append(ScheduleRow(key, due, target.sitemap_url is not None, None))
        return rows

    def suppress(self, existing: Target | None, url: str, *, reason: str | None, status_code: int | None,
                 now: int, strike: bool = True) -> Suppression:
        """A non-indexable verdict: recheck later, or delete after too many strikes in a row.

        ``http-error`` with 404/410 is *gone*: a longer recheck and fewer strikes. Strikes are one
        counter shared with failures and redirects. ``strike=False``: this URL was struck already in
        this render cycle (another device's verdict): suppressed, but no further strike."""
        s = self.cfg.render.suppression
        gone = reason == "http-error" and status_code in (404, 410)
        recheck, max_strikes = (s.gone.recheck_interval, s.gone.max_strikes) if gone else (
            s.recheck_interval, s.max_strikes)
        strike = strike or existing is None
        strikes = counted_strikes(existing.strikes if existing else 0) + (1 if strike else 0)
        if existing is not None and strike and strikes >= max_strikes:
            return Suppression(None, [], deleted=True)
        base = existing or Target(url=url)
        target = Target(url=url, sitemap_url=base.sitemap_url, scheduler_node=base.scheduler_node,
                        render_interval=base.render_interval, state=SUPPRESSED,
                        suppressed_reason="http-gone" if gone else (reason or None), suppressed_at=now,
                        strikes=strikes, struck_at=now if strike else base.struck_at, discovered=base.discovered)
        cadence = self.cadence(url, target.render_interval)
        rows = [ScheduleRow(k, minute(now) + recheck, target.sitemap_url is not None, cadence)
                for k in self.keys_of(url)]
        return Suppression(target, rows)

    def reactivated(self, target: Target) -> Target:
        return target.patched(state=None, suppressed_reason=None, suppressed_at=None, strikes=0,
                              struck_at=None)


def paced_due(key: str, now: int, within: int) -> int:
    """A due time in [now, now + within), by the key's hash: the keys of a paced revalidation (of a
    prefix, or the whole site) come due evenly over the window, whichever node owns them, and the
    same key always lands on the same minute of it."""
    if within <= 0:
        return minute(now)
    return minute(now + fnv1a32(key) % within)
