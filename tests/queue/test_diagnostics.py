"""The worker's renderSummary and diagnostics fields: bounded, malformed parts dropped, never raised."""

from __future__ import annotations

import base64

import orjson

from prerender_ray.queue import diagnostics as d

JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(200)).decode()


def shot(**kw: object) -> dict:
    return {"type": "image/jpeg", "width": 320, "height": 240, "data": JPEG, **kw}


def good() -> dict:
    return {
        "console": [{"level": "error", "text": "TypeError: x is undefined", "at": 120},
                    {"level": "warning", "text": "deprecated", "at": 80.4}],
        "exceptions": [{"message": "boom", "at": 130}],
        "failedRequests": [{"url": "https://api.example/x", "error": "net::ERR_FAILED", "type": "fetch"}],
        "blockedRequests": [{"url": "https://www.googletagmanager.com/gtm.js"}],
        "timeline": [{"at": 0, "event": "navigate", "detail": ""}, {"at": 900, "event": "settled", "detail": "2 fetch"}],
        "chars": 12345,
        "truncated": {"console": 3},
        "screenshot": shot(),
    }


def test_a_good_report_is_kept_as_sent() -> None:
    report, problems = d.parse_report(good())
    assert problems == []
    assert report is not None
    assert report["console"][1] == {"level": "warning", "text": "deprecated", "at": 80}
    assert report["exceptions"] == [{"message": "boom", "at": 130}]
    assert report["failedRequests"][0]["type"] == "fetch"
    assert report["blockedRequests"] == [{"url": "https://www.googletagmanager.com/gtm.js"}]
    assert [e["event"] for e in report["timeline"]] == ["navigate", "settled"]
    assert report["chars"] == 12345 and report["truncated"] == {"console": 3}
    assert report["screenshot"] == shot()


def test_absent_fields_are_nothing_and_no_problem() -> None:
    assert d.parse_report(None) == (None, [])
    assert d.parse_summary(None) == (None, [])


def test_the_summary_keeps_the_counts_that_are_counts() -> None:
    summary, problems = d.parse_summary({"errors": 2, "blocked": 7.0, "failed": -1, "chars": "9",
                                         "scrollSteps": True, "other": 5})
    assert summary == {"errors": 2, "blocked": 7}
    assert len(problems) == 3
    for bad in ("x", [1], 3, {"errors": float("nan")}, {"errors": 10 ** 30}):
        summary, problems = d.parse_summary(bad)
        assert summary is None and problems


def test_wrong_types_are_dropped_field_by_field() -> None:
    report, problems = d.parse_report({
        "console": "lots", "exceptions": {"message": "x"}, "failedRequests": [1, None, "x", [], {"url": 5}],
        "blockedRequests": [{"url": "ok"}, {"url": {"deep": 1}}], "timeline": [{"at": "now", "event": "e"}],
        "chars": -4, "truncated": [1], "screenshot": "abc"})
    assert report is not None
    assert report["console"] == [] and report["exceptions"] == [] and report["failedRequests"] == []
    assert report["blockedRequests"] == [{"url": "ok"}]
    assert report["timeline"] == [{"at": None, "event": "e", "detail": ""}]  # a bad time only costs the time
    assert report["chars"] is None and report["truncated"] == {} and report["screenshot"] is None
    assert len(problems) >= 7
    for bad in ("x", 1, [good()], True):
        assert d.parse_report(bad)[0] is None


def test_unknown_console_levels_are_dropped() -> None:
    report, _ = d.parse_report({"console": [{"level": "log", "text": "x"}, {"level": "error", "text": "y"}]})
    assert report is not None and [c["text"] for c in report["console"]] == ["y"]


def test_ten_thousand_items_keep_two_hundred_and_count_the_rest() -> None:
    many = [{"level": "error", "text": f"e{i}", "at": i} for i in range(10_000)]
    report, _ = d.parse_report({"console": many, "truncated": {"console": 5}})
    assert report is not None
    assert len(report["console"]) == d.MAX_ITEMS
    assert report["console"][0]["text"] == "e0"
    assert report["truncated"]["console"] == 5 + 10_000 - d.MAX_ITEMS


def test_long_strings_are_cut_and_a_list_stays_within_its_bytes() -> None:
    report, _ = d.parse_report({"exceptions": [{"message": "x" * 50_000}] * 300,
                                "timeline": [{"event": "\x00" * 5000, "detail": "y" * 5000}] * 300})
    assert report is not None
    assert all(len(e["message"]) == d.MAX_TEXT for e in report["exceptions"])
    for name in ("exceptions", "timeline"):
        assert len(orjson.dumps(report[name])) <= d.MAX_LIST_BYTES + d.MAX_ITEMS
        assert report["truncated"][name] == 300 - len(report[name]) > 0
    assert len(orjson.dumps(report)) < 5 * d.MAX_LIST_BYTES


def test_deep_nesting_is_a_wrong_type() -> None:
    deep: object = "x"
    for _ in range(10_000):  # deeper than any recursive walk could go
        deep = [deep]
    report, problems = d.parse_report({"console": [{"level": "error", "text": deep}], "timeline": deep,
                                       "screenshot": {"type": "image/jpeg", "data": deep}})
    assert report is not None and report["console"] == [] and report["timeline"] == []
    assert report["screenshot"] is None and problems


def test_a_screenshot_must_be_a_small_jpeg_in_base64() -> None:
    big = base64.b64encode(b"\xff\xd8\xff" + bytes(5 * 1024 * 1024)).decode()  # 5 MB
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(100)).decode()
    for bad in (shot(data=big), shot(data=png), shot(data="!!!not base64!!!"), shot(data=JPEG[:-3]),
                shot(type="image/png"), shot(width=0), shot(height="240"), shot(width=10 ** 6), shot(data=""),
                shot(data=None), [JPEG]):
        report, problems = d.parse_report({"screenshot": bad})
        assert report is not None and report["screenshot"] is None, bad if not isinstance(bad, dict) else bad.get("data", "")[:20]
        assert any("screenshot" in p for p in problems)
    report, _ = d.parse_report({"screenshot": None})
    assert report is not None and report["screenshot"] is None


def test_the_flags_are_bounded_expire_and_clear_only_once_sent() -> None:
    flags = d.DiagnoseFlags(ttl_ms=1000, capacity=3)
    assert flags.add("a", 0) == 1000
    assert not flags.answered("a")  # a result of a grant issued before the flag: it stays
    assert flags.waiting("a", 10)
    assert flags.wanted("a", 10) and not flags.waiting("a", 10)
    assert flags.answered("a") and not flags.wanted("a", 20)
    for k in "bcde":
        flags.add(k, 0)
    assert len(flags) == 3 and not flags.wanted("b", 1)  # the oldest went
    assert not flags.wanted("c", 1000)  # expired
    assert flags.wanted("d", 999)
