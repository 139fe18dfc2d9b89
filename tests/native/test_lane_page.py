"""The spread lane's page answer in C (prerender_ray/native/lane_page.c) against its reference
(``api.bot.lane.page_answer``): the same answer, the same refusal and the same unreadable count over
the records a page log can hold, valid ones of every frame version, time and coding, and each broken
byte by byte through every layer it parses (envelope, record head, frame, wire block)."""

from __future__ import annotations

import importlib
import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from prerender_ray import native
from prerender_ray.api.bot.lane import _STATUS_200, OTHER_FRAME, page_answer
from prerender_ray.serving.framing import CODINGS, encode_page, frame_of
from prerender_ray.storage.pagelog import key_hash
from prerender_ray.storage.pagelog.reader import PageLogReader
from prerender_ray.storage.pagelog.records import CHECKSUM_HASH
from prerender_ray.storage.pagelog.writer import Item, PageLogWriter
from prerender_ray.storage.pages import Page
from prerender_ray.storage.replication import Version, wrap

if native.state != "compiled":
    pytest.skip(f"the native path is not built here ({native.state})", allow_module_level=True)

lane_page: Any = importlib.import_module("prerender_ray.native.lane_page")
lane_page.configure(CHECKSUM_HASH, _STATUS_200)

NOW = 1_800_000_000_000
SECOND = NOW // 1000
DATE = b"Fri, 15 Jan 2027 08:00:00 GMT"
ENVELOPE = 12 + len(b"node-a")  # replication._HEAD and the writer's name


def page(rnd: random.Random, n: int) -> Page:
    coding = rnd.choice(["gzip", "gzip", "gzip", "br", "identity", None, "GZIP", "compress"])
    headers = {"content-type": "text/html; charset=utf-8", "x-n": str(n)}
    if coding is not None:
        headers["content-encoding"] = coding
    if rnd.random() < 0.7:
        headers["etag"] = rnd.choice(['"v1"', 'W/"é"', '"' + "x" * rnd.randrange(60) + '"'])
    if rnd.random() < 0.7:
        headers["last-modified"] = rnd.choice([
            "Thu, 01 Jan 2026 00:00:00 GMT",  # before the Date
            "Sat, 16 Jan 2027 08:00:00 GMT",  # after it: held to it
            "Fri, 15 Jan 2027 08:00:00 GMT",  # the same second
            "not a date"])
    if rnd.random() < 0.3:
        headers["link"] = '<https://shop.example/a>; rel="canonical"'
    last = rnd.choice([None, NOW - 5_000, NOW - 1, NOW + 3_000, NOW - 86_400_000 * 400])
    expires = rnd.choice([None, NOW + 60_000, NOW, NOW - 1])
    return Page(cache_key=f"https://shop.example/p/{n}|desktop", status_code=rnd.choice([200] * 8 + [404, 301]),
                headers=headers, content=os.urandom(rnd.choice([0, 1, 700, 5000])), last_cached=last,
                expires_at=expires, is_indexable=rnd.choice([None, True, False]))


def version_one(p: Page) -> bytes:
    """``p``'s frame as version 1 writes it (names and values NUL-joined): what a block that cannot be
    written as lines is stored as; b"" where ``p`` has no frame."""
    frame = frame_of(p)
    if not frame:
        return b""
    version, coding, etag_len, lm_len = struct.unpack_from("<BBHH", frame)
    start = 6 + etag_len + lm_len
    if version == 1:
        return frame
    lines = frame[start + 16:].split(b"\r\n")[:-1]
    block = b"\0".join(part for line in lines for part in line.split(b": ", 1))
    return struct.pack("<BBHH", 1, coding, etag_len, lm_len) + frame[6:start] + block


def broken(rnd: random.Random, data: bytes, body: int) -> bytes:
    """``data`` (a record whose body is its last ``body`` bytes) with one byte of a layer changed (the
    envelope, the record head, the key, headers and frame, the frame's last line) or cut short."""
    if rnd.random() < 0.1:
        return data[: rnd.randrange(len(data) + 1)]
    frame_end = len(data) - body
    at = rnd.choice([rnd.randrange(ENVELOPE), ENVELOPE + rnd.randrange(38),
                     min(ENVELOPE + 38 + rnd.randrange(0, 120), frame_end - 1), frame_end - 1 - rnd.randrange(4)])
    out = bytearray(data)
    out[max(0, at)] = rnd.choice([0, 1, 2, 3, 4, 0x0A, 0x0D, 0x10, 0x12, 0x7F, 0x80, 0xA7, 0xFF, out[at] ^ 1])
    return bytes(out)


class Log:
    def __init__(self, path: Path):
        self.writer = PageLogWriter(path, sync=False)
        self.reader = PageLogReader(path)
        self.n = 0

    def put(self, data: bytes, last: int | None, expires: int | None) -> bytes:
        self.n += 1
        key = key_hash(f"k{self.n}")
        self.writer.append([Item(key, data, version=self.n, last_cached=last, expires_at=expires)])
        self.reader.poll()
        return key


def both(reader: PageLogReader, key: bytes, *args: Any) -> tuple[Any, Any]:
    """(the reference's answer, the native one's), each with the unreadable count it added; a body
    compared as bytes. The native word for a version 1 frame is returned as it is."""
    def norm(got: Any) -> Any:
        return got if got is None or type(got) is int else (got[0], bytes(got[1]), got[2])

    before = reader.unreadable
    ref = norm(page_answer(reader, key, *args))
    mid = reader.unreadable
    got = norm(lane_page.answer(reader, key, *args))
    return (ref, mid - before), (got, reader.unreadable - mid)


def check(log: Log, key: bytes, rnd: random.Random, aged: bool) -> str:
    args = (NOW, aged if rnd.random() < 0.9 else not aged, rnd.choice([0, 1, 2, 3, 7, 7, 7]), SECOND, DATE,
            rnd.choice([b"", b"vary: accept-encoding\r\n", b"link: <x>\r\n"]), rnd.choice([b"\r\n", b"connection: close\r\n\r\n"]))
    ref, got = both(log.reader, key, *args)
    if got[0] == OTHER_FRAME:  # a frame of version 1: the reference's answer is the lane's
        assert got[1] == 0
        return "version 1"
    assert got == ref
    return "answered" if ref[0] is not None else "refused"


def test_the_native_answer_equals_the_reference_over_valid_and_broken_records(tmp_path: Path) -> None:
    rnd = random.Random(37)
    log = Log(tmp_path / "log")
    seen: dict[str, int] = {}
    for n in range(3000):
        p = page(rnd, n)
        one = rnd.random() < 0.25
        frame = version_one(p) if one else frame_of(p)
        data = wrap(Version(n + 1, "node-a"), p.encode(frame))
        if rnd.random() < 0.4:
            data = broken(rnd, data, len(p.content))
        last = rnd.choice([p.last_cached, p.last_cached, None, NOW - 7_000])
        key = log.put(data, last, rnd.choice([p.expires_at, NOW + 60_000, NOW + 60_000, None]))
        outcome = check(log, key, rnd, last is not None)
        seen[outcome] = seen.get(outcome, 0) + 1
    # every outcome was met often enough to mean something
    assert seen.get("answered", 0) > 300 and seen.get("refused", 0) > 500 and seen.get("version 1", 0) > 100, seen


def test_an_answer_is_the_head_the_full_path_writes_and_a_view_of_the_body(tmp_path: Path) -> None:
    log = Log(tmp_path / "log")
    p = Page(cache_key="https://shop.example/a|desktop", status_code=200,
             headers={"content-encoding": "gzip", "content-type": "text/html", "etag": '"e"',
                      "last-modified": "Sat, 16 Jan 2027 08:00:00 GMT"},
             content=b"\x1f\x8b body", last_cached=NOW - 61_000, expires_at=NOW + 1)
    key = log.put(wrap(Version(1, "node-a"), encode_page(p)), p.last_cached, p.expires_at)
    head, body, last = lane_page.answer(log.reader, key, NOW, True, 1 << CODINGS.index("gzip"), SECOND, DATE,
                                        b"vary: accept-encoding\r\n", b"\r\n")
    assert head == (b"HTTP/1.1 200 OK\r\ndate: " + DATE + b"\r\ncontent-type: text/html\r\ncontent-encoding: gzip\r\n"
                    b'etag: "e"\r\nlast-modified: ' + DATE + b"\r\ncontent-length: 11\r\nage: 61\r\n"
                    b"vary: accept-encoding\r\n\r\n") or head.count(b"last-modified: " + DATE) == 1
    assert head.startswith(b"HTTP/1.1 200 OK\r\ndate: " + DATE + b"\r\n") and head.endswith(
        b"age: 61\r\nvary: accept-encoding\r\n\r\n")
    assert b"last-modified: " + DATE + b"\r\n" in head  # later than the Date: held to it
    assert isinstance(body, memoryview) and bytes(body) == p.content and last == p.last_cached
    # a client taking no stored coding, a class whose page had no last_cached: not the lane's
    assert lane_page.answer(log.reader, key, NOW, True, 0, SECOND, DATE, b"", b"\r\n") is None
    assert lane_page.answer(log.reader, key, NOW, False, 7, SECOND, DATE, b"", b"\r\n") is None
    assert lane_page.answer(log.reader, key_hash("absent"), NOW, True, 7, SECOND, DATE, b"", b"\r\n") is None
    assert log.reader.unreadable == 0


def test_a_record_that_does_not_read_whole_is_counted_unreadable_and_never_answered(tmp_path: Path) -> None:
    log = Log(tmp_path / "log")
    p = Page(cache_key="https://shop.example/b|desktop", status_code=200,
             headers={"content-encoding": "gzip"}, content=b"z" * 4000, last_cached=NOW, expires_at=NOW + 1)
    keys = [log.put(wrap(Version(i + 1, "node-a"), encode_page(p)), NOW, NOW + 1) for i in range(3)]
    args = (NOW, True, 7, SECOND, DATE, b"", b"\r\n")
    assert both(log.reader, keys[0], *args)[1][0] is not None
    # a byte of the stored body changed on disk: the checksum refuses it
    segment = next(f for f in (tmp_path / "log").iterdir() if f.name.startswith("seg"))
    raw = bytearray(segment.read_bytes())
    at = raw.rindex(b"z" * 4000)
    raw[at] = ord("y")
    segment.write_bytes(bytes(raw))
    ref, got = both(log.reader, keys[2], *args)
    assert ref == got == (None, 1)
    # a record longer than the log says any may be
    log.reader._max_record = 10
    assert both(log.reader, keys[0], *args) == ((None, 1), (None, 1))


@pytest.mark.parametrize("one", [False, True], ids=["lines", "version 1"])
def test_every_byte_of_a_record_up_to_its_body_changed_reads_alike(tmp_path: Path, one: bool) -> None:
    """Each byte before the body set to each of a few values: every field of every layer, each check
    of each (a flag, a version, a length, a coding, a validator's UTF-8, the lines' CRLF)."""
    log = Log(tmp_path / "log")
    p = Page(cache_key="https://shop.example/é|desktop", status_code=200,
             headers={"content-encoding": "gzip", "etag": '"é1"', "last-modified": "Sat, 16 Jan 2027 08:00:00 GMT"},
             content=b"\x1f\x8b" + bytes(300), last_cached=NOW - 1_000, expires_at=NOW + 60_000)
    data = wrap(Version(1, "node-a"), p.encode(version_one(p) if one else frame_of(p)))
    rnd = random.Random(7)
    seen: dict[str, int] = {}
    for at in range(len(data) - len(p.content)):
        for value in {0, 1, 2, 3, 4, 0x0A, 0x0D, 0x10, 0x20, 0x7F, 0x80, 0xC3, 0xFF, data[at] ^ 1}:
            changed = bytearray(data)
            changed[at] = value
            key = log.put(bytes(changed), p.last_cached, p.expires_at)
            outcome = check(log, key, rnd, True)
            seen[outcome] = seen.get(outcome, 0) + 1
    assert seen.get("refused", 0) > 500 and seen.get("answered" if not one else "version 1", 0) > 500, seen
