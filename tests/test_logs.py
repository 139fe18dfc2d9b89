"""Log lines: one JSON object each, with the node and process, in a file per process."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path

import pytest
import structlog

from prerender_ray import logs


@pytest.fixture
def log_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(logs.LOG_DIR_ENV, str(tmp_path / "nodes" / "n1" / "logs"))
    yield tmp_path
    monkeypatch.delenv(logs.LOG_DIR_ENV)
    logs._sink = None
    structlog.reset_defaults()


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_line_names_its_node_and_process_even_from_a_task(log_dir) -> None:
    # Before: the node was bound as a contextvar in __init__, which an async actor's method tasks
    # do not inherit, so most keeper lines carried no node.
    logs.setup("n1", process="keeper")

    async def method() -> None:
        logs.get("k").info("from a task", rows=3)

    asyncio.run(method())
    import logging

    logging.getLogger("uvicorn.error").warning("a library line")
    [ours, lib] = _lines(log_dir / "nodes" / "n1" / "logs" / "keeper.log")
    assert ours["node"] == "n1" and ours["process"] == "keeper" and ours["rows"] == 3
    assert lib["event"] == "a library line" and lib["node"] == "n1" and lib["level"] == "warning"


def test_a_file_rotates_at_its_cap_and_reading_merges_in_time_order(log_dir, monkeypatch) -> None:
    monkeypatch.setattr(logs, "MAX_FILE_BYTES", 2000)
    logs.setup("n1", process="store")
    for i in range(40):
        logs.get().info("line", i=i)
    logs.setup("n1", process="ingress-0")
    logs.get().info("other process")
    path = log_dir / "nodes" / "n1" / "logs" / "store.log"
    assert path.stat().st_size <= 2000 and path.with_name("store.log.1").exists()
    files = logs.log_files(log_dir)
    assert [f.name for f in files] == ["ingress-0.log", "store.log"]
    merged = [json.loads(line) for line in logs.read_lines(files)]
    assert merged[-1]["event"] == "other process"
    stamps = [d["timestamp"] for d in merged]
    assert stamps == sorted(stamps)
    assert len(logs.read_lines(files, 3)) == 3


def test_follow_prints_new_lines_of_new_files_and_only_whole_lines(tmp_path) -> None:
    d = tmp_path / "nodes" / "a" / "logs"
    d.mkdir(parents=True)
    (d / "old.log").write_text('{"event": "before"}\n')
    seen: list[str] = []
    stop = threading.Event()
    t = threading.Thread(target=lambda: seen.extend(
        logs.follow(lambda: logs.log_files(tmp_path), poll_s=0.02, stop=stop.is_set)))
    t.start()
    time.sleep(0.1)
    with open(d / "old.log", "a") as f:
        f.write('{"event": "after"}\n{"event": "hal')
    (d / "new.log").write_text('{"event": "new file"}\n')
    time.sleep(0.2)
    stop.set()
    t.join(5)
    assert sorted(seen) == ['{"event": "after"}', '{"event": "new file"}']


def test_pretty_renders_a_line_for_a_terminal() -> None:
    line = json.dumps({"event": "keeper live", "node": "n1", "process": "keeper", "level": "info",
                       "timestamp": "2026-12-01T10:35:48.848259Z", "rows": 0})
    assert logs.pretty(line) == "10:35:48.848 INFO    n1/keeper          keeper live rows=0"
    assert logs.pretty("not json") == "not json"


HOSTILE = "mallory\n10:00:00.000 INFO    n1/ingress-0       admin login user=root\x1b[2J\x1b]0;pwned\x07\r\x9b31m\x7f\u2028"


def _forged(text: str) -> bool:
    return any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029" for c in text) \
        or "\n" in text


def test_pretty_escapes_control_characters_in_values_keys_and_the_event() -> None:
    # Before: a login name with a newline and ESC sequences was printed raw: it forged a second log
    # line and sent the operator's terminal escape sequences (clear screen, title, colour).
    line = json.dumps({"event": f"login refused {HOSTILE}", "level": "warning", "node": "n1",
                       "process": "ingress-0", "timestamp": "2026-12-01T10:35:48.848259Z",
                       "user": HOSTILE, f"k{HOSTILE}": 1, "nested": {"u": HOSTILE}})
    out = logs.pretty(line)
    assert not _forged(out), repr(out)
    assert "user=mallory\\n10:00:00.000 INFO" in out and "\\x1b[2J\\x1b]0;pwned\\x07\\r\\x9b31m\\x7f\\u2028" in out
    assert not _forged(logs.pretty(HOSTILE)) and not _forged(logs.pretty(json.dumps([HOSTILE])))


def test_pretty_keeps_a_tracebacks_lines_indented_and_escaped() -> None:
    line = json.dumps({"event": "boom", "level": "error", "timestamp": "2026-12-01T10:35:48.848259Z",
                       "exception": f"Traceback (most recent call last):\nValueError: {HOSTILE}"})
    first, *rest = logs.pretty(line).split("\n")
    assert first.endswith("boom") and rest[0] == "    Traceback (most recent call last):"
    assert all(r.startswith("    ") and not _forged(r) for r in rest)


def test_the_console_renderer_escapes_what_it_prints(capsys, monkeypatch) -> None:
    # A foreground process on a terminal (the render worker) renders with structlog's console
    # renderer, which wrote string values raw.
    monkeypatch.delenv(logs.LOG_DIR_ENV, raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    try:
        logs.setup("n1", process="render-worker", json_lines="auto")
        logs.get().warning(f"event {HOSTILE}", url=HOSTILE)
    finally:
        structlog.reset_defaults()
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out.rstrip("\n"))  # the renderer's own colours
    assert not _forged(out), repr(out)
    assert "event mallory\\n10:00:00.000 INFO" in out


async def test_uvicorns_warnings_about_bad_clients_come_at_most_once_a_minute(log_dir, monkeypatch) -> None:
    # Before: one line per malformed head or refused upgrade, so cheap connections could rotate the
    # sign-in and config-override history out of the 20 MB log.
    from prerender_ray.config.model import Config
    from tests.api.live_server import connect, request, response, serving, until_closed
    from tests.api.test_connections import App, closed

    logs.setup("n1", process="ingress-0")
    monkeypatch.setattr(logs._bad_clients.gate, "_last", {})  # what an earlier test in this process logged
    monkeypatch.setattr(logs._bad_clients.gate, "clock", lambda: 0.0)  # all within one minute, however slow
    bad_before = closed("bad-request")
    async with serving(App(), Config.model_validate({})) as port:
        for _ in range(100):
            r, w = await connect(port)
            w.write(b"NOT HTTP AT ALL\r\n\r\n")
            assert (await until_closed(r)).startswith(b"HTTP/1.1 400")
            w.close()
        for _ in range(100):
            r, w = await connect(port)
            w.write(request(extra="connection: upgrade\r\nupgrade: h2c\r\n"))
            assert await response(r) == (200, b"ok")
            w.close()
    events = [d["event"] for d in _lines(log_dir / "nodes" / "n1" / "logs" / "ingress-0.log")
              if d.get("logger") == "uvicorn.error"]
    assert sorted(events) == ["Invalid HTTP request received.", "Unsupported upgrade request."], events
    assert closed("bad-request") - bad_before == 100  # each one counted where the lines are not


def test_a_held_back_library_warning_is_counted_in_the_next_line() -> None:
    import logging

    now = [0.0]
    sometimes = logs._Sometimes(clock=lambda: now[0])
    record = lambda: logging.LogRecord("uvicorn.error", logging.WARNING, "", 0, "bad %s", ("x",), None)  # noqa: E731
    assert sometimes.filter(record()) and not sometimes.filter(record()) and not sometimes.filter(record())
    now[0] = 60.0
    line = record()
    assert sometimes.filter(line) and line.getMessage() == "bad x (2 more like it in the last 60 s not logged)"
    error = logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, "bad %s", ("x",), None)
    assert sometimes.filter(error)  # errors are ours (an app's exception), never held back


def test_the_console_format_escapes_control_characters_in_values_it_would_print_raw(capsys, monkeypatch) -> None:
    # Before: structlog's console renderer quotes (and so escapes) a string only when it holds a space,
    # tab, =, CR, LF or a quote: ESC, C1 controls and U+2028 went to the terminal raw.
    monkeypatch.delenv(logs.LOG_DIR_ENV, raising=False)

    class Raw:
        def __repr__(self) -> str:
            return "raw\x1b]0;title\x07"

    try:
        logs.setup("n1", process="render-worker", json_lines="never")
        logs.get().warning("event", user="a\x1b[2Jb\u2028c", c1="x\x9b31my", obj=Raw(), items=["\x1b"])
    finally:
        structlog.reset_defaults()
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out.rstrip("\n"))  # the renderer's own colours
    assert not _forged(out), repr(out)
    assert "user='a\\x1b[2Jb\\u2028c'" in out and "c1='x\\x9b31my'" in out and "obj=raw\\x1b]0;title\\x07" in out


def test_sometimes_tracks_a_bounded_number_of_keys() -> None:
    # Before: the bot path's throttle kept every reason it was given, for the process's life.
    sometimes = logs.Sometimes(max_keys=4, clock=lambda: 0.0)
    for i in range(1_000):
        assert sometimes.let(f"peer-rescue {i}") == 0
        assert len(sometimes._last) <= 4
    assert sometimes.let("peer-rescue 999") is None  # the newest is still held back
