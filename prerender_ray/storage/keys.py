"""Every RocksDB key prefix, in one place: which store holds it, what the key and the value are.

A node has four stores (``rocks.py``): ``registry`` and ``pages`` (replicated), ``schedule`` and
``leases`` (owner tier). Within a store each kind of record has its own prefix; none is a prefix of
another (``tests/storage/test_keys.py``), so a prefix scan reads one kind only.
"""

from __future__ import annotations

# --- registry (replicated; every value in the replication envelope, see replication.py)
TARGET = b"t:"  # t:<url> -> the target record (registry.py)
QUEUE_CONTROL = b"c:"  # c:<node> or c:all -> pause intent {"paused", "updatedBy", "updatedTime"}
QUEUE_STATUS = b"q:"  # q:<node> -> the last announced queue status {"hostname", "status", ...}
SITEMAP = b"s:"  # s:<sitemap url> -> the sitemap document's row
SITEMAP_RUN = b"r:"  # r:<root url> or r:all -> the progress of a walk
TARGET_BY_SITEMAP = b"i:"  # i:<sitemap url>\x00<target url> -> b"" (index; derived, node-local)
SITEMAP_ENTRIES = b"e:"  # e:<sitemap url>\x00<chunk number> -> a chunk of the document's parsed entries
OVERRIDES_KEY = b"o:config"  # the live config overrides (config/overrides.py)
REVOKED = b"x:"  # x:<session id> -> {"exp", "user", "revokedAt"} (signed-out admin sessions)
ROBOTS = b"b:"  # b:<origin> -> the last robots.txt fetched from it, parsed (sitemaps/robots.py)

# --- registry and pages: the replication bookkeeping, below every record prefix (\x00 sorts first)
INTERNAL = b"\x00"  # every family below starts so; no cache key or registry record does
VIDX = b"\x00v"  # \x00v <hlc:8> <key> -> b"" (records by version: what a peer has not seen yet)
HPTR = b"\x00h"  # \x00h <key> -> <hlc:8><live:1><writer> (older versions wrote the hlc alone, then no writer)
LIVE = b"\x00c"  # \x00c -> <live records:8>: pages, or targets in the registry
# registry only, node-local: \x00s <peer> -> <hlc:8>, every version below it has reached that peer (what
# a restarted store re-pushes from: its outbox was in memory)
SHIPPED = b"\x00s"
# registry only, node-local: \x00b -> the membership (JSON list) a rebalance walk started from, while one
# is owed (actors/store/rebalance.py); a store that starts again resumes it
REBALANCE = b"\x00b"
# registry only, node-local: \x00p -> {peer: hlc} (JSON), the peers this store still owes a pull of its
# share from, each from that version (actors/store/pulls.py, ``Owed``): kept until that peer answers
PULL_OWED = b"\x00p"

# --- pages (replicated): <cache key> -> the page record (pages.py); no prefix of its own
# \x00f<cache key> -> the freshness record an identical render wrote instead of the page (touches.py);
# below every cache key, so page scans and the live count skip it
FRESHNESS = b"\x00f"
# \x00r<cache key>\x00<kind><slot> -> the key's render history and diagnostics reports (history.py):
# kind h (the head: how many of each were written), e (an entry, slot 0-19), d (a report, slot 0-2)
RENDER_HISTORY = b"\x00r"
# \x00o -> b"1": every page record the page log holds is a stub here (storage/pagelog/thinning.py: a walk
# ended since whole records were last written); absent, a walk is owed
ONE_COPY = b"\x00o"

# --- schedule (owner tier, the keeper's): <cache key> -> the schedule row (queue/schedule.py)

# --- leases (owner tier, the lease table's)
# The keeper's schedule store: cache keys, and the keeper's own records under \x00 (no cache key
# starts so).
KEEPER_META = b"\x00"
KEEPER_EPOCH = KEEPER_META + b"membership-epoch"  # the membership its rows were last placed under
LEASE = b"l:"  # l:<cache key> -> [expires, due, cadence, released, answered, written_at, granted_at, grant]
MISSES = b"m"  # the miss histories, one JSON document (small; rewritten on each sweep)

REGISTRY_PREFIXES = (TARGET, QUEUE_CONTROL, QUEUE_STATUS, SITEMAP, SITEMAP_RUN, TARGET_BY_SITEMAP,
                     SITEMAP_ENTRIES, OVERRIDES_KEY, REVOKED, ROBOTS, VIDX, HPTR, LIVE, SHIPPED, REBALANCE,
                     PULL_OWED)
PAGE_PREFIXES = (VIDX, HPTR, LIVE, FRESHNESS, RENDER_HISTORY, ONE_COPY)
LEASE_PREFIXES = (LEASE, MISSES)
SCHEDULE_PREFIXES = (KEEPER_META, KEEPER_EPOCH)
