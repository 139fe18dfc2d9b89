"""The decision memo (issue 37): who is asking, kept per request shape *without its path*, so a crawl
that asks for a new page on every request still skips telling the bot apart on each.

A crawler sends the same header list from the same address for every page of a crawl, and what
``serve`` decides of a request before its URL matters (``middleware.identify``: the bot's name in the
registry, its verification and the method, and the counts and class stats that took) reads only those
headers and that address. So it is kept by the method, the header list as received and the client
address; everything that reads the URL (the ingress decision, the site's content signals, the policy,
the page) is done again for each request. An entry answers only under the replica state it was made
in (a config change builds a new one), while the verifier still answers the same for its client
without waiting (``verification.known``), and for at most ``DECISION_TTL_MS``; a request with
signature headers is never kept (its signature covers the URL).

With an entry, a plain local hit (``middleware.local_hit``) is answered by the HTTP protocol itself
(``BotMiddleware.wire``, ``api.connections.GuardedHttp``): no ASGI task, one page-log read, the
page's stored frame, one write (docs/serving.md#serving-bots).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from prerender_ray.api.bot.memo import MAX_KEY_BYTES, header_bytes

DECISION_TTL_MS = 1_000  # who asks is decided again at least this often
MAX_ENTRIES = 4_096
Step = tuple[Any, tuple]


class Identity:
    """Who asks (``middleware.identify``), and the counts and stats its deciding made, done again for
    each request that takes it from the memo (``steps``, as ``memo.Tape`` writes them down)."""

    __slots__ = ("checked", "method", "name", "signed", "steps", "verification")

    def __init__(self, name: str, verification: str, method: str, signed: Any,
                 checked: tuple[str, str | None, str, str] | None, steps: list[Step]):
        self.name, self.verification, self.method, self.signed = name, verification, method, signed
        self.checked = checked  # the verifier's (name, client, state, why), when it was asked
        self.steps = steps


Key = tuple[int, tuple]  # the key and its hash


def identity_key(scope: dict, headers: tuple | None = None) -> Key | None:
    """The request's method, header list and client address, and their hash; None when the header
    list does not hash (ASGI allows lists) or is longer than ``memo.MAX_KEY_BYTES`` (never kept, as
    the hit memo's keys). ``headers``: the list as a tuple, if made already (and measured)."""
    client = scope.get("client")
    if headers is None:
        if header_bytes(scope["headers"]) > MAX_KEY_BYTES:
            return None
        headers = tuple(scope["headers"])
    key = (scope["method"], headers, client[0] if client else None)
    try:
        return hash(key), key
    except TypeError:
        return None


class Entry:
    __slots__ = ("key", "state", "until", "who")

    def __init__(self, key: tuple, state: Any, who: Identity, until: int):
        self.key, self.state, self.who, self.until = key, state, who, until


class DecisionMemo:
    """Identities by request shape without the path, oldest first: at most ``max_entries``."""

    def __init__(self, max_entries: int = MAX_ENTRIES, ttl_ms: int = DECISION_TTL_MS):
        self.max_entries = max_entries
        self.ttl_ms = ttl_ms
        self.used = 0  # requests that took their identity from the memo
        self.wired = 0  # of those, plain local hits the HTTP protocol answered itself
        self.kept = 0  # entries made
        self._entries: OrderedDict[int, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key, state: Any, now: int) -> Identity | None:
        """The identity kept for ``key`` if it still holds (one that no longer does is let go)."""
        h, k = key
        entry = self._entries.get(h)
        if entry is None or entry.key != k:
            return None
        if entry.state is not state or now >= entry.until or not _unchanged(entry.who, state):
            del self._entries[h]
            return None
        self.used += 1
        return entry.who

    def keep(self, key: Key, state: Any, who: Identity, now: int) -> bool:
        """Keep ``who`` for ``key`` unless a signature was checked (it covers the URL)."""
        if who.signed is not None:
            return False
        entries = self._entries
        h, k = key
        entries.pop(h, None)
        while entries:
            first = next(iter(entries.values()))
            if len(entries) < self.max_entries and first.until > now and first.state is state:
                break
            entries.popitem(last=False)
        entries[h] = Entry(k, state, who, now + self.ttl_ms)
        self.kept += 1
        return True

    def clear(self) -> None:
        self._entries.clear()


def _unchanged(who: Identity, state: Any) -> bool:
    """Whether the verifier would still not be asked, or would answer the kept check the same now
    without waiting."""
    verifier = state.services.verifier
    checked = who.checked
    if checked is None:
        return verifier is None or verifier.method(who.name) is None
    name, client, verification, why = checked
    return verifier is not None and verifier.known(name, client) == (verification, why)
