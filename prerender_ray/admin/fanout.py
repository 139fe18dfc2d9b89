"""Summing per-node documents into a cluster view (queue-state, the overview's backlog). Pure.

Counts add up; per-hour and per-minute series add up element by element; anything that is not a
count (times, sizes of bins, status words, lists of classes) is not summed: times keep the first
node's value, other non-numeric fields are dropped from the sum.
"""

from __future__ import annotations

from typing import Any

# Fields that are numbers but not counts.
NOT_COUNTS = frozenset({
    "binMs", "fromMs", "minutes", "edges", "capacity", "pid", "stateAt", "generatedAt", "publishedAt",
    "loadMs", "publishMs", "ms", "at", "expiresAt", "dueAt", "checkedAt", "statusChangedTime",
})


def _is_count(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def sum_documents(docs: list[dict]) -> dict:
    """Add the counts of ``docs`` (dicts of the same shape). A field missing from some documents is
    summed over the ones that have it."""
    out: dict = {}
    keys: list[str] = []
    for d in docs:
        keys += [k for k in d if k not in out and k not in keys]
    for k in keys:
        values = [d[k] for d in docs if k in d]
        if k in NOT_COUNTS:
            out[k] = values[0]
            continue
        if all(_is_count(v) for v in values):
            out[k] = sum(values)
        elif all(isinstance(v, dict) for v in values):
            out[k] = sum_documents(values)
        elif all(isinstance(v, list) and all(_is_count(x) for x in v) for v in values):
            width = max(len(v) for v in values)
            out[k] = [sum(v[i] for v in values if i < len(v)) for i in range(width)]
        # anything else (words, booleans, lists of objects, None) does not add up
    return out


def merge_missed(tallies: list[dict[str, list[dict]]], limit: int) -> dict[str, list[dict]]:
    """The bots report's missed URLs of several ingress replicas as one (``MissTally.top`` rows, per
    bot class): a URL's counts add up, its first and last times are the earliest and the latest, its
    last bot the one of the latest; per class the ``limit`` most asked (ties: the most recent first)."""
    merged: dict[str, dict[str, dict]] = {}
    for tally in tallies:
        for cls, rows in tally.items():
            urls = merged.setdefault(cls, {})
            for row in rows:
                have = urls.get(row["url"])
                if have is None:
                    urls[row["url"]] = dict(row)
                    continue
                have["count"] += row["count"]
                have["firstMs"] = min(have["firstMs"], row["firstMs"])
                if row["lastMs"] > have["lastMs"]:
                    have["lastMs"], have["lastBot"] = row["lastMs"], row["lastBot"]
    return {cls: sorted(urls.values(), key=lambda r: (-r["count"], -r["lastMs"]))[:limit]
            for cls, urls in sorted(merged.items())}
