"""What one render records for its diagnostics report (``worker/diagnostics.py``)."""

from __future__ import annotations

import base64

from prerender_ray.queue.diagnostics import JPEG_MAGIC, LISTS, parse_report
from prerender_ray.queue.metadata import MAX_METADATA_BYTES, MAX_TEXT, STORED_HEADERS
from prerender_ray.worker.diagnostics import MAX_SCREENSHOT_BYTES, Recorder
from prerender_ray.worker.outcome import result_body


def test_the_largest_report_fits_the_servers_metadata_cap_and_is_kept_whole() -> None:
    """A page that logs, throws and fails without end, with the longest texts (two UTF-8 bytes a
    character), the largest screenshot, and the longest URLs and headers the server takes: the
    metadata stays under the cap the ingress refuses past (413, the page lost with it), and the
    server keeps every item sent."""
    rec = Recorder(detailed=True)
    text = "é" * (MAX_TEXT + 100)
    for _ in range(1_000):
        rec.on_console("error", text)
        rec.on_exception(text)
        rec.on_failed("https://shop.test/" + text, text, text)
        rec.on_blocked("https://shop.test/" + text)
        rec.mark("settle", text)
    jpeg = JPEG_MAGIC + bytes(MAX_SCREENSHOT_BYTES - len(JPEG_MAGIC))
    shot = {"type": "image/jpeg", "width": 1280, "height": 800, "data": base64.b64encode(jpeg).decode()}
    url = "https://shop.test/" + "a" * (64 * 1024 - 18)
    meta = {"id": url + "|desktop", "url": url, "statusCode": 200, "redirectedTo": url, "renderTime": 900,
            "headers": {name: "v" * 8192 for name in STORED_HEADERS}, "outcome": "rendered",
            "renderSummary": rec.summary(), "diagnostics": rec.report(shot)}
    _, headers = result_body(meta, None)
    assert int(headers["x-metadata-size"]) <= MAX_METADATA_BYTES
    report, problems = parse_report(meta["diagnostics"])
    assert problems == [] and report is not None
    for name in LISTS:
        assert report[name] == meta["diagnostics"][name] and rec.dropped[name] > 0
    assert report["screenshot"] is not None
