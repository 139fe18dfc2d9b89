"""Our Date, and a Last-Modified never later than it (prerender_ray.serving.dates), as plain objects."""

from __future__ import annotations

import calendar
from email.utils import formatdate

from prerender_ray.serving.dates import Dater, http_date, http_seconds

NOW = calendar.timegm((2026, 3, 4, 12, 0, 0))


def test_a_later_last_modified_becomes_date_and_an_earlier_one_stays() -> None:
    later, earlier = http_date(NOW + 1), http_date(NOW - 86_400)
    out = Dater().headers([(b"content-type", b"text/html"), (b"last-modified", later)], NOW + 0.999)
    assert out == [(b"date", http_date(NOW)), (b"content-type", b"text/html"), (b"last-modified", http_date(NOW))]
    assert Dater().headers([(b"Last-Modified", earlier)], NOW) == [(b"date", http_date(NOW)), (b"Last-Modified", earlier)]


def test_one_date_whatever_the_answer_carried_and_garbage_is_left_alone() -> None:
    out = Dater().headers([(b"Date", b"Thu, 01 Jan 1970 00:00:00 GMT"), (b"last-modified", b"soon")], NOW)
    assert out == [(b"date", http_date(NOW)), (b"last-modified", b"soon")]


def test_every_http_date_form_parses() -> None:
    assert http_seconds(formatdate(NOW, usegmt=True).encode()) == NOW
    assert http_seconds(b"Wednesday, 04-Mar-26 12:00:00 GMT") == NOW  # RFC 850
    assert http_seconds(b"Wed Mar  4 12:00:00 2026") == NOW  # asctime
    for bad in (b"", b"Wed, 04 Xyz 2026 12:00:00 GMT", b"Wed, 4x Mar 2026 12:00:00 GMT", b"\xff" * 29):
        assert http_seconds(bad) is None, bad
