"""Markdown for agents, pure: whether a request asks for Markdown, the conversion of a rendered page,
and the headers of its answer.

Only a rendered page is converted: a single-page app's origin HTML is an empty shell, so an agent
without a cached page gets what any bot gets (docs/serving.md#markdown-for-agents). The conversion is
html-to-markdown (Rust): navigation, forms, asides and hidden content dropped, links made absolute
against the page's URL, tables kept as GFM tables. The Markdown is inert (``markdown_inert.py``): text
escaped, addresses only http(s), mailto or relative, front matter quoted. Every input is bounded: the
decoded HTML (``max_input_bytes``), the tree depth (``MAX_DEPTH``), the quotes' depth (``MAX_QUOTE_DEPTH``,
checked before converting) and the Markdown (``max_output_bytes``); the wall-clock deadline is the
caller's (``api/bot/markdown.py`` runs this off the event loop).
"""

from __future__ import annotations

import codecs
import gzip
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import html_to_markdown
import xxhash

from prerender_ray.decoding import TooLarge
from prerender_ray.serving.markdown_inert import VISITOR, front_matter, plainly_inert, without_front_matter
from prerender_ray.serving.markdown_prepass import MAX_QUOTE_DEPTH, hide, prepass, quote_depth
from prerender_ray.serving.negotiation import EncodingError, add_vary, decode_body
from prerender_ray.storage.pages import PageMeta

if TYPE_CHECKING:
    from prerender_ray.config.outputs import Markdown

MARKDOWN_TYPE = "text/markdown; charset=utf-8"
MARKDOWN_TYPES = frozenset({"text/markdown", "text/x-markdown"})
MAX_ACCEPT_CHARS = 1024  # a longer Accept is not parsed: the request gets HTML (or its forced Markdown)
ACCEPT_MEMO = 1024  # distinct Accept values remembered (cleared when full)
MAX_DEPTH = 256  # elements nested deeper are dropped (the converter recurses)
GZIP_LEVEL = 6
# The page chrome an agent does not need, on top of the converter's standard clean-up (which drops
# <nav>, page <header>s, forms, scripts and styles). With a visitor (markdown_inert.VISITOR) that clean-up
# does not run (3.21): <nav> and forms are named here for that path too; page headers then stay (the
# converter's selectors cannot say "not inside <main>/<article>").
EXCLUDE = ["aside", "[aria-hidden=true]", "[role=navigation]", "[role=complementary]", "[role=contentinfo]",
           "nav", "form"]
# Why a page was served as HTML (x-harper-markdown-skipped); the first three are the conversion's own.
SKIP_REASONS = ("too-large", "output-too-large", "failed", "timeout", "busy")
TRANSIENT = frozenset({"timeout", "busy"})  # the HTML then says no-store: the next request may get Markdown
# x-markdown-tokens: the Markdown's UTF-8 bytes over 4, rounded up. BPE tokenizers average about 4
# characters a token on English prose; no tokenizer is loaded for an estimate (low for CJK text).
TOKEN_BYTES = 4


class MarkdownSkipped(Exception):
    """A page not converted; ``reason`` is one of ``SKIP_REASONS`` (the request gets the HTML)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Limits:
    max_input_bytes: int
    max_output_bytes: int
    max_depth: int = MAX_DEPTH


# ------------------------------------------------------------------------------------ negotiation


def _q(params: list[str]) -> float | None:
    q = 1.0
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return None
            if not 0.0 <= q <= 1.0:  # nan fails both
                return None
    return q


def _accept(value: str) -> tuple[float | None, int, float, int, bool]:
    """(Markdown's q or None when not listed, its position, HTML's effective q, the position of the
    range that gave it, whether that range was a wildcard). A malformed item is skipped."""
    md_q: float | None = None
    md_pos = html_pos = -1
    html_q, html_rank = 0.0, -1  # rank: 0 */*, 1 text/*, 2 text/html (the most specific range decides)
    for pos, item in enumerate(value.split(",")):
        media, *params = item.split(";")
        kind, slash, sub = media.strip().lower().partition("/")
        if not slash or not kind or not sub:
            continue
        q = _q(params)
        if q is None:
            continue
        name = f"{kind}/{sub}"
        if name in MARKDOWN_TYPES:
            if md_q is None or q < md_q:  # listed twice: the lower q, so a refusal holds
                md_q, md_pos = q, pos
            continue
        rank = 2 if name in ("text/html", "application/xhtml+xml") else 1 if name == "text/*" else \
            0 if name == "*/*" else -1
        if rank > html_rank or (rank == html_rank and rank >= 0 and q < html_q):
            html_q, html_pos, html_rank = q, pos, rank
    return md_q, md_pos, html_q, html_pos, html_rank < 2


def _decide(value: str) -> tuple[bool, bool]:
    """(Markdown preferred, Markdown refused) for one Accept value."""
    md_q, md_pos, html_q, html_pos, html_wild = _accept(value)
    if md_q is None or md_q <= 0.0:
        return False, md_q is not None
    # Equal q: Markdown when HTML is only covered by a wildcard or is listed after it.
    wins = md_q > html_q or (md_q == html_q and (html_wild or md_pos < html_pos))
    return wins, False


_decided: dict[str, tuple[bool, bool]] = {}  # bots send a handful of Accept values: each parsed once


def _prefers(value: str) -> tuple[bool, bool]:
    found = _decided.get(value)
    if found is None:
        if len(_decided) >= ACCEPT_MEMO:
            _decided.clear()
        found = _decided[value] = _decide(value)
    return found


def wants_markdown(accept: str | None, *, forced: bool = False) -> bool:
    """Whether a request with this ``Accept`` gets Markdown: text/markdown listed with a q above
    HTML's (text/html, else text/*, else */*; a tie goes to Markdown when it is listed first or HTML
    only by a wildcard). ``forced`` (a bot configured to get Markdown) wins unless the header refuses
    Markdown outright (``text/markdown;q=0``). Values over ``MAX_ACCEPT_CHARS`` are not parsed."""
    if not accept or len(accept) > MAX_ACCEPT_CHARS:
        return forced
    prefers, refused = _prefers(accept)
    return prefers or (forced and not refused)


def forced_for(bot: str | None, bot_class: str | None, bots: frozenset[str], classes: frozenset[str]) -> bool:
    """Whether ``markdown.forBots`` / ``markdown.forClasses`` give this bot Markdown whatever it
    accepts. ``bots`` holds lower-case names; ``bot_class`` is the request's bot class, when the
    bot policy names one (None otherwise)."""
    return (bot is not None and bot.lower() in bots) or (bot_class is not None and bot_class in classes)


@dataclass(frozen=True, slots=True)
class MarkdownPolicy:
    """``markdown:`` as the bot path reads it."""

    enabled: bool
    limits: Limits
    timeout_s: float
    bots: frozenset[str]  # lower case
    classes: frozenset[str]

    @classmethod
    def from_config(cls, cfg: Markdown) -> MarkdownPolicy:
        return cls(cfg.enabled, Limits(cfg.max_input_bytes, cfg.max_output_bytes), cfg.timeout_ms / 1000,
                   frozenset(b.lower() for b in cfg.for_bots), frozenset(cfg.for_classes))

    def wants(self, accept: str | None, bot: str | None, bot_class: str | None) -> bool:
        """Whether this request gets Markdown (when its page is a rendered 200)."""
        if not self.enabled:
            return False
        forced = bool(self.bots or self.classes) and forced_for(bot, bot_class, self.bots, self.classes)
        if not accept or len(accept) > MAX_ACCEPT_CHARS:  # wants_markdown inlined: this runs on every hit
            return forced
        prefers, refused = _prefers(accept)
        return prefers or (forced and not refused)


# ------------------------------------------------------------------------------------- conversion


def _options(base_url: str | None, limits: Limits, metadata: bool = True) -> html_to_markdown.ConversionOptions:
    return html_to_markdown.ConversionOptions(
        extract_metadata=metadata,
        # Nothing the page showed as text becomes markup: <, >, &, brackets, backticks, emphasis ...
        escape_misc=True, escape_asterisks=True, escape_underscores=True,
        # What the converter would copy from attributes unchecked: an abbreviation's title, a quote's
        # cite URL, an inline data: image or SVG (links and images: markdown_inert).
        expand_abbreviations=False, include_blockquote_citations=False,
        inline_data_media=html_to_markdown.InlineDataMedia.ALT_TEXT_ONLY,
        # A backtick fence ends at a language holding a backtick (its code then reads as Markdown, raw
        # HTML too); a tilde fence takes any language.
        code_block_style=html_to_markdown.CodeBlockStyle.TILDES,
        preprocessing=html_to_markdown.PreprocessingOptions(enabled=True, preset="standard",
                                                            remove_navigation=True, remove_forms=True),
        exclude_selectors=EXCLUDE,
        max_depth=limits.max_depth,
        max_input_size=limits.max_input_bytes,
        base_url=base_url,
        autolinks=False,  # a bare URL in prose stays prose
        compact_tables=True,  # no padding: fewer tokens for the agent
    )


def charset_of(content_type: str | None) -> str:
    """The ``charset`` a Content-Type names when Python knows it, else UTF-8 (what a renderer posts)."""
    for param in (content_type or "").split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            try:
                return codecs.lookup(value.strip().strip('"')).name
            except LookupError:
                break
    return "utf-8"


def _convert(text: str, options: html_to_markdown.ConversionOptions,
             visitor: object | None = None) -> html_to_markdown.ConversionResult:
    try:
        return html_to_markdown.convert(text, options, visitor=visitor)  # type: ignore[arg-type]
    except html_to_markdown.InputTooLargeError as e:  # characters re-encoded may exceed the byte count
        raise MarkdownSkipped("too-large", str(e)) from None
    except Exception as e:  # the converter's errors (ParseError, PanicError ...) and anything else
        raise MarkdownSkipped("failed", repr(e)) from None


def html_to_md(html: bytes | str, limits: Limits, base_url: str | None = None, charset: str = "utf-8") -> str:
    """``html`` as Markdown. Raises MarkdownSkipped (too-large, output-too-large, failed)."""
    if len(html) > limits.max_input_bytes:
        raise MarkdownSkipped("too-large", f"{len(html)} bytes of HTML")
    # Hidden elements marked for the converter to drop, on either path (markdown_prepass.hide).
    text = hide(html if isinstance(html, str) else html.decode(charset, "replace"))
    # Refused addresses taken out before, so that the converter needs no visitor (markdown_prepass).
    prepared = prepass(text)
    # The converter's memory grows with the square of the quotes' depth, before the output cap is checked.
    if max(quote_depth(text), quote_depth(prepared) if prepared is not text else 0) > MAX_QUOTE_DEPTH:
        raise MarkdownSkipped("output-too-large", f"quotes nested deeper than {MAX_QUOTE_DEPTH}")
    result = _convert(prepared, _options(base_url, limits))
    body = without_front_matter(result.content or "")
    if body is None or not plainly_inert(body):
        # Rare: converted again, links and images written by our visitor: its calls take the GIL, which
        # the converter alone releases (each waits out another busy thread's switch interval).
        body = _convert(text, _options(base_url, limits, metadata=False), VISITOR).content or ""
    markdown = front_matter(result.metadata.document if result.metadata else None) + body
    if len(markdown) > limits.max_output_bytes or len(markdown.encode()) > limits.max_output_bytes:
        raise MarkdownSkipped("output-too-large", f"{len(markdown)} characters of Markdown")
    return markdown


def convert_page(body: bytes | memoryview, coding: str, limits: Limits, base_url: str | None = None,
                 charset: str = "utf-8") -> bytes:
    """A stored page body (in its stored ``coding``) as gzip-coded Markdown: decoded with an output
    cap, converted, then coded once so most requests take it as it is (agents accept gzip). Raises
    MarkdownSkipped."""
    try:
        html = decode_body(body, coding, limits.max_input_bytes)
    except EncodingError as e:
        too_large = isinstance(e.__cause__, TooLarge)
        raise MarkdownSkipped("too-large" if too_large else "failed", str(e)) from None
    markdown = html_to_md(bytes(html), limits, base_url, charset)
    return gzip.compress(markdown.encode(), compresslevel=GZIP_LEVEL, mtime=0)


def markdown_etag(page_etag: str, body: bytes) -> str:
    """The Markdown's ETag: the page's with ``-md`` inside the quotes (weakness kept), so a new
    render gives a new one; a hash of the Markdown when the page has none."""
    tag = page_etag.strip()
    weak = tag[:2].upper() == "W/"
    opaque = tag[2:].strip() if weak else tag
    if opaque.startswith('"') and opaque.endswith('"') and len(opaque) >= 2:
        opaque = opaque[1:-1]
    if not opaque or '"' in opaque:
        return f'"md-{xxhash.xxh64_hexdigest(body)}"'
    return f'{"W/" if weak else ""}"{opaque}-md"'


def markdown_negotiated(headers: Mapping[str, str]) -> bool:
    """Whether an origin's answer (relayed, lowercase ``headers``) is Markdown it chose by ``Accept``
    (its ``Vary`` names Accept), so the URL has an HTML form to render."""
    mime = headers.get("content-type", "").partition(";")[0].strip().lower()
    return mime in MARKDOWN_TYPES and "accept" in (t.strip().lower() for t in headers.get("vary", "").split(","))


def markdown_link(url: str) -> str:
    """The ``Link`` an HTML answer points to its Markdown with: the page's own (canonical) URL, since
    Markdown is asked for by ``Accept`` and there is no URL form of it. The canonical form has
    ``<``, ``>``, quotes, spaces and controls percent-escaped, so the URL cannot end the reference."""
    return f'<{url}>; rel="alternate"; type="text/markdown"'


def estimate_tokens(markdown_bytes: int) -> int:
    return -(-markdown_bytes // TOKEN_BYTES)


def gzip_size(gz: bytes) -> int:
    """The decoded size of one gzip member: its trailer's ISIZE (RFC 1952; modulo 2**32, far above
    ``markdown.maxOutputBytes``), so the Markdown is not decoded again to be measured."""
    return int.from_bytes(gz[-4:], "little") if len(gz) >= 18 else 0


def markdown_meta(page: PageMeta, gz_markdown: bytes) -> PageMeta:
    """The Markdown answer of ``page`` as a page of its own (``answer.prepare`` shapes it like any
    stored page: coding negotiated, ``Vary: Accept-Encoding``, 304, HEAD): the page's headers with
    the Markdown's type, ETag, coding and ``x-markdown-tokens``, and ``Vary: Accept``."""
    headers = {k: v for k, v in page.headers.items() if k not in ("content-length", "content-type", "etag")}
    headers["content-type"] = MARKDOWN_TYPE
    headers["content-encoding"] = "gzip"
    headers["etag"] = markdown_etag(page.headers.get("etag", ""), gz_markdown)
    headers["vary"] = add_vary(headers.get("vary"), "Accept")
    headers["x-markdown-tokens"] = str(estimate_tokens(gzip_size(gz_markdown)))
    return PageMeta(cache_key=page.cache_key, status_code=200, headers=headers, last_cached=page.last_cached,
                    expires_at=page.expires_at, is_indexable=page.is_indexable)
