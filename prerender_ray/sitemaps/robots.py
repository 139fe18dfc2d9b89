"""robots.txt: what a fetch outcome means, the parse of a cut body, its ``Sitemap:`` lines, and the
bots a policy serves although the site's robots.txt disallows them.

Outcomes follow RFC 9309 and Google's crawler:

- 2xx: the body is the rules. Only the first ``robots.maxBytes`` (500 KiB, what Google reads) are
  read and parsed; a cut body loses its last, partial line so a half ``Disallow: /pri`` is not a
  rule. Bytes that are not UTF-8 are replaced and a line that is no directive is ignored, so binary
  garbage parses to no rules (allow all).
- 4xx (and a redirect chain that ends nowhere usable): "unavailable", which means allow all.
- 5xx, a timeout, a network error: "unreachable": the rules are unknown; the last good copy stays in
  force, and with none there is nothing to judge by.

Parsing is protego's (the matching rules Google documents: the longest matching user-agent group,
``*`` as the fallback, the longest matching path rule). What the site declares about the use of its
content (``Content-Signal``, ``Content-Usage``) is ``content_signals``'s, parsed with the body and
kept in the record (a record written before has none). This module holds no Ray and no HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from protego import Protego

from prerender_ray.serving.bots import DEFAULT_BOTS
from prerender_ray.sitemaps.content_signals import ROBOTS_TOKENS as ROBOTS_TOKENS
from prerender_ray.sitemaps.content_signals import Signals, declared_view, robots_token, served_view
from prerender_ray.sitemaps.content_signals import parse as parse_signals
from prerender_ray.sitemaps.rules import sample_text

if TYPE_CHECKING:
    from prerender_ray.config.model import Config
    from prerender_ray.serving.origin_policy import OriginPolicy

OK, UNAVAILABLE, UNREACHABLE = "ok", "unavailable", "unreachable"
MAX_GROUPS = 100  # user-agent groups listed in a report (the rest are counted)
MAX_AGENTS = 20  # user agents listed per group
MAX_IGNORED = 20  # ignored Sitemap: lines listed (the rest are counted)
_BOM = "\ufeff".encode()

def served_today(bot_names: Iterable[str]) -> dict[str, str]:
    """token -> serve mode with every registered bot prerendered (the default policy)."""
    return {robots_token(n): "prerender" for n in bot_names}


def served_by(cfg: Config) -> dict[str, str]:
    """token -> the serve mode the config's bot policy (``bots``) gives each registry bot, as a
    verified claim; where two registry names share a token, the one served wins (a conflict is
    about a bot that is served)."""
    from prerender_ray.serving.bot_policy import Policies
    from prerender_ray.serving.bots import BotRegistry

    policies = Policies(cfg.bots, BotRegistry.from_config(cfg))
    bots = cfg.analytics.bots
    out: dict[str, str] = {}
    for name in (b.name for b in (DEFAULT_BOTS if bots is None else bots)):
        token, mode = robots_token(name), policies.decide(name).serve
        if out.get(token) in (None, "deny"):
            out[token] = mode
    return out


def signals_report(signals: Signals, cfg: Config) -> dict:
    """What a site declares (``Content-Signal``, ``Content-Usage``) and, per class it concerns, what
    the config serves there (declared vs effective: ``bots.contentSignals``)."""
    from prerender_ray.serving.bot_policy import Policies
    from prerender_ray.serving.bots import BotRegistry

    bots = cfg.analytics.bots
    tokens = dict.fromkeys((b.name, robots_token(b.name)) for b in (DEFAULT_BOTS if bots is None else bots))
    policies = Policies(cfg.bots, BotRegistry.from_config(cfg))
    return {**declared_view(signals), "applyAsDefaults": cfg.bots.content_signals.apply_as_defaults,
            "classes": served_view(signals, policies, tokens)}


def robots_url(origin: str) -> str:
    return origin.rstrip("/") + "/robots.txt"


def origin_for(domain: str, default_scheme: str) -> str:
    """``shop.test``, ``shop.test:8080`` or ``http://shop.test:8080`` as an origin,
    ``scheme://host[:port]`` as canonical URLs spell it; ValueError says what is wrong."""
    from prerender_ray.serving.origin_policy import label, origin_of

    text = domain.strip()
    if not text or len(text) > 300:
        raise ValueError("domain must be a host, host:port or an http(s) origin")
    url = text if "://" in text else f"{default_scheme}://{text}"
    parts = origin_of(url if url.count("/") > 2 else url + "/")
    if parts is None or url.split("://", 1)[1].rstrip("/").count("/") or "?" in url or "#" in url or "@" in url:
        raise ValueError(f"{text[:200]!r} is not a host, host:port or an http(s) origin")
    scheme, host, port = parts
    return f"{scheme}://{label(scheme, host, port)}"


def configured_origins(domains: Iterable[str], default_scheme: str) -> list[str]:
    """The origin of each ``domains`` entry (``host:*``: the scheme's default port)."""
    from prerender_ray.serving.origin_policy import parse_entry

    out: list[str] = []
    for text in domains:
        entry = parse_entry(text)
        origin = f"{default_scheme}://{entry.host}" + (f":{entry.port}" if entry.port is not None else "")
        origin = origin_for(origin, default_scheme)
        if origin not in out:
            out.append(origin)
    return out


# ------------------------------------------------------------------------------------------ body


def cut(body: bytes, max_bytes: int) -> tuple[bytes, bool]:
    """The first ``max_bytes`` of a body, ending at a line end when cut: (bytes, truncated)."""
    if len(body) <= max_bytes:
        return body, False
    head = body[:max_bytes]
    end = max(head.rfind(b"\n"), head.rfind(b"\r"))
    return (head[:end + 1] if end >= 0 else b""), True


def decode(body: bytes) -> str:
    """robots.txt is UTF-8 (RFC 9309); anything else is replaced, never an error."""
    if body.startswith(_BOM):
        body = body[len(_BOM):]
    return body.decode("utf-8", "replace").replace("\x00", "")


def _groups(text: str) -> tuple[list[dict], int]:
    """The user-agent groups in file order, each with its agents and rule count (bounded), and how
    many groups there are in all. Protego keeps groups merged by agent; a report shows the file."""
    groups: list[dict] = []
    total, in_agents = 0, False
    for raw in text.splitlines():
        name, sep, value = raw.split("#", 1)[0].partition(":")
        name, value = name.strip().lower(), value.strip()
        if not sep or name in ("sitemap", "host"):  # site-wide lines do not end a group
            continue
        if name in ("user-agent", "useragent"):
            if not in_agents:
                total, in_agents = total + 1, True
                if total <= MAX_GROUPS:
                    groups.append({"userAgents": [], "allow": 0, "disallow": 0})
            if total <= MAX_GROUPS and value and len(groups[-1]["userAgents"]) < MAX_AGENTS:
                groups[-1]["userAgents"].append(value[:100])
            continue
        in_agents = False
        if name in ("allow", "disallow") and value and 0 < total <= MAX_GROUPS:
            groups[-1][name] += 1
    return groups, total


@dataclass(frozen=True)
class SitemapLines:
    """The ``Sitemap:`` lines to walk (allowed by ``domains``, deduplicated, at most ``limit``) and
    what was left out."""

    urls: list[str]
    ignored: list[dict]  # {url, reason}, at most MAX_IGNORED
    ignored_count: int
    over_limit: int  # allowed lines past the limit
    total: int


def sitemap_lines(lines: Iterable[str], policy: OriginPolicy | None, limit: int) -> SitemapLines:
    urls: list[str] = []
    seen: set[str] = set()
    ignored: list[dict] = []
    ignored_count = over = total = 0
    for line in lines:
        total += 1
        url = line.strip()
        reason = policy.url_refusal(url) if policy is not None else None
        if reason is None and not url.lower().startswith(("http://", "https://")):
            reason = f"{url[:200]!r} is not an absolute http(s) URL"
        if reason is not None:
            ignored_count += 1
            if len(ignored) < MAX_IGNORED:
                ignored.append({"url": sample_text(url), "reason": sample_text(reason)})
        elif url in seen:
            continue
        elif len(urls) >= limit:
            over += 1
        else:
            seen.add(url)
            urls.append(url)
    return SitemapLines(urls, ignored, ignored_count, over, total)


# ------------------------------------------------------------------------------------------ parse


@dataclass
class ParsedRobots:
    """One robots.txt as fetched: its outcome, and with a body, its rules."""

    url: str
    state: str  # ok | unavailable | unreachable
    status: int | None = None
    fetched_at: int | None = None
    size: int = 0  # bytes parsed (after the cut)
    truncated: bool = False
    text: str = ""
    error: str | None = None
    final_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    signals: Signals = field(default_factory=Signals)  # what the body declares about the use of content

    @classmethod
    def from_body(cls, url: str, body: bytes, *, status: int = 200, max_bytes: int,
                  fetched_at: int | None = None, truncated: bool = False, **kw: Any) -> ParsedRobots:
        """A 2xx body: cut at ``max_bytes`` (it may be cut already: ``truncated``) and decoded."""
        data, cut_here = cut(body, max_bytes)
        text = decode(data)
        return cls(url, OK, status, fetched_at, len(data), truncated or cut_here, text, **kw,
                   signals=parse_signals(text))

    @cached_property
    def rules(self) -> Protego | None:
        """None when the rules are unknown (unreachable with no copy); empty rules allow all."""
        if self.state == UNREACHABLE:
            return None
        return Protego.parse(self.text if self.state == OK else "")

    def allows(self, token: str, path: str = "/") -> bool | None:
        """Whether ``token`` may crawl ``path``; None when the rules are unknown."""
        rules = self.rules
        return None if rules is None else rules.can_fetch(path, token)

    @property
    def sitemaps(self) -> list[str]:
        rules = self.rules
        return list(rules.sitemaps) if rules is not None else []

    def summary(self, policy: OriginPolicy | None, limit: int) -> dict:
        """The report's view: outcome, size, sitemaps (as walked and as ignored), groups."""
        lines = sitemap_lines(self.sitemaps, policy, limit)
        groups, total = _groups(self.text) if self.state == OK else ([], 0)
        return {"url": self.url, "state": self.state, "status": self.status, "fetchedAt": self.fetched_at,
                "finalUrl": self.final_url, "size": self.size, "truncated": self.truncated,
                "error": self.error, "sitemaps": lines.urls, "sitemapLines": lines.total,
                "sitemapsIgnored": lines.ignored, "sitemapsIgnoredCount": lines.ignored_count,
                "sitemapsOverLimit": lines.over_limit, "groups": groups, "groupCount": total,
                "contentSignals": declared_view(self.signals)}

    def to_row(self) -> dict:
        return {"url": self.url, "state": self.state, "status": self.status, "fetchedAt": self.fetched_at,
                "size": self.size, "truncated": self.truncated, "text": self.text, "error": self.error,
                "finalUrl": self.final_url, "signals": self.signals.to_row()}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ParsedRobots:
        state, text, size = row.get("state"), row.get("text"), row.get("size")
        text = text if isinstance(text, str) else ""
        return cls(str(row.get("url") or ""), state if state in (OK, UNAVAILABLE) else UNREACHABLE,
                   row.get("status"), row.get("fetchedAt"), size if isinstance(size, int) else len(text),
                   bool(row.get("truncated")), text, row.get("error"), row.get("finalUrl"),
                   signals=Signals.from_row(row.get("signals")))


def settle(last_good: ParsedRobots | None, fetched: ParsedRobots) -> ParsedRobots:
    """The copy in force after a fetch: an unreachable robots.txt keeps the last good copy (a body
    or an unavailable answer), noting the failed attempt; anything else replaces it."""
    if fetched.state != UNREACHABLE or last_good is None or last_good.state == UNREACHABLE:
        return fetched
    kept = ParsedRobots(last_good.url, last_good.state, last_good.status, last_good.fetched_at,
                        last_good.size, last_good.truncated, last_good.text, last_good.error,
                        last_good.final_url, signals=last_good.signals)
    kept.extra["lastAttempt"] = {"at": fetched.fetched_at, "status": fetched.status, "error": fetched.error}
    return kept


# --------------------------------------------------------------------------------------- conflicts


@dataclass(frozen=True)
class Conflict:
    """A bot the policy serves on a path the site's robots.txt disallows to it."""

    bot: str  # the robots.txt token
    mode: str  # the serve mode the policy gives it
    path: str

    def as_dict(self) -> dict:
        return {"bot": self.bot, "mode": self.mode, "path": self.path,
                "message": f"robots.txt disallows {self.path} to {self.bot}, but the policy serves it "
                           f"({self.mode})"}


def report(robots: ParsedRobots, policy: OriginPolicy | None, limit: int, served: Mapping[str, str],
           paths: Sequence[str] = ("/",)) -> dict:
    """The summary and the conflicts of one robots.txt (CPU-bound on a big file: run it off the loop)."""
    return {**robots.summary(policy, limit), **robots.extra,
            "conflicts": [c.as_dict() for c in disallowed(robots, served, paths)],
            "rulesKnown": robots.rules is not None}


def disallowed(robots: ParsedRobots, served: Mapping[str, str],
               paths: Sequence[str] = ("/",)) -> list[Conflict]:
    """Every (bot, path) that ``served`` serves (any mode but ``deny``) and robots.txt disallows.
    Unknown rules (unreachable, no copy) give no conflict: nothing is known either way."""
    if robots.rules is None:
        return []
    out = []
    for token, mode in sorted(served.items()):
        if mode == "deny":
            continue
        for path in paths:
            if robots.allows(token, path) is False:
                out.append(Conflict(token, mode, path))
    return out


def check_file(cfg: Config, body: bytes, name: str) -> list[str]:
    """``config check --robots FILE``: the conflicts of a robots.txt saved locally (no network)."""
    robots = ParsedRobots.from_body(name, body, max_bytes=cfg.robots.max_bytes)
    lines = [f"warn: robots.txt {name}: {c.as_dict()['message']}" for c in disallowed(robots, served_by(cfg))]
    if robots.truncated:
        lines.insert(0, f"warn: robots.txt {name}: read up to {robots.size} bytes only (robots.maxBytes)")
    return lines
