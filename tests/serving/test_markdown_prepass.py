"""The pass over a page's HTML before conversion (markdown_prepass.py), and what it is for: pages with
refused links and with "<" in code take one conversion with no visitor."""

from __future__ import annotations

import html_to_markdown
import pytest

from prerender_ray.serving.markdown import Limits, _options, html_to_md
from prerender_ray.serving.markdown_inert import plainly_inert, without_front_matter
from prerender_ray.serving.markdown_prepass import prepass
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
