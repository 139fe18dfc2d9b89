"""llms.txt, pure (prerender_ray/serving/llms_txt.py): the document's shape, its bounds, hostile titles
made inert, a page's head read within its cap, and which requests ask for it."""

from __future__ import annotations

import gzip
import re

from prerender_ray.config.model import Config
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.devices import Devices
from prerender_ray.serving.llms_txt import HEAD_BYTES, Entry, LlmsPolicy, head_fields, render, requested_site
from tests.support import brotli_bomb

SITE = "https://shop.example"
ENTRY_LINE = re.compile(r"- \[(?:[^\\\[\]\n]|\\.)+\]\([^()\s<>]+\)(?:: [^\n]*)?")


def policy(**llms: object) -> LlmsPolicy:
    cfg = Config.model_validate({"domains": ["shop.example"], "llmsTxt": {"enabled": True, **llms}})
    return LlmsPolicy.from_config(cfg.domains, cfg.llms_txt)


def structure(doc: bytes) -> list[str]:
    """Every line that is structure (heading, quote, list item); each list item must be one whole
    well-formed entry."""
    lines = doc.decode().split("\n")
    for line in lines:
        if line.startswith("- "):
            assert ENTRY_LINE.fullmatch(line), line
    return [ln for ln in lines if ln.startswith(("#", ">", "- "))]


def test_pages_are_listed_under_their_sitemaps_with_the_home_page_naming_the_document() -> None:
    entries = [Entry(f"{SITE}/a", f"{SITE}/sitemap-a.xml", "Page A", "About A"),
               Entry(f"{SITE}/b", None, "Page B", ""),
               Entry(f"{SITE}/c", f"{SITE}/sitemap-a.xml", "Page C", "About C"),
               Entry(f"{SITE}/d", "https://cdn.example/maps/d.xml", "Page D", "About D")]
    doc, listed = render(SITE, "Shop", "We sell things.", entries, policy(), more=False)
    assert listed == 4
    assert structure(doc) == [
        "# Shop", "> We sell things.",
        "## /sitemap-a.xml", f"- [Page A]({SITE}/a): About A", f"- [Page C]({SITE}/c): About C",
        "## https://cdn.example/maps/d.xml", f"- [Page D]({SITE}/d): About D",
        "## Other pages", f"- [Page B]({SITE}/b)",
    ]
    assert b"cut" not in doc
    bare, _ = render(SITE, "", "", [], policy(), more=False)
    assert structure(bare) == ["# shop.example", "> Rendered pages of shop.example"]


def test_the_list_is_cut_at_max_entries_and_at_max_bytes_and_says_so() -> None:
    entries = [Entry(f"{SITE}/p{i:04d}", None, f"Page {i}", "x" * 200) for i in range(500)]
    doc, listed = render(SITE, "Shop", "", entries[:5], policy(maxEntries=3), more=False)
    assert listed == 3 and len([ln for ln in structure(doc) if ln.startswith("- ")]) == 3
    assert b"This list is cut at 3 pages" in doc
    doc, listed = render(SITE, "Shop", "", entries, policy(maxBytes=8192), more=False)
    assert len(doc) <= 8192 and 10 < listed < 500
    assert f"This list is cut at {listed} pages".encode() in doc
    assert len([ln for ln in structure(doc) if ln.startswith("- ")]) == listed
    doc, listed = render(SITE, "Shop", "", entries[:2], policy(), more=True)  # the gatherer stopped early
    assert listed == 2 and b"This list is cut at 2 pages" in doc


def test_hostile_titles_and_descriptions_stay_inside_their_entry() -> None:
    hostile = [
        Entry(f"{SITE}/1", None, "Nice]\n\n## Injected\n- [evil](https://evil.example)", "ok\r\n# Also injected"),
        Entry(f"{SITE}/2", None, "a\u2028## sep\u2029b\x85c\x00d\x1b[31m", "`code ] span` <script>x</script>"),
        Entry(f"{SITE}/3(x)", None, "[link](javascript:alert(1))", "\\](https://evil.example) *bold* _u_"),
        Entry(f"{SITE}/4", None, "\u202eevil\u200b", "t" * 5000),
    ]
    doc, listed = render(SITE, "Shop\n## Fake section", "sum\n- [x](y)", hostile, policy(), more=False)
    assert listed == 4
    lines = structure(doc)
    assert [ln for ln in lines if ln.startswith("#")] == ["# Shop ## Fake section", "## Other pages"]
    assert [ln for ln in lines if ln.startswith(">")] == ["> sum - \\[x\\](y)"]
    text = doc.decode()
    assert "\x00" not in text and "\x1b" not in text and "\u2028" not in text and "\u202e" not in text
    assert "<script>" not in text and "\\<script\\>" in text
    assert f"({SITE}/3%28x%29)" in text  # the address cannot close the link early
    assert max(len(ln) for ln in text.split("\n")) < 1000  # a description is capped


def test_a_page_head_gives_its_title_and_description_and_a_bomb_is_read_only_to_the_cap() -> None:
    html = ("<html><head><meta charset=utf-8><title>  The\n Widget  </title>"
            "<meta name='Description' content='All about widgets.'><meta property='og:title' content='OG'>"
            "</head><body>" + "<p>x</p>" * 50_000 + "</body></html>").encode()
    assert head_fields(gzip.compress(html), "gzip", "utf-8") == ("  The\n Widget  ", "All about widgets.")
    og = b"<html><head><meta property='og:title' content='Only OG'><meta property=og:description content=D>"
    assert head_fields(og, "identity", "utf-8") == ("Only OG", "D")
    latin = "<title>Caf\u00e9</title>".encode("latin-1")
    assert head_fields(latin, "identity", "iso-8859-1") == ("Caf\u00e9", "")
    assert head_fields(brotli_bomb(64), "br", "utf-8") == ("", "")  # 64 MiB of zeros: stops at HEAD_BYTES
    late = b"<html><head>" + b"<!-- pad -->" * (HEAD_BYTES // 10) + b"<title>too late</title>"
    assert head_fields(late, "identity", "utf-8")[0] == ""


def _site(cfg: Config, path: str, query: str = "", **headers: str) -> str | None:
    ing = cfg.ingress
    return requested_site(ing.mode, ing.bot_path_prefix, KeyFormat.from_config(cfg), Devices.from_config(cfg),
                          ing.device_type_source == "path", ing.forwarded_host_header.lower(),
                          ing.forwarded_proto_header.lower(), ing.default_protocol, path, query, headers)


def test_which_requests_ask_for_a_sites_llms_txt_in_both_modes() -> None:
    prefix = Config.model_validate({})
    assert _site(prefix, "/p/https://Shop.Example/llms.txt") == "https://shop.example"
    assert _site(prefix, "/p/http://shop.example:8080/llms.txt") == "http://shop.example:8080"
    assert _site(prefix, "/p/https://shop.example/llms.txt", "x=1") is None
    assert _site(prefix, "/p/https://shop.example/docs/llms.txt") is None
    assert _site(prefix, "/llms.txt", **{"x-forwarded-host": "shop.example"}) is None
    fwd = Config.model_validate({"ingress": {"mode": "forwarded"}})
    h = fwd.ingress.forwarded_host_header.lower()
    assert _site(fwd, "/llms.txt", **{h: "shop.example", "x-forwarded-proto": "https"}) == "https://shop.example"
    assert _site(fwd, "/llms.txt", **{h: "evil.example/x@shop.example"}) is None  # the injection guard
    assert _site(fwd, "/llms.txt") is None
    by_path = Config.model_validate({"ingress": {"mode": "forwarded", "deviceTypeSource": "path"}})
    assert _site(by_path, "/desktop/llms.txt", **{h: "shop.example"}) is not None
    assert _site(by_path, "/tv/llms.txt", **{h: "shop.example"}) is None


def test_only_sites_in_domains_and_in_sites_are_served_and_sections_filter() -> None:
    assert policy().serves("https://shop.example") and not policy().serves("https://other.example")
    assert not LlmsPolicy.from_config([], Config().llms_txt).serves("https://shop.example")  # no domains: none
    only = policy(sites=["other.example"])
    assert not only.serves("https://shop.example")
    some = policy(sitemaps=[f"{SITE}/blog-*", f"{SITE}/main.xml"])
    assert some.lists(f"{SITE}/blog-1.xml") and some.lists(f"{SITE}/main.xml")
    assert not some.lists(f"{SITE}/main.xml.gz") and not some.lists(None)
    assert policy().lists(None)


def test_a_target_only_a_bots_miss_made_is_listed_only_when_the_operator_opts_in() -> None:
    assert not policy().lists(None, discovered=True)
    opted = policy(includeDiscovered=True)
    assert opted.lists(None, discovered=True) and opted.lists(None)
    assert not policy(includeDiscovered=True, sitemaps=[f"{SITE}/main.xml"]).lists(None, discovered=True)
