"""The HTML a page is converted from, with what the converter would copy unchecked taken out first
(docs/serving.md#markdown-for-agents): one regex pass over the start tags that carry an address, in
Python between calls into the converter, so that the converter needs no visitor (whose every call takes
the GIL back from a conversion that had released it).

- a link (``a``, ``area``) whose address is not allowed loses its ``href``: the converter writes its text;
- an image whose address is not allowed, or that has none, becomes its alt text (escaped by the converter
  as any text);
- an embed (``iframe``, ``video``, ``audio``, ``source``, ``embed``) whose address is not allowed loses it:
  the converter writes nothing for it;
- a ``title`` holding what the converter would copy as markup (``<``, a backtick, a backslash) is dropped.

``hide`` marks hidden elements the converter would write with the ``hidden`` attribute, which it drops
(with ``<template>``, inline ``display:none`` and ``visibility:hidden``, ``aria-hidden="true"``): a closed
``<dialog>``, ``aria-hidden`` true in any case or spacing, the classes ``hidden`` (unless a variant shows
it, as Tailwind's ``md:block``), ``sr-only`` and ``visually-hidden``, and inline styles that hide (CSS
escapes and comments read). Stylesheets are not applied: hiding they do passes through. Where ``hide``
misreads a tag, the element is converted as it would have been without it.

Only tags that regexes anchored at a literal character flag are read in Python: most pages have none.
The work is linear in the page: Chromium leaves "<" unescaped in comments, scripts and styles, so a page
can hold any number of tag starts that never end, and no tag is read twice.

This pass reads tags as a regex does, not as the converter's HTML parser: where the two differ, the
Markdown still holds what the pass missed, and the check that follows (``markdown_inert.plainly_inert``)
sends the page to the visitor. So the pass is a speed-up, never what makes the Markdown inert.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left
from itertools import islice

from prerender_ray.serving.markdown_inert import allowed_url

# A start tag of an element the converter writes an address for, attributes read as the HTML tokenizer
# reads them (quoted values may hold ">").
_TAG = re.compile(r"""<(a|area|img|iframe|video|audio|source|embed)(?=[\s/>])((?:[^>"']|"[^"]*"|'[^']*')*)>""",
                  re.IGNORECASE)
_ATTR = re.compile(r"""([^\s/>="'][^\s/>=]*)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s>]*))?""")
_TITLE_MARKUP = re.compile(r"[<`\\]")
_ADDRESS = {"a": "href", "area": "href", "img": "src", "iframe": "src", "video": "src", "audio": "src",
            "source": "src", "embed": "src"}
# What may need the pass: an address that does not plainly start allowed (http(s)://, mailto:, or no scheme:
# name characters up to a "/", "?", "#" or its end), a title holding markup or an entity, an image without a
# source. Most pages hold none (and most tags none): they are left as they are, with no call per tag. Each
# regex starts at a literal character ("=", "<"): the scan of a 77 KB page then takes about 0.2 ms. Each
# reads at most a run of spaces, one attribute value or one run of name characters after its "=".
_SUSPECT = (
    re.compile(r"""=(?:(?<=[hH][rR][eE][fF]=)|(?<=[sS][rR][cC]=)|(?<=\s=))\s*"""
               r"""(?!(?P<q>["'])(?:https?://|mailto:|[\w.~+-]*(?:[/?#]|(?P=q)))|(?:https?://|mailto:|[\w.~+-]*[/?#\s>]))"""),
    re.compile(r"""=(?<=[tT][iI][tT][lL][eE]=)\s*(?:"[^"]*[<`\\&]|'[^']*[<`\\&])"""),
)
# An image without a source: an "<img" with no source attribute before the next ">" (the images before
# one ">" share one search).
_IMG = re.compile(r"<[iI][mM][gG]")
_IMG_SRC = re.compile(r"""\b[sS][rR][cC]\s*=\s*["']?[^"'\s>]""")
_NAME = re.compile(r"<(?:a|area|img|iframe|video|audio|source|embed)(?=[\s/>])", re.IGNORECASE)
_TAG_EVENT = re.compile(r"""[>"']""")  # what ends a tag, or starts a quoted value



def _value(raw: str | None) -> str | None:
    if raw is None:
        return None
    if raw[:1] in ("'", '"'):
        raw = raw[1:-1]
    return html.unescape(raw)


def _alt(attrs: list[tuple[str, str, str | None]]) -> str:
    """What an image whose address is taken out becomes: its alt text, or nothing when it is hidden."""
    if any(key == "hidden" for key, _, _ in attrs):
        return ""
    return html.escape(next((v for k, _, v in attrs if k == "alt"), None) or "", quote=False)


def _rewrite(m: re.Match[str]) -> str:
    name = m.group(1).lower()
    attrs = [(a.group(1).lower(), a.group(0), _value(a.group(2))) for a in _ATTR.finditer(m.group(2))]
    seen: set[str] = set()
    kept: list[str] = []
    changed = False
    for key, text, value in attrs:
        first = key not in seen  # the tokenizer keeps an attribute's first occurrence only
        seen.add(key)
        if not first:
            changed = True
            continue
        if key == _ADDRESS[name]:
            if name == "img" and (not value or not allowed_url(value)):
                return _alt(attrs)
            if value is not None and not allowed_url(value):
                changed = True
                continue
        elif key == "title" and value and _TITLE_MARKUP.search(value):
            changed = True
            continue
        kept.append(text)
    if name == "img" and _ADDRESS[name] not in seen:
        return _alt(attrs)
    if not changed:
        return m.group()
    return f"<{m.group(1)}{''.join(' ' + t for t in kept)}>"


def _sourceless_images(text: str) -> list[int]:
    """Where an "<img" has no ``src`` with a value before the next ">"."""
    found: list[int] = []
    end = -1  # the ">" that ends the run of images looked at
    src = -1  # the first source after an image of the run (``end`` when there is none)
    for m in _IMG.finditer(text):
        at = m.end()
        if at > end:
            end = text.find(">", at)
            end, src = (len(text) if end < 0 else end), -1
        if src < at:  # not searched in this run yet, or the source found is an earlier image's
            source = _IMG_SRC.search(text, at, end)
            src = source.start() if source else end
        if src >= end:
            found.append(m.start())
    return found


def _tag_end(text: str, at: int, memo: dict[int, int], scan: list[int]) -> int:
    """The ">" that ends a tag whose attributes start at ``at``, as ``_TAG`` reads them, or -1 (a quote
    never closed, no ">"). Linear over all calls: ``memo`` holds the end found from each opening quote,
    ``scan`` the last stretch searched from an ``at`` (tags are looked at left to right)."""
    if scan[0] <= at <= scan[1]:
        event = scan[1]
    else:
        event = _next_event(text, at)
        scan[:] = at, event
    path: list[int] = []
    while event < len(text) and text[event] != ">" and event not in memo:
        path.append(event)
        close = text.find(text[event], event + 1)
        event = len(text) if close < 0 else _next_event(text, close + 1)
    end = -1 if event == len(text) else memo[event] if event in memo else event
    for quote in path:
        memo[quote] = end
    return end


def _next_event(text: str, at: int) -> int:
    found = _TAG_EVENT.search(text, at)
    return found.start() if found else len(text)


def _starts(text: str, at: list[int]) -> list[int]:
    """The "<" before each of the positions ``at``, once each, in order."""
    starts: list[int] = []
    lt = prev = -1
    for pos in sorted(set(at)):
        found = text.rfind("<", prev + 1, pos + 1)  # nothing before prev is looked at again
        lt = found if found >= 0 else lt
        prev = pos
        if lt >= 0 and (not starts or starts[-1] != lt):
            starts.append(lt)
    return starts


def prepass(text: str) -> str:
    """``text`` (HTML) with refused addresses, address-less images and markup-holding titles taken out."""
    # Only the tags around what the scans found are read (a "<" inside a quoted value before it misleads
    # this: such a tag is left, for the check to find).
    suspects = [m.start() for r in _SUSPECT for m in r.finditer(text)]
    suspects += _sourceless_images(text)
    parts: list[str] = []
    last = 0
    memo: dict[int, int] = {}
    scan = [-1, -1]
    for start in _starts(text, suspects):
        name = _NAME.match(text, start) if start >= last else None
        end = _tag_end(text, name.end(), memo, scan) if name is not None else -1
        tag = _TAG.match(text, start, end + 1) if end >= 0 else None
        if tag is not None:
            parts += (text[last:start], _rewrite(tag))
            last = tag.end()
    if not parts:
        return text
    parts.append(text[last:])
    return "".join(parts)


# ------------------------------------------------------------------------------------- hidden content

# What may hide an element beyond what the converter sees (each regex starts at a literal "<" or "=" and
# reads at most one attribute value): a dialog, an aria-hidden not written exactly "true", a class with a
# hiding token, a style with a hiding property or anything that may spell one (an escape, a comment, an
# entity).
_HIDING = (
    re.compile(r"<[dD][iI][aA][lL][oO][gG](?=[\s/>])"),
    re.compile(r"""=(?<=[aA][rR][iI][aA]-[hH][iI][dD][dD][eE][nN]=)(?!"true"|'true'|true[\s/>])"""
               r"""(?:"\s*(?i:true)\s*"|'\s*(?i:true)\s*'|(?i:true)[\s/>])"""),
    re.compile(r"""=(?<=[cC][lL][aA][sS][sS]=)(?:"[^"]*?|'[^']*?|)\b(?:hidden|sr-only|visually-hidden)\b"""),
    re.compile(r"""=(?<=[sS][tT][yY][lL][eE]=)(?:"[^"]*?|'[^']*?|[^\s>"']*?)"""
               r"""(?:(?i:opacity|content-visibility|collapse)|[\\&]|/\*)"""),
)
_ANY_NAME = re.compile(r"<[A-Za-z][^\s/>]*")
_ANY_TAG = re.compile(r"""<([A-Za-z][^\s/>]*)((?:[^>"']|"[^"]*"|'[^']*')*)>""")
_HTML_WS = " \t\n\f\r"
_CLASSES = re.compile(r"[^ \t\n\f\r]+")
_SHOWN = re.compile(r":(?:block|inline|inline-block|flex|inline-flex|grid|inline-grid|table|contents|flow-root|"
                    r"list-item)$")  # "hidden md:block": shown from some width on
_CSS_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)", re.DOTALL)
_CSS_DECLARATION = re.compile(r"(?:\\.|[^;\\])++", re.DOTALL)  # an escaped ";" or ":" delimits nothing
_CSS_PROPERTY = re.compile(r"((?:\\.|[^:\\])*+):", re.DOTALL)
_CSS_ESCAPE = re.compile(r"\\(?:([0-9a-fA-F]{1,6})(?:\r\n|[ \t\n\r\f])?|(.)|\Z)", re.DOTALL)
_CSS_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?%?")
_IMPORTANT = re.compile(r"![ \t\n\r\f]*important$")


def _css_char(m: re.Match[str]) -> str:
    if m.group(1):
        code = int(m.group(1), 16)
        return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"
    return m.group(2) if m.group(2) is not None and m.group(2) not in "\r\n\f" else "\ufffd"


def _style_hides(style: str) -> bool:
    """Whether an inline style hides its element: the last declaration of display, visibility, opacity or
    content-visibility (an !important one first) says none, hidden or collapse, 0."""
    values: dict[str, tuple[bool, str]] = {}
    for declaration in _CSS_DECLARATION.finditer(_CSS_COMMENT.sub(" ", style)):
        m = _CSS_PROPERTY.match(declaration.group())
        if m is None:
            continue
        prop = _CSS_ESCAPE.sub(_css_char, m.group(1)).strip(_HTML_WS).lower()
        value = _CSS_ESCAPE.sub(_css_char, declaration.group()[m.end():]).strip(_HTML_WS).lower()
        important = _IMPORTANT.search(value)
        if important:
            value = value[:important.start()].rstrip(_HTML_WS)
        if important or not values.get(prop, (False, ""))[0]:
            values[prop] = (bool(important), value)
    opacity = values.get("opacity", (False, ""))[1]
    return (values.get("display", (False, ""))[1] == "none"
            or values.get("visibility", (False, ""))[1] in ("hidden", "collapse")
            or values.get("content-visibility", (False, ""))[1] == "hidden"
            or _CSS_NUMBER.fullmatch(opacity) is not None and float(opacity.rstrip("%")) <= 0)


def _hidden(name: str, attrs: dict[str, str | None]) -> bool:
    if name == "dialog" and "open" not in attrs:
        return True
    if (attrs.get("aria-hidden") or "").strip(_HTML_WS).lower() == "true":
        return True
    classes = _CLASSES.findall(attrs.get("class") or "")
    if "sr-only" in classes or "visually-hidden" in classes:
        return True
    if "hidden" in classes and not any(_SHOWN.search(c) for c in classes):
        return True
    return _style_hides(attrs.get("style") or "")


def hide(text: str) -> str:
    """``text`` (HTML) with the ``hidden`` attribute added to the elements hidden as the module says."""
    parts: list[str] = []
    last = skip = 0
    memo: dict[int, int] = {}
    scan = [-1, -1]
    for start in _starts(text, [m.start() for r in _HIDING for m in r.finditer(text)]):
        name = _ANY_NAME.match(text, start) if start >= skip else None
        end = _tag_end(text, name.end(), memo, scan) if name is not None else -1
        tag = _ANY_TAG.match(text, start, end + 1) if name is not None and end >= 0 else None
        if name is None or tag is None:
            continue
        skip = tag.end()  # a "<" in its values starts no tag
        attrs: dict[str, str | None] = {}
        for a in _ATTR.finditer(tag.group(2)):
            attrs.setdefault(a.group(1).lower(), _value(a.group(2)))  # the first occurrence counts
        if _hidden(tag.group(1).lower(), attrs):
            parts += (text[last:name.end()], " hidden")
            last = name.end()
    if not parts:
        return text
    parts.append(text[last:])
    return "".join(parts)


# ------------------------------------------------------------------------------------- quote nesting

# The converter prefixes each line of a quote with "> " per level and keeps a copy per level: its memory
# grows with the lines times the square of the depth (250 levels: 15 KB per byte of input), before the
# output cap can be checked. Deeper nesting than this is refused (docs/serving.md#markdown-for-agents).
MAX_QUOTE_DEPTH = 16
# A page with at most this many "<blockquote" nests no deeper; one with more is read as the HTML tokenizer
# reads it (attributes, comments), and a close counts only where it certainly closes its quote: when every
# element opened since the quote's start has been closed, in order, and none of them changes how what
# follows is read (a script, a textarea, a template ...). Anything else (an element left open, a close
# that does not match) leaves the quotes open for good. So the depth read is never less than the
# converter's (whose first parse keeps only closes that match, then may repair with html5ever; a property
# test holds the two side by side), and more only where a page's tags are not closed in order, which a
# serialized DOM's always are.
_QUOTE_OPEN = re.compile(r"<blockquote(?=[\t\n\f\r />])", re.IGNORECASE | re.ASCII)
_WS = "\t\n\f\r "
# Attributes up to the tag's ">", as the tokenizer reads them (each step possessive: no other reading).
_ATTRS = (rf"""(?:[{_WS}/]++|[^{_WS}/>][^{_WS}/=>]*+(?:[{_WS}]*+=[{_WS}]*+"""
          rf"""(?:"[^"]*+"|'[^']*+'|[^{_WS}>"'][^{_WS}>]*+|(?=>))|(?![{_WS}]*=)))*+>""")
_NAME_END = rf"(?![^{_WS}/>])"
# Text, comments and bogus comments (which end at the first ">"); "<!" otherwise (a doctype, CDATA) is odd.
_TEXT = r"[^<]++|<(?![A-Za-z!?/])|<!--(?:-?>|(?:[^-]++|-(?!-!?>))*+--!?>)|<\?[^>]*+>|</(?![A-Za-z])[^>]*+>"
_SKIP = re.compile(rf"(?:{_TEXT}|<!(?!--)[^>]*+>|</?(?!blockquote{_NAME_END})[A-Za-z][^{_WS}/>]*+{_ATTRS})*+",
                   re.IGNORECASE | re.ASCII)
_QUOTE_TAG = re.compile(rf"<(/?)blockquote{_NAME_END}{_ATTRS}", re.IGNORECASE | re.ASCII)
_TOKEN = re.compile(rf"(?P<text>{_TEXT})|(?P<odd><!(?!--)[^>]*+>)|<(?P<end>/?)(?P<name>[A-Za-z][^{_WS}/>]*+){_ATTRS}",
                    re.ASCII)
_VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())
# Elements whose content the tokenizer reads otherwise (or keeps apart): what follows them is not read here.
_OPAQUE = frozenset("script style textarea title xmp iframe noembed noframes noscript plaintext template "
                    "frameset frame head body html image".split())


def quote_depth(text: str) -> int:
    """How deep ``text`` (HTML) may nest quotes, never less than the converter does: the number of quote
    starts when that is at most ``MAX_QUOTE_DEPTH``, else ``_nesting``."""
    starts = sum(1 for _ in islice(_QUOTE_OPEN.finditer(text), MAX_QUOTE_DEPTH + 1))
    return starts if starts <= MAX_QUOTE_DEPTH else _nesting(text)


def _nesting(text: str) -> int:
    """The deepest quote nesting in ``text`` with only certain closes counted (stops once past the cap).
    Tags are read one by one only inside a quote that may still close; elsewhere up to the next quote tag."""
    opens = [m.start() for m in _QUOTE_OPEN.finditer(text)]  # every start, wherever it stands
    depth = deepest = seen = at = 0
    # The elements open since the outermost quote that may still close ("" for a quote); the quotes
    # opened before that one stay counted for good.
    stack: list[str] = []

    def hidden(end: int) -> int:  # starts before end not read as tags: in comments, values, the unread
        nonlocal seen
        found = bisect_left(opens, end, seen) - seen
        seen += found
        return found

    while at < len(text) and deepest <= MAX_QUOTE_DEPTH:
        if not stack:
            end = _SKIP.match(text, at).end()  # type: ignore[union-attr]
            tag = _QUOTE_TAG.match(text, end)
            depth += hidden(end if tag is not None else len(text))  # what never ends holds the rest
            deepest = max(deepest, depth)
            if tag is None:
                break
            if not tag.group(1):
                seen += 1
                depth += 1
                stack.append("")
            found = hidden(tag.end())  # in the tag's own attributes
            if found:
                depth += found
                stack.clear()
            deepest = max(deepest, depth)
            at = tag.end()
            continue
        token = _TOKEN.match(text, at)
        if token is None:  # a tag or comment that never ends holds the rest
            depth += hidden(len(text))
            deepest = max(deepest, depth)
            break
        at = token.end()
        name = (token.group("name") or "").lower()
        closes = bool(token.group("end"))
        if name == "blockquote" and not closes:
            seen += 1
            depth += 1
            stack.append("")
        found = hidden(at)
        depth += found
        deepest = max(deepest, depth)
        if token.group("text") and not found:
            continue
        if found or token.group("odd") or name in _OPAQUE or closes and name in _VOID:
            stack.clear()
        elif closes and stack[-1] == ("" if name == "blockquote" else name):
            stack.pop()
            if name == "blockquote":
                depth -= 1
        elif closes:
            stack.clear()
        elif name not in _VOID and name != "blockquote":
            stack.append(name)
    return deepest
