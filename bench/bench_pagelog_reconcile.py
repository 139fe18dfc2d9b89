"""The page log's reconcile at store open (storage/pagelog/reconcile.py; issue 37): how long it takes
for N pages written as the node store writes them (record, version pointer), in three cases:

- ``build``: the same as the store does it (storage/pagelog/build.py): in chunks, each one hold of
  the mirror's lock; the longest chunk is the longest a pages write waits;
- ``migrate``: a store with pages and no log yet (every page read from RocksDB and appended);
- ``steady``: the log in step with RocksDB (the usual restart: pointers walked, one small pread each);
- ``touched``: the same with a newer freshness record for a fifth of the pages;
- ``thin``: one copy on disk for a store of an earlier release (storage/pagelog/thinning.py): the walk
  that writes a stub over each whole record the log holds, in chunks (the longest is the longest a
  pages write waits), then RocksDB's compaction; beside the ``migrate`` pass over the same pages
  (which reads every record too) and with the pages RocksDB's size before and after.

Run: ``.venv/bin/python bench/bench_pagelog_reconcile.py [--pages 100000] [--body 20480]``. Bodies are
random bytes; everything is in the page cache (our code and the syscalls, not the disk).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prerender_ray.storage.keys import HPTR, VIDX  # noqa: E402
from prerender_ray.storage.pagelog import PageLogWriter  # noqa: E402
from prerender_ray.storage.pagelog.build import CHUNK_BYTES, CHUNK_KEYS, Build  # noqa: E402
from prerender_ray.storage.pagelog.reconcile import reconcile  # noqa: E402
from prerender_ray.storage.pagelog.thinning import Thinning  # noqa: E402
from prerender_ray.storage.pages import Page  # noqa: E402
from prerender_ray.storage.replication import Version, wrap  # noqa: E402
from prerender_ray.storage.rocks import Store  # noqa: E402
from prerender_ray.storage.touches import Touch, touch_key  # noqa: E402


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=100_000)
    ap.add_argument("--body", type=int, default=20_480)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    try:
        store = Store(root / "pages")
        pool = [os.urandom(args.body) for _ in range(64)]
        batch: list = []
        for i in range(args.pages):
            key = f"https://bench.example/catalog/item-{i}|desktop"
            hlc = 1_000_000 + i
            rec = wrap(Version(hlc, "node-a"), Page(cache_key=key, status_code=200, headers={"etag": f'"{i}"'},
                                                    last_cached=1, expires_at=2, content=pool[i % 64]).encode())
            k = key.encode()
            batch += [(VIDX + hlc.to_bytes(8, "big") + k, b""), (HPTR + k, hlc.to_bytes(8, "big") + b"\x01"), (k, rec)]
            if len(batch) >= 3000:
                store.write(batch)
                batch = []
        store.write(batch)
        writer = PageLogWriter(root / "pagelog-build", sync=False)
        b = Build(writer, store, set())
        while not b.step():
            pass
        r = b.finish()
        print(f"build    {args.pages} pages of {args.body} B in {b.steps} chunks of <= {CHUNK_KEYS} keys / "
              f"{CHUNK_BYTES >> 20} MB: {r.seconds:.2f} s (appended {r.appended}; longest chunk "
              f"{b.longest * 1000:.1f} ms, mean {r.seconds / b.steps * 1000:.1f} ms)")
        writer.close()
        shutil.rmtree(root / "pagelog-build")
        writer = PageLogWriter(root / "pagelog", sync=False)
        r = reconcile(writer, store)
        migrate_s = r.seconds
        print(f"migrate  {args.pages} pages of {args.body} B: {r.seconds:.2f} s (appended {r.appended})")
        r = reconcile(writer, store)
        print(f"steady   {args.pages} pages: {r.seconds:.2f} s (appended {r.appended}, retimed {r.retimed})")
        touches = []
        for i in range(0, args.pages, 5):
            key = f"https://bench.example/catalog/item-{i}|desktop"
            touches.append((touch_key(key), wrap(Version(2_000_000_000 + i, "node-a"),
                                                  Touch(key, f'"{i}"', 10, 20).encode())))
        store.write(touches)
        r = reconcile(writer, store)
        print(f"touched  {args.pages} pages, {len(touches)} freshness records new to the log: {r.seconds:.2f} s "
              f"(retimed {r.retimed})")
        r = reconcile(writer, store)
        print(f"steady   with those freshness records in the log: {r.seconds:.2f} s (retimed {r.retimed})")
        writer.close()
        writer = PageLogWriter(root / "pagelog", sync=False)
        r = reconcile(writer, store)
        print(f"reopen   (writer open + reconcile of a log in step): {r.seconds:.2f} s reconcile")
        store.flush()
        before = disk_bytes(root / "pages")
        t = Thinning(writer, store)
        while not t.step():
            pass
        walked = time.perf_counter() - t.started
        store.compact()
        compacted = time.perf_counter() - t.started - walked
        print(f"thin     {t.thinned} whole records to stubs in {t.steps} chunks of <= {t.keys} keys: {walked:.2f} s "
              f"({walked / migrate_s:.2f}x migrate; longest chunk {t.longest * 1000:.1f} ms), then RocksDB's "
              f"compaction {compacted:.2f} s; pages RocksDB {before / 1e6:,.0f} MB -> "
              f"{disk_bytes(root / 'pages') / 1e6:,.1f} MB (page log {disk_bytes(root / 'pagelog') / 1e6:,.0f} MB)")
        writer.close()
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
