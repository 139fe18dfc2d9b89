"""One logging set-up for every process: structlog, JSON lines when not on a TTY, the node name bound
into every line."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup(node: str = "", *, level: str = "info", json_lines: str = "auto", process: str = "") -> None:
    """Configure structlog (and stdlib logging, for libraries) for this process."""
    as_json = json_lines == "always" or (json_lines == "auto" and not sys.stdout.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    bound = {"node": node} if node else {}
    if process:
        bound["process"] = process
    structlog.contextvars.bind_contextvars(**bound)
    logging.basicConfig(level=_LEVELS.get(level, logging.INFO), stream=sys.stdout, format="%(message)s")
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get(name: str | None = None) -> Any:
    return structlog.get_logger(name) if name else structlog.get_logger()
