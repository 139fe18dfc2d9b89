"""The ingress page reader in process (issue 37): ``PageReader.read`` of a hit spread at random over a
corpus, and of one hot page, from the node's page log against the RocksDB secondary it replaced (the
fallback while a node has no log); plus the log index's memory per page.

Run: ``.venv/bin/python bench/bench_page_reader.py [--pages 100000] [--size 20480] [--hits 100000] [--rounds 3]``

- The pages are written as the store writes them (the page log contract): a framed page record in
  its replication envelope, into RocksDB and into the page log (its HLC, its times). Bodies are
  random bytes (incompressible, as gzip pages are). Everything lives in the page cache: this measures
  our code and the syscalls, not the disk.
- Each round opens a fresh reader of each kind and reads the same random keys through it, the two
  kinds alternated; every read decodes what the decoded-page cache does not hold (4,096 pages: a
  spread over 100,000 pages rarely repeats). Reads are driven to completion without an event loop
  turn (neither waits: the store writes nothing meanwhile).
- Index memory: ``tracemalloc`` over the load of the page log reader (the dict, its keys and values).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prerender_ray.api.bot.page_reader import PageReader  # noqa: E402
from prerender_ray.serving.framing import encode_page  # noqa: E402
from prerender_ray.storage.pagelog import Item, PageLogReader, PageLogWriter, key_hash  # noqa: E402
from prerender_ray.storage.pagelog.files import mark_complete  # noqa: E402
from prerender_ray.storage.pages import Page  # noqa: E402
from prerender_ray.storage.replication import Clock, wrap_many  # noqa: E402
from prerender_ray.storage.rocks import PAGES, Store, pagelog_path, store_path  # noqa: E402

NODE = "bench"
BATCH = 1000
POOL = 64


def cache_key(i: int) -> str:
    return f"https://bench.example/catalog/item-{i}|desktop"


def fill(data_dir: Path, n: int, size: int) -> None:
    pool = [os.urandom(size) for _ in range(POOL)]
    write_pages(data_dir, n, lambda i: Page(
        cache_key=cache_key(i), status_code=200, content=pool[i % POOL], last_cached=1, expires_at=2,
        headers={"content-type": "text/html", "content-encoding": "gzip", "etag": f'"{i}"'}))


def write_pages(data_dir: Path, n: int, page: Callable[[int], Page], node: str = NODE) -> None:
    """Pages ``page(0)`` to ``page(n - 1)`` written as the node's store writes them (the page log
    contract): each framed record in its replication envelope, into RocksDB and into the page log
    with its HLC and its times; the log then marked complete, as the store marks it once built (a
    replica reads hits from a complete log only)."""
    store = Store(store_path(data_dir, node, PAGES))
    log = PageLogWriter(pagelog_path(data_dir, node), sync=False)
    clock = Clock(node)
    for start in range(0, n, BATCH):
        pages = [page(i) for i in range(start, min(n, start + BATCH))]
        first = clock.reserve(len(pages))
        raws = wrap_many(node, first, [encode_page(p) for p in pages])
        log.append([Item(key_hash(p.cache_key), raw, first + j, p.last_cached, p.expires_at)
                    for j, (p, raw) in enumerate(zip(pages, raws, strict=True))])
        store.write([(p.cache_key.encode(), raw) for p, raw in zip(pages, raws, strict=True)])
    store.flush()
    log.close()
    store.close()
    mark_complete(pagelog_path(data_dir, node))


def drive(coro):  # type: ignore[no-untyped-def]
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a read waited")


def per_read(reader: PageReader, keys: list[str]) -> float:
    read = reader.read
    t = time.perf_counter()
    for key in keys:
        if drive(read(key)) is None:
            raise RuntimeError(f"no page for {key}")
    return (time.perf_counter() - t) / len(keys) * 1e6


def open_reader(data_dir: Path, kind: str, round_: int) -> PageReader:
    if kind == "pagelog":
        return PageReader.for_node(str(data_dir), NODE, round_)
    reader = PageReader(store_path(data_dir, NODE, PAGES), data_dir / f"secondary-{round_}")  # no log: the fallback
    assert reader.source == "secondary"
    return reader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=20_480)
    ap.add_argument("--hits", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-page-reader-"))
    try:
        t = time.perf_counter()
        fill(root, args.pages, args.size)
        print(f"{args.pages:,} pages of {args.size // 1024} KB written in {time.perf_counter() - t:.1f} s")
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        log = PageLogReader(pagelog_path(root, NODE))
        index = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        print(f"index memory: {index / len(log):.0f} bytes per page ({index / 2**20:.1f} MiB for {len(log):,})")
        log.close()
        rnd = random.Random(1)
        spread = [cache_key(rnd.randrange(args.pages)) for _ in range(args.hits)]
        hot = [cache_key(7)] * args.hits
        figures: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for kind in ("secondary", "pagelog"):
                t = time.perf_counter()
                reader = open_reader(root, kind, r)  # the log: its whole index loaded
                figures.setdefault((kind, "open"), []).append((time.perf_counter() - t) * 1e3)
                assert reader.source == kind
                figures.setdefault((kind, "spread"), []).append(per_read(reader, spread))
                figures.setdefault((kind, "hot"), []).append(per_read(reader, hot))
                reader.close()
        print(f"PageReader.read per hit over {args.hits:,} reads, {args.rounds} rounds (min-max):")
        for kind in ("secondary", "pagelog"):
            s, h, o = figures[(kind, "spread")], figures[(kind, "hot")], figures[(kind, "open")]
            print(f"  {kind:9}  spread {min(s):6.1f}-{max(s):6.1f} us   hot {min(h):5.2f}-{max(h):5.2f} us"
                  f"   open {min(o):6.0f}-{max(o):6.0f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
