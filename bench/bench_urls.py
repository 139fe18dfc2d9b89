"""Canonicalizations per second against a bare urllib.parse.urlsplit + urlunsplit loop.

Run: .venv/bin/python bench/bench_urls.py [--count 100000] [--rounds 5]

Both loops run over the same 100,000 distinct URLs in the same process, alternating, and the best
round of each is reported. The mix is what bots and sitemaps send: category and product paths,
facets, tracking parameters (utm_*, gclid, fbclid), escapes in both hex cases, trailing slashes,
fragments, mixed-case and IDN hosts, explicit ports. Distinct URLs keep urlsplit's own lru_cache
from turning the baseline into dictionary lookups; the same loop without that cache (its misses
cost a little) is printed too, as the stricter baseline.
"""

from __future__ import annotations

import argparse
import random
import time
from urllib.parse import urlsplit, urlunsplit

from prerender_ray.identity.urls import _fast_parts, canonicalize_url

ALLOWLIST = ("page", "sort", "filter", "q")
WORDS = ["shoes", "women", "men", "sale", "boots", "running", "jackets", "kids", "outdoor", "home",
         "kitchen", "garden", "new-arrivals", "brands", "accessories", "bags", "electronics", "tv"]
IDN = ["bücher", "café", "münchen-shop", "tienda-española", "例え", "магазин", "ελληνικά"]
FACETS = ["Color:Blue", "Size:M", "Brand:ACME%2BCO", "Type:Two%20Words", "Material:Cotton", "Fit:Slim"]


def _host(rng: random.Random, i: int) -> str:
    roll = rng.random()
    if roll < 0.05:
        return f"{rng.choice(IDN)}{i % 50}.de"
    sub, tld = rng.choice(["www", "m", "shop", "de", "fr"]), rng.choice(["com", "co.uk", "io"])
    host = f"{sub}.store{i % 300}.{tld}"
    if roll < 0.15:
        host = host.upper() if roll < 0.10 else host.title()
    if rng.random() < 0.03:
        host += rng.choice([":8080", ":443", ":8443"])
    return host


def _path(rng: random.Random, i: int) -> str:
    segments = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        segments.append(f"prd-{i}")
    path = "/" + "/".join(segments)
    roll = rng.random()
    if roll < 0.08:
        path += "/red%20shoes"
    elif roll < 0.11:
        path += "/a%2fb"
    elif roll < 0.13:
        path += "/%7Euser"
    elif roll < 0.14:
        path += "/ü-umlaut"
    if rng.random() < 0.2:
        path += "/"
    return path


def _query(rng: random.Random, i: int) -> str:
    params = []
    if rng.random() < 0.4:
        params.append(f"page={rng.randint(1, 40)}")
    if rng.random() < 0.35:
        params += [f"utm_source={rng.choice(['google', 'bing', 'newsletter'])}", "utm_medium=cpc",
                   f"utm_campaign=spring{i % 97}"]
    if rng.random() < 0.2:
        params.append(f"gclid={rng.getrandbits(64):x}")
    if rng.random() < 0.1:
        params.append(f"fbclid=IwAR{rng.getrandbits(48):x}")
    if rng.random() < 0.25:
        params.append("filter=" + "+".join(rng.sample(FACETS, rng.randint(1, 3))))
    if rng.random() < 0.15:
        params.append(f"sort={rng.choice(['price_asc', 'price_desc', 'newest'])}")
    if rng.random() < 0.1:
        params.append(f"q=red%20shoes%20{i % 1000}")
    rng.shuffle(params)
    return "&".join(params)


def make_urls(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    urls: list[str] = []
    seen: set[str] = set()
    i = 0
    while len(urls) < count:
        i += 1
        scheme = "https" if rng.random() < 0.9 else "http"
        if rng.random() < 0.05:
            scheme = scheme.upper()
        url = f"{scheme}://{_host(rng, i)}{_path(rng, i)}"
        query = _query(rng, i)
        if query:
            url += "?" + query
        if rng.random() < 0.05:
            url += "#reviews"
        if url not in seen:
            seen.add(url)
            urls.append(url)
    return urls


def _time(fn, urls: list[str]) -> float:
    start = time.perf_counter()
    fn(urls)
    return time.perf_counter() - start


def run_canonical(urls: list[str]) -> None:
    for url in urls:
        canonicalize_url(url, ALLOWLIST)


def run_urllib(urls: list[str]) -> None:
    for url in urls:
        urlunsplit(urlsplit(url))


def run_urllib_uncached(urls: list[str]) -> None:
    split = urlsplit.__wrapped__  # urlsplit without its lru_cache
    for url in urls:
        urlunsplit(split(url))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    urls = make_urls(args.count)
    fast = sum(_fast_parts(u) is not None for u in urls)
    best_c = best_u = best_r = float("inf")
    for _ in range(args.rounds):
        best_u = min(best_u, _time(run_urllib, urls))
        best_r = min(best_r, _time(run_urllib_uncached, urls))
        best_c = min(best_c, _time(run_canonical, urls))
    n = len(urls)
    print(f"urls: {n:,} distinct; fast path {fast / n:.1%}, ada path {(n - fast) / n:.1%}")
    for label, best in (("urlsplit+urlunsplit", best_u), ("  (urlsplit uncached)", best_r),
                        ("canonicalize_url", best_c)):
        print(f"{label:22s}: {n / best:>10,.0f} /s  {best / n * 1e6:6.2f} us each")
    print(f"ratio canonicalize / bare parse: {best_c / best_u:.2f}x  (uncached: {best_c / best_r:.2f}x; "
          "goal: within 3x)")


if __name__ == "__main__":
    main()
