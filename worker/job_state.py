"""What a render knows of its page while it runs: the requests in flight and the last activity (the
tab's listeners write them), the document the main frame committed, and the wait until the page has
been quiet long enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from prerender_ray.rpc import wait_for
from prerender_ray.worker.blocklist import Blocklist
from prerender_ray.worker.diagnostics import Recorder

LONG_REQUEST_S = 5.0


class SettleTimeout(Exception):
    pass


@dataclass
class JobState:
    """What the tab's route handler and request listeners need while a job renders."""

    origin: str
    token_header: str = ""
    token: str = ""
    main_headers: dict[str, str] = field(default_factory=dict)
    inflight: dict[Any, float] = field(default_factory=dict)
    blocklist: Blocklist = field(default_factory=Blocklist.of)
    rec: Recorder = field(default_factory=Recorder)
    last_activity: float = field(default_factory=time.monotonic)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    document_url: str = ""  # the URL of the last document the main frame loaded (Page.frameNavigated)
    documents: int = 0  # how many it has loaded

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        self.changed.set()

    async def wait_quiet(self, quiet_s: float, deadline: float) -> None:
        """Until no tracked request has been in flight for ``quiet_s`` (a request older than
        ``LONG_REQUEST_S`` stops counting; the moment it does counts as activity)."""
        while True:
            now = time.monotonic()
            young = [t0 for t0 in self.inflight.values() if now - t0 < LONG_REQUEST_S]
            if young:
                wait = LONG_REQUEST_S - (now - min(young))
            else:
                last = max([self.last_activity, *(t0 + LONG_REQUEST_S for t0 in self.inflight.values())])
                idle = now - last
                if idle >= quiet_s:
                    return
                wait = quiet_s - idle
            if now >= deadline:
                raise SettleTimeout("the page did not settle within its render budget")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                # rpc's wait_for (here and in the renderer): the budget's timeout or a drain's cancel that lands
                # as a request event comes still ends the render (asyncio's handed it the event)
                await wait_for(self.changed.wait(), max(0.001, min(wait, deadline - now)))


def _pending(state: dict[str, Any], st: JobState) -> str:
    """What a settle check found still pending, for the timeline."""
    if state.get("doc") is not None:
        return "settled"
    parts = []
    if state.get("ready") is False:
        parts.append("window.prerenderReady is false")
    if not state.get("complete"):
        parts.append("document not complete")
    if state.get("fetches"):
        parts.append(f"{state['fetches']} fetch/XHR open")
    if state.get("timer"):
        parts.append(f"a timer due in {round(state['timer'])} ms")
    if st.inflight:
        parts.append(f"{len(st.inflight)} request(s) in flight")
    return ", ".join(parts) or "activity since the check started"


def _young(st: JobState) -> bool:
    now = time.monotonic()
    return any(now - t0 < LONG_REQUEST_S for t0 in st.inflight.values())

