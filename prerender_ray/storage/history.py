"""Per-key render history and diagnostics reports, in the page store beside the key's page.

Every applied result adds one compact entry (when, how long, outcome, the worker's counts); a result
that carries a diagnostics report adds the report too. A key keeps its last ``ENTRIES`` entries and
last ``REPORTS`` reports in fixed slots, ``RENDER_HISTORY + <cache key> + \\x00`` then ``e``/``d`` and
the slot number, overwritten in turn; a small head record (``h``) counts how many of each were
written, so the next slot is that count modulo the slot count. Fixed slots because every page-store
delete is a tombstone kept forever (``replication.py``): records keyed by time and pruned would leave
one tombstone per result. The store, the one writer, reads the head (a point read of a few bytes in
its own process) and writes head, entry and report in the batch of the result's page writes; no
read of the entries themselves and no extra actor call. Replicated like every page-store record, so
a key's history moves with its pages; deleted with the key's target (``forget``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from prerender_ray.storage.keys import RENDER_HISTORY

ENTRIES = 20
REPORTS = 3
MAX_REASON = 200
MAX_WORKER = 128
# One report: five lists of at most 96 KiB and a screenshot of at most 512 KiB of base64, with room
# for the fields around them; a record past this is not written (it would not come from parse_report).
MAX_REPORT_BYTES = 1_200_000
MAX_ENTRY_BYTES = 2_048
SUMMARY_FIELDS = ("errors", "blocked", "failed", "chars", "scrollSteps")  # the worker's renderSummary

Op = tuple[bytes, bytes | None]


def _base(cache_key: str) -> bytes:
    return RENDER_HISTORY + cache_key.encode() + b"\x00"


def head_key(cache_key: str) -> bytes:
    return _base(cache_key) + b"h"


def entry_key(cache_key: str, slot: int) -> bytes:
    return _base(cache_key) + b"e" + bytes([slot])


def report_key(cache_key: str, slot: int) -> bytes:
    return _base(cache_key) + b"d" + bytes([slot])


def is_history_key(key: bytes) -> bool:
    return key.startswith(RENDER_HISTORY)


def entry(at: int, *, render_ms: float | None, outcome: str, verdict: str | None = None,
          reason: str | None = None, status_code: int | None = None, summary: dict | None = None,
          worker: str | None = None) -> dict:
    """One compact history entry; absent values are left out."""
    doc: dict[str, Any] = {"at": at, "renderMs": round(render_ms) if render_ms is not None else None,
                           "outcome": outcome, "verdict": verdict,
                           "reason": reason[:MAX_REASON] if reason else None, "statusCode": status_code,
                           "worker": worker[:MAX_WORKER] if worker else None}
    for name in SUMMARY_FIELDS:
        doc[name] = (summary or {}).get(name)
    return {k: v for k, v in doc.items() if v is not None}


def encode(doc: dict) -> bytes:
    return orjson.dumps(doc)


def _head(payload: bytes | None) -> list[int]:
    """[entries written, reports written]; [0, 0] for none or an unreadable head."""
    try:
        got = orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        return [0, 0]
    if isinstance(got, list) and len(got) == 2 and all(isinstance(n, int) and n >= 0 for n in got):
        return got
    return [0, 0]


def plan_ops(items: Sequence[Sequence[Any]], heads: dict[str, bytes | None]) -> list[Op]:
    """The page-store ops for ``items``, each ``[cache key, entry bytes | None, report bytes | None]``;
    both None forgets the key's history (tombstones for the slots it used). ``heads``: each key's
    head payload as stored now (None when absent). Items of one key apply in order."""
    ops: dict[bytes, bytes | None] = {}
    held = {k: _head(v) for k, v in heads.items()}
    for cache_key, new_entry, report in items:
        head = held.setdefault(cache_key, [0, 0])
        if new_entry is None and report is None:
            if head != [0, 0] or heads.get(cache_key) is not None:
                for slot in range(min(head[0], ENTRIES)):
                    ops[entry_key(cache_key, slot)] = None
                for slot in range(min(head[1], REPORTS)):
                    ops[report_key(cache_key, slot)] = None
                ops[head_key(cache_key)] = None
            held[cache_key] = [0, 0]
            continue
        if new_entry is not None and len(new_entry) <= MAX_ENTRY_BYTES:
            ops[entry_key(cache_key, head[0] % ENTRIES)] = bytes(new_entry)
            head[0] += 1
        if report is not None and len(report) <= MAX_REPORT_BYTES:
            ops[report_key(cache_key, head[1] % REPORTS)] = bytes(report)
            head[1] += 1
        ops[head_key(cache_key)] = orjson.dumps(head)
    return list(ops.items())


def slots_of(cache_key: str, head: bytes | None, *, reports: bool) -> tuple[list[bytes], list[bytes]]:
    """The entry and report keys a key has written (to read them)."""
    n_entries, n_reports = _head(head)
    return ([entry_key(cache_key, s) for s in range(min(n_entries, ENTRIES))],
            [report_key(cache_key, s) for s in range(min(n_reports, REPORTS))] if reports else [])


def decoded(payloads: Sequence[bytes | None]) -> list[dict]:
    """The readable records among ``payloads``, newest first (by their ``at``)."""
    out = []
    for p in payloads:
        if not p:
            continue
        try:
            doc = orjson.loads(p)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("at"), int):
            out.append(doc)
    out.sort(key=lambda d: d["at"], reverse=True)
    return out


def summarized(report: dict) -> dict:
    """A stored report without its screenshot's data (the explain answer): counts and the image's size."""
    shot = report.get("screenshot")
    out = {k: v for k, v in report.items() if k != "screenshot"}
    out["screenshot"] = None if not isinstance(shot, dict) else {
        "type": shot.get("type"), "width": shot.get("width"), "height": shot.get("height"),
        "bytes": len(shot.get("data") or "") * 3 // 4}
    return out
