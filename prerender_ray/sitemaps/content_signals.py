"""What a site's robots.txt declares about the use of its content, and the bot classes it concerns.

Two line kinds are read, per user-agent group:

- ``Content-Signal: search=yes, ai-input=yes, ai-train=no`` (Cloudflare's Content Signals Policy,
  contentsignals.org): ``yes``/``no`` per signal; a signal left out states nothing.
- ``Content-Usage: train-ai=n`` (IETF aipref: draft-ietf-aipref-attach-05 section 4 for the robots.txt
  rule, draft-ietf-aipref-vocab-07 for the vocabulary): an optional path, then an RFC 9651 dictionary
  whose labels ``train-ai`` and ``search`` take the tokens ``y``/``n``; anything else (unknown labels,
  parameters, other values) states nothing, and a dictionary that does not parse states nothing at all.

Each declaration maps to one of our bot classes (``CLASS_OF``): search -> ``search``, ai-input ->
``ai-search`` (AI search indexes and the agents a user's question sends), ai-train / train-ai ->
``ai-training``. Where a group says both yes and no for one use (two lines, or both formats), no wins
(the aipref vocabulary's rule for combining statements). Only site-wide lines count (no path, or
``/``); a rule for a narrower path is counted in the report, never applied.

The file is the site's, read as hostile: at most ``MAX_LINES`` such lines of ``MAX_VALUE`` characters
are read, groups and agents are capped, and nothing here raises for any input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import http_sf

SEARCH, AI_INPUT, AI_TRAIN = "search", "ai-input", "ai-train"
USES = (SEARCH, AI_INPUT, AI_TRAIN)
CLASS_OF = {SEARCH: "search", AI_INPUT: "ai-search", AI_TRAIN: "ai-training"}
USE_OF_CLASS = {c: u for u, c in CLASS_OF.items()}
AIPREF_LABELS = {"train-ai": AI_TRAIN, "search": SEARCH}  # draft-ietf-aipref-vocab-07, section 6.1
LABEL_OF = {u: label for label, u in AIPREF_LABELS.items()}
MAX_LINES = 100  # Content-Signal and Content-Usage lines read per file (the rest are counted)
MAX_VALUE = 1024  # characters of one line's value (a longer line is ignored, counted)
MAX_ITEMS = 16  # key=value items read from one Content-Signal line
MAX_GROUPS = 50  # groups with a declaration kept
MAX_READ_GROUPS = 2_000  # groups read (a declaration in a later one is ignored, counted)
MAX_SILENT = 1_000  # agents kept that have a group of their own which declares nothing
MAX_AGENTS = 20  # user agents kept per group
MAX_AGENT = 100  # characters of one user agent
MAX_MEMO = 1024  # tokens resolved per site (names derive from User-Agents)
WILDCARD = "*"


# The product token a site names in robots.txt for each registry bot whose display name differs
# (prerender_ray/serving/bots.py names bots for analytics; a name not listed here is its own token).
# Here rather than in robots.py so the bot policies read it without importing the robots parser.
ROBOTS_TOKENS: dict[str, str] = {
    "Google InspectionTool": "Googlebot",  # Google: it obeys Googlebot's group
    "Baidu Spider": "Baiduspider",
    "Naver Yeti": "Yeti",
    "Sogou Spider": "Sogou web spider",
    "Screaming Frog": "Screaming Frog SEO Spider",
}


def robots_token(bot_name: str) -> str:
    """The robots.txt user-agent token of a registry bot."""
    return ROBOTS_TOKENS.get(bot_name, bot_name)


def combine(old: bool | None, new: bool | None) -> bool | None:
    """Two statements on one use: a no wins, then a yes, else nothing (aipref vocab, 7.1)."""
    if old is False or new is False:
        return False
    return True if (old or new) else None


@dataclass
class Group:
    agents: list[str]  # lower-case product tokens; "*" for the default group
    signal: dict[str, bool] = field(default_factory=dict)  # Content-Signal, by use
    usage: dict[str, bool] = field(default_factory=dict)  # Content-Usage, by use

    def uses(self) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for use in USES:
            v = combine(self.signal.get(use), self.usage.get(use))
            if v is not None:
                out[use] = v
        return out

    def to_row(self) -> dict:
        """As the site wrote it: Content-Signal in yes/no, Content-Usage in aipref labels and y/n."""
        return {"agents": self.agents, "contentSignal": {u: _yn(v) for u, v in self.signal.items()},
                "contentUsage": {LABEL_OF[u]: "y" if v else "n" for u, v in self.usage.items()}}


@dataclass
class Signals:
    """What one robots.txt declares: its groups with a declaration, and what was left unread."""

    groups: list[Group] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)  # agents whose own groups declare nothing
    path_rules: int = 0  # declarations for a narrower path than the site (never applied)
    ignored: int = 0  # lines past MAX_LINES, too long, or that state nothing we read
    _memo: dict[str, dict[str, bool]] = field(default_factory=dict, repr=False, compare=False)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def for_token(self, token: str) -> dict[str, bool]:
        """use -> allowed, for a crawler by its robots.txt product token: the groups naming it (any
        case), else the ``*`` groups (RFC 9309 2.2.1), merged."""
        key = token.lower()
        found = self._memo.get(key)
        if found is None:
            named = [g for g in self.groups if key in g.agents]
            out: dict[str, bool] = {}
            if not named and key not in self.silent:  # a bot whose own group declares nothing gets nothing
                named = [g for g in self.groups if WILDCARD in g.agents]
            for g in named:
                for use, v in g.uses().items():
                    out[use] = combine(out.get(use), v)  # type: ignore[assignment]
            if len(self._memo) >= MAX_MEMO:
                self._memo.clear()
            found = self._memo[key] = out
        return found

    def to_row(self) -> dict:
        return {"groups": [g.to_row() for g in self.groups], "silent": self.silent,
                "pathRules": self.path_rules, "ignored": self.ignored}

    @classmethod
    def from_row(cls, row: object) -> Signals:
        """A stored declaration; anything unreadable is no declaration (rows written before had none)."""
        if not isinstance(row, Mapping):
            return cls()
        groups: list[Group] = []
        for g in row.get("groups") or ():
            if not isinstance(g, Mapping) or len(groups) >= MAX_GROUPS:
                continue
            agents = g.get("agents")
            agents = [a for a in agents if isinstance(a, str)][:MAX_AGENTS] if isinstance(agents, list) else []
            usage = g.get("contentUsage")
            usage = {u: usage[lb] == "y" for lb, u in AIPREF_LABELS.items() if usage.get(lb) in ("y", "n")} \
                if isinstance(usage, Mapping) else {}
            groups.append(Group(agents, _uses_of(g.get("contentSignal")), usage))
        silent = row.get("silent")
        silent = [a for a in silent if isinstance(a, str)][:MAX_SILENT] if isinstance(silent, list) else []
        return cls(groups, silent, _count(row.get("pathRules")), _count(row.get("ignored")))


def parse(text: str) -> Signals:
    """The declarations of a decoded robots.txt (``robots.decode``)."""
    out = Signals()
    current: Group | None = None  # the group being read
    in_agents, kept, lines = False, True, 0
    preamble = Group([WILDCARD])  # lines before any User-agent: read as the site-wide group
    declared: list[Group] = []
    for raw in text.splitlines():
        name, sep, value = raw.split("#", 1)[0].partition(":")
        name = name.strip().lower()
        if not sep or name in ("sitemap", "host"):  # site-wide lines do not end a group
            continue
        if name in ("user-agent", "useragent"):
            if not in_agents or current is None:
                current, in_agents, kept = Group([]), True, len(declared) < MAX_READ_GROUPS
                if kept:
                    declared.append(current)
            agent = value.strip().lower()[:MAX_AGENT]
            if agent and len(current.agents) < MAX_AGENTS and agent not in current.agents:
                current.agents.append(agent)
            continue
        in_agents = False
        if name not in ("content-signal", "content-usage"):
            continue
        lines += 1
        value = value.strip(" \t")
        if lines > MAX_LINES or len(value) > MAX_VALUE or not kept:
            out.ignored += 1
            continue
        path, statement = _split_path(value)
        if path not in ("", "/"):
            out.path_rules += 1
            continue
        target = current if current is not None else preamble
        found = _content_signal(statement) if name == "content-signal" else _content_usage(statement)
        if not found:
            out.ignored += 1
            continue
        into = target.signal if name == "content-signal" else target.usage
        for use, v in found.items():
            into[use] = combine(into.get(use), v)  # type: ignore[assignment]
    groups = ([preamble] if preamble.signal or preamble.usage else []) + declared
    out.groups = [g for g in groups if (g.signal or g.usage) and g.agents][:MAX_GROUPS]
    if out.groups:
        speaking = {a for g in out.groups for a in g.agents}
        silent = dict.fromkeys(a for g in declared if not (g.signal or g.usage) for a in g.agents
                               if a != WILDCARD and a not in speaking)
        out.silent = list(silent)[:MAX_SILENT]
    return out


def _split_path(value: str) -> tuple[str, str]:
    """(path, statement): a value starting with ``/`` has a path up to the first SP or HTAB
    (draft-ietf-aipref-attach-05, 4.2)."""
    if not value.startswith("/"):
        return "", value
    for i, ch in enumerate(value):
        if ch in " \t":
            return value[:i], value[i + 1:].strip(" \t")
    return value, ""


def _content_signal(statement: str) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for item in statement.split(",", MAX_ITEMS)[:MAX_ITEMS]:
        key, eq, v = item.partition("=")
        key, v = key.strip().lower(), v.strip().lower()
        if eq and key in USES and v in ("yes", "no"):
            out[key] = combine(out.get(key), v == "yes")  # type: ignore[assignment]
    return out


def _content_usage(statement: str) -> dict[str, bool]:
    """An RFC 9651 dictionary, read as bytes (vocab-07 6.3: it is ASCII; anything else fails)."""
    try:
        parsed = http_sf.parse(statement.encode("ascii"), tltype="dictionary")
    except Exception:  # UnicodeEncodeError, StructuredFieldError: the preferences are unknown
        return {}
    out: dict[str, bool] = {}
    if not isinstance(parsed, dict):
        return out
    for label, use in AIPREF_LABELS.items():
        member = parsed.get(label)
        value = member[0] if isinstance(member, tuple) and member else None
        if isinstance(value, http_sf.Token) and str(value) in ("y", "n"):
            out[use] = str(value) == "y"
    return out


def _yn(v: bool) -> str:
    return "yes" if v else "no"


def _uses_of(raw: object) -> dict[str, bool]:
    if not isinstance(raw, Mapping):
        return {}
    return {u: raw[u] == "yes" for u in USES if raw.get(u) in ("yes", "no")}


def _count(raw: object) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0


# ------------------------------------------------------------------------------------ the report


def declared_view(signals: Signals) -> dict:
    """The report's view of what the site declares: per group, and for the ``*`` group by use."""
    return {**signals.to_row(), "default": {u: _yn(v) for u, v in signals.for_token(WILDCARD).items()}}


def served_view(signals: Signals, policies: Any, tokens: Iterable[tuple[str, str]]) -> list[dict]:
    """Per class a site's declaration concerns: what it declares (``*`` group), the policy an
    operator set for the class (if any), and what a bot of that class with no group of its own is
    served (``effective``); then each registry bot whose own group declares otherwise.
    ``policies`` is a ``bot_policy.Policies``; ``tokens`` are (bot name, robots.txt token)."""
    out = []
    default = signals.for_token(WILDCARD)
    for use in USES:
        cls = CLASS_OF[use]
        declared = default.get(use)
        d = policies.for_class(cls, signals, WILDCARD)
        row = {"class": cls, "signal": use, "declared": None if declared is None else _yn(declared),
               "operatorPolicy": policies.explicit(cls), "effective": d.serve, "discover": d.discover,
               "source": d.source}
        bots: list[dict] = []
        for name, token in tokens:
            if policies.registry.class_of(name) != cls or not any(token.lower() in g.agents for g in signals.groups):
                continue
            own = signals.for_token(token).get(use)
            if own is not None and own != declared and len(bots) < 20:
                b = policies.decide(name, site=signals)
                bots.append({"bot": name, "declared": _yn(own), "effective": b.serve, "source": b.source})
        row["bots"] = bots
        out.append(row)
    return out
