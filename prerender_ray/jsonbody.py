"""JSON from outside, parsed within bounds: nesting depth checked before the parser sees it, and
object keys checked against the ones a body may carry.

The standard parser recurses once per nesting level: 10 KB of ``[`` is a ``RecursionError`` (not a
``ValueError``) and a 500 wherever it was not expected. No body or metadata we accept is more than
a few levels deep, so a cheap scan of the bytes refuses anything deeper than ``MAX_DEPTH`` first.

The parser also turns a ``\\ud800`` escape into a lone surrogate, a string no UTF-8 encoder takes: stored
(a target's reason, a page's header), it failed every later answer that encoded it. Such JSON is
refused; a valid pair (an escaped emoji) is one character and passes. Only text holding a surrogate
escape at all (a byte scan) has its parsed strings checked.
"""

from __future__ import annotations

import codecs
import json
import re
from array import array
from collections.abc import Collection
from itertools import accumulate
from typing import Any

MAX_DEPTH = 32

# A JSON string (escapes included): its brackets are text, not nesting. Unrolled, so it is linear.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_SIGNS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes
_CHUNK = 64 * 1024
# A \uD800-\uDFFF escape (or an escaped backslash before such text: the check of the strings decides).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


class JsonError(ValueError):
    """Not JSON we accept; the message says why."""


def json_depth(data: bytes, stop_above: int | None = None) -> int:
    """The deepest nesting of brackets outside strings (0 for a scalar), or the first depth found
    above ``stop_above``. At C speed: strings are cut out, everything but brackets is deleted, and
    the running sum of +1/-1 is maximized chunk by chunk (a deep body stops at its first chunk)."""
    skeleton = _STRING.sub(b"", data).translate(_SIGNS, _NOT_BRACKETS)
    level = deepest = 0
    for start in range(0, len(skeleton), _CHUNK):
        sums = list(accumulate(array("b", skeleton[start:start + _CHUNK]), initial=level))
        deepest, level = max(deepest, max(sums)), sums[-1]
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


def parse_json(data: bytes | str, *, max_depth: int = MAX_DEPTH, what: str = "request body") -> Any:
    """``data`` parsed, or ``JsonError``: not UTF-8, not JSON, nested deeper than ``max_depth``, or a
    number the parser refuses (an integer of more than 4,300 digits). A leading UTF-8 byte order mark
    is ignored, as ``json.loads`` ignores it in bytes."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    raw = raw.removeprefix(codecs.BOM_UTF8)
    # json.loads(bytes) would also detect UTF-16/32, whose bytes the scan misreads (a '"' byte inside
    # a character hides the brackets after it): the parser reads the text the scan saw, UTF-8 only.
    # JSON text never holds a NUL byte; UTF-16/32 of ASCII does, and is valid UTF-8.
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonError(f"{what} is not UTF-8") from None
    if b"\0" in raw:
        raise JsonError(f"{what} is not UTF-8 (it holds NUL bytes: UTF-16 or UTF-32?)")
    if json_depth(raw, stop_above=max_depth) > max_depth:
        raise JsonError(f"{what} is nested deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise JsonError(f"{what} is not valid JSON") from None
    if _SURROGATE_ESCAPE.search(raw) and not _unicode_text(value):
        raise JsonError(f"{what} holds a string that is not Unicode text: a lone surrogate escape "
                        "(\\ud800-\\udfff not in a valid pair)")
    return value


def _unicode_text(value: Any) -> bool:
    """Every string in ``value`` (keys too) encodes to UTF-8: it holds no lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    return True


def unknown_keys(obj: dict, accepted: Collection[str]) -> list[str]:
    """The keys of ``obj`` that are not ``accepted``, sorted (a typo must not pass as absent)."""
    return sorted(str(k) for k in obj if k not in accepted)
