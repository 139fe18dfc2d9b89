"""Page log benchmark (issue 37): the in-process cost of a hit spread at random over a corpus, for
(a) the page log (dict look-up + pread + checksum), (b) today's path, a RocksDB multi-get of page and
freshness keys on a secondary instance (as ``api/bot/page_reader.py`` does it), and (c) a dict of bytes in
memory (the ceiling); plus index bytes per entry, reload time and append cost. One run, side by side.

Run: ``.venv/bin/python bench/bench_pagelog.py [--sizes 100000:20480,1000000:4096] [--hits 200000]``

- Bodies are random bytes (incompressible, as gzip pages are); 1,000,000 pages use 4 KB bodies (about
  4 GB per store instead of 20 GB). Every store lives in the page cache here: this measures our code
  and the syscalls, not the disk.
- The ceiling's dict maps every key to one of 64 shared bodies: its look-up is the real one over N
  keys, without holding N bodies in memory (it returns a reference; no copy).
- Index bytes per entry: the dict's own size plus its key and value objects (``sys.getsizeof``).
- Temp dirs are removed after each size.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rocksdict import AccessType, Options, Rdict  # noqa: E402

from prerender_ray.storage.pagelog import Item, PageLogReader, PageLogWriter, key_hash  # noqa: E402
from prerender_ray.storage.rocks import Store  # noqa: E402
from prerender_ray.storage.touches import touch_key  # noqa: E402

POOL = 64
BATCH = 1000


def cache_key(i: int) -> str:
    return f"https://bench.example/catalog/item-{i}|desktop"


def bodies(size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(POOL)]


def per_call(fn, args: list, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    """Best of ``repeat`` passes over ``args``: microseconds per call."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for a in args:
            fn(a)
        best = min(best, (time.perf_counter() - t) / len(args))
    return best * 1e6


def index_bytes(entries: dict[bytes, bytes]) -> float:
    total = sys.getsizeof(entries)
    for key, value in entries.items():
        total += sys.getsizeof(key) + sys.getsizeof(value)
    return total / max(1, len(entries))


def run_size(n: int, size: int, hits: int, root: Path) -> dict[str, float]:
    pool = bodies(size)
    rnd = random.Random(n)
    out: dict[str, float] = {}
    log_dir, rocks_dir = root / "pagelog", root / "rocks"

    # --- (a) the page log: append, reload, hits
    w = PageLogWriter(log_dir, sync=False)
    t = time.perf_counter()
    for start in range(0, n, BATCH):
        w.append([Item(key_hash(cache_key(i), "gzip"), pool[i % POOL], version=i, last_cached=i, expires_at=i + 1)
                  for i in range(start, min(n, start + BATCH))])
    out["append_us"] = (time.perf_counter() - t) / n * 1e6
    w.close()
    t = time.perf_counter()
    w = PageLogWriter(log_dir, sync=False)
    out["writer_reopen_s"] = time.perf_counter() - t
    w.close()
    t = time.perf_counter()
    reader = PageLogReader(log_dir)
    out["reader_load_s"] = time.perf_counter() - t
    out["index_bytes_per_entry"] = index_bytes(reader.entries)
    picks = [rnd.randrange(n) for _ in range(hits)]
    hashed = [key_hash(cache_key(i), "gzip") for i in picks]
    names = [cache_key(i) for i in picks]
    get = reader.get
    out["a_pagelog_us"] = per_call(get, hashed)
    out["a_pagelog_with_key_hash_us"] = per_call(lambda c: get(key_hash(c, "gzip")), names)
    assert all(get(h) is not None for h in hashed[:1000])
    reader.close()

    # --- (b) RocksDB as today: page + freshness multi-get on a secondary instance
    store = Store(rocks_dir)
    t = time.perf_counter()
    for start in range(0, n, BATCH):
        store.write([(cache_key(i).encode(), pool[i % POOL]) for i in range(start, min(n, start + BATCH))])
    out["rocks_write_us"] = (time.perf_counter() - t) / n * 1e6
    store.flush()
    opts = Options(raw_mode=True)
    opts.set_max_open_files(-1)
    secondary = Rdict(str(rocks_dir), opts, access_type=AccessType.secondary(str(root / "rocks-secondary")))
    secondary.try_catch_up_with_primary()
    keys = [cache_key(i).encode() for i in picks]
    pairs = [[k, touch_key(k)] for k in keys]
    multi = secondary.get
    out["b_rocks_us"] = per_call(multi, pairs)
    assert all(multi(p)[0] is not None for p in pairs[:1000])
    secondary.close()
    store.close()

    # --- (c) the ceiling: a dict of bytes in memory
    ceiling = {key_hash(cache_key(i), "gzip"): pool[i % POOL] for i in range(n)}
    out["c_dict_us"] = per_call(ceiling.get, hashed)
    del ceiling

    # --- appends with sync (one fdatasync of the segment and one of the index per batch)
    sw = PageLogWriter(root / "synced", sync=True)
    for batch in (1, 32):
        t = time.perf_counter()
        rounds = 40
        for r in range(rounds):
            sw.append([Item(key_hash(f"s{batch}-{r}-{j}"), pool[j % POOL]) for j in range(batch)])
        out[f"sync_batch{batch}_ms"] = (time.perf_counter() - t) / rounds * 1e3
    sw.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000:20480,1000000:4096", help="pages:body bytes, comma separated")
    ap.add_argument("--hits", type=int, default=200_000)
    args = ap.parse_args()
    for spec in args.sizes.split(","):
        n, size = (int(x) for x in spec.split(":"))
        root = Path(tempfile.mkdtemp(prefix="bench-pagelog-"))
        try:
            f = run_size(n, size, args.hits, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"\n{n:,} pages of {size // 1024} KB, {args.hits:,} hits at random keys (in process)")
        print(f"  (a) page log look-up + pread + checksum   {f['a_pagelog_us']:7.2f} us"
              f"   (+ blake2b key: {f['a_pagelog_with_key_hash_us']:.2f} us)")
        print(f"  (b) RocksDB multi-get, secondary          {f['b_rocks_us']:7.2f} us")
        print(f"  (c) dict of bytes (ceiling)               {f['c_dict_us']:7.2f} us")
        print(f"  ratios: b/a {f['b_rocks_us'] / f['a_pagelog_us']:.1f}x   a/c {f['a_pagelog_us'] / f['c_dict_us']:.1f}x")
        print(f"  index bytes per entry (reader's dict)      {f['index_bytes_per_entry']:7.1f}"
              f"   ({f['index_bytes_per_entry'] * n / 2**20:.0f} MiB)")
        print(f"  reload: reader {f['reader_load_s']:.2f} s, writer reopen {f['writer_reopen_s']:.2f} s")
        print(f"  append, no sync: {f['append_us']:.1f} us/page (RocksDB write of the same: "
              f"{f['rocks_write_us']:.1f} us/page); synced: batch of 1 {f['sync_batch1_ms']:.2f} ms, "
              f"batch of 32 {f['sync_batch32_ms']:.2f} ms")


if __name__ == "__main__":
    main()
