"""What one render saw, for "why did this page render wrong": console errors and warnings, uncaught
exceptions, failed and blocked requests, the settle timeline, and (asked for by the job) a screenshot.

Every render keeps the counts (``summary``, posted with each result as ``renderSummary``); the lists
are kept only when the job asks for a diagnostics report. Everything is bounded: a page that logs a
million lines or fails every request costs a fixed amount, and the report says how much it dropped.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

# per list (items, serialized bytes), per text: what the server keeps, and what keeps a report's metadata
# under the server's cap (queue/metadata.py MAX_METADATA_BYTES)
from prerender_ray.queue.diagnostics import MAX_ITEMS, MAX_LIST_BYTES, MAX_TEXT

MAX_TIMELINE = 100
SCREENSHOT_QUALITIES = (60, 35, 15)  # JPEG qualities tried until the image fits
MAX_SCREENSHOT_BYTES = 256 * 1024  # the server refuses more than 512 KiB of base64
SCREENSHOT_TIMEOUT_MS = 3000


def _clip(text: Any) -> str:
    s = text if isinstance(text, str) else str(text)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT - 1] + "…"


@dataclass
class Recorder:
    """One render's observations; ``detailed`` keeps the lists (a diagnostics job), otherwise counts."""

    detailed: bool = False
    t0: float = field(default_factory=time.monotonic)
    errors: int = 0  # console errors and uncaught exceptions
    failed: int = 0
    blocked: int = 0
    scroll_steps: int = 0
    chars: int = 0
    console: list[dict[str, Any]] = field(default_factory=list)
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    failed_requests: list[dict[str, Any]] = field(default_factory=list)
    blocked_requests: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # serialized bytes kept per list

    def at(self) -> int:
        return round((time.monotonic() - self.t0) * 1000)

    def _keep(self, name: str, items: list, item: dict[str, Any], cap: int = MAX_ITEMS) -> None:
        if not self.detailed:
            return
        cost = len(orjson.dumps(item)) + 1  # as the server measures a list
        size = self.sizes.get(name, 0)
        if len(items) < cap and size + cost <= MAX_LIST_BYTES:
            items.append(item)
            self.sizes[name] = size + cost
        else:
            self.dropped[name] = self.dropped.get(name, 0) + 1

    def on_console(self, level: str, text: str, source: str = "") -> None:
        """A console message; ``source`` is the URL it is about (Chromium's resource-load errors name no
        URL in their text)."""
        if "ERR_BLOCKED_BY_CLIENT" in text or source.endswith("/favicon.ico"):
            return  # a request we blocked, or the browser's own favicon fetch: not the page's errors
        if source and text.startswith("Failed to load resource"):
            text = f"{text}: {source}"
        if level == "error":
            self.errors += 1
        if level in ("error", "warning"):
            self._keep("console", self.console, {"level": level, "text": _clip(text), "at": self.at()})

    def on_exception(self, message: str) -> None:
        self.errors += 1
        self._keep("exceptions", self.exceptions, {"message": _clip(message), "at": self.at()})

    def on_failed(self, url: str, error: str, kind: str) -> None:
        self.failed += 1
        self._keep("failedRequests", self.failed_requests,
                   {"url": _clip(url), "error": _clip(error), "type": _clip(kind)})

    def on_blocked(self, url: str) -> None:
        self.blocked += 1
        self._keep("blockedRequests", self.blocked_requests, {"url": _clip(url)})

    def mark(self, event: str, detail: str = "") -> None:
        """A settle-timeline entry: what happened and what was still pending then."""
        self._keep("timeline", self.timeline, {"at": self.at(), "event": event, "detail": _clip(detail)},
                   MAX_TIMELINE)

    def summary(self) -> dict[str, int]:
        return {"errors": self.errors, "blocked": self.blocked, "failed": self.failed, "chars": self.chars,
                "scrollSteps": self.scroll_steps}

    def report(self, screenshot: dict[str, Any] | None) -> dict[str, Any]:
        return {"console": self.console, "exceptions": self.exceptions, "failedRequests": self.failed_requests,
                "blockedRequests": self.blocked_requests, "timeline": self.timeline, "chars": self.chars,
                "truncated": dict(self.dropped), "screenshot": screenshot}


async def screenshot(page: Any) -> dict[str, Any] | None:
    """The first screen as a JPEG no larger than ``MAX_SCREENSHOT_BYTES`` (a 50,000 px page still
    gives one screen); None when even the lowest quality does not fit or the tab cannot take one."""
    size = page.viewport_size or {"width": 0, "height": 0}
    for quality in SCREENSHOT_QUALITIES:
        try:
            data = await page.screenshot(type="jpeg", quality=quality, full_page=False, animations="disabled",
                                         timeout=SCREENSHOT_TIMEOUT_MS)
        except Exception:
            return None
        if len(data) <= MAX_SCREENSHOT_BYTES:
            return {"type": "image/jpeg", "width": size["width"], "height": size["height"],
                    "data": base64.b64encode(data).decode("ascii")}
    return None
