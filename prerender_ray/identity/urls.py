"""URL identity: the one canonicalization behind every cache key, schedule row and origin fetch.

``canonicalize_url`` follows the reference (docs/serving.md#url-canonicalization) with WHATWG parsing by ada,
and is better in one respect: it is idempotent for every input, so a canonical URL always canonicalizes
to itself (the orphan sweep's fixed-point test relies on it). Where the reference is not, our result
is the reference applied until it stops changing:

- query segments have their escapes normalized *before* they are filtered and sorted (the reference
  sorts first, so ``?%62=1&a=2`` needs two passes to settle on ``?a=2&b=1``);
- every trailing slash of a non-root path is stripped, not just one (``/a//`` -> ``/a``; the reference
  gives ``/a/``, which its next pass turns into ``/a``);
- an escape whose decoded hex digit would complete a new escape with a stray ``%`` before it stays
  encoded (``%%34%31`` -> ``%%341``, not ``%41``, which a second pass would decode to ``A``);
- with ``plus_is_space``, a ``+`` in a query key means a space for the allowlist test, as it does
  after the fold (the reference keeps ``a%20b`` for allowlist ``["a b"]``, then drops ``a+b``).

Also deliberate: only http and https are accepted; inputs over 8 KB and inputs holding control
characters are refused (the reference silently removes tabs and newlines); ``^`` in a path is
encoded as ``%5E`` (current WHATWG, which ada implements; Node 20 kept it literal); and ``%27`` stays
encoded in a query even when ``decode_reserved`` lists ``'``, since a WHATWG parser (the renderer's
browser included) would encode the literal again.

Most URLs take a fast path: a conservative pattern proves the input is already in the form ada
would produce, so the parse is skipped. Everything else goes through ada's C API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import unquote_to_bytes

# ada's C API, as ada_url's own wrapper calls it: one parse and one href read, without the wrapper's
# per-call dict and attribute loop (parse_url costs about twice as much per URL).
from ada_url._ada_wrapper import ffi, lib

MAX_URL_LENGTH = 8192
DEFAULT_DECODE_RESERVED = (":", ",", "@")
# sub-delimiters whose escapes may be decoded without changing what the URL means (cacheKey.decodeReserved)
DECODE_RESERVED_ALLOWED = frozenset(":,@;$'()!*")
TRAILING_SLASH_MODES = ("strip", "preserve")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX_DIGITS = frozenset("0123456789ABCDEFabcdef")
_DEFAULT_PORTS = {"http": "80", "https": "443"}


class UrlError(ValueError):
    """A URL that cannot be canonicalized; the HTTP layer answers it with a 400.

    ``reason`` is a short code (``type``, ``empty``, ``too-long``, ``control-character``,
    ``relative``, ``scheme``, ``unparseable``); the message says what is wrong in words.
    """

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


# The fast path accepts input that ada would return unchanged in scheme, host, path and query
# (scheme and host may be upper-case: ada only lower-cases them). The host is plain ASCII DNS labels
# with no xn-- (ada would check the punycode) and a last label that starts with a letter, so it is
# never numeric (ada would parse IPv4 or refuse it). Path and query hold no character ada would
# percent-encode or (backslash) turn into a slash, and no path segment starts with "." or "%2e".
_FAST_HOST = re.compile(r"([A-Za-z0-9][A-Za-z0-9.\-]*)(?::([0-9]{1,5}))?(?=[/?#]|\Z)", re.ASCII)
_FAST_REST = re.compile(r"[A-Za-z0-9!$%&'()*+,\-./:;=?@\[\]_|~]*", re.ASCII)
_DOT_SEGMENT = re.compile(r"/(?:\.|%2[eE])")
# The commonest shape in one match: lower-case scheme and host, no port, no fragment, no "'" in the
# query (_split takes the rest by hand, about a microsecond more per URL of a sitemap ingest).
_COMMON = re.compile(r"(https?)://([a-z0-9][a-z0-9.\-]*)(/[A-Za-z0-9!$%&()*+,\-./:;=@\[\]_|~]*)?"
                     r"(?:\?([A-Za-z0-9!$%&()*+,\-./:;=?@\[\]_|~]*))?", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.\-]*):")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def canonicalize_url(
    url: object,  # str, an ada_url.URL or url_parts' tuple; anything else is a UrlError, not a TypeError
    allowlist: Iterable[str],
    *,
    plus_is_space: bool = False,
    trailing_slash: str = "strip",
    decode_reserved: Iterable[str] = DEFAULT_DECODE_RESERVED,
) -> str:
    """The canonical form of ``url``: the url half of a cache key and the URL fetched from the origin.

    ``url`` is a string (or an ``ada_url.URL``, or the ``url_parts`` of one: a caller that needed
    the path first does not parse twice). ``allowlist`` names the query keys kept (compared with the strictly percent-decoded key, ``+``
    is not a space); ``["*"]`` keeps all, ``[]`` drops all. Kept segments are sorted. Raises
    ``UrlError`` for input that is not an absolute http(s) URL, and ``ValueError`` for bad options.
    """
    if trailing_slash == "strip":
        strip = True
    elif trailing_slash == "preserve":
        strip = False
    else:
        raise ValueError(f"trailing_slash must be 'strip' or 'preserve', not {trailing_slash!r}")
    path_table, query_table = _escape_tables(
        decode_reserved if type(decode_reserved) is tuple else tuple(decode_reserved)
    )
    scheme, host, path, query = url if type(url) is tuple else url_parts(url)
    if strip and len(path) > 1 and path[-1] == "/":
        path = path.rstrip("/") or "/"
    if "%" in path:
        path = _normalize_escapes(path, path_table)
    if "|" in path:
        path = path.replace("|", "%7C")
    if query:
        query = _canonical_query(query, allowlist, query_table, plus_is_space)
    out = f"{scheme}://{host}{path}{query}"
    if len(out) > MAX_URL_LENGTH:
        raise UrlError("too-long", f"canonical URL is longer than {MAX_URL_LENGTH} characters ({len(out)})")
    return out


def url_host(canonical_url: str) -> str:
    """The host name (no port) of a canonical URL, e.g. for the ``domains`` check."""
    authority = canonical_url.partition("://")[2].partition("/")[0]
    if authority.startswith("["):
        return authority[: authority.index("]") + 1]
    return authority.partition(":")[0]


def whatwg_path(url: str) -> str:
    """The path of ``url`` as a WHATWG parser gives it: dot segments resolved, escapes and the
    trailing slash as written. Raises ``UrlError`` like ``canonicalize_url``."""
    return url_parts(url)[2]


def url_path(canonical_url: str) -> str:
    """The path of a canonical URL (no query)."""
    rest = canonical_url.partition("://")[2]
    slash = rest.find("/")
    return rest[slash:].partition("?")[0] if slash >= 0 else "/"


# ------------------------------------------------------------------------------------------ parsing


def url_parts(url: object) -> tuple[str, str, str, str]:
    """Scheme, host (with a non-default port), path and query as a WHATWG parser serializes them;
    ``canonicalize_url`` accepts the result in place of the URL. Raises ``UrlError``."""
    if type(url) is not str:
        href = getattr(url, "href", None)  # an ada_url.URL, like the reference's URL-object input
        if not isinstance(href, str):
            raise UrlError("type", f"expected a URL string, got {type(url).__name__}")
        url = href
    if len(url) > MAX_URL_LENGTH:
        raise UrlError("too-long", f"URL is longer than {MAX_URL_LENGTH} characters ({len(url)})")
    return _fast_parts(url) or _ada_parts(url)


def _fast_parts(url: str) -> tuple[str, str, str, str] | None:
    m = _COMMON.fullmatch(url)
    if m is not None:
        scheme, host, path, query = m.groups()
        authority = host
    else:
        split = _split(url)
        if split is None:
            return None
        scheme, host, authority, path, query = split
    if ".." in host or host[-1] == "." or "xn--" in host or not host[host.rfind(".") + 1].isalpha():
        return None
    if not path:
        path = "/"
    elif ("/." in path or "/%" in path) and _DOT_SEGMENT.search(path):
        return None
    return scheme, authority, path, query or ""


def _split(url: str) -> tuple[str, str, str, str, str] | None:
    """Scheme, host, authority (the host with a non-default port), path and query of a URL off the
    commonest shape, or None when only ada can settle it (the host is checked by the caller)."""
    if url.startswith("https://"):
        scheme, start = "https", 8
    elif url.startswith("http://"):
        scheme, start = "http", 7
    else:
        head = url[:8].lower()
        if head == "https://":
            scheme, start = "https", 8
        elif head.startswith("http://"):
            scheme, start = "http", 7
        else:
            return None
    m = _FAST_HOST.match(url, start)
    if m is None:
        return None
    host, port = m.groups()
    if not host.islower():
        host = host.lower()
    authority = host
    if port:
        if port[0] == "0" or int(port) > 65535:
            return None  # ada drops leading zeros or refuses the port
        if port != _DEFAULT_PORTS[scheme]:
            authority = f"{host}:{port}"
    rest = url[m.end():]
    hash_at = rest.find("#")
    if hash_at >= 0:
        if not rest[hash_at + 1:].isprintable():
            return None  # control characters are refused on the slow path
        rest = rest[:hash_at]
    if _FAST_REST.fullmatch(rest) is None:
        return None
    path, _, query = rest.partition("?")
    if "'" in query:
        return None  # ada encodes it in a query
    return scheme, host, authority, path, query


def _ada_parts(url: str) -> tuple[str, str, str, str]:
    href = _whatwg_href(url)
    if href.startswith("https://"):
        scheme, rest = "https", href[8:]
    elif href.startswith("http://"):
        scheme, rest = "http", href[7:]
    else:
        raise UrlError("scheme", f"unsupported scheme {href.partition(':')[0]!r}: only http and https URLs")
    # In an http(s) href the authority ends at the first "/", userinfo (escaped, so no "@" or "/"
    # inside) ends at the last "@", the path at "?" or "#", and the query at "#".
    slash = rest.find("/")
    host = rest[:slash].rpartition("@")[2]
    tail = rest[slash:].partition("#")[0]
    path, _, query = tail.partition("?")
    return scheme, host, path, query


def _whatwg_href(url: str) -> str:
    if not url.strip():
        raise UrlError("empty", "URL is empty")
    if _CONTROL.search(url):
        raise UrlError("control-character", "URL contains a control character (tab, newline, NUL ...)")
    try:
        # surrogateescape gives back the bytes of a raw request path decoded with it; ada
        # percent-encodes bytes that are not UTF-8 like any other non-ASCII byte.
        data = url.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise UrlError("unparseable", "URL is not valid Unicode (lone surrogate)") from None
    handle = lib.ada_parse(data, len(data))
    try:
        if lib.ada_is_valid(handle):
            s = lib.ada_get_href(handle)
            return ffi.unpack(s.data, s.length).decode("utf-8")
    finally:
        lib.ada_free(handle)
    m = _SCHEME.match(url)
    if m is None:
        raise UrlError("relative", f"not an absolute URL (no scheme): {_preview(url)}")
    if m.group(1).lower() not in _DEFAULT_PORTS:
        raise UrlError("scheme", f"unsupported scheme {m.group(1)!r}: only http and https URLs")
    raise UrlError("unparseable", f"not a valid URL (bad host or port?): {_preview(url)}")


def _preview(url: str) -> str:
    return repr(url if len(url) <= 120 else url[:117] + "...")


# ----------------------------------------------------------------------------------------- escapes


@lru_cache(maxsize=16)
def _escape_tables(decode_reserved: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """For the path and the query: each two-hex-digit escape body, in any case, to what it becomes.
    That is the literal character when it is unreserved or in ``decode_reserved``, else the escape
    with upper-case hex. ``%27`` stays encoded in a query even when ``'`` is listed, because WHATWG
    encodes a literal ``'`` there: the output must read back unchanged through any WHATWG parser."""
    bad = [c for c in decode_reserved if c not in DECODE_RESERVED_ALLOWED]
    if bad:
        allowed = " ".join(sorted(DECODE_RESERVED_ALLOWED))
        raise ValueError(f"decode_reserved entries {bad} not allowed; choose from {allowed}")
    path: dict[str, str] = {}
    for byte in range(256):
        char = chr(byte)
        upper = f"{byte:02X}"
        out = char if char in _UNRESERVED or char in decode_reserved else "%" + upper
        for hi in {upper[0], upper[0].lower()}:
            for lo in {upper[1], upper[1].lower()}:
                path[hi + lo] = out
    query = dict(path)
    query["27"] = "%27"
    return path, query


def _normalize_escapes(text: str, table: dict[str, str]) -> str:
    parts = text.split("%")
    out = [parts[0]]
    stray_tail: str | None = None  # text after the previous "%" when that "%" began no escape
    for part in parts[1:]:
        rep = table.get(part[:2])
        if rep is None:
            out.append("%")
            out.append(part)
            stray_tail = part
            continue
        # A decoded hex digit right after "%" or "%<hex>" would spell a new escape: keep it encoded.
        if stray_tail is not None and rep in _HEX_DIGITS and (
            not stray_tail or (len(stray_tail) == 1 and stray_tail in _HEX_DIGITS)
        ):
            rep = "%" + part[:2].upper()
        out.append(rep)
        out.append(part[2:])
        stray_tail = None
    return "".join(out)


def _decode_component(text: str) -> str | None:
    """JavaScript's decodeURIComponent: strict UTF-8, None where it would throw."""
    if "%" not in text:
        return text
    if _BAD_ESCAPE.search(text):
        return None
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        return None


# ------------------------------------------------------------------------------------------- query


def _canonical_segment(segment: str, table: dict[str, str], plus_is_space: bool) -> str:
    if "%" in segment:
        segment = _normalize_escapes(segment, table)
        if plus_is_space:
            segment = segment.replace("%20", "+")
    if "|" in segment:
        segment = segment.replace("|", "%7C")
    return segment


def _key_allowed(key: str, allowlist: Iterable[str], table: dict[str, str], plus_is_space: bool) -> bool:
    """Membership of a key holding escapes (or, with plus_is_space, a "+"), invariant under
    canonicalization so that filtering is idempotent."""
    decoded = _decode_component(key.replace("+", "%20") if plus_is_space else key)
    if decoded is None:  # the reference compares the raw key; we compare its canonical spelling
        decoded = _canonical_segment(key, table, plus_is_space)
    return decoded in allowlist


def _canonical_query(query: str, allowlist: Iterable[str], table: dict[str, str], plus_is_space: bool) -> str:
    if not isinstance(allowlist, (tuple, list, frozenset, set)):
        allowlist = tuple(allowlist)
    if not allowlist:
        return ""
    keep_all = "*" in allowlist
    kept = []
    for segment in query.split("&"):
        if not segment:
            continue
        if not keep_all:
            key = segment.partition("=")[0]
            if "%" in key or (plus_is_space and "+" in key):
                if not _key_allowed(key, allowlist, table, plus_is_space):
                    continue
            elif key not in allowlist:
                continue
        if "%" in segment or "|" in segment:
            segment = _canonical_segment(segment, table, plus_is_space)
        kept.append(segment)
    if not kept:
        return ""
    kept.sort()
    return "?" + "&".join(kept)
