"""The bot path's counters (api/bot/counters.py): its warnings come at most once a minute per reason."""

from __future__ import annotations

from structlog.testing import capture_logs

from prerender_ray.api.bot.counters import Counters


def test_a_reason_warns_once_a_minute_with_how_many_were_held_back() -> None:
    counters = Counters()
    now = [0.0]
    counters._warned.clock = lambda: now[0]
    with capture_logs() as logged:
        for _ in range(3):
            counters.warn_sometimes("origin-timeout", "origin fetch failed", url="u")
        counters.warn_sometimes("page-unreadable", "unreadable page")
        now[0] = 60.0
        counters.warn_sometimes("origin-timeout", "origin fetch failed", url="v")
    assert [(e["event"], e["reason"], e.get("held"), e.get("url")) for e in logged] == [
        ("origin fetch failed", "origin-timeout", None, "u"),
        ("unreadable page", "page-unreadable", None, None),
        ("origin fetch failed", "origin-timeout", 2, "v"),
    ]
