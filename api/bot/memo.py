"""The hit memo (issue 37): a plain cache hit's whole answer kept per request shape, so the same
request again is one look-up and one write instead of the bot decision.

The key is everything the bot path reads of a request: the method, the raw path and query, the header
list as received and the client address. Besides the request, a hit's answer depends on the
replica's state (a config change builds a new one), the page's version and times (its entry in the
page log's index), the moment (``age``, and whether the page is still a ``hit``), the content-signals
table the site was looked up in and the bot's verification answer. An entry answers only while each
of those is what it was when the entry was made, and for at most ``MEMO_TTL_MS``; only over the page
log (the secondary has no entry to compare) and only for the plain case: a local ``hit`` answered as
HTML, 200 or 304, without debug headers, a signature, Markdown asked for, or a body made afresh.
An entry is made from a second sight of a shape soon after its first (``HOT_MS``): making one costs
more than the hit it saves (the serve's calls written down, the entry kept, an older one let go), so
a crawl that never asks for the same thing twice pays a hash and a dict look-up only, and one that
asks again now and then is answered as it was the first time.

What the serve that made the entry did to the counters, the class stats and the unrouted tally is
written down as it is done (``Tape``, which ``serve`` uses in their place) and done again on each memo
hit; the page age is taken at the hit's own moment, as is the ``age`` header.

``wire`` is ``answer`` for the HTTP protocol itself (``api.connections.GuardedHttp``): the response
bytes uvicorn would write for what ``Dated`` and ``answer`` send, so a memo hit costs no ASGI task.
An entry's bytes but ``age`` are framed once per second (its Date; a Last-Modified held to it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from prerender_ray.api.bot.hit import Outcome
from prerender_ray.api.bot.wire import HEAD_END, framed, header_lines
from prerender_ray.serving.answer import Reply
from prerender_ray.serving.dates import Dater
from prerender_ray.serving.responses import age_seconds

MEMO_TTL_MS = 1_000  # an entry is made again at least this often (its counts replayed meanwhile)
MAX_ENTRIES = 4_096
# Bytes of bodies the memo keeps alive, each record counted once however many entries share it: they
# are views of pages ``DecodedPages`` holds, except for pages it has evicted meanwhile.
MAX_BYTES = 64 * 1024 * 1024
MAX_SEEN = 16_384  # shapes remembered (by hash) with their last first sight; forgotten all at once when full
# A shape seen again this soon after its first sight is kept whole (and from then on answered here):
# asked again within 20 ms, it is asked tens of times within an entry's life, which pays for making
# it. A crawl that happens to ask a page again later is answered as its first sight was (the spread
# lane, api/bot/lane.py), not by a full serve that keeps an entry no one asks for: spread at random
# over 100,000 pages at 20,000 hits/s, keeping on any second sight made a tenth of the hits full
# serves (a seventh of the throughput), on one within 100 ms still a fiftieth (a tenth of it).
HOT_MS = 20
# A request whose path, query and headers are longer is never kept: a key is held in full (to tell a
# hash collision apart), and the protocol lets a head of up to 64 KiB through (``api.connections``), so
# 4,096 hostile keys could otherwise hold 256 MB. Crawlers' heads are well under 1 KB.
MAX_KEY_BYTES = 8 * 1024
_UNSET: Any = object()
Step = tuple[Callable[..., Any], tuple]


class Tape:
    """The counters and class stats for one serve (``serve`` takes it in their place): each call is
    made and written down. ``at`` is for what depends on the moment: done again with the hit's own."""

    __slots__ = ("checked", "now", "out", "plain", "services", "sites", "steps", "timed")

    def __init__(self, services: Any) -> None:
        self.services = services
        self.steps: list[Step] = []
        self.timed: list[Step] = []
        self.now = 0
        self.out: Outcome | None = None  # set by serve once it answered
        self.plain = False  # no debug headers, no signature
        self.sites: Any = _UNSET  # the content-signals table the site was looked up in
        # the verifier's (name, client, state, why)
        self.checked: tuple[str, str | None, str, str] | None = None

    def count(self, metric: Any, *labels: str) -> None:
        count = self.services.counters.count
        count(metric, *labels)
        self.steps.append((count, (metric, *labels)))

    def observe(self, metric: Any, value: float, *labels: str) -> None:
        observe = self.services.counters.observe
        observe(metric, value, *labels)
        self.steps.append((observe, (metric, value, *labels)))

    def served(self, *args: Any) -> None:
        served = self.services.class_stats.served
        served(*args)
        self.steps.append((served, args))

    def verified(self, *args: Any) -> None:
        verified = self.services.class_stats.verified
        verified(*args)
        self.steps.append((verified, args))

    def at(self, fn: Callable[..., Any], now: int, *args: Any) -> None:
        """``fn(services, now, *args)``, done again as ``fn(services, hit's now, *args)``."""
        fn(self.services, now, *args)
        self.timed.append((fn, args))

    def plain_hit(self) -> Any:
        """The page the serve answered, if it was a plain hit of a stored 200 (from the cache, no
        debug headers or signature, no Markdown, no render-now): what the memos may keep; else None."""
        out = self.out
        page = out.page if out is not None else None
        if (page is None or out is None or not self.plain or out.source != "cache" or out.cache_status != "hit"
                or out.markdown or out.render_now or page.status_code != 200):
            return None
        return page


class Entry:
    __slots__ = (
        "body",
        "cache_key",
        "checked",
        "created",
        "hashed",
        "head",
        "key",
        "last_cached",
        "log",
        "sites",
        "stamp",
        "state",
        "status",
        "steps",
        "tail",
        "timed",
        "until",
        "wired",
    )

    def __init__(
        self,
        key: tuple,
        state: Any,
        tape: Tape,
        page: Any,
        log: Any,
        status: int,
        headers: list[tuple[bytes, bytes]],
        age_at: int,
        body: Any,
        until: int,
    ):
        self.key, self.state = key, state
        self.created, self.until = tape.now, until
        self.log, self.hashed, self.stamp = log, page.log_key, page.stamp
        self.cache_key, self.last_cached = page.cache_key, page.last_cached
        self.status, self.body = status, body
        # the header list around ``age`` (tail None: there is none)
        self.head = tuple(headers if age_at < 0 else headers[:age_at])
        self.tail = None if age_at < 0 else tuple(headers[age_at + 1 :])
        self.steps, self.timed = tape.steps, tape.timed
        self.sites, self.checked = tape.sites, tape.checked
        # (second, bytes before age, bytes after it) as ``wire`` writes them; False: not on the wire
        self.wired: tuple[int, bytes, bytes] | Literal[False] | None = None


Shape = tuple[int, tuple]  # the key and its hash (computed once a request)


def request_shape(scope: dict) -> Shape | None:
    """The request's key and its hash, or None when the server's header list does not hash (ASGI
    allows lists) or the key is longer than ``MAX_KEY_BYTES``."""
    client = scope.get("client")
    path, query, headers = scope.get("raw_path") or scope["path"], scope.get("query_string", b""), scope["headers"]
    if len(path) + len(query) + header_bytes(headers) > MAX_KEY_BYTES:
        return None
    key = (scope["method"], path, query, tuple(headers), client[0] if client else None)
    try:
        return hash(key), key
    except TypeError:
        return None


def header_bytes(headers: Any) -> int:
    """The length of a header list's names and values."""
    return sum([len(name) + len(value) for name, value in headers])


def _framed(entry: Entry, dater: Dater, second: int) -> tuple[int, bytes, bytes] | Literal[False]:
    """The entry's status line and headers as uvicorn's ``RequestResponseCycle.send`` writes them
    (default headers none: ``server_config``), dated as ``Dated`` dates them in ``second``, split
    where ``age`` goes. False where uvicorn would do more than write them (a header it refuses, a
    ``connection`` or ``transfer-encoding`` of the app's, a body its Content-Length does not
    frame): the ASGI path answers those."""
    head = header_lines(dater.headers(entry.head, second))  # our Date first
    tail = header_lines(() if entry.tail is None else dater.headers(entry.tail, second)[1:])  # per header
    if head is None or tail is None:
        return False
    length = head[1] if head[1] is not None else tail[1]
    if not framed(entry.key[0], entry.status, len(entry.body), length):
        return False
    return second, STATUS_LINE[entry.status] + head[0], tail[0]


def _held_object(body: Any) -> Any:
    """What a body keeps alive: the record a view is of, or the bytes themselves."""
    return body.obj if isinstance(body, memoryview) else body


def _size(obj: Any) -> int:
    return obj.nbytes if isinstance(obj, memoryview) else len(obj)


class HitMemo:
    """Entries by request shape, oldest first: at most ``max_entries``, and ``max_bytes`` of bodies."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES, ttl_ms: int = MEMO_TTL_MS):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_ms = ttl_ms
        self.bytes = 0
        self.hits = 0  # requests answered from the memo
        self.wired = 0  # of those, by the HTTP protocol itself (``wire``)
        self.kept = 0  # entries made
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # by the key's hash (the key is checked)
        self._held: dict[int, list] = {}  # id(object) -> [object, entries holding it]
        self._seen: dict[int, int] = {}  # a shape's hash -> its first sight (epoch ms)
        self._state: Any = None

    def __len__(self) -> int:
        return len(self._entries)

    # -------------------------------------------------------------------------------- the hit

    async def answer(self, shape: Shape, state: Any, now: int, send: Any) -> bool:
        """Send the answer kept for ``shape`` and do what its serve did, if the entry still holds;
        False (nothing done) sends the request down the full path."""
        entry = self._live(shape, state, now)
        if entry is None:
            return False
        self._replay(entry, state, now)
        tail = entry.tail
        headers = (
            list(entry.head)
            if tail is None
            else [*entry.head, (b"age", str(age_seconds(entry.last_cached, now)).encode()), *tail]
        )
        await send({"type": "http.response.start", "status": entry.status, "headers": headers})
        await send({"type": "http.response.body", "body": entry.body})
        return True

    def wire(self, shape: Shape, state: Any, now: int, dater: Dater, close: bool) -> list[Any] | None:
        """``answer`` as the buffers to write on the connection (status line, our Date, the headers
        with ``age`` at ``now``, ``connection: close`` when ``close``, the body unless HEAD), its
        serve's counts done again; None (nothing done): the ASGI path answers."""
        entry = self._live(shape, state, now)
        if entry is None:
            return None
        second = dater.date()[0]
        wired = entry.wired
        if wired is None or (wired is not False and wired[0] != second):
            wired = entry.wired = _framed(entry, dater, second)
        if wired is False:
            return None
        _, before, after = wired
        age = (
            b""
            if entry.tail is None
            else b"age: " + str(age_seconds(entry.last_cached, now)).encode() + b"\r\n"
        )
        head = b"".join((before, age, after, HEAD_END[close]))
        body = entry.body
        out = [head, body] if len(body) and entry.key[0] != "HEAD" else [head]
        self._replay(entry, state, now)
        self.wired += 1
        return out

    def _live(self, shape: Shape, state: Any, now: int) -> Entry | None:
        """The entry kept for ``shape`` if it still holds (one that no longer does is let go)."""
        h, key = shape
        entry = self._entries.get(h)
        if entry is None or entry.key != key:
            return None
        if not self._holds(entry, state, now):
            self._drop(h)
            return None
        return entry

    def _replay(self, entry: Entry, state: Any, now: int) -> None:
        """What the entry's serve did to the counts and stats, done again at ``now``."""
        services = state.services
        decoded = services.pages.decoded
        if decoded.peek(entry.cache_key) is not None:  # the page stays as recently used as a read makes it
            decoded.used(entry.cache_key)
        for fn, args in entry.steps:
            fn(*args)
        for fn, args in entry.timed:
            fn(services, now, *args)
        self.hits += 1

    def _holds(self, entry: Entry, state: Any, now: int) -> bool:
        if entry.state is not state or now >= entry.until:
            return False
        services = state.services
        pages = services.pages
        # as ``PageReader.read``: a write answered before this request is seen (the entry then differs)
        if pages.log is not entry.log or pages.log_entry(entry.hashed) != entry.stamp:
            return False
        if entry.sites is not _UNSET and services.signals.sites is not entry.sites:
            return False
        checked = entry.checked
        if checked is not None:
            name, client, verification, why = checked
            verifier = services.verifier
            if verifier is None or verifier.known(name, client) != (verification, why):
                return False
        return True

    # ------------------------------------------------------------------------------ the entry

    def seen(self, shape: Shape, now: int) -> bool:
        """Whether ``shape`` was first seen within ``HOT_MS`` before ``now`` (``admits`` without
        remembering it)."""
        first = self._seen.get(shape[0])
        return first is not None and now - first < HOT_MS

    def admits(self, shape: Shape, now: int) -> bool:
        """Whether a full serve of ``shape`` at ``now`` may make an entry (``seen``); a sight that is
        not is remembered as the first."""
        seen = self._seen
        h = shape[0]
        first = seen.get(h)
        if first is not None and now - first < HOT_MS:
            return True
        if first is None and len(seen) >= MAX_SEEN:
            seen.clear()
        seen[h] = now
        return False

    def keep(
        self, shape: Shape, state: Any, tape: Tape, reply: Reply, headers: list[tuple[bytes, bytes]]
    ) -> bool:
        """Keep ``reply`` (sent with ``headers``) for ``shape`` if its serve was a plain hit (see the
        module); whether it was kept."""
        page = tape.plain_hit()
        if page is None or reply.status not in (200, 304):
            return False
        log = state.services.pages.log
        expires = page.expires_at
        if (
            log is None
            or page.stamp is None
            or page.log_key is None
            or expires is None
            or expires <= tape.now
        ):
            return False
        body = reply.body
        if len(body) and body is not page.body and not any(v.body is body for v in page.variants.values()):
            return False  # made for this request alone: not kept
        at = next((i for i in range(len(reply.encoded), len(headers)) if headers[i][0] == b"age"), -1)
        age = age_seconds(page.last_cached, tape.now)
        if (at < 0) != (age is None) or (at >= 0 and headers[at][1] != str(age).encode()):
            return False  # not the answer this memo knows how to date
        held = _held_object(body) if len(body) else None
        size = _size(held) if held is not None else 0
        if size > self.max_bytes:
            return False
        if state is not self._state:  # a new config: nothing kept under the old one answers again
            self._forget()
            self._state = state
        h, key = shape
        self._drop(h)
        self._make_room(held, size, tape.now)
        self._entries[h] = Entry(
            key, state, tape, page, log, reply.status, headers, at, body, min(tape.now + self.ttl_ms, expires)
        )
        if held is not None:
            found = self._held.get(id(held))
            if found is None:
                self._held[id(held)] = [held, 1]
                self.bytes += size
            else:
                found[1] += 1
        self.kept += 1
        return True

    def _make_room(self, held: Any, size: int, now: int) -> None:
        """Drop the oldest entries while full, past their TTL, or while ``held`` (``size`` bytes, unless
        an entry holds it already) would take the bodies over the budget."""
        entries = self._entries
        while entries:
            h, oldest = next(iter(entries.items()))
            extra = 0 if held is None or id(held) in self._held else size
            if (
                len(entries) < self.max_entries
                and self.bytes + extra <= self.max_bytes
                and oldest.created + self.ttl_ms > now
            ):
                return
            self._drop(h)

    def _drop(self, h: int) -> None:
        entry = self._entries.pop(h, None)
        if entry is None or not len(entry.body):
            return
        held = _held_object(entry.body)
        found = self._held.get(id(held))
        if found is not None:
            found[1] -= 1
            if found[1] == 0:
                del self._held[id(held)]
                self.bytes -= _size(held)

    def clear(self) -> None:
        self._forget()
        self._seen.clear()

    def _forget(self) -> None:
        self._entries.clear()
        self._held.clear()
        self.bytes = 0
