"""llms.txt from the rendered corpus, pure: which requests ask for it, what a stored page's head says
(title, description), and the document (https://llmstxt.org: ``# Title``, ``> summary``, ``## Section``
headings with ``- [title](url): description`` lines), bounded in entries and bytes.

Every string in the document comes from a page or a sitemap someone else wrote, so each is made one
line of inert text: whitespace (newlines, Unicode line separators) collapsed, control and format
characters dropped, the characters that open Markdown structure (links, code spans, HTML, emphasis)
backslash-escaped, and its length capped. A link's address is percent-encoded where it could end the
link. The ingress side (gathering pages, the cache) is ``api/bot/llms.py``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lxml import etree

from prerender_ray.decoding import Decoder
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.devices import Devices
from prerender_ray.identity.urls import UrlError, url_parts, url_path
from prerender_ray.serving.origin_policy import Domains, compiled, origin_of

if TYPE_CHECKING:
    from prerender_ray.config.outputs import LlmsTxt

PATH = "/llms.txt"
CONTENT_TYPE = "text/markdown; charset=utf-8"
HEAD_BYTES = 64 * 1024  # decoded HTML read per page: the head, where <title> and the description live
TITLE_CHARS = 200
DESCRIPTION_CHARS = 300
OTHER = "Other pages"
NOTE_ROOM = 256  # bytes kept for the truncation note
# The forwarded-host guard of serving/classify.py: a bare host and an optional port, nothing else.
_FORWARDED_HOST = re.compile(r"[A-Za-z0-9.\-]+(?::[0-9]+)?", re.ASCII)
_SPACE = re.compile(r"\s+")
_ESCAPE = re.compile(r"([\\`*_\[\]<>])")
# What may end a link's address or the line in a naive reader: encoded, the address stays the same URL.
_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f()<>\[\]\\\"`{}|^]")


@dataclass(frozen=True, slots=True)
class Entry:
    url: str
    sitemap: str | None  # None: a page of no sitemap
    title: str
    description: str


def inert(text: str, limit: int) -> str:
    """``text`` as one line of plain Markdown text of at most ``limit`` characters (before escapes)."""
    text = unicodedata.normalize("NFC", text)
    # Cc (controls, newlines), Cf (bidi overrides, zero-width), Zl/Zp (line and paragraph separators)
    kept = "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text
                   if unicodedata.category(c) != "Cf")
    line = _SPACE.sub(" ", kept).strip()
    if len(line) > limit:
        line = line[:limit - 1].rstrip() + "…"
    return _ESCAPE.sub(r"\\\1", line)


def link_url(url: str) -> str:
    """``url`` as a link's address: characters that could close it percent-encoded."""
    return _URL_UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), url)


# ------------------------------------------------------------------------------------- the request


@dataclass(frozen=True, slots=True)
class LlmsPolicy:
    """``llmsTxt`` and ``domains`` as the ingress reads them."""

    domains: Domains
    sites: Domains
    sitemaps: tuple[str, ...]
    max_entries: int
    max_bytes: int
    include_discovered: bool = False

    @classmethod
    def from_config(cls, domains: Iterable[str], cfg: LlmsTxt) -> LlmsPolicy:
        return cls(compiled(tuple(domains)), compiled(tuple(cfg.sites)), tuple(cfg.sitemaps), cfg.max_entries,
                   cfg.max_bytes, cfg.include_discovered)

    def serves(self, origin: str) -> bool:
        """Only a host ``domains`` allows, and ``sites`` when set: never a site no one configured."""
        found = origin_of(origin + "/")
        return (found is not None and bool(self.domains) and self.domains.allows(*found)
                and self.sites.allows(*found))

    def lists(self, sitemap: str | None, discovered: bool = False) -> bool:
        """Are a target's pages listed: by its sitemap, and ``discovered`` (only a bot's miss made it)
        only when the operator opted in."""
        if discovered and not self.include_discovered:
            return False
        if not self.sitemaps:
            return True
        if sitemap is None:
            return False
        return any(sitemap.startswith(s[:-1]) if s.endswith("*") else sitemap == s for s in self.sitemaps)


def requested_site(mode: str, prefix: str, keys: KeyFormat, devices: Devices, device_from_path: bool,
                   host_header: str, proto_header: str, default_protocol: str,
                   path: str, query: str, headers: Mapping[str, str]) -> str | None:
    """The origin (``scheme://authority``) whose llms.txt a request asks for, or None (not such a
    request: it goes the bot path's way). ``path`` is the raw path."""
    if query or not path.endswith(PATH):
        return None
    if mode == "prefix":
        if not path.startswith(prefix):
            return None
        target = path[len(prefix):]
    else:
        if path != PATH:  # /<device>/llms.txt when the path names the device
            device, rest = devices.from_path(path) if device_from_path else (None, path)
            if device is None or rest != PATH:
                return None
        host = (headers.get(host_header) or "").split(",", 1)[0].strip()
        proto = (headers.get(proto_header) or "").split(",", 1)[0].strip().lower() or default_protocol
        if not host or _FORWARDED_HOST.fullmatch(host) is None or proto not in ("http", "https"):
            return None
        target = f"{proto}://{host}{PATH}"
    try:
        url = keys.canonicalize(target)
        if url_path(url) != PATH:
            return None
        scheme, authority, _, _ = url_parts(url)
    except UrlError:
        return None
    return f"{scheme}://{authority}"


# --------------------------------------------------------------------------------- a page's head


def head_fields(body: bytes | memoryview, coding: str, charset: str) -> tuple[str, str]:
    """(title, description) from the first ``HEAD_BYTES`` of a stored page's decoded HTML; empty
    strings when it has none. Raises ``decoding.DecodeError`` for a body that does not decode."""
    html = _head(body, coding)
    if not html.strip():
        return "", ""
    parser = etree.HTMLParser(encoding=charset, recover=True, no_network=True, remove_comments=True)
    try:
        root = etree.fromstring(html, parser)
    except (etree.LxmlError, ValueError, LookupError):
        return "", ""
    if root is None:
        return "", ""
    title = _text(root.find(".//title"))
    description = ""
    for meta in root.iter("meta"):
        name = (meta.get("name") or meta.get("property") or "").strip().lower()
        content = meta.get("content") or ""
        if name == "description" and content.strip():
            description = content
            break
        if name == "og:description" and not description:
            description = content
        if name == "og:title" and not title:
            title = content
    return title, description


def _head(body: bytes | memoryview, coding: str) -> bytes:
    decoder = Decoder(coding, None)
    out = bytearray()
    view = memoryview(body)
    step = 16 * 1024  # coded bytes fed at a time: a head is near the start, a bomb is not read on
    for i in range(0, len(view), step):
        for piece in decoder.feed(view[i:i + step]):
            out += piece
            if len(out) >= HEAD_BYTES:
                return _cut(bytes(out[:HEAD_BYTES]))
    return _cut(bytes(out))


def _cut(html: bytes) -> bytes:
    end = html.lower().find(b"</head>")
    return html[:end] + b"</head>" if end >= 0 else html


def _text(el: etree._Element | None) -> str:
    return "".join(el.itertext()) if el is not None else ""


# ---------------------------------------------------------------------------------- the document


def section_name(sitemap: str | None, origin: str) -> str:
    """A section's heading: the sitemap's path on the site's own origin, else its whole URL."""
    if sitemap is None:
        return OTHER
    return sitemap[len(origin):] if sitemap.startswith(origin + "/") else sitemap


def render(origin: str, title: str, summary: str, entries: list[Entry], policy: LlmsPolicy,
           more: bool) -> tuple[bytes, int]:
    """The document and how many entries it lists. ``entries`` in URL order; they are taken in that
    order while they fit ``max_entries`` and ``max_bytes`` (``more``: the caller left some out
    already), then shown grouped by sitemap, sections in order of their names, "Other pages" last."""
    host = origin.partition("://")[2]
    head = (f"# {inert(title, TITLE_CHARS) or inert(host, TITLE_CHARS)}\n\n"
            f"> {inert(summary, DESCRIPTION_CHARS) or inert(f'Rendered pages of {host}', DESCRIPTION_CHARS)}\n\n"
            "Each link below answers with the page as Markdown to a request that accepts `text/markdown`.\n").encode()
    budget = policy.max_bytes - len(head) - NOTE_ROOM
    sections: dict[str | None, list[bytes]] = {}
    used = 0
    taken = 0
    for entry in entries:
        if taken >= policy.max_entries:
            more = True
            break
        line = f"- [{inert(entry.title, TITLE_CHARS) or inert(entry.url, TITLE_CHARS)}]({link_url(entry.url)})"
        description = inert(entry.description, DESCRIPTION_CHARS)
        line = (f"{line}: {description}\n" if description else f"{line}\n")
        cost = len(line.encode())
        if entry.sitemap not in sections:
            cost += len(f"\n## {inert(section_name(entry.sitemap, origin), 2000)}\n\n".encode())
        if used + cost > budget:
            more = True
            break
        sections.setdefault(entry.sitemap, []).append(line.encode())
        used += cost
        taken += 1
    parts = [head]
    if more:
        parts.append(f"\nThis list is cut at {taken} pages (llmsTxt.maxEntries, llmsTxt.maxBytes); "
                     "the site has more.\n".encode())
    for sitemap in sorted(sections, key=lambda s: (s is None, section_name(s, origin))):
        parts.append(f"\n## {inert(section_name(sitemap, origin), 2000)}\n\n".encode())
        parts.extend(sections[sitemap])
    return b"".join(parts), taken
