"""Log lines: one JSON object each, with the node and process, in a file per process."""

from __future__ import annotations

import asyncio
import json
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
