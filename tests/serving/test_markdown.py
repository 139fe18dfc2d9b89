"""Markdown for agents, pure: the Accept negotiation, the conversion of a rendered page and its bounds,
and the headers of the Markdown answer."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import time
from pathlib import Path

import html_to_markdown
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.config.bots import BOT_CLASSES
from prerender_ray.config.model import Config
from prerender_ray.serving import markdown as markdown_module
from prerender_ray.serving.answer import prepare, prepared_reply
from prerender_ray.serving.markdown import (
    MARKDOWN_TYPE,
    MAX_ACCEPT_CHARS,
    MAX_DEPTH,
    Limits,
    MarkdownPolicy,
    MarkdownSkipped,
    _options,
    charset_of,
    convert_page,
    html_to_md,
    markdown_etag,
    markdown_meta,
    wants_markdown,
)
from prerender_ray.serving.markdown_prepass import MAX_QUOTE_DEPTH, _nesting
from prerender_ray.storage.pages import PageMeta

LIMITS = Limits(max_input_bytes=1024 * 1024, max_output_bytes=512 * 1024)
PAGE = b"""<!doctype html><html><head><title>Widget - Shop</title>
<meta name="description" content="A fine widget"><meta name="viewport" content="width=device-width">
<script>window.__STATE__ = {"secret": 1}</script><style>p { color: red }</style></head>
<body><header><nav><a href="/">Home</a><a href="/about">About us</a></nav></header>
<div id="root"><aside>Related: <a href="/other">other</a></aside>
<main><article><h1>The widget</h1><p>Made of <strong>steel</strong>; see <a href="/specs">the specs</a>
and <a href="https://elsewhere.example/review">a review</a>.</p>
<h2>Sizes</h2><table><thead><tr><th>Size</th><th>Price</th></tr></thead>
<tbody><tr><td>S</td><td>10</td></tr><tr><td>L</td><td>12</td></tr></tbody></table>
<form><input name="q"><button>Search</button></form></article></main></div></body></html>"""


# ------------------------------------------------------------------------------------ negotiation


@pytest.mark.parametrize(("accept", "expected"), [
    ("text/markdown", True),
    ("text/markdown, text/html;q=0.9", True),
    ("text/html;q=0.5, text/markdown;q=0.8", True),
    ("TEXT/Markdown ; charset=utf-8", True),
    ("text/x-markdown", True),
    ("text/markdown, text/html", True),  # a tie: listed first
    ("text/html, text/markdown", False),  # a tie: HTML listed first
    ("text/markdown, */*", True),  # a tie with a wildcard: the named type
    ("*/*, text/markdown", True),
    ("text/markdown;q=0.9, text/html", False),
    ("text/markdown;q=0", False),
    ("text/markdown;q=0, */*", False),
    ("text/html, text/markdown;q=0.8, */*;q=0.5", False),
    ("text/html;q=0, text/markdown;q=0.1", True),  # HTML refused
    ("text/*;q=0.5, text/markdown;q=0.6", True),
    ("text/markdown;q=0.5, text/html;q=0.9, text/html;q=0.1", True),  # HTML listed twice: its lower q
    ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", False),  # a browser
    ("*/*", False),
    ("", False),
    (None, False),
    ("text/markdown;q=abc", False),  # a malformed q: the item is skipped
    ("text/markdown;q=2", False),
    ("text/markdown;q=nan", False),
    ("markdown, /, ;;, text/", False),
    ("text/plain, text/markdown;q=0.1", True),  # text/plain says nothing about HTML
])
def test_accept_negotiation(accept: str | None, expected: bool) -> None:
    assert wants_markdown(accept) is expected


def test_a_forced_bot_gets_markdown_unless_its_accept_refuses_it() -> None:
    assert wants_markdown("text/html", forced=True)
    assert wants_markdown(None, forced=True)
    assert not wants_markdown("text/markdown;q=0, text/html", forced=True)


def test_an_overlong_accept_is_not_parsed() -> None:
    long = "text/markdown, " + "x/y;q=0.1, " * (MAX_ACCEPT_CHARS // 10)
    assert len(long) > MAX_ACCEPT_CHARS
    assert not wants_markdown(long)
    assert wants_markdown(long, forced=True)


def test_the_policy_reads_the_markdown_section() -> None:
    cfg = Config.model_validate({"markdown": {"forBots": ["GPTBot"], "forClasses": ["ai-search"]}}).markdown
    policy = MarkdownPolicy.from_config(cfg)
    assert policy.wants("text/markdown", None, None)
    assert policy.wants("text/html", "gptbot", None) and policy.wants(None, "GPTBot", None)
    assert not policy.wants("text/html", "ClaudeBot", None)
    assert policy.wants("text/html", "ClaudeBot", "ai-search")  # the class, once the bot policy names it
    assert not policy.wants("text/html", "ClaudeBot", "search")
    off = MarkdownPolicy.from_config(Config.model_validate({"markdown": {"enabled": False}}).markdown)
    assert not off.wants("text/markdown", "GPTBot", "ai-search")


def test_for_classes_accepts_only_the_bot_classes() -> None:
    assert BOT_CLASSES == ("search", "ai-search", "ai-training", "social", "seo-tool", "other")
    Config.model_validate({"markdown": {"forClasses": list(BOT_CLASSES)}})
    with pytest.raises(ValueError, match="for_classes"):
        Config.model_validate({"markdown": {"forClasses": ["ai"]}})


# ------------------------------------------------------------------------------------- conversion


def test_a_page_converts_to_its_main_content() -> None:
    md = html_to_md(PAGE, LIMITS, base_url="https://shop.example/widget")
    assert md.startswith('---\ntitle: "Widget - Shop"\ndescription: "A fine widget"\n---\n\n')
    assert "viewport" not in md  # the front matter keeps title, description and canonical only
    assert "# The widget" in md and "## Sizes" in md
    assert "**steel**" in md
    assert "[the specs](https://shop.example/specs)" in md  # made absolute against the page's URL
    assert "[a review](https://elsewhere.example/review)" in md
    assert "| Size | Price |" in md and "| S | 10 |" in md and "| L | 12 |" in md
    for chrome in ("About us", "Related", "__STATE__", "color: red", "Search"):  # nav, aside, script, style, form
        assert chrome not in md


HIDDEN = [
    # Handled before: the hidden attribute, <template>, inline display:none and visibility:hidden.
    "<div hidden>SECRET</div>", "<template><p>SECRET</p></template>", '<div style="display:none">SECRET</div>',
    '<p style="visibility:hidden">SECRET</p>', '<div aria-hidden="true">SECRET</div>',
    # A closed dialog; aria-hidden in any case, with spaces; the utility classes.
    "<dialog>SECRET</dialog>", "<dialog class=x><p>SECRET</p></dialog>", '<div aria-hidden="TRUE">SECRET</div>',
    '<div aria-hidden=" true">SECRET</div>', '<span aria-hidden="True ">SECRET</span>',
    '<div class="note hidden">SECRET</div>', '<span class="sr-only">SECRET</span>',
    '<span class="visually-hidden">SECRET</span>', '<a class="sr-only" href="/skip">SECRET</a>',
    # Inline styles: opacity 0, content-visibility, visibility:collapse; CSS escapes and comments read.
    '<div style="opacity:0">SECRET</div>', '<div style="color: red; OPACITY: 0.0 !important">SECRET</div>',
    '<div style="opacity:0%">SECRET</div>', '<div style="content-visibility: hidden">SECRET</div>',
    '<div style="visibility:collapse">SECRET</div>', r'<div style="display:n\6f ne">SECRET</div>',
    r'<div style="display:\6E one">SECRET</div>', r'<div style="dis\70 lay: none">SECRET</div>',
    r'<div style="opacit\y:0">SECRET</div>', '<div style="display:/* x */none">SECRET</div>',
    r'<div style="visibility:\000068 idden">SECRET</div>', '<div style="display:&#110;one">SECRET</div>',
    # Images: hidden ones go, alt text and all, with a source or without.
    '<img src="/a.png" alt="SECRET" class="sr-only">', '<img alt="SECRET" style="opacity:0">',
]
VISIBLE = [
    '<dialog open>SHOWN</dialog>', '<div aria-hidden="false">SHOWN</div>', '<div class="hidden md:block">SHOWN</div>',
    '<div class="hidden-xs Hidden not-sr-only">SHOWN</div>', '<div style="opacity:0.5">SHOWN</div>',
    '<div style="opacity:0;opacity:1">SHOWN</div>', '<div style="display:none;display:block">SHOWN</div>',
    r'<div style="display:n\6f  ne">SHOWN</div>',  # one space ends the escape, the other splits the word
    '<div style="content-visibility:auto">SHOWN</div>', '<p class="x">The SHOWN hidden sr-only opacity:0 dialog</p>',
    '<img src="/a.png" alt="SHOWN" class="avatar">',
]


def hidden_page(fragment: str) -> bytes:
    return f"<html><body><main><p>before</p>{fragment}<p>after</p></main></body></html>".encode()


@pytest.mark.parametrize("fragment", HIDDEN)
def test_hidden_content_does_not_reach_the_markdown(fragment: str) -> None:
    md = html_to_md(hidden_page(fragment), LIMITS)
    assert "SECRET" not in md
    assert "before" in md and "after" in md


@pytest.mark.parametrize("fragment", VISIBLE)
def test_visible_content_with_the_same_words_stays(fragment: str) -> None:
    assert "SHOWN" in html_to_md(hidden_page(fragment), LIMITS)


def test_hidden_content_is_dropped_on_the_visitor_path_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(markdown_module, "plainly_inert", lambda _markdown: False)  # as for a page failing it
    md = html_to_md(hidden_page("".join(HIDDEN) + "".join(VISIBLE)), LIMITS)
    assert "SECRET" not in md
    assert md.count("SHOWN") == len(VISIBLE)


def test_a_stored_page_converts_from_its_coding() -> None:
    body = convert_page(gzip.compress(PAGE), "gzip", LIMITS)
    assert b"# The widget" in gzip.decompress(body)
    assert convert_page(PAGE, "identity", LIMITS) == body


def test_input_over_the_cap_is_not_converted() -> None:
    small = Limits(max_input_bytes=len(PAGE) - 1, max_output_bytes=LIMITS.max_output_bytes)
    with pytest.raises(MarkdownSkipped) as e:
        html_to_md(PAGE, small)
    assert e.value.reason == "too-large"
    with pytest.raises(MarkdownSkipped) as e:  # the decode stops at the cap: a gzip bomb is never inflated
        convert_page(gzip.compress(b"<p>" + b"a" * 50_000_000 + b"</p>"), "gzip", small)
    assert e.value.reason == "too-large"


def test_output_over_the_cap_is_not_served() -> None:
    tight = Limits(max_input_bytes=LIMITS.max_input_bytes, max_output_bytes=100)
    with pytest.raises(MarkdownSkipped) as e:
        html_to_md(PAGE, tight)
    assert e.value.reason == "output-too-large"


def test_a_corrupt_stored_body_is_a_failed_conversion() -> None:
    with pytest.raises(MarkdownSkipped) as e:
        convert_page(b"\x1f\x8bnot gzip at all", "gzip", LIMITS)
    assert e.value.reason == "failed"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 100, 100_000])
def test_deep_nesting_is_cut_not_a_crash(depth: int) -> None:
    deep = b"<html><body><p>top</p>" + b"<div>" * depth + b"deep text" + b"</div>" * depth + b"</body></html>"
    md = html_to_md(deep, Limits(max_input_bytes=len(deep), max_output_bytes=LIMITS.max_output_bytes))
    assert "top" in md and "deep text" not in md  # past MAX_DEPTH (the converter's own default is 1024)
    shallow = b"<div>" * (MAX_DEPTH // 2) + b"deep text" + b"</div>" * (MAX_DEPTH // 2)
    assert "deep text" in html_to_md(shallow, LIMITS)


# A child process, so that its peak RSS is this conversion's alone.
_PEAK = """
import resource
from prerender_ray.serving.markdown import Limits, MarkdownSkipped, html_to_md
html = "<blockquote>" * 250 + "<p>x</p>" * 20_000 + "</blockquote>" * 250  # 166 KB
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    html_to_md(html, Limits(max_input_bytes=2 * 1024 * 1024, max_output_bytes=1024 * 1024))
    outcome = "converted"
except MarkdownSkipped as e:
    outcome = e.reason
print(outcome, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_deeply_nested_quotes_are_refused_before_the_converter_spends_memory() -> None:
    """The converter prefixes every line with "> " per level and keeps each level's copy: 250 levels
    took 15 KB of memory per byte of input (166 KB: 2.5 GB), and the output cap came after."""
    child = subprocess.run([sys.executable, "-c", _PEAK], capture_output=True, text=True, timeout=300,
                           cwd=Path(__file__).resolve().parents[2], check=True)
    outcome, peak_mb = child.stdout.split()
    assert outcome == "output-too-large"
    assert int(peak_mb) < 200


def test_ordinary_quotes_convert_as_before() -> None:
    nested = b"<blockquote><p>one</p><blockquote><p>two</p><blockquote><p>three</p></blockquote></blockquote></blockquote>"
    assert html_to_md(nested, LIMITS) == "> one\n>\n> > two\n> >\n> > > three\n"
    # A thread of many quotes, one after the other: links, comments, apostrophes, "<" in text, images.
    quote = (b'<blockquote class="post"><p>It\'s <a href="/u/1" title="a &quot;user&quot;">Ann</a> wrote<!-- -->:'
             b' 1 < 2 <img src="/e.png" alt="smile"></p><blockquote><p>Earlier</p></blockquote><br></blockquote>')
    thread = b"<main>" + quote * (MAX_QUOTE_DEPTH * 3) + b"</main>"
    md = html_to_md(thread, LIMITS)
    assert md.count("> > Earlier") == MAX_QUOTE_DEPTH * 3


@pytest.mark.parametrize("level", [
    "<blockquote><!-- </blockquote> -->",  # a close in a comment
    "<blockquote><table><tr><td></blockquote>",  # a close out of scope
    "<blockquote><p title='</blockquote>'>",  # a close in an attribute value
    '<blockquote><p a=b"c d="></blockquote>">',  # a quote inside an unquoted value opens nothing
    "<blockquote><textarea></blockquote></textarea>",
    "<blockquote><script></blockquote></script>",
    "<blockquote></ </blockquote>",  # a bogus comment up to the next ">"
])
def test_closes_the_parser_ignores_do_not_hide_nesting(level: str) -> None:
    html = level * 40 + "<p>deep</p>"
    assert converted_depth(level * 20 + "<p>deep</p>") == 20  # the converter does nest them
    assert _nesting(html) > MAX_QUOTE_DEPTH
    with pytest.raises(MarkdownSkipped) as e:
        html_to_md(html, LIMITS)
    assert e.value.reason == "output-too-large"


_QUOTE_PREFIX = re.compile(r"(?:[ \t]*(?:[-*+]|\d+[.)])[ \t])*((?:>[ \t]?)*)")


def converted_depth(html: str) -> int:
    """The deepest quote in the converter's Markdown for ``html`` (a code block's lines count as deep as
    the line opening it: what they hold is not markup)."""
    markdown = html_to_markdown.convert(html, _options(None, LIMITS)).content or ""
    deepest, fence = 0, ""
    for line in markdown.splitlines():
        prefix = _QUOTE_PREFIX.match(line)
        depth = prefix.group(1).count(">") if prefix else 0
        tildes = re.match(r"[ \t]*(~{3,})", line[prefix.end() if prefix else 0:])
        if not fence:
            deepest = max(deepest, depth)
            fence = tildes.group(1) if tildes else ""
        elif tildes and tildes.group(1).startswith(fence):
            fence = ""
    return deepest


QUOTE_PIECES = st.sampled_from([
    "<blockquote>", "<blockquote>", "</blockquote>", "</blockquote>", "<BLOCKQUOTE x='>'>", "</blockquote x>",
    "<blockquote/>", "x", " ", "\n", "<p>", "</p>", "<div>", "</div>", "<ul><li>", "</ul>", "<b>", "</b>", "<a>",
    "</a>", "<!--", "-->", "--!>", "<!-->", "<!---", "<![CDATA[", "]]>", "<?", "</ ", "</>", ">", "<", "'", '"',
    "=", "<p title='", "<p title=\"", "<p a=", "'>", '">', "<script>", "</script>", "<style>", "</style>",
    "<textarea>", "</textarea>", "<title>", "</title>", "<table>", "<td>", "</td>", "</table>", "<svg>", "</svg>",
    "<path/>", "<foreignObject>", "<desc>", "<math>", "<template>", "</template>", "<select>", "</select>",
    "<noscript>", "</noscript>", "<xmp>", "<iframe>", "</iframe>", "<object>", "<marquee>", "<button>",
    "<plaintext>", "<body>", "</body>", "<pre>", "</pre>", "<tr>", "</tr>", "<li>", "</li>", "</br>", "<br>", "<hr/>",
    "<div/>", "<path d='x'/>", "<x-y>", "</x-y>", "<image>", "<frameset>", "<option>", "<caption>", "<img src=x>",
])


@settings(max_examples=1500, deadline=None)
@given(st.lists(QUOTE_PIECES, max_size=60).map("".join))
def test_the_nesting_read_is_never_less_than_the_converters(html: str) -> None:
    assert min(_nesting(html), MAX_QUOTE_DEPTH + 1) >= min(converted_depth(html), MAX_QUOTE_DEPTH + 1)


def test_a_pathological_table_is_converted_within_its_bounds() -> None:
    """Wide tables are the converter's slow case: the input cap keeps one conversion to a bounded
    time (the wall-clock deadline is the ingress's: tests/api/bot/test_markdown.py)."""
    row = b"<tr>" + b"<td>x</td>" * 2000 + b"</tr>"
    table = b"<table>" + row * 25 + b"</table>"
    started = time.monotonic()
    md = html_to_md(table, Limits(max_input_bytes=len(table), max_output_bytes=4 * len(table)))
    assert md.count("\n") >= 25 and time.monotonic() - started < 30
    with pytest.raises(MarkdownSkipped):
        html_to_md(table * 10, Limits(max_input_bytes=len(table), max_output_bytes=4 * len(table)))


def test_text_that_is_not_utf8_is_replaced_not_refused() -> None:
    assert "caf\ufffd" in html_to_md(b"<p>caf\xe9</p>", LIMITS)


def test_the_stored_charset_is_honoured() -> None:
    assert charset_of("text/html; charset=ISO-8859-1") == "iso8859-1"
    assert charset_of('text/html;Charset="shift_jis"') == "shift_jis"
    assert charset_of("text/html; charset=bogus") == charset_of("text/html") == charset_of(None) == "utf-8"
    assert "caf\u00e9" in html_to_md(b"<p>caf\xe9</p>", LIMITS, charset=charset_of("text/html; charset=latin1"))


# -------------------------------------------------------------------------------------- the answer


@pytest.mark.parametrize(("page", "expected"), [
    ('"abc"', '"abc-md"'),
    ('W/"abc"', 'W/"abc-md"'),
    ("bare", '"bare-md"'),
])
def test_the_markdown_etag_derives_from_the_page(page: str, expected: str) -> None:
    assert markdown_etag(page, b"x") == expected


def test_without_a_page_etag_the_markdown_etag_is_its_hash() -> None:
    a, b = markdown_etag("", b"one"), markdown_etag("", b"two")
    assert a.startswith('"md-') and a != b and markdown_etag('"', b"one") == a


def _meta() -> PageMeta:
    return PageMeta(cache_key="https://s.example/w|desktop", status_code=200, last_cached=1_000, expires_at=9_000,
                    headers={"content-type": "text/html; charset=utf-8", "content-encoding": "br", "etag": '"p1"',
                             "content-length": "99", "vary": "Accept-Encoding", "cache-control": "max-age=60",
                             "last-modified": "Wed, 01 Jan 2025 00:00:00 GMT", "link": "</a.js>; rel=preload"})


def test_the_markdown_answer_has_its_own_type_etag_and_vary() -> None:
    body = convert_page(PAGE, "identity", LIMITS)
    meta = markdown_meta(_meta(), body)
    p = prepare(meta, body, "gzip, br")
    h = p.headers
    assert h["content-type"] == MARKDOWN_TYPE and h["etag"] == '"p1-md"' and h["content-encoding"] == "gzip"
    assert h["vary"] == "Accept-Encoding, Accept" and h["cache-control"] == "max-age=60"
    assert h["content-length"] == str(len(body)) and "link" not in h and p.body is body
    plain = prepare(meta, body, None)  # identity: decoded, a weak ETag (other bytes, same content)
    assert plain.body == gzip.decompress(body) and plain.headers["etag"] == 'W/"p1-md"'
    assert "content-encoding" not in plain.headers
    r = prepared_reply(p, last_cached=1_000, now=5_000, request_headers={"if-none-match": '"p1-md"'})
    assert r.status == 304 and r.body == b""
    r = prepared_reply(p, last_cached=1_000, now=5_000, request_headers={"if-none-match": '"p1"'})
    assert r.status == 200  # the HTML's ETag does not validate the Markdown
    head = prepared_reply(p, last_cached=1_000, now=5_000, request_headers={}, head=True)
    assert head.status == 200 and head.body == b"" and dict(head.asgi_headers())[b"content-length"] == str(
        len(body)).encode()


def test_the_accept_memo_is_bounded() -> None:
    from prerender_ray.serving import markdown

    for i in range(markdown.ACCEPT_MEMO + 10):
        wants_markdown(f"text/markdown;q=0.{i % 9 + 1}, x/y{i}")
    assert 0 < len(markdown._decided) <= markdown.ACCEPT_MEMO
