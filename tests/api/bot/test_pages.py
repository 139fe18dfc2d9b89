"""The decoded-page LRU (api/bot/pages.py ``DecodedPages``): bounded by pages and bytes, a page's
negotiated forms counted against it."""

from __future__ import annotations

from prerender_ray.api.bot.pages import DecodedPages, StoredPage
from prerender_ray.storage.pages import PageMeta

KEY = "https://x.com/a|desktop"


def test_the_decoded_cache_is_bounded_by_pages_and_bytes() -> None:
    meta = PageMeta(cache_key=KEY, status_code=200)
    cache = DecodedPages(max_pages=3, max_bytes=250)
    for i in range(5):
        cache.add(f"k{i}", StoredPage(bytes([i]) * 100, meta, b""))
    assert cache.bytes <= 250 and cache.lookup("k0", bytes([0]) * 100) is None
    assert cache.lookup("k4", bytes([4]) * 100) is not None
    assert cache.lookup("k4", b"other") is None and cache.lookup("k4", bytes([4]) * 100) is None


class _Prepared:
    def __init__(self, body: bytes):
        self.body = body


def test_every_negotiated_form_of_a_cached_page_counts_against_the_byte_budget() -> None:
    meta = PageMeta(cache_key=KEY, status_code=200)
    cache = DecodedPages(max_pages=10, max_bytes=1000)
    pages = {k: StoredPage(k.encode() * 50, meta, b"coded") for k in ("k0", "k1")}  # 100 bytes each
    for k, page in pages.items():
        cache.add(k, page)
    assert cache.bytes == 200
    # a small br page decoded for a bot without br: its decoded form is what takes the memory
    cache.add_variant("k0", pages["k0"], "identity", _Prepared(b"d" * 300))
    cache.add_variant("k0", pages["k0"], "br", _Prepared(pages["k0"].body))  # served as stored: free
    cache.add_variant("k0", pages["k0"], "identity", _Prepared(b"d" * 300))  # already held: not twice
    assert cache.bytes == 500 == sum(p.size for p in pages.values())
    cache.add_variant("k1", pages["k1"], "gzip", _Prepared(b"d" * 600))  # over budget: k0 goes
    assert cache.peek("k0") is None and cache.peek("k1") is pages["k1"] and cache.bytes == 700
    # a page no longer cached (or a peer's) keeps its form without touching the budget
    cache.add_variant("k0", pages["k0"], "gzip", _Prepared(b"d" * 100))
    assert cache.bytes == 700
    cache.drop("k1")
    assert cache.bytes == 0
