"""What keeps Markdown for agents inert (docs/serving.md#markdown-for-agents): nothing a page showed as
text becomes markup, and no link or image points anywhere but http(s), mailto or a relative address.

The converter escapes the text it writes itself (its escape options, ``markdown.py``), but writes
addresses, titles and alt text as the attributes hold them. Its Markdown is kept when a check that
over-approximates shows it inert (``plainly_inert``: most pages); otherwise the page is converted again
with a visitor that writes every link, image and embed itself: one whose address is not allowed becomes
its text alone. The front matter is ours: title, description and canonical as double-quoted YAML
scalars that hold no Markdown either.
"""

from __future__ import annotations

import html
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from html_to_markdown._html_to_markdown import DocumentMetadata

ALLOWED_SCHEMES = frozenset({"http", "https", "mailto"})
_TRIM = "".join(map(chr, range(0x21)))  # a browser trims C0 controls and spaces from both ends of a URL
_DROP = str.maketrans("", "", "\t\n\r")  # and removes tabs and newlines anywhere in it
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
# Most addresses are judged by how they start: nothing a browser or a Markdown renderer rewrites can come
# before a scheme's colon.
_PLAIN = re.compile(r"https?://|[/#?]")
_MD_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")  # CommonMark's backslash escapes (any ASCII punctuation)


def _scheme_allowed(url: str) -> bool:
    found = _SCHEME.match(url.strip(_TRIM).translate(_DROP))
    return found is None or found.group(1).lower() in ALLOWED_SCHEMES


def allowed_url(url: str) -> bool:
    """Whether a link or image may point at ``url`` (an attribute's value, entities decoded): its
    scheme, as a browser parses it, is http, https or mailto, or it has none (relative). Judged again as
    the URL reads once a Markdown renderer has decoded the backslash escapes and entities it may hold,
    so that no decoding on the way makes it another scheme. Percent-encoding never forms a scheme."""
    if _PLAIN.match(url):
        return True
    if not _scheme_allowed(url):
        return False
    decoded = html.unescape(_MD_ESCAPE.sub(r"\1", url))
    return decoded == url or _scheme_allowed(decoded)


# ------------------------------------------------------------------------------------- the check

# Where a destination may start: after an inline link's or image's "](", or a definition's "]:".
_DEST_AT = re.compile(r"\](?:\(|:)[ \t\n]*")
_DEST_HEAD = re.compile(r"[^\s)]*")


def _unescaped_lt(markdown: str) -> bool:
    """Whether ``markdown`` holds a < with no backslash escaping it (none, or an escaped backslash before
    it): raw HTML and autolinks start there. Code holds such a < as text, but is not told apart here: a
    page with one takes the visitor. (A loop of finds: a regex with a look-behind is 50 times slower.)"""
    at = markdown.find("<")
    while at >= 0:
        start = at
        while start and markdown[start - 1] == "\\":
            start -= 1
        if (at - start) % 2 == 0:
            return True
        at = markdown.find("<", at + 1)
    return False


def plainly_inert(markdown: str) -> bool:
    """Whether the converter's Markdown is inert by a check that only errs towards "no": it holds no
    unescaped ``<`` (no raw HTML, no autolink), and every place a link destination could start, escaped
    or in code or not, holds an allowed address (a link needs "](" or a definition's "]:")."""
    if _unescaped_lt(markdown):
        return False
    for at in _DEST_AT.finditer(markdown):
        head = _DEST_HEAD.match(markdown, at.end())
        if head is not None and not allowed_url(head.group()):
            return False
    return True


# ------------------------------------------------------------------------------------- Markdown out

# A destination read back exactly: spaces and controls percent-encoded (a browser drops or encodes them
# anyway), what ends or opens one and what starts an entity backslash-escaped.
_DEST = re.compile(r"[\x00-\x20\x7f]|[()<>\\]|&(?=#?[A-Za-z0-9]+;)")
# Text written from an attribute (alt, title): every character Markdown reads as markup escaped.
_TEXT = re.compile(r"[\\`*_\[\]<>&!|~\"]")
_SPACE = re.compile(r"\s+")


def _dest_char(m: re.Match[str]) -> str:
    c = m.group()
    return f"%{ord(c):02X}" if c <= " " or c == "\x7f" else "\\" + c


def destination(url: str) -> str:
    return _DEST.sub(_dest_char, url.strip(_TRIM).translate(_DROP))


def attribute_text(text: str) -> str:
    """``text`` from an attribute as Markdown text: on one line, its markup characters escaped."""
    return _TEXT.sub(r"\\\g<0>", _SPACE.sub(" ", text).strip())


def _titled(title: str | None) -> str:
    return f' "{attribute_text(title)}"' if title and title.strip() else ""


def _custom(output: str) -> dict[str, str]:
    # A dict, not html_to_markdown.VisitResult: the binding (3.21) ignores a VisitResult's custom output.
    return {"type": "custom", "output": output}


class InertVisitor:
    """The converter's visitor: writes links, images and embeds (iframe, video, audio), each only with
    an allowed address, in the converter's own form. Stateless: one serves every conversion."""

    def visit_link(self, _ctx: Any, href: str, text: str, title: str | None) -> dict[str, str]:
        # ``text`` is the converter's Markdown of the link's content, escaped already.
        if not allowed_url(href):
            return _custom(text)
        return _custom(f"[{text}]({destination(href)}{_titled(title)})")

    def visit_image(self, _ctx: Any, src: str, alt: str, title: str | None) -> dict[str, str]:
        if not allowed_url(src):
            return _custom(attribute_text(alt))
        return _custom(f"![{attribute_text(alt)}]({destination(src)}{_titled(title)})")

    def _embed(self, kind: str, src: str) -> dict[str, str]:
        return _custom(f"[{kind}]({destination(src)})" if src and allowed_url(src) else "")

    def visit_iframe(self, _ctx: Any, src: str) -> dict[str, str]:
        return self._embed("iframe", src)

    def visit_video(self, _ctx: Any, src: str) -> dict[str, str]:
        return self._embed("video", src)

    def visit_audio(self, _ctx: Any, src: str) -> dict[str, str]:
        return self._embed("audio", src)


VISITOR = InertVisitor()

# ----------------------------------------------------------------------------------- the front matter

# Escaped as \uXXXX in a value: what starts Markdown markup (the front matter reads as Markdown where a
# renderer knows none), what YAML does not allow or reads as a line break, and invisible format characters.
_YAML_ESCAPE = re.compile("[<>&\\[\\]\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                          "\ud800-\udfff\ufeff\ufff9-\ufffb\ufffe\uffff\U000e0000-\U000e007f]")


def _unicode_escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\u{c:04X}" if c <= 0xFFFF else f"\\U{c:08X}"


def yaml_quoted(value: str) -> str:
    """``value`` as a double-quoted YAML scalar on one line, holding no Markdown markup."""
    return _YAML_ESCAPE.sub(_unicode_escape, json.dumps(value, ensure_ascii=False))


def front_matter(document: DocumentMetadata | None) -> str:
    """The page's title, description and canonical (an allowed address only) as YAML front matter."""
    if document is None:
        return ""
    lines = []
    for key, value in (("title", document.title), ("description", document.description),
                       ("canonical", document.canonical_url)):
        if value and (key != "canonical" or allowed_url(value)):
            lines.append(f"{key}: {yaml_quoted(value)}")
    return "---\n" + "\n".join(lines) + "\n---\n\n" if lines else ""


def without_front_matter(markdown: str) -> str | None:
    """The converter's Markdown without the front matter it writes (one ``key: value`` line per entry,
    values with line breaks quoted); None when what opens it is not that (a page that starts with a
    rule and has no metadata, or a format we do not know): the caller converts again without one."""
    if not markdown.startswith("---\n"):
        return markdown
    end = markdown.find("\n---\n", 3)
    if end < 0 or any(": " not in line for line in markdown[4:end].split("\n")):
        return None
    return markdown[end + 5:].lstrip("\n")
