"""One logging set-up for every process: structlog, JSON lines when not on a TTY, the node name and
process in every line.

A process placed on a node (``PRERENDER_LOG_DIR`` set by its placement) writes its lines, always as
JSON, to ``<dir>/<process>.log`` instead of stdout: Ray's own log capture would prefix them and add
colour codes, and its files live in a temp dir nobody can name. `prerender-ray up` prints those
files as they grow and `prerender-ray logs` reads them (``read_lines`` and ``follow`` below).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LOG_DIR_ENV = "PRERENDER_LOG_DIR"
MAX_FILE_BYTES = 20 * 1024 * 1024  # then the file is rotated to <name>.log.1 (one generation kept)


class _RotatingFile:
    """A line sink that rotates itself at ``MAX_FILE_BYTES``; ``print`` writes and flushes it."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (held for the process's life)
        self._size = self._f.tell()

    def write(self, s: str) -> int:
        if self._size + len(s) > MAX_FILE_BYTES and self._size:
            self._f.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self._size = 0
        self._size += len(s)
        return self._f.write(s)

    def flush(self) -> None:
        self._f.flush()

    def isatty(self) -> bool:
        return False


class _JsonRecords(logging.Formatter):
    """Library records (uvicorn, Ray's Python side) as the same JSON objects as ours."""

    def __init__(self, static: dict[str, str]):
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"event": record.getMessage(), "logger": record.name,
                                "level": record.levelname.lower(), **self.static,
                                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                                + f".{int(record.msecs * 1000):06d}Z"}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


_NO_WEBSOCKETS = "No supported WebSocket library detected"  # uvicorn's advice after any refused upgrade


class Sometimes:
    """At most one line per key every ``every_s``, with how many were held back since: bots and
    hostile clients repeat themselves, and one line each would rotate the sign-in and override history
    out of the log file. At most ``max_keys`` keys are tracked (all forgotten at once past it), so a
    caller's keys cannot grow memory."""

    def __init__(self, every_s: float = 60.0, max_keys: int = 256, clock: Any = time.monotonic):
        self.every_s = every_s
        self.max_keys = max_keys
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # key -> (when last let through, held back since)

    def let(self, key: str) -> int | None:
        """None: hold this one back; else let it through, with the count held back since the last."""
        now = self.clock()
        last, held = self._last.get(key, (None, 0))
        if last is not None and now - last < self.every_s:
            self._last[key] = (last, held + 1)
            return None
        if len(self._last) >= self.max_keys:
            self._last.clear()
        self._last[key] = (now, 0)
        return held


class _Sometimes(logging.Filter):
    """A library's warnings at most once per message template (``Sometimes``); uvicorn warns once per
    malformed head or refused upgrade. Errors (an app's exception) always pass."""

    def __init__(self, every_s: float = 60.0, clock: Any = time.monotonic):
        super().__init__()
        self.gate = Sometimes(every_s, clock=clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        key = str(record.msg)
        if key.startswith(_NO_WEBSOCKETS):  # the replica has no WebSocket by choice (api/server.py)
            return False
        held = self.gate.let(key)
        if held is None:
            return False
        if held:
            record.msg = f"{record.getMessage()} ({held} more like it in the last {self.gate.every_s:g} s not logged)"
            record.args = None
        return True


_bad_clients = _Sometimes()
_sink: Any = None


def setup(node: str = "", *, level: str = "info", json_lines: str = "auto", process: str = "") -> None:
    """Configure structlog (and stdlib logging, for libraries) for this process."""
    global _sink
    log_dir = os.environ.get(LOG_DIR_ENV)
    if log_dir and process:
        if _sink is None or _sink.path != Path(log_dir) / f"{process}.log":
            _sink = _RotatingFile(Path(log_dir) / f"{process}.log")
        out: TextIO = _sink
    else:
        out = sys.stdout
    as_json = out is not sys.stdout or json_lines == "always" or (json_lines == "auto" and not out.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    static = {k: v for k, v in (("node", node), ("process", process)) if v}

    def add_static(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        # Not contextvars: an async actor's methods run in tasks whose context is not __init__'s.
        for k, v in static.items():
            event.setdefault(k, v)
        return event

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_static,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *(() if as_json else (_escape_event,)),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    root = logging.getLogger()
    root.setLevel(_LEVELS.get(level, logging.INFO))
    if out is not sys.stdout:
        for h in list(root.handlers):
            root.removeHandler(h)
        handler = logging.StreamHandler(out)
        handler.setFormatter(_JsonRecords(static))
        root.addHandler(handler)
    else:
        logging.basicConfig(level=_LEVELS.get(level, logging.INFO), stream=sys.stdout, format="%(message)s")
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    uvicorn_error = logging.getLogger("uvicorn.error")
    if _bad_clients not in uvicorn_error.filters:
        uvicorn_error.addFilter(_bad_clients)


def get(name: str | None = None) -> Any:
    return structlog.get_logger(name) if name else structlog.get_logger()


# ------------------------------------------------------------------------------------ reading


def log_files(data_dir: Path, node: str | None = None) -> list[Path]:
    """Every process's current log file under a data dir (``nodes/<node>/logs/*.log`` and the
    controller's ``logs/controller.log``), optionally one node's only."""
    files = sorted((data_dir / "nodes").glob(f"{node or '*'}/logs/*.log"))
    if node is None or node == "controller":
        files += sorted((data_dir / "logs").glob("*.log"))
    return files


def _stamp(line: str) -> str:
    try:
        return str(json.loads(line).get("timestamp", ""))
    except (ValueError, AttributeError):
        return ""


def read_lines(files: list[Path], last: int | None = None) -> list[str]:
    """The lines of ``files`` (with their rotated generation), merged in time order."""
    lines: list[tuple[str, str]] = []
    for f in files:
        for path in (f.with_name(f.name + ".1"), f):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            lines += [(_stamp(line), line) for line in text.splitlines() if line.strip()]
    lines.sort(key=lambda p: p[0])  # stable: a file's own order is kept for equal stamps
    out = [line for _, line in lines]
    return out[-last:] if last else out


def follow(find: Any, *, poll_s: float = 0.25, stop: Any = None, from_end: bool = True) -> Iterator[str]:
    """New lines of the files ``find()`` names as they are written (new files are picked up, a rotated
    one is reopened), until ``stop()`` is true."""
    offsets: dict[Path, int] = {}
    first = True
    while stop is None or not stop():
        for f in find():
            try:
                size = f.stat().st_size
            except OSError:
                continue
            at = offsets.get(f)
            if at is None:
                at = size if (first and from_end) else 0
            if size < at:  # rotated: the new file starts from 0
                at = 0
            if size > at:
                with open(f, "rb") as fh:
                    fh.seek(at)
                    chunk = fh.read(size - at)
                end = chunk.rfind(b"\n") + 1  # a partial last line waits for its newline
                at += end
                for line in chunk[:end].decode("utf-8", errors="replace").splitlines():
                    if line.strip():
                        yield line
            offsets[f] = at
        first = False
        time.sleep(poll_s)


# Every control character (C0, DEL, C1) and the Unicode line/paragraph separators, as a visible
# escape: a logged value (a login name, a URL, a header) must neither start a forged line nor send
# the operator's terminal an escape sequence.
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_TERMINAL_SAFE = {c: _NAMED.get(chr(c), f"\\x{c:02x}")
                  for c in (*range(0x20), *range(0x7F, 0xA0))} | {0x2028: "\\u2028", 0x2029: "\\u2029"}


def terminal_safe(text: object) -> str:
    """``text`` as a string a terminal shows as-is, on one line."""
    return str(text).translate(_TERMINAL_SAFE)


def _indented(block: str) -> str:
    """A traceback keeps its lines, each indented so that none can pass for a log line."""
    return "\n".join("    " + terminal_safe(line) for line in block.splitlines())


class _Shown:
    """A value the console renderer prints as this text (it prints a non-string as its repr)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _escaped(value: Any) -> Any:
    """A value as structlog's console renderer will print it, its control characters escaped. The
    renderer quotes a string (with repr, which escapes them) only when it holds a space, tab, ``=``,
    CR, LF or a quote, so ESC, C1 and U+2028 in any other would reach the terminal raw; and a
    non-string is printed as its repr, which its class may make anything."""
    if isinstance(value, str):
        return value if terminal_safe(value) == value else _Shown(repr(value))
    text = repr(value)
    safe = terminal_safe(text)
    return value if safe == text else _Shown(safe)


_BLOCKS = ("event", "exception", "stack")  # printed by the renderer as text, not as a value


def _escape_event(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """For structlog's console renderer, which writes the event, the keys, a traceback and some
    values raw."""
    out = {terminal_safe(k): v if k in _BLOCKS else _escaped(v) for k, v in event.items()}
    if isinstance(out.get("event"), str):
        out["event"] = terminal_safe(out["event"])
    for block in ("exception", "stack"):
        if isinstance(out.get(block), str):
            out[block] = _indented(out[block])
    return out


def pretty(line: str) -> str:
    """A JSON line for a terminal: time, level, node/process, event, then the other fields; every
    part with its control characters escaped."""
    try:
        d = json.loads(line)
    except ValueError:
        return terminal_safe(line)
    if not isinstance(d, dict):
        return terminal_safe(line)
    ts = str(d.pop("timestamp", ""))[11:23]
    level = str(d.pop("level", "")).upper()
    where = "/".join(str(d.pop(k)) for k in ("node", "process") if k in d)
    event = d.pop("event", "")
    exc = d.pop("exception", None)
    rest = " ".join(f"{k}={v}" for k, v in d.items())
    out = terminal_safe(f"{ts} {level:<7} {where:<18} {event} {rest}".rstrip())
    return f"{out}\n{_indented(str(exc))}" if exc else out
