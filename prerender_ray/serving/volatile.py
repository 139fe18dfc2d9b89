"""The content hash behind a rendered page's ETag, blind to per-response noise it can identify.

Two renders of an unchanged page can differ in values a server makes up for every response: a CSP
nonce (``nonce="..."`` on a script, style or link; ``'nonce-...'`` in a CSP meta) and the token of a
CSRF or CSP-nonce meta (``<meta name="csrf-token" content="...">``). The hash is taken over the
decoded bytes with those values blanked, so such a render counts as unchanged and the stored page
(whose old nonce is as self-consistent as the new one) stays served. Conservative on purpose: only
those values, only inside those tags; any other byte that differs changes the hash. A page holding
none of them hashes exactly as its raw bytes do.

Cheap: a page without any of them costs two substring checks; one with them a literal-first regex
pass each. Streamed with the decoder, a piece at a time.

Bounded: each candidate (a ``nonce=``, a meta naming a nonce or a token) costs a Python call, so a
hostile page of millions of them held a keeper's loop for seconds (0.3 s per 2 MB of ``nonce=a``, 3 s
at the 20 MB cap). A page's first ``MAX_CANDIDATES`` of each kind are looked at, the rest hashed as
they are: in document order, so a stream cut anywhere still hashes as the whole page does.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import xxhash

from prerender_ray.decoding import MAX_HTML_BYTES, Decoder, TooLarge

MAX_TAG = 4096  # bytes of one tag looked into; a longer tag is hashed as it is
MAX_VALUE = 512  # a longer value is not a nonce or a token: hashed as it is
MAX_SEGMENT = 1024 * 1024  # a stream is normalized in runs ending at a ">"; a longer run goes as it is
MAX_CANDIDATES = 4096  # of each kind a page; a real page holds a few dozen scripts and metas
_VALUE = rb"""(?:"[^"<>]{0,%d}"|'[^'<>]{0,%d}'|[^\s"'<>=`]{1,%d})""" % (MAX_VALUE, MAX_VALUE, MAX_VALUE)
# Literal-first patterns (the scan between candidates runs in C), with names as the browser
# serializes them (lowercase): the fleet posts Chromium's serialization. No match holds a ">" but
# as its last byte, so a document cut after any ">" normalizes piece by piece as it does whole.
_NONCE = re.compile(rb"nonce\s{0,16}=\s{0,16}" + _VALUE)
# only a meta that names a nonce or a token is a candidate (whatever else the piece holds)
_META = re.compile(rb"<meta\b(?=[^<>]{0,%d}?(?:nonce|csrf-token))[^<>]{0,%d}>" % (MAX_TAG, MAX_TAG))
_NONCE_TAGS = re.compile(rb"<(?:script|style|link)[\s/]")
_ATTR_START = frozenset(b' \t\n\r\f"\'/')
_CSP_NONCE = re.compile(rb"'nonce-[^'\s<>]{0,%d}'" % MAX_VALUE)
_TOKEN_META = re.compile(rb"""[\s"'/]name\s*=\s*["']?(?:csrf-token|csp-nonce)["'\s/>]""")
_CONTENT = re.compile(rb"""([\s"'/]content\s*=\s*)""" + _VALUE)


def _nonce(m: re.Match[bytes]) -> bytes:
    """A nonce attribute of a script, style or link tag, its value blanked; anything else as it is."""
    buf, at = m.string, m.start()
    if at == 0 or buf[at - 1] not in _ATTR_START:
        return m.group(0)
    lt = buf.rfind(b"<", max(0, at - MAX_TAG), at)
    if lt < 0 or buf.find(b">", lt, at) >= 0 or _NONCE_TAGS.match(buf, lt) is None:
        return m.group(0)
    return buf[at:at + 5] + b'=""'


def _meta(m: re.Match[bytes]) -> bytes:
    """A CSP meta's nonce sources and a CSRF or CSP-nonce meta's token, blanked."""
    tag = _CSP_NONCE.sub(b"'nonce-'", m.group(0))
    return _CONTENT.sub(rb'\1""', tag) if _TOKEN_META.search(tag) else tag


class Budget:
    """What is left of a page's candidates of each kind."""

    __slots__ = ("metas", "nonces")

    def __init__(self, limit: int = MAX_CANDIDATES) -> None:
        self.nonces = self.metas = limit


def normalized(data: bytes, budget: Budget | None = None) -> bytes:
    """``data`` with the volatile values blanked, within ``budget`` (a whole page's when None). Most
    pages hold none: two substring checks."""
    if budget is None:
        budget = Budget()
    nonce = b"nonce" in data
    if nonce and budget.nonces:
        data, n = _NONCE.subn(_nonce, data, count=budget.nonces)
        budget.nonces -= n
    if (nonce or b"csrf-token" in data) and budget.metas:
        data, n = _META.subn(_meta, data, count=budget.metas)
        budget.metas -= n
    return data


class Normalizer:
    """``normalized`` over a stream: ``feed`` pieces, then ``finish``; ``sink`` receives the output,
    whose concatenation is ``normalized`` of the whole input (cut after the last ">" of each piece,
    the rest carried; a run of ``MAX_SEGMENT`` bytes without one is passed on as it comes), within
    ``limit`` candidates of each kind for the whole stream."""

    def __init__(self, sink: Callable[[bytes], object], limit: int = MAX_CANDIDATES):
        self.sink = sink
        self._carry = b""
        self._budget = Budget(limit)  # the page's, across its pieces

    def feed(self, piece: bytes) -> None:
        buf = self._carry + piece if self._carry else piece
        cut = buf.rfind(b">") + 1
        if cut == 0 and len(buf) > MAX_SEGMENT:
            cut = len(buf)
        if cut:
            self.sink(normalized(buf[:cut] if cut < len(buf) else buf, self._budget))
        self._carry = buf[cut:]

    def finish(self) -> None:
        if self._carry:
            self.sink(normalized(self._carry, self._budget))
            self._carry = b""


def content_digest(data: bytes | memoryview, coding: str, limit: int | None = MAX_HTML_BYTES) -> str:
    """xxh3-128 (hex) of the decoded bytes, normalized: the same for the same page whatever its coding
    and on every node. Raises as ``decoding.decode`` (TooLarge past ``limit``, DecodeError)."""
    h = xxhash.xxh3_128()
    n = Normalizer(h.update)
    if coding == "identity":
        if limit is not None and len(data) > limit:
            raise TooLarge(limit)
        n.feed(bytes(data))
    else:
        d = Decoder(coding, limit)
        for piece in d.feed(data):
            n.feed(piece)
        d.finish()
    n.finish()
    return h.hexdigest()
