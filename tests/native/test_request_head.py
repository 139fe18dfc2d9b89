"""A simple request's head in C (prerender_ray/native/request_head.c) against llhttp (httptools) and
uvicorn's callbacks: every head it accepts is one complete request that llhttp parses to the same
method, target, headers (lower-cased names, values stripped as uvicorn strips them) and keep-alive,
with nothing after it; over generated heads and every byte of valid ones changed, inserted or
removed. It must also accept the heads crawlers send, or the protocol's fast path never runs."""

from __future__ import annotations

import importlib
import random
from typing import Any

import httptools
import pytest

from prerender_ray import native

if native.state != "compiled":
    pytest.skip(f"the native path is not built here ({native.state})", allow_module_level=True)

request_head: Any = importlib.import_module("prerender_ray.native.request_head")
MAX_HEADERS, MAX_BYTES = 100, 64 * 1024
UA = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"


class Seen:
    """What uvicorn's protocol gathers from llhttp for the bytes fed."""

    def __init__(self) -> None:
        self.begun = self.complete = 0
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: tuple[str, str, bool, bool] | None = None
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value.rstrip(b" \t")))  # uvicorn's on_header

    def on_headers_complete(self) -> None:
        p = self.parser
        version = p.get_http_version()
        self.head = (p.get_method().decode("ascii"), version, version != "1.0" and p.should_keep_alive(),
                     p.should_upgrade())

    def on_message_complete(self) -> None:
        self.complete += 1


def check(data: bytes) -> Any:
    """simple_head's answer for ``data``; where it accepts, llhttp must agree on every part."""
    got = request_head.simple_head(data, MAX_HEADERS, MAX_BYTES)
    if got is None:
        return None
    method, target, headers, keep_alive = got
    seen = Seen()
    seen.parser.feed_data(data)  # raises on what llhttp refuses: the test fails
    assert (seen.begun, seen.complete) == (1, 1), data
    assert seen.head == (method, "1.1", keep_alive, False), data
    assert (seen.url, seen.headers) == (target, headers), data
    for name, value in headers:
        assert name not in (b"content-length", b"transfer-encoding", b"upgrade", b"expect")
        assert value and value == value.rstrip(b" \t") == value.lstrip(b" \t")
    return got


def head(target: str = "/p/https://shop.example/a?b=1", headers: list[tuple[str, str]] | None = None,
         method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1"] + [f"{n}: {v}" for n, v in (headers if headers is not None else [
        ("Host", "127.0.0.1:8080"), ("User-Agent", UA), ("Accept-Encoding", "gzip, deflate, br")])]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def test_the_heads_crawlers_send_are_taken() -> None:
    assert check(head()) == ("GET", b"/p/https://shop.example/a?b=1", [
        (b"host", b"127.0.0.1:8080"), (b"user-agent", UA.encode()), (b"accept-encoding", b"gzip, deflate, br")], True)
    assert check(head(method="HEAD"))[0] == "HEAD"
    assert check(head(headers=[("Host", "a"), ("Connection", "Keep-Alive")]))[3] is True
    assert check(head(headers=[("Host", "a"), ("CONNECTION", "close")]))[3] is False
    assert check(head("/", []))[1:] == (b"/", [], True)
    assert check(head(headers=[("X-Pad", "a \t"), ("Accept", "\t */*")]))[2] == [(b"x-pad", b"a"), (b"accept", b"*/*")]


@pytest.mark.parametrize("data", [
    head(method="POST"), head(method="get"), head(method="OPTIONS"),
    head(headers=[("Content-Length", "0")]), head(headers=[("Transfer-Encoding", "chunked")]),
    head(headers=[("Upgrade", "websocket"), ("Connection", "Upgrade")]), head(headers=[("Expect", "100-continue")]),
    head(headers=[("Connection", "keep-alive, close")]), head(headers=[("Connection", "close"), ("Connection", "close")]),
    head().replace(b"HTTP/1.1", b"HTTP/1.0"), head().replace(b"HTTP/1.1", b"HTTP/2.0"),
    head() + head(),  # pipelined: llhttp's
    head()[:-2], head()[:-1], head() + b"\r\n", b"", b"GET",
    head("http://shop.example/a"), head("*"), head("/a#frag"), head("/a b"), head("/é"), head("/a\\b"),
    head(headers=[("X", "")]), head(headers=[("X", " \t ")]), head(headers=[("X Y", "1")]), head(headers=[("X ", "1")]),
    head(headers=[("X", "a\x00b")]), head(headers=[("X", "a\x7fb")]), head(headers=[("X", "caf\xe9")]),
    head().replace(b"\r\nUser", b"\r\n User"),  # a folded line
    head().replace(b"\r\nUser", b"\nUser"), head().replace(b"1\r\n", b"1\n"), head().replace(b"\r\n\r\n", b"\n\n"),
    head("/" + "a" * MAX_BYTES), head(headers=[("X", "a" * MAX_BYTES)]),
    head(headers=[(f"x-{i}", "1") for i in range(MAX_HEADERS + 1)]),
])
def test_anything_else_is_left_to_llhttp(data: bytes) -> None:
    assert request_head.simple_head(data, MAX_HEADERS, MAX_BYTES) is None


def test_the_bounds_are_the_protocols() -> None:
    at = head(headers=[(f"x-{i}", "1") for i in range(MAX_HEADERS)])
    assert len(check(at)[2]) == MAX_HEADERS
    assert request_head.simple_head(at, MAX_HEADERS - 1, MAX_BYTES) is None
    exact = head("/a", [("x", "b")])  # 2 bytes of target, 2 of the header
    assert check(exact) is not None and request_head.simple_head(exact, MAX_HEADERS, 3) is None
    padded = head("/a", [("x", "b  ")])  # a value's trailing whitespace counts, as the protocol counts llhttp's
    assert check(padded) is not None and request_head.simple_head(padded, MAX_HEADERS, 5) is None


_NAMES = ["Host", "user-agent", "ACCEPT", "Connection", "Content-Length", "Transfer-Encoding", "Upgrade", "Expect",
          "X-A", "x_b", "x.c", "a!#$%&'*+-.^_`|~9", "X Y", "X\x00", "\xe9", "", "X:Y"]
_VALUES = ["close", "Keep-Alive", "keep-alive, close", "upgrade", "100-continue", "0", "chunked", "gzip, br", "a b",
           "\t*/*", "v ", " ", "", "caf\xe9", "a\x00", "a\x7f", "a\rb", "a\nb", UA, "\x80"]
_TARGET = "abcXYZ019-._~%!$&'()*+,;=:@/?" * 3 + "#\\ \"<>^`{|}\x00\x7f\xe9"


def _generated(rnd: random.Random) -> bytes:
    method = rnd.choice(["GET"] * 6 + ["HEAD"] * 2 + ["POST", "get", "GET ", ""])
    target = "/" + "".join(rnd.choice(_TARGET) for _ in range(rnd.randrange(12)))
    if rnd.random() < 0.05:
        target = rnd.choice(["", "*", "http://a/", "a/b"])
    version = rnd.choice(["HTTP/1.1"] * 8 + ["HTTP/1.0", "HTTP/1.1 ", "http/1.1"])
    ends = ["\r\n"] * 20 + ["\n", "\r", " \r\n", "\r\n "]
    out = f"{method} {target} {version}" + rnd.choice(ends)
    for _ in range(rnd.randrange(6)):
        name = rnd.choice(_NAMES) if rnd.random() < 0.9 else "".join(rnd.choice(_TARGET) for _ in range(3))
        out += name + rnd.choice([": ", ":", ":\t", " :", ":  "]) + rnd.choice(_VALUES) + rnd.choice(ends)
    out += rnd.choice(["\r\n"] * 10 + ["", "\n", "\r\nGET / HTTP/1.1\r\n\r\n", "\r\n\r\n", "\r\nx"])
    return out.encode("latin-1")


def test_generated_heads_accepted_are_llhttps_heads() -> None:
    rnd = random.Random(2026)
    accepted = 0
    for _ in range(30_000):
        accepted += check(_generated(rnd)) is not None
    assert accepted > 500  # the generator reaches what the recognizer accepts (and what it refuses)


def test_every_byte_of_a_valid_head_changed_inserted_or_removed() -> None:
    base = head(headers=[("Host", "a.example"), ("User-Agent", UA), ("Connection", "keep-alive"), ("X-Pad", "v ")])
    assert check(base) is not None
    values = [0x00, 0x09, 0x0A, 0x0D, 0x20, 0x22, 0x23, 0x25, 0x2C, 0x3A, 0x3F, 0x41, 0x61, 0x7F, 0x80, 0xFF]
    for i in range(len(base)):
        for v in values:
            check(base[:i] + bytes([v]) + base[i + 1:])
            check(base[:i] + bytes([v]) + base[i:])
        check(base[:i] + base[i + 1:])
