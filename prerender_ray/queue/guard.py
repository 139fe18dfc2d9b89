"""A bad render never replaces a good page: measure a render, judge it against the stored page.

Pure. ``scan`` measures a decoded page (visible text, links, bytes) and matches the site's not-found
markers; ``judge`` compares the measure with the stored page's, which the planner keeps in an
internal stored header (``MEASURE_HEADER``, never served), so judging a result reads no stored body.

Verdicts (``why``): ``not-found`` (a marker matched), ``empty-shell`` (visible text below
``minTextChars``), ``lost-text`` / ``lost-links`` (below ``keepFraction`` of a stored page that had
substantial text or links). Actions: ``refused`` (the stored page stays; the result takes the
failure lane), ``stored`` (there is no good page to keep: a first render, or a stored page that was
itself judged bad, is stored and marked ``suspect``), ``accepted`` (a loss refused ``acceptAfter``
times in a row is a real content change). Shells and not-found views are never accepted over a good
page: a site whose renderer broke keeps its last good pages.

Bounded: one regex tokenizer pass in C over the page (the counts in one C pass where the build is
fresh: ``native/page_measure.c``), at most ``MAX_TOKENS`` Python steps (script,
style and comment boundaries), linear patterns only (no ``.*?`` that an unclosed tag could make
quadratic). Broken HTML, no body, deep nesting or 20 MB of text cost one pass, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prerender_ray import native
from prerender_ray.config.render import Guard

MEASURE_HEADER = "x-prerender-measure"  # internal: the serve path drops it (serving/responses.py)
WHYS = ("not-found", "empty-shell", "lost-text", "lost-links")
LOSSES = ("lost-text", "lost-links")
MAX_TOKENS = 50_000  # script/style/comment boundaries walked; the rest of a page past them counts as visible
MAX_MARKUP = 4 * 1024 * 1024  # markup outside scripts measured: counts of a larger page are lower bounds
MAX_MARKUP_SEARCH = 2 * 1024 * 1024  # a `re:` marker searches this much markup (a not-found view is small)

# What is not visible text: comments, and raw-text or hidden elements up to their end tag. An element
# whose name only starts like one (<scripts>, <title-bar>) is not one of them.
_HIDDEN = (b"script", b"style", b"noscript", b"template", b"title", b"svg")
_NAME_ENDS = rb"(?![a-z0-9_:-])"
_OPENER = re.compile(rb"<(?:!--|(" + b"|".join(_HIDDEN) + rb")" + _NAME_ENDS + rb")")
_CLOSERS = {name: re.compile(rb"</" + name + _NAME_ENDS) for name in _HIDDEN}
# A tag stops at the next `<` or `>`, so an unclosed one costs its own length, not the rest of the page.
_TAG = re.compile(rb"<[!/?a-zA-Z][^<>]*>?")
_LINK = re.compile(rb"<a\s[^<>]*?\bhref\s*=", re.I)
# Whitespace, and UTF-8 continuation bytes: what is left is one byte per visible character.
_NOT_COUNTED = bytes(b" \t\n\r\f\v") + bytes(range(0x80, 0xC0))


@dataclass(frozen=True)
class Measure:
    text: int  # visible characters, whitespace not counted
    links: int  # <a href>
    size: int  # decoded bytes

    def as_json(self) -> dict[str, int]:
        return {"textChars": self.text, "links": self.links, "bytes": self.size}


@dataclass(frozen=True)
class Scan:
    measure: Measure
    not_found: bool


@dataclass(frozen=True)
class Verdict:
    why: str
    action: str  # refused, stored or accepted
    new: Measure
    stored: Measure | None


class Rule:
    """One compiled guard config (the global one, or a route's override over it)."""

    def __init__(self, cfg: Guard):
        self.cfg = cfg
        self.text_markers = [_plain(m) for m in cfg.not_found_markers if not m.startswith("re:")]
        self.markup_markers = [re.compile(m[3:].encode(), re.I | re.S)
                               for m in cfg.not_found_markers if m.startswith("re:")]

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled


def _plain(marker: str) -> re.Pattern[bytes]:
    """Case-insensitive (ASCII), any run of whitespace between its words."""
    return re.compile(rb"\s+".join(re.escape(w.encode()) for w in marker.split()), re.I)


def _hidden_parts(html: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (start, end) spans of visible markup and of title text: one regex walk over a lower-cased
    copy, from each hidden element's end to the next opener. (A find from the start for each of the
    seven openers cost 18 us apiece on a 33 KB page that holds none: 131 us against 43.)"""
    low = html.lower()
    n = len(low)
    visible: list[tuple[int, int]] = []
    titles: list[tuple[int, int]] = []
    pos = start = steps = 0
    while steps < MAX_TOKENS:
        steps += 1
        m = _OPENER.search(low, start)
        if m is None:
            break
        at, after, name = m.start(), m.end(), m.group(1)
        if name == b"template" and b"shadowrootmode" in low[after:_tag_end(low, after)]:
            start = after  # declarative shadow DOM: a web component's own content
            continue
        visible.append((pos, at))
        if name is None:
            close = low.find(b"-->", after)
            pos = n if close < 0 else close + 3
        else:
            open_end = _tag_end(low, after)
            end = _CLOSERS[name].search(low, after)
            if end is None:
                pos = n
            else:
                if name == b"title":
                    titles.append((open_end, end.start()))
                pos = _tag_end(low, end.start() + 2)
        start = pos
    if pos < n:
        visible.append((pos, n))
    return visible, titles


def _tag_end(low: bytes, at: int) -> int:
    """Just past the ``>`` closing the tag at ``at`` (or at the next ``<``: a tag left open). The
    ``>`` is looked for only up to that ``<``, so a page of open tags costs its length, not its square."""
    lt = low.find(b"<", at)
    gt = low.find(b">", at, lt if lt >= 0 else len(low))
    if gt >= 0:
        return gt + 1
    return lt if lt >= 0 else len(low)


def measure(markup: bytes) -> tuple[int, int]:
    """(visible characters, links) of visible markup: the reference of ``native/page_measure.c``."""
    return len(_TAG.sub(b" ", markup).translate(None, _NOT_COUNTED)), _LINK.subn(b"", markup)[1]


def _native_measure() -> Callable[[bytes], tuple[int, int]]:
    """``native/page_measure.c``'s ``measure`` (one pass, no copies) where the build is fresh, else the reference."""
    module: Any = native.extension("page_measure")
    return measure if module is None else module.measure


_measure = _native_measure()


def scan(html: bytes, rule: Rule | None = None) -> Scan:
    """Measure a decoded page and match ``rule``'s not-found markers against it."""
    spans, titles = _hidden_parts(html)
    parts, room = [], MAX_MARKUP
    for a, b in spans:
        if room <= 0:
            break
        parts.append(html[a:min(b, a + room)])
        room -= b - a
    markup = b" ".join(parts)
    chars, links = _measure(markup)
    measure = Measure(text=chars, links=links, size=len(html))
    found = False
    if rule is not None and (rule.text_markers or rule.markup_markers):
        text = _TAG.sub(b" ", markup) if rule.text_markers else b""
        heading = b" ".join(html[a:b] for a, b in titles[:10])[:MAX_MARKUP_SEARCH]
        found = any(p.search(text) or p.search(heading) for p in rule.text_markers) or \
            any(p.search(markup, 0, MAX_MARKUP_SEARCH) for p in rule.markup_markers)
    return Scan(measure, found)


# ------------------------------------------------------------------------------- the stored side


def measure_header(m: Measure, suspect: str | None = None) -> str:
    value = f"text={m.text}; links={m.links}; bytes={m.size}"
    return f"{value}; suspect={suspect}" if suspect else value


def parse_measure(value: str | None) -> tuple[Measure | None, str | None]:
    """(measure, suspect) of a stored header; anything unreadable is (None, None): not known."""
    if not value or len(value) > 200:
        return None, None
    fields = dict(part.strip().partition("=")[::2] for part in value.split(";"))
    try:
        m = Measure(int(fields["text"]), int(fields["links"]), int(fields["bytes"]))
    except (KeyError, ValueError):
        return None, None
    if min(m.text, m.links, m.size) < 0:
        return None, None
    suspect = fields.get("suspect")
    return m, suspect if suspect in WHYS else None


def judge(rule: Rule, seen: Scan, stored: dict[str, str] | None, repeats: int = 0) -> Verdict | None:
    """The verdict on a render, or None when it is fine. ``stored``: the stored page's headers (None:
    no page); a page stored before pages carried a measure is a good page of unknown size.
    ``repeats``: how many times in a row this key's render was refused before."""
    cfg, new = rule.cfg, seen.measure
    before, suspect = parse_measure((stored or {}).get(MEASURE_HEADER))
    good = stored is not None and suspect is None
    why = None
    if seen.not_found:
        why = "not-found"
    elif new.text < cfg.min_text_chars:
        why = "empty-shell"
    elif good and before is not None and cfg.keep_fraction > 0:
        if before.text >= max(cfg.min_stored_chars, 1) and new.text < cfg.keep_fraction * before.text:
            why = "lost-text"
        elif before.links >= max(cfg.min_stored_links, 1) and new.links < cfg.keep_fraction * before.links:
            why = "lost-links"
    if why is None:
        return None
    if not good:
        return Verdict(why, "stored", new, before)
    if why in LOSSES and cfg.accept_after and repeats >= cfg.accept_after:
        return Verdict(why, "accepted", new, before)
    return Verdict(why, "refused", new, before)


# ----------------------------------------------------------------------- the refusal record


def refusal(key: str, v: Verdict, now: int, count: int) -> dict[str, Any]:
    """The last refused render of a target (kept in the target record: small, one per URL)."""
    return {"cacheKey": key, "why": v.why, "at": now, "count": count, "new": v.new.as_json(),
            "stored": v.stored.as_json() if v.stored is not None else None}


def repeats_of(record: Any, key: str) -> int:
    """Refusals in a row for ``key`` so far (the caller checks no render was stored since)."""
    if not isinstance(record, dict) or record.get("cacheKey") != key:
        return 0
    count = record.get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def describe_refusal(record: Any) -> dict | None:
    """A stored refusal record as the explainer shows it: known fields of the right type only."""
    if not isinstance(record, dict) or record.get("why") not in WHYS:
        return None

    def sizes(d: Any) -> dict | None:
        if not isinstance(d, dict):
            return None
        return {k: d[k] for k in ("textChars", "links", "bytes") if isinstance(d.get(k), int)}

    key = record.get("cacheKey") if isinstance(record.get("cacheKey"), str) else None
    return {"cacheKey": key, "why": record["why"], "at": record.get("at") if isinstance(record.get("at"), int) else None,
            "count": repeats_of(record, key) if key is not None else 0, "new": sizes(record.get("new")),
            "stored": sizes(record.get("stored"))}
