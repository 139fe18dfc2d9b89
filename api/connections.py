"""The ingress's HTTP protocol: uvicorn's httptools protocol with deadlines and a connection cap
(docs/serving.md#slow-clients-and-connection-budgets).

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``) but not the time a client takes
to send a request's headers, and it caps nothing at accept: ``limit_concurrency`` answers 503 to new
*requests* once the open connections reach it, so a crowd of slow clients would turn every real
request away. Here:

- **Header deadline.** A timer starts when a connection opens and when the first byte of each further
  request arrives; the request's headers must be complete before it fires, or the connection is closed
  (no answer: a slow client learns nothing, and nothing is written to a socket it may never read).
- **Connection cap.** A replica keeps at most ``max_connections`` open. A new connection over the cap
  takes the place of the connection that has waited longest without a request being served (headers
  still arriving, or idle between keep-alive requests): a crowd of slow or idle clients cannot hold the
  replica, and no request being served is touched. When every open connection is serving a request,
  the new one is closed at once, before anything is read from it.
- **Request heads.** httptools 0.9 (llhttp) bounds neither a head's size nor its headers: the URL
  and header names and values are counted as the parser hands them over, before uvicorn keeps them,
  and past ``MAX_HEAD_BYTES`` or ``MAX_HEADERS`` the request is answered 431 (``_refuse_head``).
- **Pipelining.** At most ``MAX_PIPELINE`` requests wait behind the answer in flight; the next one
  is dropped unread with everything after it, and the last request taken closes the connection once
  answered (as a server closing a keep-alive connection: a pipelining client retries the rest).
- **Write deadline.** A client that does not take what it is sent holds its connection: uvicorn's
  send waits for a drain while writing is paused, and a graceful close waits for the buffer to empty
  before the connection is lost (and uncounted). Bytes waiting that way (writing paused, or a close
  with bytes still buffered) for ``write_timeout_s`` abort the connection, unless the client took at
  least ``MIN_WRITE_PROGRESS`` bytes of them meanwhile (a slow reader, not a stalled one: as nginx's
  ``send_timeout``, the deadline runs between two reads, and a trickle cannot hold the slot). A
  connection closing with
  bytes its client has not taken is waiting too: an eviction takes it, by aborting it.

**One timer a connection.** The deadlines (the headers', uvicorn's idle keep-alive, the write's) are
kept as times on the connection, and one timer checks them when it fires: early (the deadline moved
on since) it sleeps again until the deadline. uvloop's ``call_later`` and ``cancel`` cost 7.6 us of the 12.4
us this protocol spent around each answer (``bench/bench_protocol.py``): two timers made and
cancelled per request. Now a request moves a deadline (a float) and the timer fires about once per
timeout per connection.

A **memo hit** (``api/bot/memo.py``) is answered here, when its headers complete, without an ASGI
task: the bytes the ASGI path would write (``HitMemo.wire``), then what uvicorn does at the end of a
response. Only where that is certainly the same: a GET or HEAD without a body or upgrade, no answer
in flight or queued before it on the connection, writing not paused, the app the replica's own
a ``Dated`` app with its bot path; anything else goes to uvicorn's path unchanged.

**A simple read, whole** (``_simple_hit``). A read that is exactly one complete GET or HEAD of the
plainest form (``native/request_head.c``: a strict subset of what llhttp takes, held equal to it by
tests/native/test_request_head.py) is offered to the bot path at once, with the method, target,
headers and keep-alive the C gives, on the scope uvicorn's ``on_message_begin`` makes: none of
llhttp's callbacks into Python (one a header). Where the bot path does not answer, llhttp parses the
read as it always does, the scope the bot path saw carried over (its request shape, a reply made that
the ASGI path sends) and the bot path not asked twice. Compiled builds only (``native.state``); ``simple_heads`` off: never.

**Answers held to the end of the loop's turn** (corked). A memo hit's bytes are not written at once:
they wait with the other connections' answers made in the same turn of the event loop and go out
together when it ends (one ``call_soon``), or once the first of them has waited ``CORK_HOLD_S``.
Written one by one, each answer woke the client anew (on loopback the sender's ``writev`` delivers
and wakes the reader); written together, a client woken by the first finds the rest ready. Under a
crawl of 100,000 pages (the app outside Ray, 32 connections) that is 40-41 -> 20-24 us of system
time an answer, 83-89 -> 57-64 us of user time, 7,700-8,000 -> 11,400-12,600 answers a second.
Unbounded, a turn's first answers waited for all of them (p99 1.2-3.7 ms, up to 32 answers): the
bound keeps most of the gain. Order on a connection holds: anything else that writes or closes it
(uvicorn's path for a later request, its 400, an answer that closes, the peer's end of file, a
shutdown, a deadline) sends what it holds first, and it holds at most ``CORK_BYTES`` (a client
pipelining many requests in one read).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import urllib.parse
from collections import OrderedDict
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from prerender_ray import logs, metrics, native
from prerender_ray.api.app import Dated

log = logs.get("ingress")

CORK_BYTES = 256 * 1024  # a connection's answers held to the turn's end; past it they go out at once
CORK_HOLD_S = 0.0005  # the first answer of a turn is held no longer than this (and what it took to make)
# Requests queued on a connection behind the answer in flight (each a cycle, its scope and an event,
# about 2.2 KB, from 18 bytes on the wire); past it the connection takes no more: those queued are
# answered, the last with a close (a pipelining client retries the rest on a new connection).
MAX_PIPELINE = 16
MIN_WRITE_PROGRESS = 16 * 1024  # bytes a client must take within the write deadline to keep its connection
# A request's head: its URL and header names and values, and its header lines (httptools 0.9 bounds
# neither). Past either it is answered 431 and the connection takes no more requests. A header line
# still arriving is held whole by the parser, uncounted until it ends: a head whose reads after its
# first pass ``MAX_HEAD_BYTES`` and what its framing may add (separators, whitespace) is refused too.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_HEAD_READ = MAX_HEAD_BYTES + 4 * 1024
_TOO_LARGE = (b'{"error": "request head too large: more than %d bytes of URL and header names and values, '
              b'or more than %d headers"}' % (MAX_HEAD_BYTES, MAX_HEADERS))
HEAD_TOO_LARGE = (b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                  % (len(_TOO_LARGE), _TOO_LARGE))  # the 431's headers and body


def _native_head() -> Any:
    """``native/request_head.c``'s ``simple_head`` where the per-URL path runs compiled; else None (llhttp
    parses every read)."""
    module: Any = native.extension("request_head")
    return None if module is None else module.simple_head


_simple_head = _native_head()


class Turn:
    """The connections holding answers until this turn of the event loop ends (one per server)."""

    __slots__ = ("held", "scheduled", "since")

    def __init__(self) -> None:
        self.held: list[GuardedHttp] = []
        self.since = 0.0  # when the first of them was held (perf_counter)
        self.scheduled = False

    def hold(self, conn: GuardedHttp, loop: asyncio.AbstractEventLoop) -> None:
        if not self.held:
            self.since = time.perf_counter()
        self.held.append(conn)
        if not self.scheduled:
            self.scheduled = True
            loop.call_soon(self._ends)

    def _ends(self) -> None:
        self.scheduled = False
        self.flush()

    def flush(self) -> None:
        held, self.held = self.held, []
        for conn in held:
            try:
                conn._uncork()
            except Exception as e:  # one broken transport must not hold back the others' answers
                log.warning("held answers could not be written; the connection is closed", error=repr(e))
                conn.transport.abort()


class GuardedHttp(HttpToolsProtocol):
    """Set per server by ``guarded_protocol``; one subclass per uvicorn server."""

    header_timeout_s: float = 10.0
    write_timeout_s: float = 30.0
    max_connections: int = 10_000
    # Connections not serving a request, longest waiting first (the order evictions take).
    waiting: OrderedDict[GuardedHttp, None] = OrderedDict()
    memo_hits = True  # memo hits answered here (``_memo_hit``); False: every request to the app
    simple_heads = True  # simple reads offered to them without llhttp's callbacks (``_simple_hit``)
    turn = Turn()  # connections with answers held to the end of this turn of the loop
    _failed = False  # a memo hit here raised once (logged once a process)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the one deadline that applies (the headers' or the idle keep-alive's), what passing it does,
        # and the timer that checks it (due at ``_timer_at``; never later than the deadline)
        self._due: float | None = None
        self._timing_headers = False  # the deadline is the headers' (else uvicorn's idle keep-alive)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._shortest = 0.0  # the shortest of the timeouts: how far ahead a timer is ever set
        self._write_due: float | None = None  # bytes wait that the client has not taken: abort then
        self._write_left = 0  # the bytes waiting when the write deadline was set
        self._refused = False
        app = self.app  # uvicorn's, unwrapped only when no middleware of its own is on
        self._dated = app if self.memo_hits and isinstance(app, Dated) and app.bot is not None else None
        self._answered = False  # the request being parsed was answered at its headers (or dropped)
        # no more requests taken: a memo hit here closed it, or ``_take_no_more``, ``_refuse_head``
        self._closed = False
        self._cork: list[Any] | None = None  # answers written when this turn of the loop ends
        self._cork_bytes = 0
        # the head being read: its URL and header names and values (bytes), whether one is open (1:
        # begun in the read being parsed, 2: before it), and its reads' bytes after the first
        self._head_bytes = 0
        self._head_open = 0
        self._head_read = 0
        self._simple = self._dated is not None and self.simple_heads and _simple_head is not None
        self._between = True  # llhttp is between two requests (none begun and not complete)
        # a simple read's scope the bot path saw (``_simple_hit``), carried to llhttp's parse of it
        self._carried: dict[str, Any] | None = None
        self._wired = False  # the request being parsed was offered to the bot path already

    # ------------------------------------------------------------------------------- connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections and not self._evict_one():
            self._refused = True
            metrics.connections_closed.labels("refused").inc()
            transport.abort()  # nothing read, nothing written
            return
        super().connection_made(transport)
        self._shortest = min(self.header_timeout_s, self.timeout_keep_alive, self.write_timeout_s)
        self._wait()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._due = self._write_due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.waiting.pop(self, None)
        self._cork = None
        super().connection_lost(exc)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest without a request being served."""
        while self.waiting:
            oldest, _ = self.waiting.popitem(last=False)
            if oldest.transport is None:
                continue
            # a closing one too: its close may wait for bytes its client never takes, counted meanwhile
            oldest._due = oldest._write_due = None
            self.connections.discard(oldest)  # its connection_lost comes on a later turn of the loop
            oldest.transport.abort()
            metrics.connections_closed.labels("evicted").inc()
            return True
        return False

    # ----------------------------------------------------------------------------- the deadlines

    def _wait(self) -> None:
        self.waiting.pop(self, None)
        self.waiting[self] = None  # to the end: the newest waiter

    def _arm(self) -> None:
        """The header deadline, unless it runs already."""
        if not self._timing_headers or self._due is None:
            self._set_due(self.header_timeout_s, True)

    def _disarm(self) -> None:
        self._due = None  # a timer set meanwhile finds nothing due when it fires

    def _set_due(self, seconds: float, headers: bool) -> None:
        due = self.loop.time() + seconds
        self._due, self._timing_headers = due, headers
        self._wake_by(due)

    def _wake_by(self, due: float) -> None:
        if self._timer is None or self._timer_at > due:
            if self._timer is not None:
                self._timer.cancel()
            self._schedule(due)

    def _schedule(self, due: float) -> None:
        # never further ahead than the shorter timeout: the other deadline, set next, is then not
        # earlier than this timer (no cancel and remake as a request moves between the two)
        loop = self.loop
        self._timer_at = at = min(due, loop.time() + self._shortest)
        self._timer = loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self.loop.time()
        if self._write_due is not None and now >= self._write_due:
            self._write_due = None
            if self._unsent():
                left = self.transport.get_write_buffer_size()
                if self._write_left - left < MIN_WRITE_PROGRESS:
                    metrics.connections_closed.labels("write-timeout").inc()
                    self.transport.abort()
                    return
                # taking its answer, slowly: a new deadline from here (the timer is set below)
                self._write_left, self._write_due = left, now + self.write_timeout_s
        due = self._due
        if due is not None and now >= due:
            self._due = None
            self._uncork()
            if self._timing_headers:
                self._headers_late()
            else:
                self.timeout_keep_alive_handler()
                self._close_waits()
        # a deadline still ahead (it moved on since this timer was set)
        ahead = [t for t in (self._due, self._write_due) if t is not None]
        if ahead:
            self._schedule(min(ahead))

    def _unsent(self) -> bool:
        """Bytes wait that the client has not taken: writing paused, or a close waiting for them."""
        transport = self.transport
        return transport.get_write_buffer_size() > 0 and (self.flow.write_paused or transport.is_closing())

    def _write_wait(self) -> None:
        """The write deadline, unless it runs already."""
        if self._write_due is None:
            self._write_left = self.transport.get_write_buffer_size()
            self._write_due = due = self.loop.time() + self.write_timeout_s
            self._wake_by(due)

    def _close_waits(self) -> None:
        """After a close: bytes the client has not taken keep the connection (and its slot) until they
        drain. It gets the write deadline, and waits among those an eviction may take."""
        transport = self.transport
        if transport.is_closing() and transport.get_write_buffer_size() and self in self.connections:
            self._write_wait()
            self.waiting.setdefault(self, None)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_wait()

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self._unsent():
            self._write_due = None  # a timer set meanwhile finds nothing due when it fires

    def _headers_late(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if not self._closed:  # else counted once already: a head refused, still arriving
                metrics.connections_closed.labels("header-timeout").inc()
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._closed:  # no more requests taken; uvicorn may resume reading for an answer in flight
            return
        if self._simple and self._between and data.endswith(b"\r\n\r\n") and self._simple_hit(data):
            return
        # Bytes between requests that begin none (llhttp skips stray CRLFs) still stop uvicorn's
        # keep-alive timer: they must not hold the connection past the header deadline either.
        if self.cycle is None or self.cycle.response_complete:
            self._arm()  # unless the header deadline runs already
        if self._head_open:
            self._head_open = 2
        super().data_received(data)
        self._carried = None  # taken by the read's one request (it cannot outlive the read it was made for)
        if self._head_open == 2:  # a head begun before this read, unfinished: the read was all its own
            self._head_read += len(data)
            if self._head_read > MAX_HEAD_READ:
                self._refuse_head()

    def on_message_begin(self) -> None:
        self._between = False
        if self._closed:  # dropped unread: nothing kept, not timed (answers may still be going out)
            return
        super().on_message_begin()
        carried = self._carried
        if carried is not None:  # what the bot path put on the scope (its request shape, a reply) rides on
            self._carried = None
            self._wired = True
            scope: dict[str, Any] = self.scope  # type: ignore[assignment]  # uvicorn's TypedDict
            for name, value in carried.items():
                scope.setdefault(name, value)
        self._answered = False
        self._head_bytes = self._head_read = 0
        self._head_open = 1
        # a further request on a keep-alive connection: its headers are timed too (in place of the
        # idle deadline, which a memo hit answered earlier in this read may have set)
        self._arm()

    def on_url(self, url: bytes) -> None:
        # uvicorn's, counted first (the URL may come in pieces)
        if self._closed:
            return
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse_head()
            return
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's (0.55), counted first: a header past the bounds is never kept
        if self._closed:
            return
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES or len(self.headers) >= MAX_HEADERS:
            self._refuse_head()
            return
        name = name.lower()
        # llhttp keeps trailing OWS, which RFC 9110 5.5 excludes from the value
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _refuse_head(self) -> None:
        """431 and no more requests taken; behind answers still to go (it cannot be answered first),
        those are sent and the connection closes after them. The client may still be sending the
        head: with its answer sent, the connection half-closes and reads (and drops) the rest until
        the client closes or the header deadline (running since the head began) passes, so that a
        close with bytes unread does not reset the connection under the answer."""
        self.headers.clear()
        self.url = b""
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete):
            self._take_no_more("head-too-large")
            return
        metrics.connections_closed.labels("head-too-large").inc()
        self._closed = self._answered = True
        self._uncork()  # what was answered before goes first
        content = [STATUS_LINE[431]]
        for name, value in self.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        content.append(HEAD_TOO_LARGE)
        transport = self.transport
        transport.write(b"".join(content))
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()
            self._close_waits()

    def on_headers_complete(self) -> None:
        self._head_open = 0
        # read after an answer that closed, or dropped: uvicorn never serves it either (a refused
        # head's deadline still runs, and its connection still waits, see ``_refuse_head``)
        if self._closed:
            self._answered = True
            return
        self._disarm()
        self.waiting.pop(self, None)
        if len(self.pipeline) >= MAX_PIPELINE:
            self._take_no_more("pipeline-full")
            return
        wired, self._wired = self._wired, False
        if self._dated is not None and not wired and self._memo_hit():
            return
        self._uncork()  # uvicorn's path answers this one: what was answered before goes first
        super().on_headers_complete()

    def _take_no_more(self, reason: str) -> None:
        """Drop the request being read and every later one; the answer last taken (in flight or
        queued) closes the connection once it is sent."""
        metrics.connections_closed.labels(reason).inc()
        self._closed = self._answered = True
        self._disarm()  # the dropped head's deadline: it must not cut the answers still to go
        self.cycle.keep_alive = False
        self.flow.pause_reading()

    def on_body(self, body: bytes) -> None:
        if not self._answered:  # answered at its headers (or dropped): no cycle of its own
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._between = True
        if not self._answered:
            super().on_message_complete()

    # ------------------------------------------------------------------------------- memo hits

    def _memo_hit(self) -> bool:
        """Answer the request whose headers just completed from the hit memo, as the ASGI path would,
        byte for byte. False, nothing written or counted: uvicorn's path takes it."""
        parser = self.parser
        if not self._answerable() or self.expect_100_continue or parser.should_upgrade():
            return False
        method = parser.get_method()
        if method != b"GET" and method != b"HEAD":
            return False
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                return False  # a body follows
        # the scope as uvicorn's on_headers_complete completes it (the memo's key is read from it)
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]  # uvicorn's TypedDict
        version = parser.get_http_version()
        scope["method"] = method.decode("ascii")
        if version != "1.1":
            scope["http_version"] = version
        return self._wire(scope, version != "1.0" and parser.should_keep_alive())  # as uvicorn's cycle has it

    def _answerable(self) -> bool:
        """Nothing on the connection stands before an answer written here, and uvicorn would add
        nothing to it."""
        cycle = self.cycle
        return not (
            (cycle is not None and not cycle.response_complete)  # an answer in flight: theirs first
            or self.pipeline
            or self.flow.write_paused
            or self.transport.is_closing()
            or self.access_log  # what uvicorn adds per response: none of it here
            or self.limit_concurrency is not None
            or self.server_state.default_headers
        )

    def _simple_hit(self, data: bytes) -> bool:
        """A read that is one simple request, whole (``native/request_head.c``: a strict subset of
        what llhttp takes, tested against it), offered to the bot path as ``_memo_hit`` offers a
        request after llhttp's callbacks, without them: no callback per header. False: llhttp parses
        the read as it would have, with what the bot path put on this scope carried to its scope
        (``on_message_begin``) and the bot path not asked again."""
        assert _simple_head is not None
        if not self._answerable():
            return False
        parsed = _simple_head(data, MAX_HEADERS, MAX_HEAD_BYTES)
        if parsed is None:
            return False
        method, target, headers, keep_alive = parsed
        # what llhttp's callbacks would have made: uvicorn's on_message_begin (its scope), the URL and
        # headers kept (the scope's header list is ``self.headers``), on_headers_complete's method
        HttpToolsProtocol.on_message_begin(self)
        self.url = target
        self.headers += headers
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]  # uvicorn's TypedDict
        scope["method"] = method
        self._disarm()  # our header deadline ends, as at on_headers_complete
        self.waiting.pop(self, None)
        if self._wire(scope, keep_alive):
            return True
        self._carried = scope
        return False

    def _wire(self, scope: dict[str, Any], keep_alive: bool) -> bool:
        """The bot path's answer for ``scope`` (method and version set), written as uvicorn ends a
        response; False, nothing written: uvicorn's path takes the request."""
        dated = self._dated
        assert dated is not None and dated.bot is not None
        try:
            url = httptools.parse_url(self.url)
            path = url.path.decode("ascii")
            scope["path"] = self.root_path + (urllib.parse.unquote(path) if "%" in path else path)
            scope["raw_path"] = self.root_path.encode("ascii") + url.path
            scope["query_string"] = url.query or b""
            out = dated.bot.wire(scope, dated.dater, not keep_alive)
        except Exception as e:  # a fault of this path alone must not cost the request
            if not GuardedHttp._failed:
                GuardedHttp._failed = True
                log.exception("memo hit in the protocol failed; the app answers", error=repr(e))
            return False
        if out is None:
            return False
        self._answered = True
        self._send(out)
        if not keep_alive:
            self._uncork()
            self._closed = True
            self.transport.close()
        self.on_response_complete()  # the keep-alive timer (or nothing: closing), waiting again
        return True

    def _send(self, out: list[Any]) -> None:
        """Hold ``out`` to the end of this turn of the loop, with the other connections' answers."""
        cork = self._cork
        if cork is None:
            self._cork = cork = []
            self._cork_bytes = 0
            self.turn.hold(self, self.loop)
        cork += out
        for part in out:
            self._cork_bytes += len(part)  # bytes, or a memoryview of bytes
        if self._cork_bytes >= CORK_BYTES:
            self._uncork()
        elif time.perf_counter() - self.turn.since >= CORK_HOLD_S:  # a long turn: what it made so far
            self.turn.flush()

    def _uncork(self) -> None:
        """Write what this connection holds back, now."""
        cork = self._cork
        if cork is not None:
            self._cork = None
            if not self.transport.is_closing():
                self.transport.writelines(cork)

    def eof_received(self) -> None:
        self._uncork()  # the transport closes itself after this: what was answered goes first
        super().eof_received()
        if self.transport.get_write_buffer_size():
            self._write_wait()  # that close waits for them

    def send_400_response(self, msg: str) -> None:
        if self._closed:  # the error is in what is dropped unread; the last answer (a 431 too) is given
            return
        # uvicorn's warning for it is logged at most once a minute (prerender_ray.logs): counted here
        metrics.connections_closed.labels("bad-request").inc()
        self._uncork()
        super().send_400_response(msg)
        self._close_waits()

    def shutdown(self) -> None:
        self._uncork()
        super().shutdown()
        self._close_waits()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # uvicorn's (0.55), and when the task ends, the write deadline for what it left unsent: an app
        # that fails mid-answer has uvicorn close the connection with no further call here
        if self.config.reset_contextvars:
            task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
        else:
            task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(self._asgi_done)
        self.tasks.add(task)

    def _asgi_done(self, task: asyncio.Task[None]) -> None:
        self._close_waits()

    def on_response_complete(self) -> None:
        # uvicorn's (0.55), with the idle keep-alive deadline in place of a timer of its own
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            self._close_waits()
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._set_due(self.timeout_keep_alive, False)
        self._wait()  # idle between keep-alive requests

