"""The render fleet's API, byte-compatible with the reference fleet: claim, job_result, pause/resume,
queue status and control."""

from __future__ import annotations

import asyncio
from typing import cast

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from prerender_ray import logs
from prerender_ray.admin.users import Principal
from prerender_ray.api.auth import require
from prerender_ray.api.bodies import bad_request, int_field, int_text, parse_body, read_body, read_object
from prerender_ray.api.context import NodeContext
from prerender_ray.batching import GroupCommit
from prerender_ray.decoding import DecodeError, TooLarge, decoded_size
from prerender_ray.identity.cachekeys import DEVICE, CacheKeyError
from prerender_ray.queue.metadata import ENCODINGS, MAX_METADATA_BYTES, Result, ResultError, forwarded
from prerender_ray.queue.status import Via
from prerender_ray.storage.keys import QUEUE_CONTROL, QUEUE_STATUS
from prerender_ray.storage.pagelog.mirror import RETRY_AFTER_S, refusal
from prerender_ray.storage.registry import decode_json

router = APIRouter()
log = logs.get("render_queue")


class ResultFailed(RuntimeError):
    """A keeper's answer that a result failed; ``retry_after`` (s) when the fleet should wait."""

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after if isinstance(retry_after, int) and 0 < retry_after <= 3600 else None


CLAIM_DEADLINE_S = 10.0
RESULT_DEADLINE_S = 30.0
SIZE_ERROR = "x-metadata-size must be a positive integer no larger than the request body"
MAX_WORKER_ID = 256
CLAIM_KEYS = {"limit"}  # the reference fleet sends exactly {"limit": N}
# A result's page as gzip: the reference fleet and our worker send one member. Each member costs the
# check a few Python steps on the event loop (10 MB of empty members took 0.79 s); a few are allowed.
MAX_GZIP_MEMBERS = 16


def _ctx(request: Request) -> NodeContext:
    return request.app.state.ctx


@router.post("/render_queue/claim")
async def claim(request: Request, who: Principal = Depends(require("fleet"))) -> Response:
    """Always 200 with a bare JSON array (the fleet circuit-breaks on anything else); ``[]`` when
    paused, unready or empty, and when the keeper cannot be reached."""
    ctx = _ctx(request)
    body = await read_object(request, 64 * 1024, keys=CLAIM_KEYS, allow_empty=True)
    limit = cast(int, int_field(body, "limit", default=20))  # None only when allow_none
    limit = max(1, min(limit, ctx.cfg.queue.max_claim_limit))
    try:  # each grant records the claiming worker: its result is told apart from a previous holder's
        content = await asyncio.wait_for(_claims(ctx).submit((limit, worker_id(request))), CLAIM_DEADLINE_S)
    except Exception as e:  # a restarting keeper: the node is unready, the fleet idles
        log.warning("claim failed; answering []", error=repr(e), worker=request.headers.get("x-worker-id"))
        content = b"[]"
    return Response(content, media_type="application/json")


def worker_id(request: Request) -> str | None:
    """The fleet's ``x-worker-id`` (sent on every request), bounded: it is stored with each grant."""
    worker = request.headers.get("x-worker-id")
    return None if worker is None else worker[:MAX_WORKER_ID]


def _claims(ctx: NodeContext) -> GroupCommit[tuple[int, str | None], bytes]:
    """Concurrent claims on this replica share one keeper call (the keeper deals the jobs out in
    arrival order and encodes each answer), so a busy fleet costs one actor hop per batch."""
    claims = ctx.claims
    if claims is None:
        async def flush(asks: list[tuple[int, str | None]]) -> list[bytes]:
            limits, workers = [a[0] for a in asks], [a[1] for a in asks]
            return await ctx.keeper.within(CLAIM_DEADLINE_S).claim_json(limits, workers)

        claims = ctx.claims = GroupCommit(flush)
    return claims


RESULT_BATCH_BYTES = 8 * 1024 * 1024  # result bytes in one keeper call at most (Ray's object store is small)


def _results(ctx: NodeContext) -> GroupCommit[tuple[dict, bytes | None, str | None, int], dict]:
    """Concurrent results for keys this node owns share keeper calls (the keeper applies them as one
    group: one lease-table call to begin them, one store read, one store write, one call to finish
    them), each call carrying at most ``RESULT_BATCH_BYTES`` of posted bodies (the last field of an
    item: metadata and page; one larger than that goes alone)."""
    results = ctx.results
    if results is None:
        async def flush(items: list[tuple[dict, bytes | None, str | None, int]]) -> list[dict]:
            groups: list[list] = [[]]
            size = 0
            for meta, content, worker, n in items:
                if groups[-1] and size + n > RESULT_BATCH_BYTES:
                    groups.append([])
                    size = 0
                groups[-1].append((meta, content, worker))
                size += n
            keeper = ctx.keeper.within(RESULT_DEADLINE_S)
            answers = await asyncio.gather(*(keeper.process_results(g) for g in groups), return_exceptions=True)
            out: list[dict] = []
            for g, a in zip(groups, answers):
                out += [{"error": repr(a)}] * len(g) if isinstance(a, BaseException) else a
            return out

        results = ctx.results = GroupCommit(flush)
    return results


def check_encoding(encoding: str, content: bytes | None, max_bytes: int) -> None:
    """A content-encoding that does not match the bytes would be served as garbage, and a body that
    decodes past ``max_bytes`` would be decoded again for every bot that cannot take its coding: the
    whole stream is decoded here (streamed, output dropped piece by piece, stopped at the cap)."""
    if encoding not in ENCODINGS:
        raise bad_request(f"unsupported content-encoding {encoding!r}; expected gzip, br or identity")
    if not content:
        return
    try:
        decoded_size(content, encoding, max_bytes, max_members=MAX_GZIP_MEMBERS)
    except TooLarge:
        raise bad_request(f"the content decodes to more than {max_bytes} bytes (server.maxHtmlBytes)",
                          413) from None
    except DecodeError as e:
        raise bad_request(f"the content is not {encoding}-encoded: {e}") from None


@router.post("/render_queue/job_result", status_code=204)
async def job_result(request: Request, who: Principal = Depends(require("fleet"))) -> Response:
    ctx = _ctx(request)
    body = await read_body(request, ctx.cfg.server.max_body_bytes)
    raw = request.headers.get("x-metadata-size")
    size = None if raw is None else int_text(raw)
    if size is None or not 0 < size <= len(body):
        raise bad_request(SIZE_ERROR)
    if size > MAX_METADATA_BYTES:  # refused unparsed: 10 MB of JSON is a second and 255 MiB on this loop
        raise bad_request(f"the metadata is larger than {MAX_METADATA_BYTES} bytes", 413)
    # Depth-bounded; keys outside docs/fleet-protocol.md#metadata-fields are ignored here, not refused
    # (the metadata is the fleet's format, and a newer fleet's extra field must never cost a rendered
    # page), and not forwarded: the keeper gets the fields it reads.
    meta = parse_body(body[:size], "metadata")
    content = body[size:] or None
    try:
        result = Result.parse(meta, content)
        url = ctx.rules.url_of(result.id)
        device = ctx.rules.device_of(result.id)
    except (ResultError, CacheKeyError) as e:
        raise bad_request(str(e)) from None
    if (device or DEVICE in ctx.rules.keys.attributes) and device not in ctx.rules.supported \
            or ctx.rules.keys.key(url, device) != result.id:  # a [url] layout's keys name no device
        raise bad_request(f"id {result.id!r} is not a cache key of this service")
    check_encoding(result.content_encoding, content, ctx.cfg.server.max_html_bytes)
    meta = forwarded(meta)
    try:  # the owner's keeper checks the lease first: an id never granted changes nothing
        if ctx.owner_of(url) == ctx.node.name:
            item = (meta, content, worker_id(request), len(body))
            outcome = await asyncio.wait_for(_results(ctx).submit(item),
                                             2 * RESULT_DEADLINE_S)  # the group in flight, then ours
        else:
            keeper = await ctx.keeper_of(url)
            outcome = await keeper.within(RESULT_DEADLINE_S).process_result(meta, content, False, worker_id(request))
        if "error" in outcome:
            raise ResultFailed(outcome["error"], outcome.get("retryAfter"))
    except Exception as e:  # the lease stays held: the job is re-granted when it expires
        log.error("result processing failed; lease held", key=result.id, error=repr(e)[:500])
        retry = getattr(e, "retry_after", None) or (RETRY_AFTER_S if refusal(e) is not None else None)
        if retry:  # the store cannot take pages now (its page log is full): the fleet's circuit waits
            return JSONResponse({"error": "the page store cannot take results now; retry later (the lease is held)"},
                                status_code=503, headers={"Retry-After": str(int(retry))})
        return JSONResponse({"error": "result processing failed; the lease is held"}, status_code=503)
    if outcome.get("refused"):
        raise bad_request(outcome["refused"], 409)
    return Response(status_code=204)


async def _set_pause(ctx: NodeContext, paused: bool | None, who: Principal) -> JSONResponse:
    # A fleet credential changes the node's intent only where the admin API has not (fleet_write).
    via: Via = "admin" if who.has("admin") else "fleet"
    result = await ctx.keeper.within(10).set_pause(ctx.node.name, paused, who.name or "render_queue-api", via)
    if "refused" in result:
        return JSONResponse({"error": result["refused"], "node": result["node"]}, status_code=409)
    return JSONResponse(result)


@router.post("/render_queue/pause")
async def pause(request: Request, who: Principal = Depends(require("fleet"))) -> JSONResponse:
    """Pause this node only (cluster-wide control is the admin API's). 409 over an admin's explicit run."""
    return await _set_pause(_ctx(request), True, who)


@router.post("/render_queue/resume")
async def resume(request: Request, who: Principal = Depends(require("fleet"))) -> JSONResponse:
    """Drop this node's override: it inherits the cluster intent (never punches through a cluster pause).
    409 when an admin's pause holds it: the admin API lifts that."""
    return await _set_pause(_ctx(request), None, who)


async def _rows(ctx: NodeContext, prefix: bytes) -> list[dict]:
    rows = await ctx.store.within(10).scan(prefix, None, 10_000)
    return [{"scope" if prefix == QUEUE_CONTROL else "node": k[len(prefix):].decode(), **decode_json(v)}
            for k, v in rows]


@router.get("/queue_status")
async def queue_status(request: Request, who: Principal = Depends(require("viewer", "fleet"))) -> JSONResponse:
    """Every node's last observed status (written on change; ``updatedTime`` is the change time)."""
    return JSONResponse(await _rows(_ctx(request), QUEUE_STATUS))


@router.get("/queue_control")
async def queue_control(request: Request, who: Principal = Depends(require("viewer", "fleet"))) -> JSONResponse:
    return JSONResponse(await _rows(_ctx(request), QUEUE_CONTROL))
