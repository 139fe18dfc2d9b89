"""The page log: framed answers in append-only segment files and a fixed-record index log, one writer
(the node store) and any number of readers in other processes (ingress replicas) following the same
directory; a hit is a dict look-up and one ``pread`` (docs/architecture.md, issue 37).

Modules: ``records`` (formats, bounds, errors), ``index`` (the in-memory index and how records apply),
``files`` (directory plumbing), ``writer`` (appends, recovery, generations), ``compaction``,
``reader`` (follow and serve).
"""

from prerender_ray.storage.pagelog.compaction import Compacted, compact, maintain
from prerender_ray.storage.pagelog.reader import Hit, PageLogReader
from prerender_ray.storage.pagelog.records import PageLogCorrupt, PageLogError, PageLogFull, key_hash
from prerender_ray.storage.pagelog.writer import Item, PageLogWriter, Position

__all__ = ["Compacted", "Hit", "Item", "PageLogCorrupt", "PageLogError", "PageLogFull", "PageLogReader",
           "PageLogWriter", "Position", "compact", "key_hash", "maintain"]
