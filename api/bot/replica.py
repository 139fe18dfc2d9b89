"""One ingress replica's bot path: its state, built from the config in one place, and its lifecycle.

``ReplicaState`` is the replica's config (``prerender_ray.api.context.ReplicaConfig``: the compiled
config, its findings, the live overrides) plus what the bot path builds from it: the ingress decision (its route
table and key format) with its memo, and the hit and miss paths. It sits in ``ctx.state``, where
every reader of the config finds it, and a change of the live options (routes, default interval,
boost) builds a new one and swaps it in with one assignment: a request holds the state it started
with to the end. ``Services`` is what outlives a config change (the page reader, the pooled origin
and peer clients, the counters, the analytics tallies, the discovery memo); each new state is given
the same one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from prerender_ray import logs, metrics
from prerender_ray.api.bot.counters import Counters
from prerender_ray.api.bot.decisions import DecisionMemo
from prerender_ray.api.bot.hit import Hit
from prerender_ray.api.bot.holders import HolderReader
from prerender_ray.api.bot.key_directory import DirectoryFetcher
from prerender_ray.api.bot.lane import Lane
from prerender_ray.api.bot.llms import LlmsTxt
from prerender_ray.api.bot.markdown import Converter
from prerender_ray.api.bot.memo import HitMemo
from prerender_ray.api.bot.miss import Discovery, Miss
from prerender_ray.api.bot.origin import OriginClient
from prerender_ray.api.bot.page_reader import PageReader
from prerender_ray.api.bot.peer import PeerClient
from prerender_ray.api.bot.signals import SiteSignals
from prerender_ray.api.context import NodeContext, ReplicaConfig
from prerender_ray.config.model import Config
from prerender_ray.serving.bot_policy import VERIFIED, Policies
from prerender_ray.serving.bots import BotRegistry
from prerender_ray.serving.class_stats import ClassStats
from prerender_ray.serving.classify import RESERVED_PATHS, Ingress, Remembered
from prerender_ray.serving.indexnow import KeyFile
from prerender_ray.serving.proxies import Proxies
from prerender_ray.serving.tally import LabelBudget, MissTally, UnroutedTally
from prerender_ray.serving.verification import OUTCOMES as DNS_OUTCOMES
from prerender_ray.serving.verification import RangeError, Verifier, reserved_names
from prerender_ray.serving.web_bot_auth import REASONS as SIGNATURE_REASONS
from prerender_ray.serving.web_bot_auth import WebBotAuth

log = logs.get("bot")
BOT_LABELS = 200  # distinct derived bot names kept as metric labels; the rest count as ~overflow
RANGE_FETCH_S = 20.0  # one read of a bot operator's range URL, whole


class Services:
    """What a replica keeps whatever config it runs. Built from the config it started with: none of
    what they read is a live option (``prerender_ray.config.overrides.LIVE_PATHS``)."""

    def __init__(self, ctx: NodeContext):
        cfg = ctx.cfg
        self.ctx = ctx
        self.bots = BotRegistry.from_config(cfg)  # its memo of User-Agents is kept too
        self.pages = PageReader.for_node(ctx.data_dir, ctx.node.name, ctx.replica)
        # plain hits' whole answers by request shape, over the page log (api/bot/memo.py; None: off)
        self.memo: HitMemo | None = HitMemo()
        # who asks, by request shape without the path (api/bot/decisions.py; None: off)
        self.decisions: DecisionMemo | None = DecisionMemo()
        # a plain hit for a new page by its class's entry, over the page log (api/bot/lane.py; None: off)
        self.lane: Lane | None = Lane()
        self.origin = OriginClient(cfg)
        self.peer = PeerClient(cfg.peer_rescue, cfg.origin.max_body_bytes)
        self.holders = HolderReader(ctx, cfg.cluster)
        self.counters = Counters()
        self.converter = Converter(cfg.markdown.cache_bytes, self.counters)
        self.llms = LlmsTxt(ctx, cfg, self.pages, self.counters) if cfg.llms_txt.enabled else None
        inx = cfg.index_now
        self.index_now_key = KeyFile.of(inx.key, inx.hosts) if inx.enabled else None
        # registry names always pass: only names derived from any User-Agent spend the budget
        self.bot_label = LabelBudget(BOT_LABELS, always=self.bots.labels())
        rep = cfg.ingress.report
        self.report_unrouted = rep.enabled and cfg.ingress.mode == "forwarded"
        self.report_interval_s = rep.interval / 1000
        self.unrouted = UnroutedTally(rep.max_buckets, rep.top_n)
        self.misses = MissTally(cfg.analytics.missed_urls)  # per bot class, for the admin bots report
        self.discovery = Discovery(ctx, self.counters)
        # The client address for verification: the socket peer, or behind server.trustedProxies the
        # client they forward for; X-Forwarded-For from anyone else is never believed.
        self.proxies = Proxies(cfg.server.trusted_proxies)
        verify = cfg.bots.verify
        # a test injects a fake resolver here; nothing else does
        self.verifier = (Verifier(verify, resolver=ctx.bot_resolver, fetch=fetch_ranges)
                         if verify.enabled else None)
        self.ranges_refresh_s = verify.range_refresh / 1000
        # Web Bot Auth: on when the operator allows a signature agent; its directories come through
        # their own bounded client, in the background only.
        wba = cfg.bots.web_bot_auth
        self.directories = DirectoryFetcher(wba, cfg.sitemap.user_agent) if wba.agents else None
        self.web_bot_auth = (WebBotAuth(wba, self.directories.fetch, on_fetch=self._count_fetch,
                                        reserved=reserved_names(verify))
                             if self.directories is not None else None)
        self.class_stats = ClassStats({"signature": (VERIFIED, *SIGNATURE_REASONS), "dns": DNS_OUTCOMES,
                                       "ranges": DNS_OUTCOMES})  # per class, for the admin bots report
        self._report: asyncio.Task | None = None
        self._ranges: asyncio.Task | None = None
        # what each site's robots.txt declares, for the bot policies (bots.contentSignals)
        self.signals = SiteSignals(ctx.store)
        self.signals_on = cfg.bots.content_signals.apply_as_defaults
        self._signals: asyncio.Task | None = None

    def start(self) -> None:
        self.pages.start()
        if self.report_unrouted:
            self._report = asyncio.get_running_loop().create_task(self._report_loop())
        if self.verifier is not None and self.verifier.ranges.files:
            self._ranges = asyncio.get_running_loop().create_task(self._ranges_loop(self.verifier))
        if self.web_bot_auth is not None:
            self.web_bot_auth.start()
        if self.signals_on:
            self._signals = asyncio.get_running_loop().create_task(self.signals.follow())
        self.counters.start()

    async def close(self) -> None:
        if self._report is not None:
            self._report.cancel()
        if self._ranges is not None:
            self._ranges.cancel()
        if self._signals is not None:
            self._signals.cancel()
        if self.verifier is not None:
            self.verifier.close()
        if self.web_bot_auth is not None:
            self.web_bot_auth.close()
        if self.directories is not None:
            await self.directories.aclose()
        self.discovery.stop()
        self.counters.close()
        self.converter.close()
        if self.llms is not None:
            self.llms.close()
        self.pages.close()
        await self.origin.aclose()
        await self.peer.aclose()

    def _count_fetch(self, outcome: str) -> None:
        self.counters.count(metrics.key_directory_fetches, outcome)

    async def _ranges_loop(self, verifier: Verifier) -> None:
        """Read the bots' range files and URLs now and every ``bots.verify.rangeRefresh`` (off the
        loop); a source that fails keeps its last good ranges and is logged at each read."""
        while True:
            try:
                for error in await asyncio.to_thread(verifier.ranges.reload):
                    log.error("bot range file not loaded", error=error, replica=self.ctx.replica)
            except Exception as e:
                metrics.loop_errors.labels("bot-ranges").inc()
                log.error("bot range reload failed", error=repr(e))
            await asyncio.sleep(self.ranges_refresh_s)

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.report_interval_s)
            try:
                tally = self.unrouted
                for line in tally.lines(tally.drain()):
                    log.warning(line, node=self.ctx.node.name, replica=self.ctx.replica)
            except Exception as e:
                metrics.loop_errors.labels("unrouted-report").inc()
                log.error("unrouted report failed", error=repr(e))


def fetch_ranges(url: str, max_bytes: int) -> bytes:
    """A bot operator's published IP ranges from the URL the operator configured (``bots.verify.ranges``;
    never from a request): GET, no redirects, no cookies, no content coding, at most ``max_bytes`` + 1
    bytes read, under one deadline for the whole read. Blocking: the ranges loop runs it in a thread."""
    deadline = time.monotonic() + RANGE_FETCH_S
    try:
        with httpx.Client(timeout=RANGE_FETCH_S, follow_redirects=False, trust_env=False) as client, \
                client.stream("GET", url, headers={"accept-encoding": "identity"}) as r:
            if r.status_code != 200:
                raise RangeError(f"{url}: answered {r.status_code}")
            data = bytearray()
            for chunk in r.iter_raw():
                data += chunk
                if len(data) > max_bytes:
                    break
                if time.monotonic() > deadline:
                    raise RangeError(f"{url}: not read within {RANGE_FETCH_S:g} s")
            return bytes(data)
    except httpx.HTTPError as e:
        raise RangeError(f"{url}: {type(e).__name__}: {str(e)[:200]}") from None


@dataclass(frozen=True, eq=False)
class ReplicaState(ReplicaConfig):
    ingress: Ingress
    hit: Hit
    miss: Miss
    services: Services
    debug_key: str
    analytics: bool
    record_unmatched: bool
    policies: Policies
    resolved: Remembered  # the ingress decisions under this config only

    def resolve(self, method: str, path: str, query: str, headers: dict[str, str]) -> Any:
        """The ingress decision, remembered (``Remembered``)."""
        return self.resolved.resolve(method, path, query, headers)


def build(ctx: NodeContext, current: ReplicaConfig, services: Services) -> ReplicaState:
    """The bot path's state under ``current``: everything built from the config is built here, and
    what outlives a config change comes in as ``services``."""
    cfg: Config = current.cfg
    ingress = current.compiled.ingress(reserved_of(ctx))
    hit = Hit(cfg, ingress.keys, services.pages, services.counters, services.converter)
    miss = Miss(ctx, cfg, hit=hit, pages=services.pages, origin=services.origin, peer=services.peer,
                holders=services.holders, counters=services.counters, discovery=services.discovery)
    return ReplicaState(
        compiled=current.compiled, findings=current.findings, live=current.live,
        ingress=ingress, hit=hit, miss=miss, services=services,
        debug_key=cfg.debug_header.key.strip().lower(), analytics=cfg.analytics.enabled,
        record_unmatched=cfg.analytics.record_unmatched, policies=Policies(cfg.bots, services.bots),
        resolved=Remembered(ingress),
    )


def reserved_of(ctx: NodeContext) -> tuple[str, ...]:
    """The paths of our own routes (set by api.app when it builds the app), never bot requests."""
    return ctx.reserved_paths if ctx.reserved_paths is not None else RESERVED_PATHS


# ---------------------------------------------------------------------------------------- lifecycle


def open_replica(ctx: NodeContext) -> ReplicaState:
    """The replica's bot path, built and started on first use (the replica opens it at start-up)."""
    state = ctx.state
    if isinstance(state, ReplicaState):
        return state
    services = Services(ctx)
    opened = ctx.state = build(ctx, state, services)
    services.start()
    return opened


def opened(ctx: NodeContext) -> ReplicaState | None:
    """The bot path if it is open, without opening it."""
    state = ctx.state
    return state if isinstance(state, ReplicaState) else None


async def close_replica(ctx: NodeContext) -> None:
    state = ctx.state
    if isinstance(state, ReplicaState):
        ctx.state = ReplicaConfig(state.compiled, state.findings, state.live)
        await state.services.close()


def reconfigure(ctx: NodeContext, cfg: Config) -> None:
    """Swap in a config that differs only in live options: what reads the config per request sees
    it at once, and the bot path's ingress decision is rebuilt (with an empty memo)."""
    state = ctx.state
    current = ReplicaConfig.of(cfg, state.live)
    ctx.state = build(ctx, current, state.services) if isinstance(state, ReplicaState) else current


def apply_overrides(ctx: NodeContext, raw: bytes | None) -> bool:
    """Apply the stored live overrides (``o:config``) to this replica if they changed."""
    live = ctx.state.live
    cfg = live.changed(raw, log)
    if cfg is None:
        return False
    reconfigure(ctx, cfg)
    log.info("live config applied", replica=ctx.replica, overrides=live.names())
    return True
