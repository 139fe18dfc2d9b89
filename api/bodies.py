"""Request bodies read with a size cap, and JSON answers in the shapes the fleet and admins expect."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request


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


async def read_json(request: Request, cap: int = 1024 * 1024, *, allow_empty: bool = False) -> Any:
    body = await read_body(request, cap)
    if not body.strip():
        if allow_empty:
            return {}
        raise bad_request("a JSON body is required")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise bad_request("request body is not valid JSON") from None


async def read_object(request: Request, cap: int = 1024 * 1024, *, allow_empty: bool = False) -> dict:
    data = await read_json(request, cap, allow_empty=allow_empty)
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return data


def int_field(data: dict, name: str, *, default: int | None = None, minimum: int | None = None,
              allow_none: bool = False) -> int | None:
    """An integer field: ints, integral floats and digit strings; anything else is a 400."""
    if name not in data or (data[name] is None and allow_none):
        return default
    v = data[name]
    if isinstance(v, bool):
        raise bad_request(f"{name} must be an integer")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v.strip())
    if not isinstance(v, int):
        raise bad_request(f"{name} must be an integer, got {data[name]!r}")
    if minimum is not None and v < minimum:
        raise bad_request(f"{name} must be >= {minimum}")
    return v
