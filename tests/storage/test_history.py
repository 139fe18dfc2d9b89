"""Render history slots: the last 20 entries and 3 reports per key, no read of the entries to write one."""

from __future__ import annotations

import orjson

from prerender_ray.storage import history as h

KEY = "https://shop.example/p|desktop"


def run(db: dict[bytes, bytes | None], items: list[list]) -> list:
    keys = {item[0] for item in items}
    ops = h.plan_ops(items, {k: db.get(h.head_key(k)) for k in keys})
    for key, value in ops:
        db[key] = value
    return ops


def read(db: dict, key: str = KEY) -> tuple[list[dict], list[dict]]:
    entries, reports = h.slots_of(key, db.get(h.head_key(key)), reports=True)
    return h.decoded([db.get(k) for k in entries]), h.decoded([db.get(k) for k in reports])


def test_a_key_keeps_its_last_twenty_entries_and_three_reports() -> None:
    db: dict[bytes, bytes | None] = {}
    for at in range(1, 46):
        report = h.encode({"at": at, "console": []}) if at % 5 == 0 else None
        ops = run(db, [[KEY, h.encode(h.entry(at, render_ms=800.4, outcome="rendered")), report]])
        assert len(ops) == (3 if report else 2)  # entry (+ report) + head: nothing else written
    entries, reports = read(db)
    assert [e["at"] for e in entries] == list(range(45, 25, -1))
    assert entries[0] == {"at": 45, "renderMs": 800, "outcome": "rendered"}
    assert [r["at"] for r in reports] == [45, 40, 35]
    assert len([k for k in db if k.startswith(h.entry_key(KEY, 0)[:-1])]) == h.ENTRIES


def test_an_entry_carries_what_the_result_had() -> None:
    e = h.entry(5, render_ms=None, outcome="error", verdict="failed/fast", reason="r" * 500, status_code=503,
                summary={"errors": 2, "blocked": 0}, worker="w" * 300)
    assert e["errors"] == 2 and e["blocked"] == 0 and "renderMs" not in e and "chars" not in e
    assert len(e["reason"]) == h.MAX_REASON and len(e["worker"]) == h.MAX_WORKER
    assert len(h.encode(e)) <= h.MAX_ENTRY_BYTES


def test_forget_deletes_every_slot_written_and_the_head() -> None:
    db: dict[bytes, bytes | None] = {}
    other = "https://shop.example/q|desktop"
    for at in range(3):
        run(db, [[KEY, h.encode({"at": at}), h.encode({"at": at})], [other, h.encode({"at": at}), None]])
    ops = run(db, [[KEY, None, None]])
    assert sorted(k for k, v in ops if v is None) == sorted(
        [h.head_key(KEY)] + [h.entry_key(KEY, s) for s in range(3)] + [h.report_key(KEY, s) for s in range(3)])
    assert read(db) == ([], [])
    assert len(read(db, other)[0]) == 3
    assert run(db, [[KEY, None, None]]) == []  # nothing held: nothing written


def test_an_oversized_record_or_a_broken_head_is_not_trusted() -> None:
    db: dict[bytes, bytes | None] = {h.head_key(KEY): b"garbage"}
    run(db, [[KEY, h.encode({"at": 1}), b"x" * (h.MAX_REPORT_BYTES + 1)]])
    assert orjson.loads(db[h.head_key(KEY)]) == [1, 0]
    assert read(db)[0] == [{"at": 1}] and read(db)[1] == []


def test_a_summary_has_no_screenshot_data() -> None:
    s = h.summarized({"at": 1, "console": [], "screenshot": {"type": "image/jpeg", "width": 2, "height": 3,
                                                             "data": "A" * 400}})
    assert s["screenshot"] == {"type": "image/jpeg", "width": 2, "height": 3, "bytes": 300}
    assert h.summarized({"at": 1, "screenshot": None})["screenshot"] is None
