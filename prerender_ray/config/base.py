"""What every config section is built from: the base ``Model`` (camelCase aliases, unknown keys refused,
frozen), durations and the host-name helpers.

Durations are milliseconds (ints), or strings such as ``"30s"``, ``"6h"`` and ``"7d"``.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": SECOND, "m": MINUTE, "h": HOUR, "d": DAY, None: 1}


def _duration(value: Any) -> Any:
    """Accept ``90000`` or ``"90s"``; anything else is left for the int validator to reject (and a
    ValueError for a string past a float's range)."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            ms = float(m.group(1)) * _UNIT_MS[m.group(2)]
            if not math.isfinite(ms):  # 400 nines are an infinite float: int() would raise OverflowError
                raise ValueError("not a duration: too many digits")
            return int(ms)
    return value


def duration_ms(value: Any) -> int:
    """``90000`` or ``"90s"`` (ms, s, m, h, d) as milliseconds; ValueError for anything else."""
    ms = _duration(value)
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise ValueError(f"not a duration: {value!r} (milliseconds, or a number with ms, s, m, h or d)")
    return ms


# The longest duration: a century. Times are stored as 64-bit milliseconds, which a due time of now
# plus "9" * 300 + "d" would overflow where it is written (a 500, or a keeper's write failing).
MAX_DURATION_MS = 100 * 365 * DAY
Duration = Annotated[int, BeforeValidator(_duration), Field(le=MAX_DURATION_MS)]
PositiveDuration = Annotated[int, BeforeValidator(_duration), Field(gt=0, le=MAX_DURATION_MS)]
NonNegDuration = Annotated[int, BeforeValidator(_duration), Field(ge=0, le=MAX_DURATION_MS)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
        loc_by_alias=False,
    )


HOST_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}$")


def clean_host(value: str) -> str:
    """A host name lower-cased without its trailing dot; ValueError for anything else (a ``*`` or ``?``
    would widen the worker's CDP pattern past the host)."""
    value = value.strip().lower().strip(".")
    if not HOST_NAME.match(value):
        raise ValueError(f"not a host name: {value[:100]!r}")
    return value


def is_loopback(host: str | None) -> bool:
    """A loopback address (``[::1]`` bracketed or not) or ``localhost``: the one test of "only this
    machine can reach it" (listeners, the open-policy default, http allowed to a local fake)."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"
