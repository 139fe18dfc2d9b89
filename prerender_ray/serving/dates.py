"""``Date`` on every answer, and ``Last-Modified`` never later than it (RFC 9110 section 8.8.2.1).

uvicorn's own Date is refreshed by a timer once a second, so it can trail a page written a moment
ago (its Last-Modified is the writer's clock), and a page rendered on a node whose clock runs ahead
carries a Last-Modified in this node's future. So the ingress sends its own Date (uvicorn's is
turned off: ``api.server.server_config``) and, in the same place, sets a later Last-Modified to
that Date: one choke point below every answer, whether it was framed when stored, prepared, relayed
from the origin or a 304.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate, parsedate_to_datetime

_MONTHS = {m: i for i, m in enumerate((b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep",
                                       b"Oct", b"Nov", b"Dec"), 1)}


def http_date(second: int) -> bytes:
    """``second`` (epoch) as an IMF-fixdate."""
    return formatdate(second, usegmt=True).encode()


def _fixdate(value: bytes) -> int | None:
    """An IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``, what we write) in epoch seconds, quickly."""
    if len(value) != 29 or value[25:] != b" GMT" or value[3:5] != b", ":
        return None
    month = _MONTHS.get(value[8:11])
    if month is None:
        return None
    try:
        parts = (int(value[12:16]), month, int(value[5:7]), int(value[17:19]), int(value[20:22]), int(value[23:25]))
    except ValueError:
        return None
    return calendar.timegm(parts)


def http_seconds(value: bytes) -> int | None:
    """An HTTP date (any of RFC 9110's three forms) in epoch seconds; None when it does not parse."""
    fixed = _fixdate(value)
    if fixed is not None:
        return fixed
    try:
        return int(parsedate_to_datetime(value.decode("latin-1").strip()).timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def held_modified(value: bytes, second: int, date: bytes) -> bytes:
    """A Last-Modified sent with the Date ``date`` (of ``second``): held to it when later; one that
    does not parse is left as it is (a cache ignores it)."""
    if value != date:
        modified = http_seconds(value)
        if modified is not None and modified > second:
            return date
    return value


class Dater:
    """The Date of this second, formatted once per second."""

    __slots__ = ("_date", "_second", "clock")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # a test's fixed second (the class is compiled: no subclass of it)
        self._second = -1
        self._date = b""

    def date(self, now: float | None = None) -> tuple[int, bytes]:
        """The second (of ``now``, or the clock's) and its Date value."""
        second = int(self.clock() if now is None else now)
        if second != self._second:
            self._second, self._date = second, http_date(second)
        return second, self._date

    def headers(self, headers: Iterable[tuple[bytes, bytes]], now: float | None = None) -> list[tuple[bytes, bytes]]:
        """``headers`` with our Date first (any other Date dropped) and a Last-Modified later than it
        set to it. One that does not parse is left as it is (a cache ignores it)."""
        second, date = self.date(now)
        out = [(b"date", date)]
        for name, value in headers:
            low = name.lower()
            if low == b"date":
                continue
            if low == b"last-modified":
                value = held_modified(value, second, date)
            out.append((name, value))
        return out
