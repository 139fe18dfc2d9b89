"""What every admin module shares: JSON answers, deadlines, the heavy-read cap, the management switch,
key parsing and the fan-out to every node's actors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from ray.exceptions import RayError

from prerender_ray import logs
from prerender_ray.actors.client import ActorClient
from prerender_ray.api.bodies import bad_request, int_text
from prerender_ray.api.context import NodeContext
from prerender_ray.api.errors import http_error
from prerender_ray.identity.cachekeys import CacheKeyError

NO_STORE = {"cache-control": "no-store"}
# on every admin answer: a browser never guesses a type other than the one we send
ANSWER_HEADERS = {**NO_STORE, "x-content-type-options": "nosniff"}
log = logs.get("admin")
DEADLINE_S = 10.0  # actor calls on this node
HEAVY_SLOTS = 2  # concurrent heavy reads per replica (sitemap detail, pages, page content, fan-out)
HEAVY_RETRY_AFTER_S = 1
C = TypeVar("C", bound=ActorClient)
T = TypeVar("T")


class AdminRoute(APIRoute):
    """Every admin answer is no-store and nosniff, errors included: an ``HTTPException`` is rendered
    by the app's own error answer (``api/errors.py``), then given the headers every answer gets."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def no_store(request: Request) -> Response:
            try:
                response = await handler(request)
            except HTTPException as e:
                response = http_error(request, e)  # the app's answer to it, made no-store below
            except TimeoutError as e:  # an actor call past its deadline (DeadlineExceeded)
                log.warning("admin read timed out", path=request.url.path, error=str(e))
                return answer({"error": f"this node did not answer in time ({e}); nothing is known, "
                               "retry", "node": ctx_of(request).node.name}, 504)
            except RayError as e:  # an actor of this node died or is restarting
                log.warning("admin call failed", path=request.url.path, error=repr(e)[:300])
                return answer({"error": f"an actor of this node is unavailable ({type(e).__name__}); retry",
                               "node": ctx_of(request).node.name}, 503)
            for name, value in ANSWER_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return no_store


def admin_router() -> APIRouter:
    """A router for one admin module: the management switch first, then the route's own role check."""
    return APIRouter(route_class=AdminRoute, dependencies=[Depends(management_enabled)])


def answer(body: object, status: int = 200, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={**ANSWER_HEADERS, **(headers or {})})


def ctx_of(request: Request) -> NodeContext:
    return request.app.state.ctx


def peer_timeout_s(ctx: NodeContext) -> float:
    return ctx.cfg.management.peer_timeout_ms / 1000


async def management_enabled(request: Request) -> None:
    """Every /prerender_admin route, login and session included, is 404 when management is off."""
    if not ctx_of(request).cfg.management.enabled:
        raise HTTPException(404, detail={"error": "Management API is disabled"})


# ----------------------------------------------------------------------------------- heavy reads


class HeavySlots:
    """A non-blocking cap: a request that finds every slot taken is refused at once (429), it never
    queues behind the others."""

    def __init__(self, size: int = HEAVY_SLOTS):
        self.size = size
        self.in_use = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self.in_use >= self.size:
            raise HTTPException(
                429, detail={"error": f"Too many heavy admin reads in flight on this replica "
                             f"(max {self.size}) - retry shortly", "retryAfterSeconds": HEAVY_RETRY_AFTER_S},
                headers={"Retry-After": str(HEAVY_RETRY_AFTER_S), **NO_STORE})
        self.in_use += 1
        try:
            yield
        finally:
            self.in_use -= 1


def heavy(ctx: NodeContext) -> HeavySlots:
    slots = ctx.heavy_slots
    if slots is None:
        slots = ctx.heavy_slots = HeavySlots()
    return slots


# ------------------------------------------------------------------------------------------ keys


def parse_key(ctx: NodeContext, key: object) -> str:
    """A cache key as given, checked for the configured shape and a supported device."""
    if not isinstance(key, str) or not key:
        raise bad_request("cacheKey is required")
    if len(key) > 9000:
        raise bad_request("cacheKey is too long")
    try:
        url, device = ctx.rules.url_of(key), ctx.rules.device_of(key)
    except CacheKeyError as e:
        raise bad_request(str(e)) from None
    if device not in ctx.rules.supported:
        raise bad_request(f"unknown device type in {key!r}")
    return ctx.rules.keys.key(url, device)


def query_int(request: Request, name: str, *, default: int, minimum: int, maximum: int) -> int:
    """An integer query parameter within [minimum, maximum]; anything else is a 400."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    value = int_text(raw)
    if value is None:
        raise bad_request(f"{name} must be an integer between {minimum} and {maximum}")
    if not minimum <= value <= maximum:
        raise bad_request(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def body_int(body: dict, name: str, *, default: int, minimum: int, maximum: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer between {minimum} and {maximum}")
    if not minimum <= value <= maximum:
        raise bad_request(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


# ---------------------------------------------------------------------------------------- fan-out


def member_names(ctx: NodeContext) -> list[str]:
    return sorted(set(ctx.peers) | {ctx.node.name})


async def fan_out(ctx: NodeContext, at: Callable[[str], Awaitable[C]], ask: Callable[[C], Awaitable[T]],
                  *, timeout: float | None = None) -> dict[str, tuple[bool, T | str]]:
    """``ask`` (a client method, e.g. ``KeeperClient.queue_state``) of the client ``at`` gives for every
    node (e.g. ``ctx.keeper_at``), all at once, each within the deadline (``management.peerTimeoutMs``
    unless told). Node name -> (True, answer) or (False, reason)."""
    deadline = peer_timeout_s(ctx) if timeout is None else timeout

    async def one(name: str) -> tuple[bool, T | str]:
        try:
            return True, await ask((await at(name)).within(deadline))
        except ValueError:  # ray.get_actor: no such actor (not placed yet, or the node is gone)
            return False, f"no actor placed on {name} to answer"
        except TimeoutError:
            return False, f"no answer within {deadline * 1000:g} ms"
        except Exception as e:  # a dead actor, a lost node: the node is reported, the view goes on
            ctx.forget_remote()
            return False, f"{type(e).__name__}: {str(e)[:200]}"

    names = member_names(ctx)
    found = await asyncio.gather(*(one(n) for n in names))
    return dict(zip(names, found))
