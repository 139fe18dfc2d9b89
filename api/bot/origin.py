"""The origin client of one ingress replica: one shared, pooled httpx.AsyncClient (HTTP/1.1
keep-alive) for every origin fetch of the bot path.

Better than the reference (docs/serving.md#origin-fetch), which has no deadlines, relays bodies of any size
and proxies any host it is asked for:

- connect and per-read deadlines from ``origin.*TimeoutMs``, plus a whole-fetch deadline (connect +
  two reads) so an origin that drips a byte at a time cannot hold a request forever: 504;
- redirects are never followed; the 3xx is relayed with its ``Location``;
- the body is streamed and counted, and refused past ``origin.maxBodyBytes`` (502) without reading
  the rest, so memory stays bounded; a declared ``Content-Length`` over the cap fails before any read;
- an origin that closes mid-body or breaks the protocol is a 502; a 5xx it answers is relayed;
- hosts are checked against ``domains`` by the ingress decision, and again here by the origin policy
  (``prerender_ray.serving.origin_policy``) on the URL as httpx will connect to it: host and port must be
  allowed, an empty list is refused outright unless the listener is loopback or ``allowAnyDomain``
  is set; a refusal is a 403 naming the origin, before any connection (so before the token is sent);
  with ``allowAnyDomain`` on a public listener, a host is connected to only at a public address
  (``api/outbound.py``), else a 403 as well;
- no cookie is kept: one origin's ``Set-Cookie`` is never replayed to a later fetch;
- staging pinning connects to the configured IP while Host and TLS SNI stay the real host;
- concurrent misses of one key share one fetch (``collapsed``: the caller keys it, ``Miss.from_origin``
  by the headers it sends too);
- bypass requests (other methods, whose bodies a bot may drip) hold at most ``MAX_BYPASS`` of the
  ``MAX_CONNECTIONS`` pooled connections (``take_bypass``), so they never take those misses need.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass

import httpx

from prerender_ray import metrics
from prerender_ray.api.outbound import NonPublicAddress, transport
from prerender_ray.config.model import Config
from prerender_ray.serving.answer import encode_header
from prerender_ray.serving.origin_policy import NoCookies, OriginPolicy

MAX_CONNECTIONS = 256
# Bypass requests (a bot's POST ...) in flight at once: each holds a pooled connection while its body
# arrives, for up to the whole-fetch deadline, so a crowd dripping bodies would take every connection
# and every bot's GET miss would wait out the pool timeout (504). Past it, a 503 at once.
MAX_BYPASS = MAX_CONNECTIONS // 4
MAX_KEEPALIVE = 64
KEEPALIVE_EXPIRY_S = 30.0


class OriginError(Exception):
    """An origin fetch that produced no relayable answer; ``status`` is what the bot gets."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status = status  # 502, 504, or 403 for a refused host
        self.kind = kind  # metric label: timeout, connect, (head-)too-large, protocol, refused, error


@dataclass(slots=True)
class OriginAnswer:
    status: int
    headers: list[tuple[str, str]]  # as received (latin-1 decoded), names in any case
    body: bytes
    via_staging: bool
    seconds: float  # to the response head


def _set_max_header_bytes(n: int) -> None:
    """httpcore reads a response head of at most this many bytes (h11's incomplete-event cap).
    It is a class attribute, so it applies to the whole process: only the ingress fetches origins."""
    from httpcore._async.http11 import AsyncHTTP11Connection

    AsyncHTTP11Connection.MAX_INCOMPLETE_EVENT_SIZE = n


class OriginClient:
    def __init__(self, cfg: Config):
        o = cfg.origin
        self.cap = o.max_body_bytes
        self.total_s = (o.connect_timeout_ms + 2 * o.read_timeout_ms) / 1000
        self.timeout = httpx.Timeout(connect=o.connect_timeout_ms / 1000, read=o.read_timeout_ms / 1000,
                                     write=o.read_timeout_ms / 1000, pool=o.connect_timeout_ms / 1000)
        self.limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE,
                                   keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self.policy = OriginPolicy(cfg)
        self.max_head = o.max_response_header_bytes
        _set_max_header_bytes(self.max_head)
        self.client = self._client(None)
        self._pinned: dict[str, httpx.AsyncClient] = {}  # staging IP -> client (config allows one)
        self._inflight: dict[Hashable, asyncio.Future] = {}
        self.max_bypass = MAX_BYPASS
        self.bypassing = 0  # bypass requests between take_bypass and give_bypass

    def _client(self, ip: str | None) -> httpx.AsyncClient:
        connects = transport(self.limits, pin=ip or "", public_only=self.policy.public_only)
        return httpx.AsyncClient(transport=connects, timeout=self.timeout, follow_redirects=False,
                                 trust_env=False, cookies=NoCookies())

    async def aclose(self) -> None:
        for c in (self.client, *self._pinned.values()):
            await c.aclose()

    # -------------------------------------------------------------------------------------- fetch

    async def fetch(self, method: str, url: str, headers: Sequence[tuple[str, str]], *, reason: str,
                    body: bytes | AsyncIterator[bytes] | None = None, pin: str | None = None) -> OriginAnswer:
        """One origin request, its answer's body read whole (within the cap); a request ``body`` given
        as an iterator is streamed (what it raises passes through). Raises OriginError."""
        client = self.client
        try:
            # a bot's headers as the bytes they came as (httpx encodes text as ASCII: one byte over 127
            # made every miss of that bot a 500)
            sent = [(encode_header(name), encode_header(value)) for name, value in headers]
            request = client.build_request(method, url, headers=sent, content=body)
        except httpx.InvalidURL as e:
            raise OriginError(400, "refused", f"not a URL the origin client can fetch: {e}") from None
        refused = self.policy.request_refusal(request.url.scheme, request.url.raw_host, request.url.port)
        if refused:
            raise OriginError(403, "refused", f"origin fetch refused: {refused}")
        if pin:
            client = self._pinned.get(pin) or self._pinned.setdefault(pin, self._client(pin))
        t0 = time.perf_counter()
        status = 0
        try:
            async with asyncio.timeout(self.total_s):
                response = await client.send(request, stream=True)
                status = response.status_code
                head_s = time.perf_counter() - t0
                try:
                    self._check_head(response)
                    content = await self._read(response)
                finally:
                    await response.aclose()
        except OriginError:
            raise
        except NonPublicAddress as e:  # allowAnyDomain on a public listener: resolved to our own network
            raise OriginError(403, "refused", f"origin fetch refused: {e}") from None
        except (TimeoutError, httpx.TimeoutException) as e:
            raise OriginError(504, "timeout",
                              f"the origin did not answer in time ({type(e).__name__})") from None
        except httpx.ConnectError as e:
            raise OriginError(502, "connect", f"cannot connect to the origin: {e}") from None
        except (httpx.RemoteProtocolError, httpx.LocalProtocolError, httpx.NetworkError) as e:
            raise OriginError(502, "protocol", f"the origin broke the connection: {e}") from None
        except httpx.HTTPError as e:
            raise OriginError(502, "error", f"origin fetch failed: {type(e).__name__}: {e}") from None
        finally:
            metrics.origin_fetch_seconds.labels(str(status), reason).observe(time.perf_counter() - t0)
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw]
        return OriginAnswer(status, raw, content, pin is not None, head_s)

    def _check_head(self, response: httpx.Response) -> None:
        """h11 bounds the head it buffers only approximately (one read past the cap): be exact."""
        size = sum(len(k) + len(v) + 4 for k, v in response.headers.raw)
        if size > self.max_head:
            raise OriginError(502, "head-too-large", f"the origin's response head ({size} bytes) is over "
                                                     f"the {self.max_head}-byte cap")

    async def _read(self, response: httpx.Response) -> bytes:
        """The raw (still content-coded) body, refused past the cap without reading the rest."""
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.cap:
            raise OriginError(502, "too-large", f"the origin body ({declared} bytes) is over the "
                                                f"{self.cap}-byte cap")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > self.cap:
                raise OriginError(502, "too-large", f"the origin body is over the {self.cap}-byte cap")
            chunks.append(chunk)
        return b"".join(chunks)

    def take_bypass(self) -> bool:
        """A slot for one bypass request, or False when ``max_bypass`` are in flight (the rest of the
        pool stays free for misses); ``give_bypass`` returns it."""
        if self.bypassing >= self.max_bypass:
            return False
        self.bypassing += 1
        return True

    def give_bypass(self) -> None:
        self.bypassing -= 1

    # ----------------------------------------------------------------------------------- collapse

    async def collapsed(self, key: Hashable,
                        start: Callable[[], Awaitable[OriginAnswer]]) -> tuple[OriginAnswer, bool]:
        """One fetch per ``key`` at a time: the first caller starts it, later ones wait for the same
        answer. The fetch runs as its own task, so a bot that hangs up cancels only its wait.
        Returns (answer, whether this caller started the fetch). Raises OriginError."""
        future = self._inflight.get(key)
        leader = future is None
        if future is None:
            future = asyncio.ensure_future(start())
            self._inflight[key] = future
            future.add_done_callback(functools.partial(self._settled, key))
        return await asyncio.shield(future), leader

    def _settled(self, key: Hashable, future: asyncio.Future) -> None:
        if self._inflight.get(key) is future:
            del self._inflight[key]
        if not future.cancelled():
            future.exception()  # retrieved: a fetch nobody waits for any more must not warn

    @property
    def inflight(self) -> int:
        return len(self._inflight)
