"""Records of the registry store (replicated tier): targets, queue control and status, sitemaps and
sitemap runs. Each kind lives under its own key prefix; values are compact JSON in the replication
envelope. Targets are keyed by URL, never by device."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

import orjson

from prerender_ray.storage.keys import (
    ROBOTS,
    SITEMAP,
    SITEMAP_ENTRIES,
    SITEMAP_RUN,
    TARGET,
    TARGET_BY_SITEMAP,
)
from prerender_ray.timeutil import finite

SUPPRESSED = "suppressed"


def target_key(url: str) -> bytes:
    return TARGET + url.encode()


def by_sitemap_prefix(sitemap_url: str) -> bytes:
    """Every by-sitemap key of ``sitemap_url`` starts so (the NUL ends the sitemap URL)."""
    return TARGET_BY_SITEMAP + sitemap_url.encode() + b"\x00"


def by_sitemap_key(sitemap_url: str, url: str) -> bytes:
    return by_sitemap_prefix(sitemap_url) + url.encode()


class RecordError(ValueError):
    """A stored record that does not decode."""


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # built once: json.dumps(separators=) builds one per call
_SITEMAP_HEAD = b'{"sitemap_url":"'


def sitemap_of_record(data: bytes | None) -> str | None:
    """A stored target's sitemap URL, read without decoding the whole record: every target write pays
    this to keep the by-sitemap index. ``Target.encode`` writes ``sitemap_url`` first (ASCII, escapes
    as ``\\``) and leaves it out when absent; anything else takes the full decode."""
    if not data:
        return None
    if data.startswith(_SITEMAP_HEAD):
        end = data.find(b'"', len(_SITEMAP_HEAD))
        raw = data[len(_SITEMAP_HEAD):end] if end > 0 else b"\\"
        if b"\\" not in raw and raw.isascii():
            return raw.decode() or None
    elif b'"sitemap_url"' not in data:
        return None
    try:
        found = json.loads(data).get("sitemap_url")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) and found else None


class SitemapReader:
    """``sitemap_of_record`` with the sitemap's by-sitemap prefix, remembering the last record head it
    read: a walk writes thousands of targets of one sitemap, and a head match is one comparison."""

    __slots__ = ("_head", "_last")

    def __init__(self) -> None:
        self._head = b""  # the record head of _last's sitemap; empty when it has escapes
        self._last: tuple[str | None, bytes | None] = (None, None)

    def __call__(self, data: bytes | None) -> tuple[str | None, bytes | None]:
        """(sitemap URL, its by-sitemap prefix) of a target record, or (None, None)."""
        if not data:
            return None, None
        if self._head and data.startswith(self._head):
            return self._last
        sitemap = sitemap_of_record(data)
        if sitemap is None:
            return None, None
        head = _SITEMAP_HEAD + sitemap.encode() + b'"'
        # a head with a backslash could open an escape in another record: never matched on
        self._head = head if b"\\" not in head and data.startswith(head) else b""
        self._last = (sitemap, by_sitemap_prefix(sitemap))
        return self._last


def _dumps(d: dict) -> bytes:
    return _COMPACT.encode({k: v for k, v in d.items() if v is not None}).encode()


def _loads(data: bytes, what: str, shape: type = dict) -> Any:
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise RecordError(f"{what}: not JSON") from e
    if not isinstance(d, shape):
        raise RecordError(f"{what}: not {'an object' if shape is dict else 'a list'}")
    return d


@dataclass(frozen=True)
class Target:
    """One URL in rotation (or suppressed). ``render_interval`` is the stored cadence (a sitemap's
    changefreq or an explicit API value); None means resolve route > default at schedule time."""

    url: str
    sitemap_url: str | None = None
    scheduler_node: str | None = None
    render_interval: int | None = None
    state: str | None = None
    suppressed_reason: str | None = None
    suppressed_at: int | None = None
    strikes: int = 0
    struck_at: int | None = None  # when the last strike was taken: one strike per render cycle
    refused: dict | None = None  # the last render refused over the stored page (queue/guard.py)
    # made by a bot's miss and not confirmed since (a sitemap's attribution, an operator's put clears
    # it): anyone may send misses, so such a target is not listed in llms.txt nor sent to IndexNow
    discovered: bool = False

    @property
    def suppressed(self) -> bool:
        return self.state == SUPPRESSED

    def encode(self) -> bytes:
        """Compact JSON, absent fields left out, ``sitemap_url`` first (``sitemap_of_record`` reads it
        there), ``discovered`` (as 1) last. Built by hand: a sitemap ingest encodes a target per URL,
        and this is 3x ``json``'s dict path, byte for byte the same output."""
        fields = (("sitemap_url", self.sitemap_url), ("scheduler_node", self.scheduler_node),
                  ("render_interval", self.render_interval), ("state", self.state),
                  ("suppressed_reason", self.suppressed_reason), ("suppressed_at", self.suppressed_at),
                  ("strikes", self.strikes or None), ("struck_at", self.struck_at), ("refused", self.refused),
                  ("discovered", 1 if self.discovered else None))
        parts = []
        for name, value in fields:
            if value is None:
                continue
            if type(value) is str:
                parts.append(f'"{name}":{_json_str(value)}')
            elif type(value) is int:
                parts.append(f'"{name}":{value}')
            else:  # anything else (floats, bools from a hand-built Target) the slow, exact way
                return _dumps(dict(fields))
        return ("{" + ",".join(parts) + "}").encode()

    @classmethod
    def decode(cls, url: str, data: bytes) -> Target:
        d = _loads(data, f"target {url}")
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in _TARGET_FIELDS}
        ri = finite(kw.get("render_interval"))
        kw["render_interval"] = int(ri) if ri is not None and ri > 0 else None
        st = finite(kw.get("strikes"))
        kw["strikes"] = int(st) if st is not None and st > 0 else 0
        at = finite(kw.get("struck_at"))
        kw["struck_at"] = int(at) if at is not None and at > 0 else None
        if not isinstance(kw.get("refused"), dict):
            kw.pop("refused", None)
        kw["discovered"] = kw.get("discovered") == 1 and type(kw.get("discovered")) in (int, bool)
        return cls(url=url, **kw)

    def patched(self, **changes: Any) -> Target:
        return replace(self, **changes)

    def as_json(self) -> dict:
        return {"url": self.url, "sitemapUrl": self.sitemap_url, "schedulerNode": self.scheduler_node,
                "renderInterval": self.render_interval, "state": self.state,
                "suppressedReason": self.suppressed_reason, "suppressedAt": self.suppressed_at,
                "strikes": self.strikes, **({"discovered": True} if self.discovered else {})}


_TARGET_FIELDS = frozenset(f.name for f in fields(Target)) - {"url"}  # once: fields() is slow per decode


def encode_json(d: dict) -> bytes:
    return _dumps(d)


def decode_json(data: bytes, what: str = "record") -> dict:
    return _loads(data, what)


# ------------------------------------------------------------------------------------- sitemaps
# A sitemap is one metadata row ``s:<url>`` (what lists and the walk need) plus its parsed entries in
# chunk rows ``e:<url>\x00<n>`` of ENTRY_CHUNK entries each: a 50,000-entry document is not one 10 MB
# value, a page of entries costs one or two reads, and listing sitemaps never touches the entries.

ENTRY_CHUNK = 1000


def sitemap_key(url: str) -> bytes:
    return SITEMAP + url.encode()


def sitemap_run_key(root: str) -> bytes:
    return SITEMAP_RUN + root.encode()


def robots_key(origin: str) -> bytes:
    return ROBOTS + origin.encode()


def entries_key(url: str, chunk: int) -> bytes:
    return SITEMAP_ENTRIES + url.encode() + b"\x00" + b"%06d" % chunk


def encode_entries(entries: list) -> bytes:
    """A chunk of entries as compact JSON rows ``[loc, lastmod, changefreq, priority]``; an index's
    rows are ``[loc, lastmod]`` (its other fields are never read). orjson: a million-URL walk stores
    every entry, and it is six times ``json`` here (orjson takes no NamedTuple, hence ``tuple``)."""
    return orjson.dumps([tuple(e) for e in entries])


def decode_entries(data: bytes, what: str = "sitemap entries") -> list[dict]:
    rows = _loads(data, what, list)
    names = ("loc", "lastmod", "changefreq", "priority")
    return [dict(zip(names, row)) for row in rows if isinstance(row, list)]
