"""Request bodies read with a size cap, and JSON answers in the shapes the fleet and admins expect.

Every JSON body goes through ``read_object`` (or ``parse_body`` for the fleet's metadata): bounded in
size and depth before it is parsed (``prerender_ray.jsonbody``), and an object whose keys are declared
per route, so a typo is a 400 naming it rather than a field silently absent.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from fastapi import HTTPException, Request

from prerender_ray.jsonbody import JsonError, parse_json, unknown_keys

# ASCII digits (str.isdigit also takes "²", which int() refuses), no more than int() converts: 4,300
# (sys.int_info.default_max_str_digits), so every ASCII string that converted before still does.
_INTEGER = re.compile(r"-?[0-9]{1,4300}")


def int_text(text: str, *, signed: bool = False) -> int | None:
    """``text`` (surrounding whitespace aside) as an integer, or None when it is not one."""
    text = text.strip()
    if not _INTEGER.fullmatch(text) or (text.startswith("-") and not signed):
        return None
    return int(text)


def bad_request(message: str, status: int = 400, **extra: Any) -> HTTPException:
    return HTTPException(status, detail={"error": message, **extra})


async def read_body(request: Request, cap: int) -> bytes:
    """The whole body, refused with 413 past ``cap`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise bad_request("content-length is not a number")
        if int(declared) > cap:
            raise bad_request(f"request body is larger than {cap} bytes", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise bad_request(f"request body is larger than {cap} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_body(data: bytes, what: str = "request body") -> Any:
    """JSON bytes parsed, or a 400 (not UTF-8, not JSON, nested too deep): never a RecursionError."""
    try:
        return parse_json(data, what=what)
    except JsonError as e:
        raise bad_request(str(e)) from None


def check_keys(obj: dict, keys: Collection[str], what: str = "request body") -> dict:
    """``obj``, or a 400 naming its keys outside ``keys`` and the accepted ones."""
    unknown = unknown_keys(obj, keys)
    if unknown:
        accepted = sorted(keys)
        raise bad_request(f"{what} has unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(repr(k) for k in unknown[:10])}; accepted: "
                          f"{', '.join(accepted) if accepted else 'none'}",
                          unknownKeys=unknown[:10], acceptedKeys=accepted)
    return obj


async def read_object(request: Request, cap: int = 1024 * 1024, *, keys: Collection[str],
                      allow_empty: bool = False) -> dict:
    """The body as a JSON object with no key outside ``keys`` (413 past ``cap`` bytes, else 400)."""
    body = await read_body(request, cap)
    if not body.strip():
        if allow_empty:
            return {}
        raise bad_request("a JSON body is required")
    data = parse_body(body)
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return check_keys(data, keys)


def bool_field(data: dict, name: str, default: bool) -> bool:
    """``data[name]`` as a boolean (absent or null: ``default``); anything else is a 400."""
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false")
    return value


def int_field(data: dict, name: str, *, default: int | None = None, minimum: int | None = None,
              maximum: int | None = None, allow_none: bool = False) -> int | None:
    """An integer field: ints, integral floats and digit strings; anything else is a 400."""
    if name not in data or (data[name] is None and allow_none):
        return default
    v = data[name]
    if isinstance(v, bool):
        raise bad_request(f"{name} must be an integer")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str) and (parsed := int_text(v, signed=True)) is not None:
        v = parsed
    if not isinstance(v, int):
        raise bad_request(f"{name} must be an integer, got {data[name]!r}")
    if minimum is not None and v < minimum:
        raise bad_request(f"{name} must be >= {minimum}")
    if maximum is not None and v > maximum:
        raise bad_request(f"{name} must be <= {maximum}")
    return v
