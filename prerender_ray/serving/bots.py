"""Bot names for analytics: which crawler sent a request, from its User-Agent.

The registry is one case-insensitive regex over every match string, longest first, each followed by
``/ ; )``, whitespace or the end (so ``googleother`` cannot match ``GoogleOther-Image``, which has
its own entry). There is no leading boundary: ``yeti`` also matches inside ``Spaghettiyeti/1``. The
leftmost match wins, and the longest entry at that position. A UA the registry misses is labelled
with the name it declares (``deriveUnknownBots``), else ``other``.

Each entry has a class (``BOT_CLASSES``): what ``bots.classes`` policies are keyed by
(``prerender_ray.serving.bot_policy``). A derived name, ``other`` and ``debug`` are class ``other``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from prerender_ray.config.model import Config

OTHER = "other"
DEBUG = "debug"
# search: classic engines; ai-search: AI search indexes and the fetchers a user's question triggers;
# ai-training: crawlers that collect training data; social: link previews; seo-tool: audits.
BOT_CLASSES = ("search", "ai-search", "ai-training", "social", "seo-tool", "other")
DEBUG_HEADER = ("harper", "pre-render")  # the reference's marker for its own test traffic
MEMO_SIZE = 1000
# Only a User-Agent's first 1,024 characters name its bot (crawlers' are under 300): a head may be
# 64 KiB, and naming one that long took 40 ms of regular expressions; the memo's keys stay small too.
MAX_AGENT_CHARS = 1024


class BotEntry(NamedTuple):
    name: str
    match: str
    bot_class: str = ""  # empty: the built-in entry's class of this name, else other


# Match strings are what a request User-Agent carries (robots.txt-only tokens such as
# Google-Extended never appear in a request). Display names follow the reference's registry.
DEFAULT_BOTS: tuple[BotEntry, ...] = (
    # search engines
    BotEntry("Googlebot-Image", "googlebot-image", "search"),
    BotEntry("Googlebot-Video", "googlebot-video", "search"),
    BotEntry("Google InspectionTool", "google-inspectiontool", "search"),
    BotEntry("GoogleOther-Image", "googleother-image", "other"),
    BotEntry("GoogleOther-Video", "googleother-video", "other"),
    BotEntry("GoogleOther", "googleother", "other"),
    BotEntry("Storebot-Google", "storebot-google", "search"),
    BotEntry("AdsBot-Google", "adsbot-google", "search"),
    BotEntry("Googlebot", "googlebot", "search"),
    BotEntry("Bingbot", "bingbot", "search"),
    BotEntry("DuckDuckBot", "duckduckbot-https", "search"),
    BotEntry("DuckDuckBot", "duckduckbot", "search"),
    BotEntry("Applebot", "applebot", "search"),
    BotEntry("YandexBot", "yandexbot", "search"),
    BotEntry("Baidu Spider", "baiduspider", "search"),
    BotEntry("SeznamBot", "seznambot", "search"),
    BotEntry("Naver Yeti", "yeti", "search"),
    BotEntry("Sogou Spider", "sogou", "search"),
    BotEntry("PetalBot", "petalbot", "search"),
    BotEntry("MojeekBot", "mojeekbot", "search"),
    # AI crawlers and assistants
    BotEntry("GPTBot", "gptbot", "ai-training"),
    BotEntry("OAI-SearchBot", "oai-searchbot", "ai-search"),
    BotEntry("ChatGPT-User", "chatgpt-user", "ai-search"),
    BotEntry("ClaudeBot", "claudebot", "ai-training"),
    BotEntry("Claude-User", "claude-user", "ai-search"),
    BotEntry("Claude-SearchBot", "claude-searchbot", "ai-search"),
    BotEntry("PerplexityBot", "perplexitybot", "ai-search"),
    BotEntry("Perplexity-User", "perplexity-user", "ai-search"),
    BotEntry("Google-CloudVertexBot", "google-cloudvertexbot", "ai-search"),
    BotEntry("CCBot", "ccbot", "ai-training"),
    BotEntry("Bytespider", "bytespider", "ai-training"),
    BotEntry("Meta-ExternalAgent", "meta-externalagent", "ai-training"),
    BotEntry("Meta-ExternalFetcher", "meta-externalfetcher", "ai-search"),
    BotEntry("FacebookBot", "facebookbot", "ai-training"),
    BotEntry("Amazonbot", "amazonbot", "ai-training"),
    BotEntry("DuckAssistBot", "duckassistbot", "ai-search"),
    BotEntry("MistralAI-User", "mistralai-user", "ai-search"),
    BotEntry("YouBot", "youbot", "ai-search"),
    BotEntry("AI2Bot", "ai2bot", "ai-training"),
    BotEntry("Diffbot", "diffbot", "ai-training"),
    # SEO and site-audit tools
    BotEntry("AhrefsBot", "ahrefsbot", "seo-tool"),
    BotEntry("SemrushBot", "semrushbot", "seo-tool"),
    BotEntry("MJ12bot", "mj12bot", "seo-tool"),
    BotEntry("Rogerbot", "rogerbot", "seo-tool"),
    BotEntry("DotBot", "dotbot", "seo-tool"),
    BotEntry("Screaming Frog", "screaming frog seo spider", "seo-tool"),
    BotEntry("Botify", "botify", "seo-tool"),
    BotEntry("Deepcrawl", "deepcrawl", "seo-tool"),
    BotEntry("OnCrawl", "oncrawl", "seo-tool"),
    BotEntry("Sitebulb", "sitebulb", "seo-tool"),
    # link previews (they render shared pages, so they see the prerendered HTML)
    BotEntry("facebookexternalhit", "facebookexternalhit", "social"),
    BotEntry("Twitterbot", "twitterbot", "social"),
    BotEntry("LinkedInBot", "linkedinbot", "social"),
    BotEntry("Slackbot", "slackbot-linkexpanding", "social"),
    BotEntry("Slackbot", "slackbot", "social"),
    BotEntry("Discordbot", "discordbot", "social"),
    BotEntry("TelegramBot", "telegrambot", "social"),
    BotEntry("Pinterestbot", "pinterestbot", "social"),
    BotEntry("WhatsApp", "whatsapp", "social"),
    BotEntry("redditbot", "redditbot", "social"),
)


class BotRegistry:
    """A compiled registry with a bounded memo per User-Agent. Build one per config."""

    def __init__(
        self, bots: Iterable[Any] | None = None, *, derive_unknown: bool = True, memo_size: int = MEMO_SIZE
    ):
        entries = [e for e in map(_entry, DEFAULT_BOTS if bots is None else bots) if e is not None]
        entries.sort(key=lambda e: -len(e.match))  # stable: equal lengths keep their order
        # Later entries win on a shared match string, as in the reference.
        self._names = {e.match.lower(): e.name for e in entries}
        # A name's class: its entry's, else the built-in entry's of that name (a replaced registry
        # keeps the classes of the crawlers it still names), else other.
        self._classes = {e.name.lower(): e.bot_class for e in DEFAULT_BOTS}
        self._classes.update({e.name.lower(): e.bot_class for e in entries if e.bot_class})
        alternation = "|".join(re.escape(e.match) for e in entries)
        self._regex = re.compile(f"({alternation})(?=[/;)\\s]|\\Z)", re.IGNORECASE) if entries else None
        self.derive_unknown = derive_unknown
        self._memo = lru_cache(maxsize=memo_size)(self._resolve)

    @classmethod
    def from_config(cls, cfg: Config) -> BotRegistry:
        return cls(cfg.analytics.bots, derive_unknown=cfg.analytics.derive_unknown_bots)

    def name(self, user_agent: str | None) -> str:
        """The bot name for a User-Agent: a registry name, a derived name, or ``other``."""
        if not user_agent:
            return OTHER
        return self._memo(user_agent[:MAX_AGENT_CHARS])

    def class_of(self, name: str) -> str:
        """The class of a bot name (``other`` for a derived name, ``other`` and ``debug``)."""
        return self._classes.get(name.lower(), OTHER)

    def names(self) -> frozenset[str]:
        """Every registry name, lower-cased (what per-bot policies may name besides derived ones)."""
        return frozenset(self._classes)

    def labels(self) -> frozenset[str]:
        """Every name ``name_for`` can give besides derived ones: registry names, ``other``, ``debug``."""
        return frozenset({*self._names.values(), OTHER, DEBUG})

    def name_for(self, headers: Mapping[str, str]) -> str:
        """``debug`` for the ``harper: pre-render`` marker, else ``name(user-agent)``."""
        if headers.get(DEBUG_HEADER[0]) == DEBUG_HEADER[1]:
            return DEBUG
        return self.name(headers.get("user-agent"))

    def _resolve(self, user_agent: str) -> str:
        if self._regex is not None:
            m = self._regex.search(user_agent)
            if m is not None:
                return self._names.get(m.group(1).lower(), OTHER)
        if self.derive_unknown:
            return derive_bot_name(user_agent) or OTHER
        return OTHER


def _entry(raw: Any) -> BotEntry | None:
    if isinstance(raw, Mapping):
        name, match, cls = raw.get("name"), raw.get("match"), raw.get("bot_class")
    else:
        name, match, cls = (getattr(raw, "name", None), getattr(raw, "match", None),
                            getattr(raw, "bot_class", None))
    if isinstance(name, str) and isinstance(match, str) and match:
        return BotEntry(name, match, cls if cls in BOT_CLASSES else "")
    return None


# ------------------------------------------------------------------------------------- derivation

# Words that name a browser, engine or platform, never a crawler: a UA reducing to these only is a
# browser, not a self-identification.
_GENERIC = frozenset({
    "mozilla", "applewebkit", "webkit", "khtml", "gecko", "presto", "like", "compatible", "version",
    "chrome", "chromium", "crios", "headlesschrome", "safari", "firefox", "fxios", "opera", "opr",
    "edg", "edge", "edga", "edgios", "msie", "trident", "samsungbrowser", "ucbrowser",
    "windows", "win64", "wow64", "x11", "linux", "ubuntu", "android", "iphone", "ipad", "ipod",
    "macintosh", "mac", "os", "x", "nt", "cpu", "u", "wv", "mobile", "tablet", "arm64", "x86_64", "intel",
})
_BARE_KEYWORDS = frozenset({"bot", "bots", "robot", "robots", "crawler", "crawlers", "spider", "spiders",
                            "slurp"})
_LINKISH = re.compile(r"://|@|www\.", re.IGNORECASE)
_URL_OR_EMAIL = re.compile(r"\+?(?:https?://|www\.)\S+|\S+@\S+", re.IGNORECASE)
_COMPATIBLE_SLOT = re.compile(r"\bcompatible;\s*([^;()]+)", re.IGNORECASE)
_LEADING_PRODUCT = re.compile(r"([A-Za-z][A-Za-z0-9 ._-]{0,49}?)\s*/")
_KEYWORD_TOKEN = re.compile(
    r"(?<![A-Za-z0-9._-])[A-Za-z][A-Za-z0-9._-]*?(?:bot|crawler|spider|slurp)[A-Za-z0-9._-]*", re.IGNORECASE
)
_NAME_SHAPE = re.compile(r"[A-Za-z][A-Za-z0-9 ._-]{1,39}")
_VERSION_TAIL = re.compile(r"\s+v?\d[\d.~_]*\Z")


def derive_bot_name(user_agent: str) -> str | None:
    """The name a self-identifying crawler declares, or None.

    Candidates, most reliable first: the ``compatible; Name/1.0`` slot, a leading product token
    (``CCBot/2.0``, ``Screaming Frog SEO Spider/21.4``), then any token holding bot, crawler, spider
    or slurp. URLs and e-mail addresses are removed first, so ``+http://x/bot.html`` names nothing.
    """
    text = _URL_OR_EMAIL.sub(" ", user_agent) if _LINKISH.search(user_agent) else user_agent
    slot = _COMPATIBLE_SLOT.search(text)
    if slot and (name := _clean(slot.group(1))):
        return name
    head = _LEADING_PRODUCT.match(text)
    if head and (name := _clean(head.group(1))):
        return name
    for token in _KEYWORD_TOKEN.finditer(text):
        if name := _clean(token.group(0)):
            return name
    return None


def _clean(candidate: str) -> str | None:
    """A candidate cut at ``/``, without a trailing version; None unless it looks like a name."""
    name = _VERSION_TAIL.sub("", candidate.partition("/")[0].strip())
    if not _NAME_SHAPE.fullmatch(name):
        return None
    words = name.lower().split()
    if len(words) > 4 or all(w in _GENERIC for w in words):
        return None
    if len(words) == 1 and words[0] in _BARE_KEYWORDS:
        return None
    return name
