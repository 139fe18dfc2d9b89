"""Markdown for agents is inert (docs/serving.md#markdown-for-agents): hostile pages (the corpus in
markdown_corpus/, and link forms from the OWASP XSS filter-evasion cheat sheet) are converted, the
Markdown rendered by a CommonMark renderer with raw HTML allowed, and the HTML it makes is checked:
only the elements Markdown syntax makes, no handler, no address but http(s), mailto or relative."""

from __future__ import annotations

import html
import re
from pathlib import Path

import lxml.html
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from prerender_ray.serving.markdown import Limits, _options, html_to_md
from prerender_ray.serving.markdown_inert import allowed_url, plainly_inert, without_front_matter, yaml_quoted
from tests.serving.test_markdown import PAGE

CORPUS = sorted((Path(__file__).parent / "markdown_corpus").glob("*.html"))
LIMITS = Limits(max_input_bytes=1024 * 1024, max_output_bytes=1024 * 1024)
BASE = "https://site.example/dir/page"

# The oracle: CommonMark with raw HTML on (its default). markdown-it's own link filter is turned off so the
# check sees every address the Markdown holds, as a renderer without that filter would make it.
RENDERER = MarkdownIt("commonmark", {"html": True})
RENDERER.validateLink = lambda url: True  # type: ignore[method-assign]
# What Markdown syntax makes, with the attributes it sets; anything else came from raw HTML.
MADE = {"p": set(), "h1": set(), "h2": set(), "h3": set(), "h4": set(), "h5": set(), "h6": set(),
        "em": set(), "strong": set(), "code": {"class"}, "pre": set(), "ul": set(), "ol": {"start"},
        "li": set(), "blockquote": set(), "hr": set(), "br": set(), "a": {"href", "title"},
        "img": {"src", "alt", "title"}}
ALLOWED_SCHEMES = {None, "http", "https", "mailto"}


def scheme(url: str) -> str | None:
    """The scheme a browser reads in ``url`` (WHATWG URL: C0 controls and spaces trimmed, tab and newlines
    removed, case folded), None for a relative reference. Written apart from the code under test."""
    url = url.strip("".join(map(chr, range(0x21)))).replace("\t", "").replace("\n", "").replace("\r", "")
    found = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", url)
    return found.group(1).lower() if found else None


def render(markdown: str) -> lxml.html.HtmlElement:
    return lxml.html.fragment_fromstring(RENDERER.render(markdown) or "<p></p>", create_parent="div")


# GFM as markdown-it reads it (tables, strikethrough; linkify off: it makes only links it checks itself).
GFM = MarkdownIt("gfm-like", {"html": True}).disable("linkify")
GFM.validateLink = lambda url: True  # type: ignore[method-assign]
MADE_GFM = MADE | {"table": set(), "thead": set(), "tbody": set(), "tr": set(), "th": {"style"}, "td": {"style"},
                   "s": set()}


def live(markdown: str, renderer: MarkdownIt = RENDERER) -> list[str]:
    """What in ``markdown``'s rendering is not inert, described (empty: all inert)."""
    found = []
    made = MADE if renderer is RENDERER else MADE_GFM
    root = lxml.html.fragment_fromstring(renderer.render(markdown) or "<p></p>", create_parent="div")
    for el in root.iter():
        if not isinstance(el.tag, str):  # a comment or processing instruction: never run
            continue
        if el is not root and el.tag not in made:
            found.append(f"<{el.tag}> element")
        for name, value in el.attrib.items():
            if name.lower().startswith("on"):
                found.append(f"handler {name}={value!r} on <{el.tag}>")
            elif el is root or name not in made.get(el.tag, set()):
                found.append(f"attribute {name}={value!r} on <{el.tag}>")
            elif name in ("href", "src") and scheme(value) not in ALLOWED_SCHEMES:
                found.append(f"{name}={value!r} on <{el.tag}>")
    return found


def convert(page: bytes | str, base_url: str | None = BASE) -> str:
    return html_to_md(page, LIMITS, base_url=base_url)


def front_matter(markdown: str) -> tuple[dict, str]:
    assert markdown.startswith("---\n")
    block, _, body = markdown[4:].partition("\n---\n")
    return yaml.safe_load(block), body


# ------------------------------------------------------------------------------------------ the oracle


def test_the_oracle_sees_live_markup() -> None:
    """The check itself: each kind of live markup is reported."""
    assert live("[x](javascript:alert(1))") == ["href='javascript:alert(1)' on <a>"]
    assert live("![x](JaVa%09script:x)") == []  # percent-encoding is never decoded in a scheme
    assert live("<script>alert(1)</script>") == ["<script> element"]
    assert live("x <img src=x onerror=alert(1)>") == ["handler onerror='alert(1)' on <img>"]
    assert live("<iframe src=https://a.example/></iframe>") == ["<iframe> element",
                                                               "attribute src='https://a.example/' on <iframe>"]
    assert live("[x](https://a.example/) ![y](/i.png) [m](mailto:a@b.example) [r](rel#f)") == []


# ------------------------------------------------------------------------------------------ the corpus


@pytest.mark.parametrize("page", CORPUS, ids=lambda p: p.stem)
@pytest.mark.parametrize("base_url", [BASE, None], ids=["absolute", "relative"])
def test_every_page_of_the_corpus_converts_to_inert_markdown(page: Path, base_url: str | None) -> None:
    markdown = convert(page.read_bytes(), base_url)
    assert live(markdown) == []
    body = markdown.split("\n---\n", 1)[1] if markdown.startswith("---\n") else markdown
    assert live(body) == []  # and without its front matter (a renderer that knows none shows it as text)


def test_the_issues_page_keeps_its_text_as_text() -> None:
    markdown = convert(b'<a href="javascript:alert(1)">x</a><p>&lt;script&gt;alert(1)&lt;/script&gt;</p>')
    root = render(markdown)
    assert root.text_content().split() == ["x", "<script>alert(1)</script>"]
    assert not root.xpath("//a") and "javascript" not in markdown


# Link forms from the OWASP XSS filter-evasion cheat sheet and issue 35, as they stand in an attribute.
HOSTILE_URLS = [
    "javascript:alert(1)", "JaVaScRiPt:alert(1)", "JAVASCRIPT:alert(1)", "java\tscript:alert(1)",
    "java\nscript:alert(1)", "java\rscript:alert(1)", "java&#09;script:alert(1)", "java&#x0A;script:alert(1)",
    "java&Tab;script:alert(1)", "java&NewLine;script:alert(1)", "javascript&colon;alert(1)",
    "&#106;avascript:alert(1)", "&#x6A;avascript:alert(1)", "&#X6a;avascript:alert(1)", "&#0000106avascript:alert(1)",
    "&#x6A&#x61&#x76&#x61&#x73&#x63&#x72&#x69&#x70&#x74&#x3A&#x61&#x6C&#x65&#x72&#x74&#x28&#x31&#x29",
    " javascript:alert(1)", "\x01javascript:alert(1)", " &#14;  javascript:alert(1)", "&#0;javascript:alert(1)",
    "\x7fjavascript:alert(1)", "javascript:alert(1) ", "&amp;#106;avascript:alert(1)", "&amp;#x6A;avascript:alert(1)",
    "javascript&amp;colon;alert(1)", "java&amp;Tab;script:alert(1)", "javascript\\:alert(1)", "java\\script:alert(1)",
    "data:text/html,<script>alert(1)</script>", "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "DATA:image/svg+xml,<svg onload=alert(1)>", "vbscript:msgbox(1)", "VbScRiPt:msgbox(1)", "livescript:alert(1)",
    "mocha:alert(1)", "file:///etc/passwd", "x-unknown:thing", "tel:+15555550100", "about:blank",
    "javascript://%0Aalert(1)", "javascript:/*--></title></style></textarea></script><svg/onload=alert(1)>",
    "https://a.example/x)<script>alert(1)</script>", "https://a.example/x>&#10;&#10;<script>alert(1)</script>",
    "https://a.example/\"><img src=x onerror=alert(1)>", "/x]<img src=x onerror=alert(1)>",
    "https://a.example/a b\\c`d", "//evil.example/x", "#<script>alert(1)</script>",
]


@pytest.mark.parametrize("url", HOSTILE_URLS)
@pytest.mark.parametrize("base_url", [BASE, None], ids=["absolute", "relative"])
def test_a_hostile_address_is_inert_wherever_it_stands(url: str, base_url: str | None) -> None:
    attr = url.replace('"', "&quot;")
    for element in (f'<a href="{attr}">the text</a>', f'<img src="{attr}" alt="the alt">',
                    f'<iframe src="{attr}"></iframe>', f'<video src="{attr}"></video>', f'<audio src="{attr}"></audio>',
                    f'<a href="https://ok.example/"><img src="{attr}" alt="inner"></a>',
                    f'<a href="{attr}"><img src="https://ok.example/i.png" alt="outer"></a>'):
        markdown = convert(f"<p>before</p>{element}<p>after</p>", base_url)
        assert live(markdown) == [], element
        text = render(markdown).text_content()
        assert "before" in text and "after" in text
        if element.startswith("<a") and "the text" in element:
            assert "the text" in text  # an address refused, its link's text is kept


# ------------------------------------------------------------------------------------- the front matter


def test_front_matter_values_are_quoted_scalars() -> None:
    markdown = convert((CORPUS[0].parent / "front_matter.html").read_bytes())
    meta, body = front_matter(markdown)
    assert meta == {
        "title": "Title \"quoted\" 'single' <img src=x onerror=alert(1)>\n---\ninjected: true\n"
                 "[link](javascript:alert(1)) &lt;b&gt; \\ end",
        # (an HTML parser reads &#x85; as U+2026, as windows-1252 has it)
        "description": "line one\n---\n\n<script>alert(1)</script>\r: {x} # not a comment \u2028 \u2026 \x7f \u202e",
    }  # a canonical not allowed as a link is left out; the other meta tags are not kept
    assert "body" in body and "injected" not in body and "og:title" not in markdown
    for line in markdown.split("\n---\n", 1)[0].split("\n")[1:]:
        assert re.fullmatch(r'(title|description|canonical): "[^"\\]*(\\.[^"\\]*)*"', line), line


def test_a_page_without_metadata_has_no_front_matter_even_when_it_starts_with_a_rule() -> None:
    markdown = convert(b"<hr><p>one: two</p><hr><p>three</p>")
    assert "one: two" in render(markdown).text_content() and "three" in markdown


@pytest.mark.parametrize("canonical", ["https://site.example/a?b=1&c=2", "/relative/path", "mailto:a@b.example"])
def test_an_allowed_canonical_is_kept(canonical: str) -> None:
    page = f'<html><head><title>T</title><link rel="canonical" href="{html.escape(canonical)}"></head><body><p>x</p>'
    meta, _ = front_matter(convert(page))
    assert meta == {"title": "T", "canonical": canonical}


# ----------------------------------------------------------------------------------- ordinary content


def test_ordinary_content_still_converts() -> None:
    page = b"""<html><head><title>Guide</title></head><body><main><h1>Install</h1><h2>Steps</h2>
    <ul><li>one</li><li>two <a href="/docs/setup?x=1&amp;y=2">setup</a></li></ul><ol><li>first</li><li>second</li></ol>
    <p>See <a href="https://example.com/a_(b)">the wiki</a>, <a href="mailto:ops@example.com">mail us</a>,
    <a href="#top">the top</a> and <img src="/img/logo.png" alt="the logo" title="Logo"></p>
    <pre><code class="language-python">if a &lt; b and c &amp; d:\n    print("&lt;tag&gt;")</code></pre>
    <p>Inline <code>x &lt; y</code>, a &lt; b &amp; c, <strong>bold</strong> and <em>em</em>.</p></main></body></html>"""
    markdown = convert(page)
    assert live(markdown) == []
    root = render(markdown.split("\n---\n", 1)[1])
    assert [h.text_content() for h in root.xpath("//h1 | //h2")] == ["Install", "Steps"]
    assert [li.text_content() for li in root.xpath("//ul/li")] == ["one", "two setup"]
    assert [li.text_content() for li in root.xpath("//ol/li")] == ["first", "second"]
    links = {a.text_content(): a.get("href") for a in root.xpath("//a")}
    assert links == {"setup": "https://site.example/docs/setup?x=1&y=2", "the wiki": "https://example.com/a_(b)",
                     "mail us": "mailto:ops@example.com", "the top": "https://site.example/dir/page#top"}
    (img,) = root.xpath("//img")
    assert (img.get("src"), img.get("alt"), img.get("title")) == ("https://site.example/img/logo.png", "the logo", "Logo")
    (code,) = root.xpath("//pre/code")
    assert code.get("class") == "language-python"
    assert code.text_content() == 'if a < b and c & d:\n    print("<tag>")\n'
    assert "a < b & c," in root.text_content() and root.xpath("//p/code")[0].text_content() == "x < y"
    assert root.xpath("//strong")[0].text_content() == "bold" and root.xpath("//em")[0].text_content() == "em"


TEXTS = ["a < b & c", "&lt;script&gt; as the page showed it", "<img src=x onerror=alert(1)>", "*not em* _nor this_",
         "[x](javascript:alert(1))", "![y](/i.png)", "<https://a.example/>", "`code`", "back\\slash \\*",
         "# hash", "1. one", "- dash", "+ plus", "> quote", "---", "===", "| a | b |", "&amp; &#106; &copy;",
         "<!-- c -->", "~~strike~~ ==mark==", "trailing backslash\\", "a_b_c snake_case 2*3*4"]


@pytest.mark.parametrize("text", TEXTS)
def test_text_reads_back_as_the_page_showed_it(text: str) -> None:
    markdown = convert(f"<p>{html.escape(text)}</p><h2>{html.escape(text)}</h2><ul><li>{html.escape(text)}</li></ul>")
    root = render(markdown)
    assert live(markdown) == []
    assert [el.text_content() for el in root.xpath("//p | //h2 | //li")] == [text, text, text]


# ---------------------------------------------------------------------------------- the address rule


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://a.example/x", True), ("HTTP://a.example", True), ("mailto:a@b.example", True), ("/rel", True),
    ("rel/x:y", True), ("#frag", True), ("?q=1", True), ("//host/x", True), ("javascript%3Aalert(1)", True),
    ("", True), ("javascript:alert(1)", False), (" \x00\x1fJavaScript:x", False), ("java\tscr\nipt:x", False),
    ("data:,x", False), ("vbscript:x", False), ("file:///x", False), ("tel:1", False), ("x-y.z+w:1", False),
    ("&#106;avascript:x", False), ("javascript&colon;x", False), ("javascript\\:x", False),
    ("j&#97;vascript:x", False), ("https:&#47;&#47;a.example", True),
])
def test_the_address_rule(url: str, allowed: bool) -> None:
    """Judged as a browser parses it, and again as it reads once a Markdown renderer has decoded the
    entities and backslash escapes in a destination."""
    assert allowed_url(url) is allowed


@pytest.mark.parametrize("value", ["plain", "", "a\nb\r\tc", '"q" \\ \'s\'', "<img src=x onerror=alert(1)>",
                                   "[x](y) &amp;", "---", "\u2028\u2029\x85\x7f\x9f\ufeff\u202e\ufffe", "日本語 ü",
                                   "\U0001f600 \U000e0001", "key: value # c", "- item", "@at `tick`"])
def test_a_yaml_quoted_value_reads_back_and_holds_no_markup(value: str) -> None:
    quoted = yaml_quoted(value)
    assert yaml.safe_load(f"k: {quoted}") == {"k": value}
    assert not set(quoted) & set("<>&[]\n\r") and quoted.isprintable()
    assert live(f"k: {quoted}") == []


# ------------------------------------------------------------------------ which Markdown is kept as is


@pytest.mark.parametrize("markdown", [
    "<script>alert(1)</script>", "a \\\\<b>", "<javascript:alert(1)>",
    "[x](javascript:alert(1))", "![x](data:image/png,x)", "[x]( \n JaVaScRiPt:x)", "[x](&#106;avascript:x)",
    "[x](javascript\\:x)", "\\[x\\](javascript:x)", "[x]: javascript:x", "[x]:\n  vbscript:x", "[t](tel:1)",
    "[x](\rjavascript:alert(1))",  # a carriage return is a line break to CommonMark
    # What looks like code and is not, or may not be, to a CommonMark (or GFM) renderer:
    "[~~~ <a> ~~~](/x)", "` `<b>`", "\\``x`<b>`", "a `x\ny` `<b>`", "``x`<b>`",
    "```\n~~~\n```\n<b>\n~~~", "~~~~\n<b>\n~~~ x\n~~~~\n<b>", " ~~~\n<b>\n ~~~", "- x\n  ~~~\n  <b>\n  ~~~",
    "> ~~~\n> <b>\n> ~~~", "``` `\n<b>\n```", "[a](/x \"t\n`\")<b>`", "[a](/x`)<b>`", "[a]: /x`\n<b>`",
    "| `|<img src=x onerror=alert(1)>` |\n| - |", "~~~ |\n| - |\n<b>\n~~~",
])
def test_markdown_that_may_be_live_is_not_kept_as_the_converter_wrote_it(markdown: str) -> None:
    assert not plainly_inert(markdown)


@pytest.mark.parametrize("markdown", [
    "a \\< b \\& c", "a \\\\\\<b", "[x](https://a.example/) ![y](/i.png) [m](mailto:a@b.example)", "x](#f) y]: //h/",
    # Code: "<" in a top-level fence or a span paired on its line is text.
    "~~~\n<b>\n~~~", "`<b>`", "~~~~ lang`<b>\n<b>\n~~~\n<b>\n~~~~\nafter", "```rust\nfn f<T>() {}\n```",
    "See [the guide](/g) for ``Vec<`T`>`` and `a < b`.", "| `x\\|<b>` |\n| --- |", "~~~\n<b>", "a\n~~~\n<b>\n~~~\nb",
    "~~~\n<b>\r\n~~~\r\n",
])
def test_markdown_shown_inert_is_kept(markdown: str) -> None:
    assert plainly_inert(markdown)


# Pieces of Markdown for the generated documents: code of both kinds, what may end or hide it (containers,
# indentation, links with titles, escapes, tables, carriage returns) and live bait (<b>, <img onerror>).
PIECES = ["`", "``", "```", "~~~", "~~~~", "~", "<b>", "<", ">", "\\", "[a]", "](", ")", "(", "/x", " ", "\n", "\n\n",
          "   ", "    ", "- ", "> ", "1. ", "|", "\\|", "---", '"', "x", "]:", "\r", "\t", "<!--", "-->", "*", "&#96;",
          "`<b>`", "\n~~~\n", "\n```\n", "[a](/x)", '[a](/x "t`")', "| a | b |\n| - | - |\n", "\n- ", "\n> ",
          "\n   ", "<img src=x onerror=y>", "javascript:x", "\n~~~ a | b\n", "| - | - |\n"]


@settings(max_examples=3000, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(PIECES), min_size=4, max_size=40).map("".join))
def test_markdown_kept_as_written_renders_inert(markdown: str) -> None:
    """The check against the renderers on generated Markdown: whatever it keeps, a CommonMark renderer and
    a GFM one render with no live markup (it reads code as they do, or not at all)."""
    if plainly_inert(markdown):
        assert live(markdown) == []
        assert live(markdown, GFM) == []


# Documents of the form the converter writes code in: top-level fences (any length, either character, an
# info string) and one-line spans among escaped text, each run paired on its line. Here the check must read
# every piece of code.
_LINE = st.one_of(
    st.builds(lambda n, c, info: c * n + info, st.integers(3, 5), st.sampled_from("~`"),
              st.sampled_from(["", "rust", " a b", "x~y"])),
    st.lists(st.sampled_from(["a", " ", "\\<b>", "\\`", "`<b>`", "``a`<b>``", "` <i> `", "\\\\", "*"]),
             min_size=1, max_size=6).map(" ".join),
    st.sampled_from(["", "<b>", "fn f<T>()", "x", "  <i>"]))


@settings(max_examples=1500, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_LINE, max_size=12).map("\n".join))
def test_code_is_read_as_commonmark_reads_it(markdown: str) -> None:
    """Exactly: kept when and only when markdown-it finds no HTML in it (its tokens), so no fence or span
    markdown-it sees is missed and none it does not see is taken as code."""
    tokens = RENDERER.parse(markdown)
    html_found = any(t.type == "html_block" or any(c.type == "html_inline" for c in t.children or ())
                     for t in tokens)
    assert plainly_inert(markdown) is not html_found


def test_an_ordinary_page_is_kept_as_the_converter_wrote_it() -> None:
    """Most pages take one conversion with no visitor (which runs at half the speed and takes the GIL)."""
    import html_to_markdown

    result = html_to_markdown.convert(PAGE.decode(), _options(BASE, LIMITS))
    body = without_front_matter(result.content or "")
    assert body is not None and plainly_inert(body)


def test_a_page_converted_by_the_visitor_still_drops_its_chrome() -> None:
    page = PAGE.replace(b"</article>", b'<a href="tel:1">call</a></article>')
    markdown = convert(page)
    assert "call" in markdown and "tel:" not in markdown
    for chrome in ("About us", "Related", "__STATE__", "color: red", "Search"):
        assert chrome not in markdown
