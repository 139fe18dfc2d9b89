"""Streaming sitemap parsing: bytes in (plain or gzip, any chunking), entries out, constant memory.

``SitemapParser`` is a push parser: the fetcher feeds body chunks as they arrive and gets back the
``<url>`` / ``<sitemap>`` entries each chunk completed. A document is never held whole: gzip is
inflated in 64 KiB pieces, libxml2 sees one piece at a time, and every consumed element is cut out
of the tree, so memory is set by the piece size and not by the document (a 2 GB body costs what a
2 MB one does, until the byte cap stops it).

Accepted: a ``<urlset>`` or ``<sitemapindex>`` root in the sitemap namespace, in no namespace, or
under a prefix bound to the sitemap namespace (``<sm:urlset>``, which the reference rejects).
Entry children are read in either of those namespaces; any other element (``image:image``,
``xhtml:link``) is ignored. gzip is detected by its magic bytes, whatever the URL or content type.

Hostile input is harmless: no entity is ever expanded, no DTD or external resource is loaded, and a
DOCTYPE is refused outright (billion laughs, XXE). Caps on decompressed bytes and on entries per
document stop a bomb early.

Failure is whole-document: when a cap is exceeded or the XML turns out malformed, ``feed``/``close``
raise ``SitemapError`` and entries already returned must be discarded by the caller. A truncated
entry list would unlink every target that happened to sit past the cut, so a partial document is
never reconciled. Content after the root element closes is ignored (the reference tolerates it).
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from lxml import etree

from prerender_ray.config.origin import Sitemap as SitemapConfig
from prerender_ray.decoding import DecodeError, Decoder

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
MAX_BYTES = 50 * 1024 * 1024  # the sitemap protocol's limits, also cfg.sitemap's defaults
MAX_ENTRIES = 50_000

Kind = Literal["urlset", "sitemapindex"]
_ENTRY_OF: dict[str, str] = {"urlset": "url", "sitemapindex": "sitemap"}
_FIELDS = ("loc", "lastmod", "changefreq", "priority")
_FIELD_INDEX: dict[str, int] = {
    f"{ns}{name}": i for ns in ("", f"{{{SITEMAP_NS}}}") for i, name in enumerate(_FIELDS)
}
# The only tags the main parser reports; everything else is parsed by libxml2 without a Python event.
_WATCHED = tuple(
    f"{ns}{name}" for ns in ("", f"{{{SITEMAP_NS}}}") for name in (*_ENTRY_OF, *_ENTRY_OF.values())
)

_PIECE = 64 * 1024  # largest slice libxml2 parses at once; also the pruning interval
_PROBE_SLICE = 2048  # bytes the root probe parses at a time
_HEAD = 400  # bytes kept for error messages (the reference's snippet window)
_GZIP_MAGIC = b"\x1f\x8b"
_FIRST_TAG = re.compile(rb"<([A-Za-z_][\w.:-]{0,63})")
_DOCTYPE = re.compile(rb"<!DOCTYPE(?:\s+([A-Za-z_][\w.:-]{0,63}))?")
_NOT_SITEMAP = "expected a <urlset> or <sitemapindex> root, got"


class SitemapError(ValueError):
    """A document that is not a usable sitemap; ``code`` names the class of problem."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class SitemapEntry(NamedTuple):
    """One ``<url>`` or ``<sitemap>``: values trimmed and entity-decoded; absent or blank is None.

    ``changefreq`` is lower-cased but not validated (an unknown value means the default cadence);
    ``priority`` is a finite float or None; ``lastmod`` stays text. A tuple because a million of them
    are built per index walk and tuples construct several times faster than frozen dataclasses.
    """

    loc: str | None
    lastmod: str | None = None
    changefreq: str | None = None
    priority: float | None = None


@dataclass(slots=True)
class ParsedSitemap:
    kind: Kind
    entries: list[SitemapEntry] = field(default_factory=list)
    size: int = 0  # decompressed bytes parsed
    compressed: bool = False

    @property
    def is_index(self) -> bool:
        return self.kind == "sitemapindex"


def _xml_parser(events: tuple[str, ...], tag: tuple[str, ...] | None = None) -> etree.XMLPullParser:
    return etree.XMLPullParser(
        events=events,
        tag=tag,
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,  # keeps libxml2's own limits: 10 MB text nodes, depth 256
        remove_comments=True,
        remove_pis=True,
        remove_blank_text=True,
        collect_ids=False,
    )


class _Gunzip:
    """Inflates a gzip stream (several members allowed, trailing garbage ignored) into pieces of at
    most ``_PIECE`` bytes; the parser counts them against its own cap."""

    def __init__(self) -> None:
        self._d = Decoder("gzip", None, piece=_PIECE, trailing_garbage=True)

    def inflate(self, data: bytes) -> Iterator[bytes]:
        try:
            yield from self._d.feed(data)
        except DecodeError as e:
            raise SitemapError(str(e), "SITEMAP_BAD_GZIP") from None

    @property
    def complete(self) -> bool:
        return self._d.complete


class SitemapParser:
    """Incremental parser for one document. ``feed`` chunks, then ``close``; each returns new entries.

    After a ``SitemapError`` the parser is dead: every later call raises the same error. ``done`` turns
    true once the root element has closed; the caller may stop reading the body then.
    """

    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.kind: Kind | None = None
        self.size = 0
        self.entry_count = 0
        self.compressed = False
        self.done = False
        self.head = b""  # the first decompressed bytes, for error messages and snippets
        self._sniff: bytes | None = b""  # None once plain/gzip is decided
        self._gunzip: _Gunzip | None = None
        self._probe: etree.XMLPullParser | None = _xml_parser(("start",))
        self._prolog_tail: bytes | None = (
            b""  # the prolog's last bytes (a DOCTYPE split in two); None after it
        )
        self._xml = _xml_parser(("start", "end"), _WATCHED)
        self._root: etree._Element | None = None
        self._entry_tags: frozenset[str] = frozenset()
        self._error: SitemapError | None = None
        self._closed = False

    @classmethod
    def from_config(cls, sitemap_cfg: SitemapConfig) -> SitemapParser:
        return cls(sitemap_cfg.max_bytes, sitemap_cfg.max_entries)

    @property
    def is_index(self) -> bool:
        return self.kind == "sitemapindex"

    def feed(self, chunk: bytes) -> list[SitemapEntry]:
        self._usable()
        out: list[SitemapEntry] = []
        if self.done or not chunk:
            return out
        try:
            for piece in self._decoded(chunk):
                self._parse(piece, out)
                if self.done:
                    break
        except SitemapError as e:
            self._error = e
            raise
        return out

    def close(self) -> list[SitemapEntry]:
        self._usable()
        self._closed = True
        out: list[SitemapEntry] = []
        try:
            if self._sniff:  # a one-byte body never got past gzip detection
                data, self._sniff = self._sniff, None
                self._parse(data, out)
            if self.done:
                return out
            if self._gunzip is not None and not self._gunzip.complete:
                raise SitemapError("truncated gzip stream", "SITEMAP_BAD_GZIP")
            if self._probe is not None:
                self._find_root(b"", closing=True)
            # The root closes while the bytes are fed (libxml2 reports an end tag as soon as it has
            # it). Not having seen it by now means the document was cut short, whatever close() says:
            # some libxml2 releases close the open elements themselves and report no error.
            try:
                self._xml.close()
            except etree.XMLSyntaxError as e:
                raise _malformed(e) from None
            raise SitemapError(
                "malformed XML: the document ended before its root element closed", "SITEMAP_MALFORMED"
            )
        except SitemapError as e:
            self._error = e
            raise
        return out

    # ----------------------------------------------------------------------------------- bytes

    def _usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("SitemapParser is closed")

    def _decoded(self, chunk: bytes) -> Iterator[bytes]:
        if self._sniff is not None:
            self._sniff += chunk
            if len(self._sniff) < 2:
                return
            chunk, self._sniff = self._sniff, None
            if chunk[:2] == _GZIP_MAGIC:
                self._gunzip, self.compressed = _Gunzip(), True
        if self._gunzip is not None:
            yield from self._gunzip.inflate(chunk)
        elif len(chunk) <= _PIECE:
            yield chunk
        else:
            view = memoryview(chunk)
            for i in range(0, len(chunk), _PIECE):
                yield bytes(view[i : i + _PIECE])

    def _parse(self, piece: bytes, out: list[SitemapEntry]) -> None:
        self.size += len(piece)
        if self.size > self.max_bytes:
            raise SitemapError(
                f"document is larger than {self.max_bytes} bytes decompressed; rejected as a whole",
                "SITEMAP_TOO_LARGE",
            )
        if len(self.head) < _HEAD:
            self.head += piece[: _HEAD - len(self.head)]
        if self._prolog_tail is not None:
            self._refuse_doctype(piece)
        if self._probe is not None:
            self._find_root(piece, closing=False)
        try:
            self._xml.feed(piece)
        except etree.XMLSyntaxError as e:
            self._drain(out)
            if self.done:
                return  # trailing content after the root
            raise _malformed(e) from None
        self._drain(out)
        if not self.done:
            self._prune()

    # ------------------------------------------------------------------------------------- XML

    def _find_root(self, piece: bytes, *, closing: bool) -> None:
        """A throwaway parser that reports the root's start, whatever its name, so junk fails at once.

        The main parser only reports sitemap tags (one Python event per entry instead of five), so on
        its own it would parse a whole HTML page or Atom feed before noticing.
        """
        probe = self._probe
        assert probe is not None
        failure = None
        root = None
        try:
            if closing:
                probe.close()
            else:  # in slices: the root starts in the first bytes, and the rest would build a tree
                for i in range(0, len(piece), _PROBE_SLICE):
                    probe.feed(piece[i : i + _PROBE_SLICE])
                    if (root := next((el for _, el in probe.read_events()), None)) is not None:
                        break
        except etree.XMLSyntaxError as e:
            failure = e
        if root is None:
            root = next((el for _, el in probe.read_events()), None)
        if root is None:
            if failure is not None or closing:
                raise self._before_root(failure)
            return
        self._probe = None
        ns, local = etree.QName(root).namespace, etree.QName(root).localname
        if ns not in (None, SITEMAP_NS) or local not in _ENTRY_OF:
            name = f"{root.prefix}:{local}" if root.prefix else local
            where = f" in namespace {ns}" if ns else ""
            raise SitemapError(f"{_NOT_SITEMAP} <{name}>{where}", "SITEMAP_NOT_SITEMAP")
        info = root.getroottree().docinfo
        if info.doctype or info.internalDTD is not None or info.externalDTD is not None:
            raise _doctype_refused()
        self.kind = local
        child = _ENTRY_OF[local]
        self._entry_tags = frozenset((child, f"{{{SITEMAP_NS}}}{child}"))

    def _refuse_doctype(self, piece: bytes) -> None:
        """Refuse a DOCTYPE as soon as its bytes arrive, before libxml2 stores a flood of declarations
        (the root-start check in ``_find_root`` stays as the backstop, e.g. for UTF-16 bodies)."""
        window = (self._prolog_tail or b"") + piece
        m, tag = _DOCTYPE.search(window), _FIRST_TAG.search(window)
        self._prolog_tail = piece[-64:] if tag is None else None  # after the first tag: content
        if m is None or (tag is not None and tag.start() < m.start()):
            return
        if (m.group(1) or b"").lower() == b"html":  # an error page: say what it is
            raise SitemapError(f"{_NOT_SITEMAP} <{m.group(1).decode()}>", "SITEMAP_NOT_SITEMAP")
        raise _doctype_refused()

    def _before_root(self, failure: etree.XMLSyntaxError | None) -> SitemapError:
        """Name what was served when it is not XML: an HTML error page usually is not well-formed."""
        m = _FIRST_TAG.search(self.head)
        if m is None:
            return SitemapError(f"{_NOT_SITEMAP} a non-XML or empty document", "SITEMAP_NOT_XML")
        name = m.group(1).decode("ascii", "replace")
        if name.rpartition(":")[2] not in _ENTRY_OF:
            return SitemapError(f"{_NOT_SITEMAP} <{name}>", "SITEMAP_NOT_SITEMAP")
        return (
            _malformed(failure) if failure is not None else SitemapError("malformed XML", "SITEMAP_MALFORMED")
        )

    def _drain(self, out: list[SitemapEntry]) -> None:
        root = self._root
        for event, el in self._xml.read_events():
            if event == "start":
                if root is None:
                    self._root = root = el
            elif el is root:
                self.done = True
            elif el.tag in self._entry_tags and el.getparent() is root:
                self.entry_count += 1
                if self.entry_count > self.max_entries:
                    raise SitemapError(
                        f"document has more than {self.max_entries} entries; rejected as a whole",
                        "SITEMAP_TOO_MANY_ENTRIES",
                    )
                out.append(_entry(el))

    def _prune(self) -> None:
        """Cut everything already consumed out of the tree, keeping only the path still open.

        Consumed entries go, and so does junk nobody reads (``<x/>`` by the million would otherwise
        cost libxml2 about 30 times its size): every completed child of the root, every completed
        non-field child of the open entry, and every completed child below that.
        """
        node = self._root
        if node is None or not len(node):
            return
        if len(node) > 1:
            del node[:-1]
        entry = node[-1]
        if len(entry) > 1:
            seen: set[int] = set()
            for child in entry[:-1]:
                i = _FIELD_INDEX.get(child.tag) if isinstance(child.tag, str) else None
                if i is None or i in seen:
                    entry.remove(child)
                else:
                    seen.add(i)
        node = entry
        while len(node):  # below the entry only the open path matters
            node = node[-1]
            if len(node) > 1:
                del node[:-1]


_tuple_new = tuple.__new__


def _entry(el: etree._Element) -> SitemapEntry:
    values: list[str | None] = [None, None, None, None]  # the first of each field wins
    for child in el:
        i = _FIELD_INDEX.get(child.tag)
        if i is not None and values[i] is None:
            values[i] = child.text
    loc, lastmod, freq, prio = values
    return _tuple_new(SitemapEntry, (  # NamedTuple's own __new__ is a Python frame per entry
        loc.strip() or None if loc else None,
        lastmod.strip() or None if lastmod else None,
        freq.strip().lower() or None if freq else None,
        _priority(prio) if prio else None,
    ))


def _priority(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _doctype_refused() -> SitemapError:
    return SitemapError(
        "a DOCTYPE is not allowed in a sitemap (entity and DTD declarations are refused)", "SITEMAP_DOCTYPE"
    )


def _malformed(e: etree.XMLSyntaxError) -> SitemapError:
    return SitemapError(f"malformed XML: {e.msg}", "SITEMAP_MALFORMED")


def snippet(head: bytes) -> str:
    """The reference's body snippet for error messages: whitespace collapsed, cut at 200 with '…'."""
    text = " ".join(head[:_HEAD].decode("utf-8", "replace").split())
    return text if len(text) <= 200 else text[:200] + "…"


def parse_chunks(
    chunks: Iterable[bytes], *, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES
) -> ParsedSitemap:
    """Parse a whole document from a byte iterator; stops reading once the root has closed."""
    parser = SitemapParser(max_bytes, max_entries)
    entries: list[SitemapEntry] = []
    for chunk in chunks:
        entries += parser.feed(chunk)
        if parser.done:
            break
    entries += parser.close()
    return _result(parser, entries)


async def parse_stream(
    chunks: AsyncIterable[bytes], *, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES
) -> ParsedSitemap:
    """``parse_chunks`` for an async body (e.g. ``httpx.Response.aiter_raw()``)."""
    parser = SitemapParser(max_bytes, max_entries)
    entries: list[SitemapEntry] = []
    async for chunk in chunks:
        entries += parser.feed(chunk)
        if parser.done:
            break
    entries += parser.close()
    return _result(parser, entries)


def parse_bytes(data: bytes, *, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> ParsedSitemap:
    return parse_chunks((data,), max_bytes=max_bytes, max_entries=max_entries)


def _result(parser: SitemapParser, entries: list[SitemapEntry]) -> ParsedSitemap:
    assert parser.kind is not None  # close() raised otherwise
    return ParsedSitemap(parser.kind, entries, parser.size, parser.compressed)
