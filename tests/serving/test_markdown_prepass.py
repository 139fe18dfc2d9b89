"""The pass over a page's HTML before conversion (markdown_prepass.py), and what it is for: pages with
refused links and with "<" in code take one conversion with no visitor."""

from __future__ import annotations

import re
import time

import html_to_markdown
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.serving.markdown import Limits, _options, html_to_md
from prerender_ray.serving.markdown_inert import plainly_inert, without_front_matter
from prerender_ray.serving.markdown_prepass import _rewrite, hide, prepass
from tests.serving.test_markdown import PAGE
from tests.serving.test_markdown_inert import live, render

LIMITS = Limits(max_input_bytes=1024 * 1024, max_output_bytes=1024 * 1024)
BASE = "https://site.example/docs/page"

DOCS = PAGE.replace(b"</article>", b"""<p>Call <a href="tel:+15555550100">the desk</a>, <a href="javascript:void(0)">open the menu</a>
or <a href="/help" title="Help &lt;here&gt;">help</a>. <img src="data:image/png;base64,AAAA" alt="a chart">
<iframe src="javascript:alert(1)"></iframe> <img alt="no source"></p>
<p>Use <code>Vec&lt;T&gt;</code> when <code>a &lt; b</code>:</p>
<pre><code class="language-rust">fn first&lt;T: Clone&gt;(v: &amp;[T]) -&gt; Option&lt;T&gt; {
    v.get(0).cloned() // &lt;script&gt;alert(1)&lt;/script&gt;
}</code></pre></article>""")


def fast_path(page: bytes) -> bool:
    """Whether ``page`` is converted once, with no visitor (what html_to_md keeps as the converter wrote it)."""
    result = html_to_markdown.convert(prepass(page.decode()), _options(BASE, LIMITS))
    body = without_front_matter(result.content or "")
    return body is not None and plainly_inert(body)


def test_a_page_with_refused_links_and_code_holding_lt_takes_the_fast_path() -> None:
    assert fast_path(DOCS)
    markdown = html_to_md(DOCS, LIMITS, base_url=BASE)
    assert live(markdown) == []
    root = render(markdown.split("\n---\n", 1)[1])
    assert {a.text_content(): a.get("href") for a in root.xpath("//a")} == {
        "the specs": "https://site.example/specs", "a review": "https://elsewhere.example/review",
        "help": "https://site.example/help"}  # the refused links keep their text only
    text = root.text_content()
    assert "the desk" in text and "open the menu" in text and "a chart" in text and "no source" in text
    assert "tel:" not in markdown and "javascript" not in markdown and "data:" not in markdown
    assert [c.text_content() for c in root.xpath("//p/code")] == ["Vec<T>", "a < b"]
    (block,) = root.xpath("//pre/code")
    assert block.text_content().startswith("fn first<T: Clone>(v: &[T]) -> Option<T> {")
    assert "// <script>alert(1)</script>" in block.text_content()
    for chrome in ("About us", "Related", "__STATE__", "Search"):  # the converter's own clean-up ran
        assert chrome not in markdown


@pytest.mark.parametrize(("tag", "expected"), [
    ('<a href="tel:1" class="c">t</a>', '<a class="c">t</a>'),
    ('<A HREF="JaVa&#09;Script:x">t</A>', "<A>t</A>"),
    ("<a title='x>y' href=javascript:x>t</a>", "<a title='x>y'>t</a>"),  # a quoted ">" does not end the tag
    ('<a href="/ok" href="javascript:x">t</a>', '<a href="/ok">t</a>'),  # the first of an attribute counts
    ('<a href="/ok" title="a &lt;b&gt;">t</a>', '<a href="/ok">t</a>'),
    ('<a href="/ok" title="a `b`">t</a>', '<a href="/ok">t</a>'),
    ('<img src="javascript:x" alt="a &lt;b&gt; &amp; c">', "a &lt;b&gt; &amp; c"),
    ('<img alt="none"/>', "none"),
    ('<img src="" alt="empty">', "empty"),
    ('<iframe src="data:text/html,x" width="1"></iframe>', '<iframe width="1"></iframe>'),
    ('<video src="vbscript:x"><source src="file:///x" type="video/mp4"></video>',
     '<video></video>'.replace("></", '><source type="video/mp4"></')),
])
def test_the_pass_takes_out_what_the_converter_would_copy(tag: str, expected: str) -> None:
    assert prepass(f"<p>{tag}</p>") == f"<p>{expected}</p>"


@pytest.mark.parametrize("tag", [
    '<a href="https://a.example/x?y=1&amp;z=2" title="Plain title">t</a>', '<a href="/rel" rel="nofollow">t</a>',
    '<img src="/i.png" alt="a" title="t">', '<a href="mailto:a@b.example">m</a>', '<iframe src="https://v.example/e"></iframe>',
    "<abbr title='x < y'>t</abbr>", '<p title="x &lt; y">not an address tag</p>', "<area href='#map'>",
])
def test_the_pass_leaves_allowed_tags_as_they_are(tag: str) -> None:
    page = f"<body>{tag}</body>"
    assert prepass(page) is page or prepass(page) == page


# ---------------------------------------------------------------------------------- linear work

# The pass as it was before it was made linear: the oracle its output is compared with.
_OLD_TAG = re.compile(r"""<(a|area|img|iframe|video|audio|source|embed)(?=[\s/>])((?:[^>"']|"[^"]*"|'[^']*')*)>""",
                      re.IGNORECASE)
_OLD_SUSPECT = (
    re.compile(r"""=(?:(?<=[hH][rR][eE][fF]=)|(?<=[sS][rR][cC]=)|(?<=\s=))\s*"""
               r"""(?!(?P<q>["'])(?:https?://|mailto:|[\w.~+-]*(?:[/?#]|(?P=q)))|(?:https?://|mailto:|[\w.~+-]*[/?#\s>]))"""),
    re.compile(r"""=(?<=[tT][iI][tT][lL][eE]=)\s*(?:"[^"]*[<`\\&]|'[^']*[<`\\&])"""),
    re.compile(r"""<[iI][mM][gG](?![^>]*\b[sS][rR][cC]\s*=\s*["']?[^"'\s>])"""),
)


def old_prepass(text: str) -> str:
    starts = sorted({text.rfind("<", 0, m.start() + 1) for r in _OLD_SUSPECT for m in r.finditer(text)})
    parts: list[str] = []
    last = 0
    for start in starts:
        tag = _OLD_TAG.match(text, start) if start >= last else None
        if tag is not None:
            parts += (text[last:start], _rewrite(tag))
            last = tag.end()
    if not parts:
        return text
    parts.append(text[last:])
    return "".join(parts)


# What the pass reads, shuffled: tags it rewrites, quotes that pair or do not, comments, entities.
PIECES = st.sampled_from([
    "<a ", "<A ", "<img ", "<IMG", "<area ", "<iframe ", "<source ", "<video ", "<audio", "<embed ", "<p ", "<",
    ">", "/>", " ", "\n", '"', "'", "=", " = ", "href=", "HREF =", "src=", "Src = ", "title=", "alt=", "x",
    "javascript:x", "tel:1", "/ok", "https://a.example/", "mailto:a@b", "#top", "a.b?c", "data:,x",
    "&lt;", "&amp;", "`", "\\", "<!-- ", " -->", "</a>", "<script>", "</script>", "imgsrc", "src",
])


@settings(max_examples=1500, deadline=None)
@given(st.lists(PIECES, max_size=40).map("".join))
def test_the_pass_rewrites_as_the_quadratic_one_did(html: str) -> None:
    assert prepass(html) == old_prepass(html)


@pytest.mark.parametrize("page", [PAGE, DOCS])
def test_the_pass_leaves_ordinary_pages_as_the_quadratic_one_did(page: bytes) -> None:
    html = page.decode()
    assert prepass(html) == old_prepass(html)
    assert prepass(html * 50) == old_prepass(html * 50)


@pytest.mark.parametrize("hostile", [
    "<!-- " + "<a href=j: " * 20_000 + "' -->",  # every tag start read up to the unpaired quote
    "<!-- " + "<img " * 40_000 + " -->",  # every image's look-ahead read up to the one ">"
    "<a src=j:" * 22_000,  # no ">" at all
    "<script>" + "<img src" * 25_000 + "</script>",
    "<p " + "href=j: " * 260_000,  # 2 MB: every suspect looked back from to the one "<"
])
def test_the_pass_takes_time_linear_in_its_input(hostile: str) -> None:
    """Chromium leaves "<" unescaped in comments, scripts and styles, so a page can hold any number of tag
    starts that never end. Counting the regex engine's steps is not possible from Python (the quadratic
    work was backtracking inside single calls), so this bounds the thread's CPU time instead, generously:
    about 200 KB takes milliseconds (2 MB a few tenths of a second); the quadratic pass took minutes."""
    assert len(hostile) >= 150_000
    started = time.thread_time()
    prepass(hostile)
    assert time.thread_time() - started < 2.0


@pytest.mark.parametrize("hostile", [
    "<!-- " + "<div class=hidden " * 12_000 + "' -->",  # every tag start read up to the unpaired quote
    "<!-- " + "<p style='opacity:0 " * 10_000 + " -->",
    "<!-- " + '<dialog title="x' * 14_000,
    '<p style="' + "x\\" * 100_000 + ':0">',  # one long style, read once
    '<p style="' + "/*" * 100_000 + '">',
    "<!-- " + '<i aria-hidden=" TRUE " ' * 8_000 + " -->",
])
def test_hiding_takes_time_linear_in_its_input(hostile: str) -> None:
    """As for the addresses: a bound on CPU time, milliseconds expected."""
    assert len(hostile) >= 150_000
    started = time.thread_time()
    hide(hostile)
    assert time.thread_time() - started < 2.0
