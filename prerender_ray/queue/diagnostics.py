"""Diagnostics for one URL: what the keeper asks of prerender-ray's worker, and what it accepts back.

A job may carry ``renderOptions.diagnostics = true`` (the reference fleet ignores the field); the
result's metadata then may carry ``diagnostics`` (console, exceptions, failed and blocked requests,
the settle timeline, the serialized size, a small JPEG screenshot). Every result of our worker also
carries ``renderSummary`` (counts). Both come from a browser that ran the origin's code, so both are
hostile input: each is bounded here (item counts, string lengths, bytes, the screenshot's size and
format) and anything malformed is dropped, field by field where that makes sense. Nothing here
raises: a bad field costs the field, never the rendered page.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from typing import Any

import orjson

from prerender_ray.storage.history import SUMMARY_FIELDS

MAX_ITEMS = 200  # per list
MAX_EXAMINED = 2_000  # items of one list looked at; the rest only counted (a 5M-item list costs nothing)
MAX_TEXT = 2_000  # characters per string (longer ones are cut)
MAX_LIST_BYTES = 96 * 1024  # serialized, per list: five lists stay under half a MiB
MAX_SCREENSHOT_B64 = 512 * 1024  # characters of base64
MAX_DIMENSION = 100_000
MAX_COUNT = 1_000_000_000
MAX_AT_MS = 86_400_000  # an offset into one render: a day is a broken clock
MAX_TRUNCATED_NAMES = 16
JPEG_MAGIC = bytes((0xFF, 0xD8, 0xFF))  # every JPEG starts so
LISTS = ("console", "exceptions", "failedRequests", "blockedRequests", "timeline")
LEVELS = ("error", "warning")

FLAG_TTL_MS = 30 * 60_000
MAX_FLAGS = 1_000


def _count(value: Any) -> int | None:
    """A non-negative integer (an integral float too, as JSON allows), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return None
    return int(value) if 0 <= value <= MAX_COUNT else None


def _at(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return round(value) if 0 <= value <= MAX_AT_MS else None


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def parse_summary(value: Any) -> tuple[dict | None, list[str]]:
    """``renderSummary``: the known counts that are non-negative integers; (None, []) when absent."""
    if value is None:
        return None, []
    if not isinstance(value, dict):
        return None, [f"renderSummary is a {type(value).__name__}, not an object"]
    out, problems = {}, []
    for name in SUMMARY_FIELDS:
        if name not in value:
            continue
        n = _count(value[name])
        if n is None:
            problems.append(f"renderSummary.{name} is not a count")
        else:
            out[name] = n
    return out or None, problems


# ---------------------------------------------------------------------------------- list items


def _console(item: dict) -> dict | None:
    level, text = item.get("level"), _text(item.get("text"))
    if level not in LEVELS or text is None:
        return None
    return {"level": level, "text": text, "at": _at(item.get("at"))}


def _exception(item: dict) -> dict | None:
    message = _text(item.get("message"))
    return None if message is None else {"message": message, "at": _at(item.get("at"))}


def _failed(item: dict) -> dict | None:
    url = _text(item.get("url"))
    if url is None:
        return None
    return {"url": url, "error": _text(item.get("error")) or "", "type": _text(item.get("type")) or ""}


def _blocked(item: dict) -> dict | None:
    url = _text(item.get("url"))
    return None if url is None else {"url": url}


def _event(item: dict) -> dict | None:
    event = _text(item.get("event"))
    if event is None:
        return None
    return {"at": _at(item.get("at")), "event": event, "detail": _text(item.get("detail")) or ""}


ITEM: dict[str, Callable[[dict], dict | None]] = {
    "console": _console, "exceptions": _exception, "failedRequests": _failed,
    "blockedRequests": _blocked, "timeline": _event}


def _list(name: str, value: Any, truncated: dict[str, int], problems: list[str]) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"diagnostics.{name} is a {type(value).__name__}, not a list")
        return []
    shape, size, bad = ITEM[name], 0, 0
    out: list[dict] = []
    for item in value[:MAX_EXAMINED]:
        got = shape(item) if isinstance(item, dict) else None
        if got is None:
            bad += 1
            continue
        cost = len(orjson.dumps(got)) + 1
        if len(out) >= MAX_ITEMS or size + cost > MAX_LIST_BYTES:
            truncated[name] = truncated.get(name, 0) + 1
            continue
        out.append(got)
        size += cost
    if len(value) > MAX_EXAMINED:
        truncated[name] = truncated.get(name, 0) + len(value) - MAX_EXAMINED
    if bad:
        problems.append(f"diagnostics.{name}: {bad} malformed item(s) dropped")
    return out


def _screenshot(value: Any, problems: list[str]) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.append("diagnostics.screenshot is not an object")
        return None
    data, width, height = value.get("data"), _count(value.get("width")), _count(value.get("height"))
    why = None
    if value.get("type") != "image/jpeg":
        why = "its type is not image/jpeg"
    elif not isinstance(data, str) or not data:
        why = "it has no data"
    elif len(data) > MAX_SCREENSHOT_B64:
        why = f"its data is longer than {MAX_SCREENSHOT_B64} characters of base64"
    elif width is None or height is None or not 0 < width <= MAX_DIMENSION or not 0 < height <= MAX_DIMENSION:
        why = "its width or height is not a size in pixels"
    else:
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raw = None
        if raw is None:
            why = "its data is not base64"
        elif not raw.startswith(JPEG_MAGIC):
            why = "its data is not a JPEG"
    if why is not None:
        problems.append(f"diagnostics.screenshot dropped: {why}")
        return None
    return {"type": "image/jpeg", "width": width, "height": height, "data": data}


def parse_report(value: Any) -> tuple[dict | None, list[str]]:
    """``diagnostics``, bounded: (the report, what was dropped); (None, []) when absent. Lists keep their
    first ``MAX_ITEMS`` well-formed items within ``MAX_LIST_BYTES``; what did not fit is added to
    ``truncated`` (with the worker's own counts)."""
    if value is None:
        return None, []
    if not isinstance(value, dict):
        return None, [f"diagnostics is a {type(value).__name__}, not an object"]
    problems: list[str] = []
    truncated: dict[str, int] = {}
    sent = value.get("truncated")
    if isinstance(sent, dict):
        for name, n in list(sent.items())[:MAX_TRUNCATED_NAMES]:
            count = _count(n)
            if isinstance(name, str) and count is not None:
                truncated[name[:64]] = count
    elif sent is not None:
        problems.append("diagnostics.truncated is not an object")
    report: dict[str, Any] = {name: _list(name, value.get(name), truncated, problems) for name in LISTS}
    chars = _count(value.get("chars"))
    if value.get("chars") is not None and chars is None:
        problems.append("diagnostics.chars is not a count")
    report["chars"] = chars
    report["truncated"] = truncated
    report["screenshot"] = _screenshot(value.get("screenshot"), problems)
    return report, problems


# -------------------------------------------------------------------------------------- flags


class DiagnoseFlags:
    """Keys an admin asked to render with diagnostics, in the owning keeper's memory: bounded, each
    for ``FLAG_TTL_MS``, and cleared by the first result of a job that carried the flag. A keeper
    restart forgets them (the admin asks again)."""

    def __init__(self, ttl_ms: int = FLAG_TTL_MS, capacity: int = MAX_FLAGS):
        self.ttl_ms = ttl_ms
        self.capacity = capacity
        self._flags: dict[str, list] = {}  # key -> [expires, sent in a job]; insertion order = age

    def __len__(self) -> int:
        return len(self._flags)

    def add(self, key: str, now: int) -> int:
        """Flag ``key`` (again: a fresh expiry); the oldest flag goes when full. Answers the expiry."""
        self._flags.pop(key, None)
        while len(self._flags) >= self.capacity:
            self._flags.pop(next(iter(self._flags)))
        expires = now + self.ttl_ms
        self._flags[key] = [expires, False]
        return expires

    def wanted(self, key: str, now: int) -> bool:
        """Does the job being built for ``key`` ask for diagnostics? Marks the flag as sent."""
        flag = self._flags.get(key)
        if flag is None:
            return False
        if flag[0] <= now:
            del self._flags[key]
            return False
        flag[1] = True
        return True

    def waiting(self, key: str, now: int) -> bool:
        """Is ``key`` flagged, and not yet sent in a job (it was asked while a render was in flight)?"""
        flag = self._flags.get(key)
        return flag is not None and not flag[1] and flag[0] > now

    def answered(self, key: str) -> bool:
        """A result for ``key`` was applied: a flag that went out in a job is done. One set after the
        grant this result answers stays for the next claim. Answers whether the flag was cleared."""
        flag = self._flags.get(key)
        if flag is None or not flag[1]:
            return False
        del self._flags[key]
        return True
