"""The spread lane (issue 37): a plain local hit for a page the replica has not answered before,
answered from what the full serve of *another* page of the same class decided and counted, plus the
page's own bytes. A crawl asks for every page once, so neither the hit memo (whole answers by request)
nor the decoded-page cache helps it; the decision memo (``api/bot/decisions.py``) keeps who asks.

What ``serve`` decides for a plain local hit (``middleware.local_hit``, then ``_cacheable``) reads
the request's class, not its page: who asks (the decision memo's entry: name, verification, the
header list, the client), the URL's site for content signals, the ingress decision's route class,
route, device and method, and the replica's state. The page adds only its bytes (the stored frame,
the body), its times (``age``, whether it is a ``hit``, the page-age count) and its URL (the Markdown
``Link``). So an entry is made per class from the tape (``memo.Tape``) of one full serve that the
protocol answered, and answers the class's other pages while the state, the identity entry and the
content-signals table are the same objects, for at most ``LANE_TTL_MS``:

- the page: one index look-up and one checksummed ``pread`` (``PageLogReader.get``), its record's
  fixed head and its frame; a ``hit`` by the index entry's times, a 200 framed in a coding the
  client takes as stored, with ``last_cached`` as present as the entry's page had it; never for a
  conditional request (each page's validators choose between 200 and 304);
- the answer: the status line, our Date, the frame's header block as uvicorn writes it
  (``wire.frame_lines``), ``age``, the entry's header lines after it (the Vary, the ``Link`` made
  for this URL), the body: the bytes ``wire.wire_reply`` writes for the full path's ``Reply``.
  These two are ``page_answer``, done in one C call where the per-URL path is compiled
  (``native/lane_page.c``: a third of a spread hit's cost was Python objects made per step);
- the counts: the entry's steps done again, the page age at this hit's moment and ``last_cached``.

Anything else (no entry, a page that is not such a hit, an unreadable record) answers None with
nothing done or counted, and the full path takes the request. A class whose serve counted anything
that reads the URL (the unrouted tally) gets no entry. tests/api/bot/test_lane.py plays the same
requests through the lane and through the full path and compares every byte and every count.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from prerender_ray import native
from prerender_ray.api.bot.memo import Tape
from prerender_ray.api.bot.wire import HEAD_END, frame_lines, header_lines
from prerender_ray.serving.answer import Reply, asgi_headers
from prerender_ray.serving.classify import BotRequest
from prerender_ray.serving.dates import Dater
from prerender_ray.serving.framing import CODINGS, frame_block, taken_codings, wire_frame
from prerender_ray.serving.markdown import markdown_link
from prerender_ray.serving.responses import age_seconds
from prerender_ray.storage.pagelog import key_hash
from prerender_ray.storage.pagelog.reader import PageLogReader
from prerender_ray.storage.pagelog.records import CHECKSUM_HASH
from prerender_ray.storage.pages import PageDecodeError, decode_head
from prerender_ray.storage.replication import EnvelopeError, payload_view

LANE_TTL_MS = 1_000  # a class is served again through the full path at least this often
MAX_ENTRIES = 1_024
_LINK = object()  # in an entry's tail: the Markdown Link of the URL being answered

ClassKey = tuple[int, int, int, str, str, str, str]


class Entry:
    __slots__ = ("aged", "joined", "log", "route", "site", "sites", "state", "steps", "tail", "timed", "until",
                 "who")

    def __init__(self, state: Any, who: Any, site: Any, route: Any, sites: Any, log: Any, tape: Tape,
                 tail: list[Any], aged: bool, until: int):
        # what the key names by id(), held: compared by identity, never a reused id
        self.state, self.who, self.site, self.route, self.sites, self.log = state, who, site, route, sites, log
        self.steps, self.timed = tape.steps, tape.timed
        self.tail = tail  # the lines of the reply's headers after age, in order; _LINK for the URL's Link
        self.joined: bytes | None = None if any(line is _LINK for line in tail) else b"".join(tail)
        self.aged = aged  # the page it was made from had last_cached (so an age and a page-age count)
        self.until = until


class Lane:
    """Class entries, oldest first: at most ``max_entries``."""

    def __init__(self, max_entries: int = MAX_ENTRIES, ttl_ms: int = LANE_TTL_MS):
        self.max_entries = max_entries
        self.ttl_ms = ttl_ms
        self.hits = 0  # plain local hits answered here
        self.kept = 0  # entries made
        self._entries: OrderedDict[ClassKey, Entry] = OrderedDict()
        self._state: Any = None

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(who: Any, site: Any, req: BotRequest) -> ClassKey:
        return id(who), id(site), id(req.route), req.route_class, req.device, req.method, req.mode

    def find(self, key: ClassKey, state: Any, who: Any, site: Any, req: BotRequest, now: int) -> Entry | None:
        """The entry of ``key`` if it still holds (one that no longer does is let go)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        services = state.services
        if (entry.state is not state or entry.who is not who or entry.site is not site
                or entry.route is not req.route or now >= entry.until
                or entry.sites is not _sites(services)
                or entry.log is not services.pages.log):
            del self._entries[key]
            return None
        return entry

    # -------------------------------------------------------------------------------- the hit

    def wire(self, entry: Entry, state: Any, req: BotRequest, headers: dict[str, str], now: int, dater: Dater,
             close: bool) -> list[Any] | None:
        """``req``'s answer as the buffers the protocol writes, its serve's counts done; None (nothing
        done): the full path answers it."""
        services = state.services
        pages = services.pages
        hashed = key_hash(req.cache_key)
        if pages.log_entry(hashed) is None:  # as read_log: a write answered before this request is seen
            return None
        log = pages.log
        if log is not entry.log:
            return None
        tail = entry.joined
        if tail is None:  # the class's lines with this URL's Link
            link = link_line(req.url)
            if link is None:
                return None
            tail = b"".join([link if line is _LINK else line for line in entry.tail])
        second, date = dater.date()
        takes = taken_codings(headers.get("accept-encoding"))
        end = HEAD_END[close]
        got: Any = _answer(log, hashed, now, entry.aged, takes, second, date, tail, end)
        if type(got) is int:  # OTHER_FRAME: a frame of version 1, which the reference answers
            got = page_answer(log, hashed, now, entry.aged, takes, second, date, tail, end)
        if got is None:
            return None
        head_bytes, body, last_cached = got
        out = [head_bytes, body] if body.nbytes and req.method != "HEAD" else [head_bytes]
        for fn, args in entry.steps:
            fn(*args)
        for fn, args in entry.timed:  # the page age: at this hit's moment, of this page
            fn(services, now, last_cached, *args[1:])
        self.hits += 1
        return out

    # ------------------------------------------------------------------------------ the entry

    def learn(self, key: ClassKey, state: Any, who: Any, site: Any, req: BotRequest, headers: dict[str, str],
              tape: Tape, reply: Reply, page_age: Any) -> bool:
        """Keep the class of a plain local hit the full path just served and the protocol wrote
        (``tape`` its counts, ``reply`` its answer); whether it was kept. ``page_age``: the one
        function the tape may have timed (the page age, done again with each page's time)."""
        page = tape.plain_hit()
        if (page is None or reply.status != 200 or page.frame is None or reply.encoded is not page.frame.headers
                or page.stamp is None):
            return False
        if "if-none-match" in headers or "if-modified-since" in headers:
            return False  # each page's validators decide between a 200 and a 304
        if any(fn is not page_age or args[0] != page.last_cached for fn, args in tape.timed):
            return False  # something timed that reads the URL (the unrouted tally)
        sent = list(reply.headers.items())
        aged = page.last_cached is not None
        if aged != (bool(sent) and sent[0][0] == "age"):
            return False
        link = markdown_link(req.url)
        tail: list[Any] = []  # each header's line as the full path writes it, _LINK for the URL's Link
        for name, value in sent[1:] if aged else sent:
            if name in ("age", "date", "last-modified"):
                return False
            if name == "link" and value == link:
                tail.append(_LINK)
                continue
            if req.url in value:  # anything else of this URL's: not the class's
                return False
            line = header_lines(asgi_headers({name: value}))
            if line is None or line[1] is not None:
                return False
            tail.append(line[0])
        services = state.services
        entries = self._entries
        if state is not self._state:  # a new config: nothing kept under the old one answers again
            entries.clear()
            self._state = state
        entries.pop(key, None)
        while len(entries) >= self.max_entries:
            entries.popitem(last=False)
        entries[key] = Entry(state, who, site, req.route, _sites(services), services.pages.log, tape, tail, aged,
                             tape.now + self.ttl_ms)
        self.kept += 1
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._state = None


OTHER_FRAME = 2  # the native answer's word for a frame of version 1: the reference answers it


def page_answer(log: PageLogReader, key: bytes, now: int, aged: bool, takes: int, second: int, date: bytes,
                tail: bytes, end: bytes) -> tuple[bytes, memoryview, int | None] | None:
    """The page part of a lane hit: the head bytes (status line, ``date``, the stored frame's lines, age,
    ``tail``, ``end``), a view of the body and the page's ``last_cached``; None where the page is not
    such a hit (absent, unreadable: counted by the reader, expired, not ``aged`` as the class's page,
    not a 200 framed in a coding ``takes`` names: ``framing.taken_codings``). ``native/lane_page.c``
    does the same in one call where it is built (tests/native/test_lane_page.py holds them equal)."""
    hit = log.get(key)
    if hit is None or hit.expires_at is None or hit.expires_at <= now or (hit.last_cached is not None) != aged:
        return None
    try:
        payload = payload_view(hit.data)
        head = None if payload is None else decode_head(payload)
    except (EnvelopeError, PageDecodeError):
        return None
    if head is None or head.status_code != 200 or not head.frame:
        return None
    body = head.body
    wired = wire_frame(head.frame)  # written as lines when stored (framing: version 2)
    lines: bytes | memoryview | None
    if wired is not None:
        if not takes >> CODINGS.index(wired.coding) & 1:
            return None
        lines = wired.lines(second, date)
    else:
        frame = frame_block(head.frame)
        if frame is None or not takes >> CODINGS.index(frame[0]) & 1:
            return None
        lines = frame_lines(frame[1], date, second, body.nbytes)
        if lines is None:
            return None
    age = age_seconds(hit.last_cached, now)
    return b"".join((_STATUS_200, b"date: ", date, b"\r\n", lines, b"" if age is None else b"age: %d\r\n" % age,
                     tail, end)), body, hit.last_cached


def _native_answer() -> Any:
    """``native/lane_page.c``'s ``answer`` where the per-URL path runs compiled, else the reference."""
    module: Any = native.extension("lane_page")
    if module is None:
        return page_answer
    module.configure(CHECKSUM_HASH, _STATUS_200)
    return module.answer


_STATUS_200 = STATUS_LINE[200]
_answer = _native_answer()


def link_line(url: str) -> bytes | None:
    """The Markdown ``Link`` of ``url`` as ``header_lines(asgi_headers({"link": ...}))`` writes it; None
    where that refuses it. A canonical URL is printable ASCII, so the usual case is one encode."""
    value = markdown_link(url)
    if value.isascii() and value.isprintable():  # no control character
        return b"link: " + value.encode() + b"\r\n"
    line = header_lines(asgi_headers({"link": value}))  # dropped where not a valid value: b""
    return None if line is None else line[0]


def _sites(services: Any) -> Any:
    """The content-signals table the serve looked the site up in (None: signals off)."""
    return services.signals.sites if services.signals_on else None
