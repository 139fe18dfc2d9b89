"""What keeps Markdown for agents inert (docs/serving.md#markdown-for-agents): nothing a page showed as
text becomes markup, and no link or image points anywhere but http(s), mailto or a relative address.

The converter escapes the text it writes itself (its escape options, ``markdown.py``), but writes
addresses, titles and alt text as the attributes hold them: refused ones are taken out of the HTML first
(``markdown_prepass.py``). Its Markdown is kept when a check that over-approximates shows it inert
(``plainly_inert``, which reads code as CommonMark does where that is certain: nearly all pages);
otherwise the page is converted again with a visitor that writes every link, image and embed itself: one
whose address is not allowed becomes its text alone. The front matter is ours: title, description and canonical as double-quoted YAML
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
    it): raw HTML and autolinks start there (run on the Markdown with its code taken out, ``without_code``).
    (A loop of finds: a regex with a look-behind is 50 times slower.)"""
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
    """Whether the converter's Markdown is inert by a check that only errs towards "no": outside the code
    that ``without_code`` can tell exactly as CommonMark does, it holds no unescaped ``<`` (no raw HTML, no
    autolink), and every place a link destination could start, escaped or not, holds an allowed address (a
    link needs "](" or a definition's "]:")."""
    markdown = without_code(markdown)
    if _unescaped_lt(markdown):
        return False
    for at in _DEST_AT.finditer(markdown):
        head = _DEST_HEAD.match(markdown, at.end())
        if head is not None and not allowed_url(head.group()):
            return False
    return True


# ------------------------------------------------------------------------------------- code, exactly

# Code holds "<" as text (the converter writes it there unescaped), so the check reads the Markdown with
# the code CommonMark would see taken out, where that can be told without a parser:
# - Fenced blocks at the top level: a fence line there starts at column 0 (indented up to 3 spaces, or
#   after a container's marker, it may belong to a list item or quote whose extent a regex cannot know,
#   so one such line anywhere turns fence-reading off, as does a fence line holding "|"). A column-0 line
#   closes every open container (a fence is never a lazy continuation: it interrupts a paragraph), so
#   CommonMark's top-level fences are exactly the ones this reads, from opener to closer (or the end).
# - Code spans, one line at a time: backtick runs are paired as CommonMark pairs them (an escape is
#   skipped, a run closes at the next run of its length). A line is read only when every run on it is
#   paired on it (else a run may pair with one on the next line of its paragraph) and every "](" on it
#   ends a link at once, "](" address ")" with no space, paren, backslash or backtick (else a title or
#   address may hold a backtick that pairs otherwise); once a line is not read, neither is the rest of
#   its paragraph (up to a blank line or a fence). A span holding an unescaped "|" is not taken as code:
#   a GFM table row splits on it before it finds code.
# tests/serving/test_markdown_inert.py checks this against markdown-it on generated Markdown.
_NEWLINE = re.compile(r"\r\n?")
# A fence line not at column 0, or one holding "|" (a GFM table's header row, when a delimiter row
# follows, is read before a fence by some renderers).
_FENCES_UNSURE = re.compile(r"^[ \t>*+\-.)0-9]+(?:```|~~~)|^(?:```|~~~)[^\n]*\|", re.MULTILINE)
_FENCE_LINE = re.compile(r"^(?:(`{3,})[^`\n]*|(~{3,})[^\n]*)$", re.MULTILINE)
_PARAGRAPH_END = re.compile(r"(\n[ \t]*\n)")
_RUN = re.compile(r"\\[!-/:-@\[-`{-~]|`+")
_TICKS = re.compile(r"`+")
_LINK_AT = re.compile(r"\][(:]")
_LINK_CLOSED = re.compile(r"\]\([^\s()<>\\`\[\]\x00-\x1f\x7f]*\)")
_PIPE = re.compile(r"\\*\|")


def _span_free(line: str) -> str | None:
    """``line`` with each code span replaced by "x", or None when a run on it is not paired on it."""
    parts: list[str] = []
    at = last = 0
    while (run := _RUN.search(line, at)) is not None:
        at = run.end()
        if run.group()[0] == "\\":  # an escape: no run starts at its character
            continue
        closer = _TICKS.search(line, at)
        while closer is not None and len(closer.group()) != len(run.group()):
            closer = _TICKS.search(line, closer.end())
        if closer is None:
            return None
        if any(len(p.group()) % 2 for p in _PIPE.finditer(line, at, closer.start())):
            return None  # an unescaped "|" (an even run of backslashes before it)
        parts += (line[last:run.start()], "x")
        at = last = closer.end()
    parts.append(line[last:])
    return "".join(parts)


def _paragraph_without_spans(paragraph: str) -> str:
    lines = paragraph.split("\n")
    for i, line in enumerate(lines):
        links = sum(1 for _ in _LINK_AT.finditer(line))
        if links and (line.count("]:") or links != sum(1 for _ in _LINK_CLOSED.finditer(line))):
            break
        if "`" in line:
            free = _span_free(line)
            if free is None:
                break
            lines[i] = free
    return "\n".join(lines)


def _without_spans(text: str) -> str:
    if "`" not in text:
        return text
    return "".join(_paragraph_without_spans(p) if "`" in p else p
                   for p in _PARAGRAPH_END.split(text))


def without_code(markdown: str) -> str:
    """``markdown`` with line breaks as "\\n" and the code CommonMark reads in it (top-level fenced blocks,
    code spans) taken out, where that is certain (see above); code not certain is left in."""
    markdown = _NEWLINE.sub("\n", markdown)
    if "<" not in markdown or "`" not in markdown and "~~~" not in markdown:
        return markdown
    if _FENCES_UNSURE.search(markdown):
        return _without_spans(markdown)
    parts: list[str] = []
    last = 0
    fence: tuple[str, int] | None = None  # the open fence's character and length
    for line in _FENCE_LINE.finditer(markdown):
        mark = line.group(1) or line.group(2)
        if fence is None:
            parts.append(_without_spans(markdown[last:line.start()]))
            fence = (mark[0], len(mark))
        elif mark[0] == fence[0] and len(mark) >= fence[1] and not line.group()[len(mark):].strip(" \t"):
            parts.append("x")  # the block, its opener and closer (an info string is not markup either)
            last, fence = line.end(), None
    if fence is not None:
        parts.append("x")
    else:
        parts.append(_without_spans(markdown[last:]))
    return "".join(parts)


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
