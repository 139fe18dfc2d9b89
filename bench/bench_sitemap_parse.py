"""Sitemap parse rate (URLs/s) and peak RSS: SitemapParser against lxml's bare iterparse.

Run: .venv/bin/python bench/bench_sitemap_parse.py [--docs 20] [--per-doc 50000] [--rounds 3]

Generates 1,000,000 URLs as 20 urlset documents of 50,000 (every fourth one gzip), written to a
temporary directory so no document is held in memory, then times over the same files, in the same
process, alternating, best round of each:
- SitemapParser fed 64 KiB reads (what a streamed HTTP body looks like);
- bare ``etree.iterparse(file)``, the baseline: every element's end event, nothing cleared;
- ``etree.iterparse(file, tag=url)`` clearing each entry, the tuned idiom and practical ceiling;
- SitemapParser plus ``partition_entries`` (route classification and canonical keys, prefix mode),
  the pure share of end-to-end ingestion.
Peak RSS is measured in a fresh interpreter per parser, so the figures do not mix.
"""

from __future__ import annotations

import argparse
import gzip
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from lxml import etree

from prerender_ray.config.model import Config
from prerender_ray.identity.routes import Router
from prerender_ray.sitemaps.parser import SITEMAP_NS, SitemapParser
from prerender_ray.sitemaps.rules import canonicalizer, partition_entries

URL_TAG = f"{{{SITEMAP_NS}}}url"
READ = 64 * 1024
WORDS = [
    "shoes",
    "women",
    "men",
    "sale",
    "boots",
    "running",
    "jackets",
    "kids",
    "outdoor",
    "home",
    "kitchen",
    "garden",
    "new-arrivals",
    "brands",
    "accessories",
    "bags",
    "electronics",
    "tv",
]
FREQS = ["always", "hourly", "daily", "weekly", "monthly", "yearly", "never", "Daily", "sometimes"]


def _entry(rng: random.Random, n: int) -> str:
    path = "/".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    loc = f"https://www.shop{n % 7}.example.com/{path}/prd-{n}"
    if rng.random() < 0.2:
        loc += f"?page={rng.randint(1, 30)}&amp;utm_source=sitemap"
    parts = [f"<url><loc>{loc}</loc>"]
    if rng.random() < 0.9:
        parts.append(f"<lastmod>2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}</lastmod>")
    if rng.random() < 0.8:
        parts.append(f"<changefreq>{rng.choice(FREQS)}</changefreq>")
    if rng.random() < 0.7:
        parts.append(f"<priority>0.{rng.randint(1, 9)}</priority>")
    if rng.random() < 0.1:
        parts.append(f"<image:image><image:loc>https://cdn.example.com/{n}.jpg</image:loc></image:image>")
    parts.append("</url>\n")
    return "".join(parts)


def generate(directory: Path, docs: int, per_doc: int) -> list[Path]:
    rng = random.Random(11)
    paths = []
    for d in range(docs):
        head = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{SITEMAP_NS}" '
            'xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">\n'
        )
        body = "".join(_entry(rng, d * per_doc + i) for i in range(per_doc))
        data = (head + body + "</urlset>\n").encode()
        path = directory / (f"sitemap-{d}.xml.gz" if d % 4 == 3 else f"sitemap-{d}.xml")
        path.write_bytes(gzip.compress(data, 6) if path.suffix == ".gz" else data)
        paths.append(path)
    return paths


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")  # type: ignore[return-value]


def run_ours(paths: list[Path]) -> int:
    n = 0
    for path in paths:
        parser = SitemapParser()
        with path.open("rb") as f:  # raw bytes: the parser detects and inflates gzip itself
            while chunk := f.read(READ):
                n += len(parser.feed(chunk))
        n += len(parser.close())
    return n


def run_ours_partitioned(paths: list[Path]) -> int:
    cfg = Config()
    classify, canonicalize = Router(cfg).classify, canonicalizer(cfg)
    n = 0
    for path in paths:
        parser = SitemapParser()
        entries = []
        with path.open("rb") as f:
            while chunk := f.read(READ):
                entries += parser.feed(chunk)
        entries += parser.close()
        n += len(partition_entries(entries, classify, canonicalize).incoming)
    return n


def run_bare(paths: list[Path]) -> int:
    n = 0
    for path in paths:
        with _open(path) as f:
            for _event, el in etree.iterparse(f):
                n += el.tag == URL_TAG
    return n


def run_tuned(paths: list[Path]) -> int:
    n = 0
    for path in paths:
        with _open(path) as f:
            for _event, el in etree.iterparse(f, tag=URL_TAG):
                n += 1
                el.clear()
    return n


RUNNERS: dict[str, Callable[[list[Path]], int]] = {
    "ours": run_ours,
    "bare": run_bare,
    "tuned": run_tuned,
    "partitioned": run_ours_partitioned,
}


def _high_water_mb() -> float:
    """This process's peak RSS. VmHWM starts afresh at exec; ru_maxrss would also count the pages
    shared with the parent between fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_mb(which: str, directory: Path) -> float:
    """Peak RSS of a fresh interpreter that imports everything and runs one parser over every file."""
    out = subprocess.run(
        [sys.executable, __file__, "--rss", which, "--dir", str(directory)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--per-doc", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rss", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss:
        RUNNERS[args.rss](sorted(Path(args.dir).iterdir()))
        print(_high_water_mb())
        return
    with tempfile.TemporaryDirectory(prefix="bench-sitemap-") as tmp:
        directory = Path(tmp)
        paths = generate(directory, args.docs, args.per_doc)
        total = args.docs * args.per_doc
        raw = sum(p.stat().st_size for p in paths)
        gz = [p for p in paths if p.suffix == ".gz"]
        print(
            f"documents: {len(paths)} x {args.per_doc:,} = {total:,} URLs; {len(gz)} gzip; "
            f"{raw / 1e6:.0f} MB on disk"
        )
        best = {name: float("inf") for name in RUNNERS}
        for _ in range(args.rounds):
            for name, run in RUNNERS.items():
                start = time.perf_counter()
                counted = run(paths)
                best[name] = min(best[name], time.perf_counter() - start)
                assert counted == total, (name, counted)
        rss = {name: peak_rss_mb(name, directory) for name in ("ours", "bare", "tuned")}
    rate = {name: total / seconds for name, seconds in best.items()}
    rows = [
        ("lxml iterparse, bare (baseline)", "bare"),
        ("lxml iterparse, url tag + clear", "tuned"),
        ("SitemapParser, 64 KiB feeds", "ours"),
        ("SitemapParser + partition_entries", "partitioned"),
    ]
    for label, name in rows:
        mem = f"peak RSS {rss[name]:6.0f} MB" if name in rss else ""
        print(f"{label:<36}: {rate[name]:>10,.0f} URLs/s  {mem}")
    print(f"ratio SitemapParser / bare iterparse : {rate['ours'] / rate['bare']:.2f}  (goal: >= 0.25)")
    print(f"ratio SitemapParser / tuned iterparse: {rate['ours'] / rate['tuned']:.2f}")


if __name__ == "__main__":
    main()
