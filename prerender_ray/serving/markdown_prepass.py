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

Only tags that regexes anchored at a literal character flag are read in Python: most pages have none.

This pass reads tags as a regex does, not as the converter's HTML parser: where the two differ, the
Markdown still holds what the pass missed, and the check that follows (``markdown_inert.plainly_inert``)
sends the page to the visitor. So the pass is a speed-up, never what makes the Markdown inert.
"""

from __future__ import annotations

import html
import re

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
# regex starts at a literal character ("=", "<"): the scan of a 77 KB page then takes about 0.2 ms.
_SUSPECT = (
    re.compile(r"""=(?:(?<=[hH][rR][eE][fF]=)|(?<=[sS][rR][cC]=)|(?<=\s=))\s*"""
               r"""(?!(?P<q>["'])(?:https?://|mailto:|[\w.~+-]*(?:[/?#]|(?P=q)))|(?:https?://|mailto:|[\w.~+-]*[/?#\s>]))"""),
    re.compile(r"""=(?<=[tT][iI][tT][lL][eE]=)\s*(?:"[^"]*[<`\\&]|'[^']*[<`\\&])"""),
    re.compile(r"""<[iI][mM][gG](?![^>]*\b[sS][rR][cC]\s*=\s*["']?[^"'\s>])"""),
)



def _value(raw: str | None) -> str | None:
    if raw is None:
        return None
    if raw[:1] in ("'", '"'):
        raw = raw[1:-1]
    return html.unescape(raw)


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
                alt = next((v for k, _, v in attrs if k == "alt"), None) or ""
                return html.escape(alt, quote=False)
            if value is not None and not allowed_url(value):
                changed = True
                continue
        elif key == "title" and value and _TITLE_MARKUP.search(value):
            changed = True
            continue
        kept.append(text)
    if name == "img" and _ADDRESS[name] not in seen:
        alt = next((v for k, _, v in attrs if k == "alt"), None) or ""
        return html.escape(alt, quote=False)
    if not changed:
        return m.group()
    return f"<{m.group(1)}{''.join(' ' + t for t in kept)}>"


def prepass(text: str) -> str:
    """``text`` (HTML) with refused addresses, address-less images and markup-holding titles taken out."""
    # Only the tags around what the scans found are read (a "<" inside a quoted value before it misleads
    # this: such a tag is left, for the check to find).
    starts = sorted({text.rfind("<", 0, m.start() + 1) for r in _SUSPECT for m in r.finditer(text)})
    parts: list[str] = []
    last = 0
    for start in starts:
        tag = _TAG.match(text, start) if start >= last else None
        if tag is not None:
            parts += (text[last:start], _rewrite(tag))
            last = tag.end()
    if not parts:
        return text
    parts.append(text[last:])
    return "".join(parts)
