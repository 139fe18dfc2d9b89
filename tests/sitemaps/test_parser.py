"""Streaming sitemap parsing and hostile input (docs/sitemaps.md#limits)."""

from __future__ import annotations

import gzip
import itertools
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.config.origin import Sitemap
from prerender_ray.sitemaps.parser import (
    MAX_BYTES,
    MAX_ENTRIES,
    SITEMAP_NS,
    SitemapEntry,
    SitemapError,
    SitemapParser,
    parse_bytes,
    parse_chunks,
    parse_stream,
    snippet,
)

NS = SITEMAP_NS.encode()


def _urlset(*locs: str) -> bytes:
    body = b"".join(b"<url><loc>%s</loc></url>" % loc.encode() for loc in locs)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="%s">%s</urlset>\n' % (NS, body)


def _error(data: bytes, **caps: int) -> SitemapError:
    with pytest.raises(SitemapError) as info:
        parse_bytes(data, **caps)
    return info.value


def _error_from(chunks: Iterator[bytes], **caps: int) -> SitemapError:
    with pytest.raises(SitemapError) as info:
        parse_chunks(chunks, **caps)
    return info.value


def _url_stream(count: int, *, per_chunk: int = 500) -> Iterator[bytes]:
    """A urlset of ``count`` entries, made chunk by chunk, never whole."""
    yield b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="%s">\n' % NS
    for start in range(0, count, per_chunk):
        yield b"".join(
            b"<url><loc>https://example.com/p/%d</loc><lastmod>2024-01-02</lastmod>"
            b"<changefreq>daily</changefreq><priority>0.5</priority></url>\n" % i
            for i in range(start, min(start + per_chunk, count))
        )
    yield b"</urlset>\n"


def _gzip_stream(prefix: bytes, filler: bytes, total: int, suffix: bytes = b"") -> Iterator[bytes]:
    """Compress ``prefix + filler * n + suffix`` (``total`` bytes of filler) lazily, 1 MiB at a time."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    yield z.compress(prefix)
    block = filler * (1024 * 1024 // len(filler))
    for _ in range(total // len(block)):
        out = z.compress(block)
        if out:
            yield out
    yield z.compress(suffix) + z.flush()


def _run_isolated(code: str) -> int:
    """Run ``code`` in a fresh interpreter and return its peak RSS in MiB (libxml2 memory included)."""
    # VmHWM starts afresh at exec; ru_maxrss would also count the pages shared with pytest before it.
    peak = "print(next(ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM:')))"
    script = textwrap.dedent(code) + "\n" + peak + "\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1]) // 1024


# --------------------------------------------------------------------------------------- structure


def test_a_urlset_with_several_entries_parses_to_a_list_in_document_order() -> None:
    parsed = parse_bytes(_urlset("https://a.com/1", "https://a.com/2", "https://a.com/3"))
    assert parsed.kind == "urlset" and not parsed.is_index
    assert [e.loc for e in parsed.entries] == ["https://a.com/1", "https://a.com/2", "https://a.com/3"]


def test_a_single_url_is_still_a_one_element_list() -> None:
    assert parse_bytes(_urlset("https://a.com/only")).entries == [SitemapEntry("https://a.com/only")]


def test_a_sitemapindex_is_an_index_whose_entries_are_its_children() -> None:
    doc = (
        b'<sitemapindex xmlns="%s"><sitemap><loc>https://a.com/s1.xml</loc><lastmod>2024-05-01</lastmod>'
        b"</sitemap><sitemap><loc>https://a.com/s2.xml.gz</loc></sitemap></sitemapindex>" % NS
    )
    parsed = parse_bytes(doc)
    assert parsed.is_index
    assert parsed.entries == [
        SitemapEntry("https://a.com/s1.xml", "2024-05-01"),
        SitemapEntry("https://a.com/s2.xml.gz"),
    ]


@pytest.mark.parametrize(
    "doc",
    [b"<urlset></urlset>", b"<urlset/>", b'<urlset xmlns="%s"/>' % NS, b"<sitemapindex></sitemapindex>"],
)
def test_empty_roots_give_zero_entries_without_an_error(doc: bytes) -> None:
    assert parse_bytes(doc).entries == []


def test_an_index_that_lists_itself_parses_to_its_own_url() -> None:
    url = "https://a.com/sitemap_index.xml"
    doc = b'<sitemapindex xmlns="%s"><sitemap><loc>%s</loc></sitemap></sitemapindex>' % (NS, url.encode())
    assert [e.loc for e in parse_bytes(doc).entries] == [url]


def test_fields_are_trimmed_entity_decoded_and_changefreq_is_case_insensitive() -> None:
    doc = (
        b'<urlset xmlns="%s"><url>\n  <loc>\n   https://a.com/x?a=1&amp;b=&#50;  </loc>\n'
        b"  <lastmod> 2024 </lastmod><changefreq> WeEkLy </changefreq><priority> 0.8 </priority>\n"
        b"</url></urlset>" % NS
    )
    assert parse_bytes(doc).entries == [SitemapEntry("https://a.com/x?a=1&b=2", "2024", "weekly", 0.8)]


def test_cdata_and_comments_inside_a_loc_read_as_plain_text() -> None:
    doc = b"<urlset><url><loc><![CDATA[https://a.com/a?x=1&y=2]]><!-- note --></loc></url></urlset>"
    assert parse_bytes(doc).entries[0].loc == "https://a.com/a?x=1&y=2"


def test_entries_without_loc_or_with_a_blank_loc_come_back_with_loc_none() -> None:
    doc = b"<urlset><url></url><url><loc>   </loc><changefreq>daily</changefreq></url><url/></urlset>"
    assert parse_bytes(doc).entries == [
        SitemapEntry(None),
        SitemapEntry(None, None, "daily"),
        SitemapEntry(None),
    ]


def test_an_invalid_changefreq_is_kept_lowercased_and_a_junk_priority_becomes_none() -> None:
    doc = (
        b"<urlset><url><loc>https://a.com/</loc><changefreq>Sometimes</changefreq>"
        b"<priority>high</priority></url></urlset>"
    )
    assert parse_bytes(doc).entries == [SitemapEntry("https://a.com/", None, "sometimes", None)]


def test_the_first_of_repeated_fields_wins() -> None:
    doc = b"<urlset><url><loc>https://a.com/1</loc><loc>https://a.com/2</loc></url></urlset>"
    assert parse_bytes(doc).entries[0].loc == "https://a.com/1"


def test_extension_children_are_ignored_and_do_not_shadow_fields() -> None:
    doc = (
        b'<urlset xmlns="%s" xmlns:image="http://www.google.com/schemas/sitemap-image/1.1" '
        b'xmlns:xhtml="http://www.w3.org/1999/xhtml"><url><loc>https://a.com/p</loc>'
        b'<xhtml:link rel="alternate" hreflang="de" href="https://a.com/de/p"/>'
        b"<image:image><image:loc>https://a.com/i.png</image:loc></image:image></url></urlset>" % NS
    )
    assert parse_bytes(doc).entries == [SitemapEntry("https://a.com/p")]


def test_nested_urls_and_urls_outside_the_root_level_are_not_entries() -> None:
    doc = b"<urlset><url><loc>https://a.com/1</loc><url><loc>https://a.com/nested</loc></url></url></urlset>"
    assert [e.loc for e in parse_bytes(doc).entries] == ["https://a.com/1"]


def test_trailing_content_after_the_root_is_tolerated() -> None:
    parsed = parse_bytes(_urlset("https://a.com/1") + b"<urlset><url><loc>x</loc></url></urlset> junk")
    assert [e.loc for e in parsed.entries] == ["https://a.com/1"]


def test_reading_stops_once_the_root_has_closed() -> None:
    endless = itertools.chain([_urlset("https://a.com/1")], itertools.repeat(b"<junk/>"))
    assert [e.loc for e in parse_chunks(endless).entries] == ["https://a.com/1"]


def test_non_utf8_encodings_are_decoded() -> None:
    body = "<urlset><url><loc>https://a.com/{}</loc></url></urlset>"
    latin = b'<?xml version="1.0" encoding="ISO-8859-1"?>' + body.format("caf\xe9").encode("latin-1")
    utf16 = ('<?xml version="1.0" encoding="UTF-16"?>' + body.format("ü")).encode("utf-16")
    assert parse_bytes(latin).entries[0].loc == "https://a.com/café"
    assert parse_bytes(utf16).entries[0].loc == "https://a.com/ü"


# -------------------------------------------------------------------------------------- namespaces


def test_a_default_namespace_root_is_accepted() -> None:
    assert len(parse_bytes(_urlset("https://a.com/1")).entries) == 1


def test_a_root_without_namespace_is_accepted() -> None:
    assert len(parse_bytes(b"<urlset><url><loc>https://a.com/1</loc></url></urlset>").entries) == 1


def test_a_prefixed_root_bound_to_the_sitemap_namespace_is_accepted() -> None:
    doc = b'<sm:urlset xmlns:sm="%s"><sm:url><sm:loc>https://a.com/1</sm:loc></sm:url></sm:urlset>' % NS
    assert parse_bytes(doc).entries == [SitemapEntry("https://a.com/1")]


def test_a_sitemap_root_in_a_foreign_namespace_is_rejected_with_its_namespace() -> None:
    err = _error(b'<x:urlset xmlns:x="urn:other"><x:url/></x:urlset>')
    assert str(err) == "expected a <urlset> or <sitemapindex> root, got <x:urlset> in namespace urn:other"


# ------------------------------------------------------------------------------- not a sitemap


def test_an_html_403_page_names_its_root() -> None:
    page = b"<HTML><HEAD><TITLE>Access Denied</TITLE></HEAD><BODY>You don't have permission</BODY></HTML>"
    err = _error(page)
    assert str(err) == "expected a <urlset> or <sitemapindex> root, got <HTML>"
    assert err.code == "SITEMAP_NOT_SITEMAP"


def test_html5_that_is_not_well_formed_xml_still_names_its_root() -> None:
    page = b"<!doctype html>\n<html lang=en><head><meta charset=utf-8><title>Hi</title></head></html>"
    assert str(_error(page)) == "expected a <urlset> or <sitemapindex> root, got <html>"


def test_an_atom_feed_is_rejected_at_its_root() -> None:
    err = _error(b'<feed xmlns="http://www.w3.org/2005/Atom"><entry/></feed>')
    assert str(err).startswith("expected a <urlset> or <sitemapindex> root, got <feed>")


@pytest.mark.parametrize("body", [b"", b"   \n", b"Access Denied", b"\x00\x01\x02\xff" * 64, b"<", b"{}"])
def test_empty_text_and_binary_bodies_are_a_non_xml_or_empty_document(body: bytes) -> None:
    err = _error(body)
    assert str(err) == "expected a <urlset> or <sitemapindex> root, got a non-XML or empty document"
    assert err.code == "SITEMAP_NOT_XML"


def test_a_sitemap_cut_short_is_malformed() -> None:
    err = _error(_urlset("https://a.com/1")[:-15])
    assert err.code == "SITEMAP_MALFORMED" and str(err).startswith("malformed XML: ")


@pytest.mark.parametrize("kind", ["urlset", "sitemapindex"])
def test_a_document_cut_at_any_byte_is_refused_whole(kind: str) -> None:
    """Whatever libxml2 release is installed: the parser itself decides the root closed. A cut that
    leaves only the trailing newline off is complete; every shorter one is refused, fed whole or byte
    by byte, plain or gzip (where the whole document arrived and only gzip's trailer is missing, it
    is complete)."""
    entry = "url" if kind == "urlset" else "sitemap"
    doc = (b'<?xml version="1.0" encoding="UTF-8"?>\n<%s xmlns="%s"><%s><loc>https://a.com/1</loc>'
           b"<lastmod>2024-01-01</lastmod></%s><%s><loc>https://a.com/2</loc></%s></%s>"
           % (kind.encode(), NS, *(entry.encode(),) * 4, kind.encode()))
    complete = len(doc)
    for cut in range(complete):
        with pytest.raises(SitemapError):
            parse_bytes(doc[:cut])
        with pytest.raises(SitemapError):
            parse_chunks(doc[i : i + 1] for i in range(cut))
    assert len(parse_bytes(doc).entries) == 2
    zipped = gzip.compress(doc + b"\n")
    for cut in range(len(zipped)):
        if len(zlib.decompressobj(wbits=31).decompress(zipped[:cut])) >= complete:
            assert len(parse_bytes(zipped[:cut]).entries) == 2  # only the gzip trailer is missing
            continue
        with pytest.raises(SitemapError):
            parse_bytes(zipped[:cut])
    assert len(parse_bytes(zipped).entries) == 2


def test_an_undeclared_entity_is_malformed_not_expanded() -> None:
    assert _error(b"<urlset><url><loc>&foo;</loc></url></urlset>").code == "SITEMAP_MALFORMED"


def test_a_parser_that_failed_keeps_failing_with_the_same_error() -> None:
    parser = SitemapParser()
    with pytest.raises(SitemapError) as first:
        parser.feed(b"<html></html>")
    with pytest.raises(SitemapError) as again:
        parser.feed(_urlset("https://a.com/1"))
    assert again.value is first.value


# ------------------------------------------------------------------------------------------- gzip


def test_gzip_is_detected_by_its_magic_bytes() -> None:
    parsed = parse_bytes(gzip.compress(_urlset("https://a.com/1", "https://a.com/2")))
    assert parsed.compressed and [e.loc for e in parsed.entries] == ["https://a.com/1", "https://a.com/2"]


def test_a_gzip_split_anywhere_decodes_the_same() -> None:
    data = gzip.compress(_urlset(*(f"https://a.com/{i}" for i in range(200))))
    parser = SitemapParser()
    entries = [e for i in range(len(data)) for e in parser.feed(data[i : i + 1])] + parser.close()
    assert len(entries) == 200 and entries[-1].loc == "https://a.com/199"


def test_concatenated_gzip_members_form_one_document() -> None:
    doc = _urlset("https://a.com/1", "https://a.com/2")
    data = gzip.compress(doc[:50]) + gzip.compress(doc[50:])
    assert len(parse_bytes(data).entries) == 2


def test_a_corrupt_gzip_stream_is_an_error() -> None:
    data = bytearray(gzip.compress(_urlset(*(f"https://a.com/{i}" for i in range(50)))))
    data[20:40] = b"\xff" * 20
    assert _error(bytes(data)).code == "SITEMAP_BAD_GZIP"


def test_a_truncated_gzip_stream_is_an_error() -> None:
    data = gzip.compress(_urlset(*(f"https://a.com/{i}" for i in range(500))))
    err = _error(data[: len(data) // 2])
    assert (err.code, str(err)) == ("SITEMAP_BAD_GZIP", "truncated gzip stream")


def test_gzip_of_a_non_sitemap_is_reported_like_the_plain_body() -> None:
    assert str(_error(gzip.compress(b"<html><body>nope</body></html>"))).endswith("got <html>")


# ---------------------------------------------------------------------------------- hostile input


def test_a_billion_laughs_document_is_refused_without_expanding_anything() -> None:
    lols = "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10))
    doc = f'<!DOCTYPE lolz [<!ENTITY lol0 "lol">{lols}]><urlset><url><loc>&lol9;</loc></url></urlset>'
    err = _error(doc.encode())
    assert err.code == "SITEMAP_DOCTYPE" and "DOCTYPE" in str(err)


def test_an_external_entity_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-MARKER")
    for target in (secret.as_uri(), "file:///etc/passwd"):
        doc = (
            f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY xxe SYSTEM "{target}">]>'
            f"<urlset><url><loc>&xxe;</loc></url></urlset>"
        ).encode()
        parser = SitemapParser()
        with pytest.raises(SitemapError) as info:
            parser.feed(doc)
            parser.close()
        assert info.value.code == "SITEMAP_DOCTYPE"
        assert "TOP-SECRET-MARKER" not in str(info.value) and "root:" not in str(info.value)


def test_an_external_parameter_entity_and_an_external_dtd_are_refused(tmp_path: Path) -> None:
    dtd = tmp_path / "evil.dtd"
    dtd.write_text('<!ENTITY leak "TOP-SECRET-MARKER">')
    for doctype in (
        f'<!DOCTYPE urlset [<!ENTITY % ext SYSTEM "{dtd.as_uri()}"> %ext;]>',
        f'<!DOCTYPE urlset SYSTEM "{dtd.as_uri()}">',
        '<!DOCTYPE urlset SYSTEM "http://127.0.0.1:9/never.dtd">',
    ):
        err = _error(f"{doctype}<urlset><url><loc>&leak;</loc></url></urlset>".encode())
        assert err.code in ("SITEMAP_DOCTYPE", "SITEMAP_MALFORMED")
        assert "TOP-SECRET-MARKER" not in str(err)


def test_a_doctype_on_an_otherwise_valid_sitemap_is_refused() -> None:
    assert _error(b"<!DOCTYPE urlset><urlset/>").code == "SITEMAP_DOCTYPE"


def test_a_doctype_is_refused_as_its_bytes_arrive_even_split_across_chunks() -> None:
    parser = SitemapParser()
    assert parser.feed(b'<?xml version="1.0"?><!-- ' + b"c" * 100_000 + b" --><!DOC") == []
    with pytest.raises(SitemapError) as info:
        parser.feed(b'TYPE urlset [<!ENTITY e0 "x">')  # an entity flood would follow
    assert info.value.code == "SITEMAP_DOCTYPE" and parser.size < 101_000


def test_doctype_text_inside_the_document_is_just_text() -> None:
    doc = b"<urlset><!-- <!DOCTYPE x> --><url><loc><![CDATA[https://a.com/<!DOCTYPE]]></loc></url></urlset>"
    assert parse_bytes(doc).entries == [SitemapEntry("https://a.com/<!DOCTYPE")]


def test_a_doctype_in_utf16_is_caught_at_the_root() -> None:
    doc = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE urlset [<!ENTITY a "b">]><urlset/>'
    assert _error(doc.encode("utf-16")).code == "SITEMAP_DOCTYPE"


def test_an_html_doctype_names_the_page_it_announces() -> None:
    page = b'<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 4.01//EN"><HTML><BODY>Access Denied</BODY></HTML>'
    assert str(_error(page)) == "expected a <urlset> or <sitemapindex> root, got <HTML>"


def test_nesting_beyond_libxml2s_depth_limit_is_malformed() -> None:
    doc = b"<urlset><url>" + b"<x>" * 5000 + b"</x>" * 5000 + b"</url></urlset>"
    assert _error(doc).code == "SITEMAP_MALFORMED"


def test_a_gzip_bomb_of_zeros_fails_at_once_without_inflating_it() -> None:
    consumed = 0

    def bomb() -> Iterator[bytes]:
        nonlocal consumed
        for chunk in _gzip_stream(b"", b"\x00", 10 * 1024**3):
            consumed += 1
            yield chunk

    assert _error_from(bomb()).code == "SITEMAP_NOT_XML"
    assert consumed < 10


def test_a_gzip_bomb_inside_a_urlset_stops_at_the_byte_cap_with_bounded_memory() -> None:
    cap = 8 * 1024 * 1024
    tracemalloc.start()
    try:
        stream = _gzip_stream(b"<urlset>", b" ", 10 * 1024**3, b"</urlset>")
        err = _error_from(stream, max_bytes=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.code == "SITEMAP_TOO_LARGE" and str(err).startswith(f"document is larger than {cap} bytes")
    assert peak < 8 * 1024 * 1024  # the compressor's window and one piece, never the document


def test_the_byte_cap_is_checked_on_decompressed_bytes_before_they_are_parsed() -> None:
    doc = _urlset(*(f"https://a.com/{i}" for i in range(100)))
    assert parse_bytes(doc, max_bytes=len(doc)).entries
    assert _error(doc, max_bytes=len(doc) - 1).code == "SITEMAP_TOO_LARGE"
    assert _error(gzip.compress(doc), max_bytes=len(doc) - 1).code == "SITEMAP_TOO_LARGE"


def test_one_entry_more_than_the_cap_rejects_the_whole_document() -> None:
    assert len(parse_bytes(_urlset("https://a.com/1", "https://a.com/2"), max_entries=2).entries) == 2
    err = _error(_urlset("https://a.com/1", "https://a.com/2", "https://a.com/3"), max_entries=2)
    assert err.code == "SITEMAP_TOO_MANY_ENTRIES"
    assert str(err) == "document has more than 2 entries; rejected as a whole"


def test_the_caps_default_to_the_sitemap_protocol_and_follow_the_config() -> None:
    assert (MAX_BYTES, MAX_ENTRIES) == (Sitemap().max_bytes, Sitemap().max_entries) == (52_428_800, 50_000)
    parser = SitemapParser.from_config(Sitemap(max_bytes=4096, max_entries=7))
    assert (parser.max_bytes, parser.max_entries) == (4096, 7)


def test_a_document_fed_in_chunks_keeps_python_memory_flat() -> None:
    parser = SitemapParser(max_entries=1 << 40)
    count = 0
    tracemalloc.start()
    try:
        for chunk in _url_stream(40_000):
            count += len(parser.feed(chunk))  # entries are dropped as they come, as a streaming caller would
        count += len(parser.close())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 40_000 and parser.size > 5_000_000
    assert peak < 1024 * 1024  # one chunk's entries, not the document's


def test_a_flood_of_junk_elements_does_not_grow_libxml2s_tree() -> None:
    # Without pruning, 20 MB of <x/> costs libxml2 about 650 MB; pruned it stays near the baseline.
    rss = _run_isolated(
        """
        from prerender_ray.sitemaps.parser import SitemapParser
        parser = SitemapParser()
        parser.feed(b"<urlset><url><loc>https://a.com/</loc>" + b"<y/>" * 500_000 + b"</url>")
        for _ in range(300):
            parser.feed(b"<x/>" * 16384)
        assert parser.size > 20_000_000
        """
    )
    assert rss < 120


def test_a_large_gzip_document_keeps_resident_memory_bounded() -> None:
    # Unpruned, these 500,000 entries would hold about 160 MB of libxml2 tree.
    rss = _run_isolated(
        """
        import gzip
        from prerender_ray.sitemaps.parser import SitemapParser
        parser = SitemapParser(max_entries=1 << 40)
        urls = b"".join(b"<url><loc>https://example.com/p/%d</loc></url>" % i for i in range(20_000))
        block = gzip.compress(urls)
        parser.feed(gzip.compress(b"<urlset>"))
        for _ in range(25):
            parser.feed(block)  # one gzip member per block: a multi-member stream
        parser.feed(gzip.compress(b"</urlset>"))
        parser.close()
        assert parser.entry_count == 500_000 and parser.compressed and parser.size > 20_000_000
        """
    )
    assert rss < 100


# ------------------------------------------------------------------------------ chunking and APIs


def _full_urlset(count: int) -> bytes:
    """Entries with every field, an extension child and a comment, to catch anything pruned too early."""
    return b'<urlset xmlns="%s" xmlns:image="urn:image">%s</urlset>' % (
        NS,
        b"".join(
            b"<url><loc>https://a.com/%d?q=&amp;x</loc><lastmod>2024-01-%02d</lastmod><!-- c -->"
            b"<image:image><image:loc>https://cdn/%d.png</image:loc></image:image>"
            b"<changefreq>Weekly</changefreq><priority>0.%d</priority></url>" % (i, i % 28 + 1, i, i % 10)
            for i in range(count)
        ),
    )


def test_every_field_survives_one_byte_chunks() -> None:
    doc = _full_urlset(30)
    parser = SitemapParser()
    entries = [e for i in range(len(doc)) for e in parser.feed(doc[i : i + 1])] + parser.close()
    assert entries == parse_bytes(doc).entries
    assert entries[7] == SitemapEntry("https://a.com/7?q=&x", "2024-01-08", "weekly", 0.7)


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=40), compress=st.booleans())
def test_any_chunking_yields_the_same_entries(cuts: list[int], compress: bool) -> None:
    doc = _full_urlset(60)
    data = gzip.compress(doc) if compress else doc
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    parsed = parse_chunks([data[a:b] for a, b in itertools.pairwise(bounds)])
    assert parsed.entries == parse_bytes(doc).entries and parsed.compressed == compress
    assert all(e.lastmod and e.changefreq == "weekly" and e.priority is not None for e in parsed.entries)


async def test_an_async_body_parses_like_a_sync_one() -> None:
    data = gzip.compress(_urlset("https://a.com/1", "https://a.com/2"))

    async def body() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 7):
            yield data[i : i + 7]

    parsed = await parse_stream(body())
    assert [e.loc for e in parsed.entries] == ["https://a.com/1", "https://a.com/2"]


def test_feed_returns_entries_as_they_complete() -> None:
    parser = SitemapParser()
    assert parser.feed(b"<urlset><url><loc>https://a.com/1</loc></url><url><loc>https://a.") == [
        SitemapEntry("https://a.com/1")
    ]
    assert parser.feed(b"com/2</loc></url>") == [SitemapEntry("https://a.com/2")]
    assert not parser.done
    assert parser.feed(b"</urlset>") == [] and parser.done
    assert parser.close() == [] and parser.entry_count == 2


def test_a_closed_parser_cannot_be_fed() -> None:
    parser = SitemapParser()
    parser.feed(b"<urlset/>")
    parser.close()
    with pytest.raises(RuntimeError):
        parser.feed(b"<urlset/>")


def test_the_snippet_collapses_whitespace_and_cuts_at_200() -> None:
    assert snippet(b"  <html>\n\n  <body>  403 </body>") == "<html> <body> 403 </body>"
    long = snippet(b"x" * 500)
    assert len(long) == 201 and long.endswith("…")
    parser = SitemapParser()
    with pytest.raises(SitemapError):
        parser.feed(b"<html>" + b"a" * 1000)
    assert snippet(parser.head).startswith("<html>aaa")


def test_the_sitemap_modules_load_no_service_dependencies() -> None:
    code = ("import sys, prerender_ray.sitemaps.parser, prerender_ray.sitemaps.rules, prerender_ray.sitemaps.refresh; "
            "print(sorted(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.strip()[2:-2].split("', '"))
    assert not loaded & {"ray", "httpx", "rocksdict", "fastapi"}
