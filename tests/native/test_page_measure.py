"""The render guard's counts in C (prerender_ray/native/page_measure.c) against their reference
(``queue.guard.measure``): the same visible characters and links over generated markup made of the
pieces the two patterns turn on (tag openers, ``<a`` and ``href`` in every case and spacing, < and >
out of place, UTF-8, every whitespace byte and the bytes beside it), over every byte of a page set to
each of those pieces' bytes, and over hostile shapes (200,000 ``<a ``, half a million ``<``, an opener
before a megabyte with no ``<`` or ``>``)."""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest

from prerender_ray import native
from prerender_ray.queue.guard import measure

if native.state != "compiled":
    pytest.skip(f"the native path is not built here ({native.state})", allow_module_level=True)

page_measure: Any = importlib.import_module("prerender_ray.native.page_measure")

PIECES = [b"<", b">", b"<a", b"<A", b"<a ", b"<a\t", b"<a\x0b", b"<a\x1c", b"<ab ", b"href", b"HREF", b"hReF",
          b"xhref", b"_href", b"-href", b"href=", b"href =", b"href\n\x0c=", b"href x=", b"=", b" ", b"\t", b"\r\n",
          b"\x0b", b"\x0c", b"\x1c", b"\x1f", b"\x7f", b"\x80", b"\xbf", b"\xc0", b"\xe2\x82\xac", b"\xff",
          b"</", b"<!", b"<?", b"<!--", b"-->", b"</a>", b"<1", b"< a", b"<_", b"<p>", b"<div class=x>",
          b"text", b"Z", b"9", b"\x00"]
# the bytes the patterns and the count turn on, and their neighbours
BYTES = sorted({b for p in PIECES for b in p} | {0x08, 0x0e, 0x20, 0x21, 0x2e, 0x40, 0x5b, 0x60, 0x7b, 0x7e, 0xc1})


def markup(rnd: random.Random, size: int) -> bytes:
    return b"".join(rnd.choice(PIECES) for _ in range(size))


def test_generated_markup_counts_as_the_reference() -> None:
    rnd = random.Random(37)
    for n in range(20_000):
        m = markup(rnd, rnd.randrange(0, 40))
        assert page_measure.measure(m) == measure(m), m


def test_every_byte_of_a_page_changed_counts_as_the_reference() -> None:
    page = (b'<html><head><title>T</title></head><body><a href="/x">one</a> <A\tclass=c HREF = "/y">two</a>'
            b'<p>caf\xc3\xa9 \xe2\x82\xac 9</p><a name=n>no</a><a  data-href="z" href=/w>w</a><img src=i></body></html>')
    for i in range(len(page) + 1):
        for b in BYTES:
            for m in (page[:i] + bytes([b]) + page[i + 1:], page[:i] + bytes([b]) + page[i:], page[:i] + page[i + 1:]):
                assert page_measure.measure(m) == measure(m), (i, b)


def test_a_real_page_and_its_pieces() -> None:
    cards = b"".join(b'<div class="card"><a href="/p/%d">Product %d</a><span>$%d.99</span></div>\n' % (i, i, i)
                     for i in range(300))
    assert page_measure.measure(cards) == measure(cards) == (measure(cards)[0], 300)
    assert page_measure.measure(b"") == (0, 0)
    assert page_measure.measure(b"<a href=") == (0, 1)
    assert page_measure.measure(b"<a hre") == (0, 0)
    assert page_measure.measure(b"a b\xc3\xa9") == (3, 0)  # whitespace and a continuation byte not counted
    assert page_measure.measure(bytearray(b"<p>x</p>")) == (1, 0)  # any buffer
    with pytest.raises(TypeError):
        page_measure.measure("text")


def test_hostile_shapes_count_as_the_reference_in_one_pass() -> None:
    for m in (b"<a " * 200_000, b"<a x" * 200_000, b"<" * 500_000, b"<p" * 300_000, b"<a href" * 100_000,
              b"<a " + b"x" * 1_000_000, b"<a href " * 100_000 + b"=", b"\x80" * 1_000_000):
        assert page_measure.measure(m) == measure(m), m[:20]
