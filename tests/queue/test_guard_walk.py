"""The guard's walk over hidden elements (``guard._hidden_parts``) against the walk it replaced.

The walk was seven ``find``s kept one per opener; it is now one regex walk. The old one stays here as
the oracle: on any markup both give the same visible spans and titles, so a page measures the same
(a stored measure header stays comparable with a new render's)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.queue import guard
from prerender_ray.queue.guard import MAX_TOKENS

_HIDDEN = (b"script", b"style", b"noscript", b"template", b"title", b"svg")
_OPENERS = (b"<!--",) + tuple(b"<" + name for name in _HIDDEN)
_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_:")


def seven_finds(html: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The walk as it was before 2026-12-06, verbatim but for its name."""
    low = html.lower()
    n = len(low)
    nxt = [low.find(op) for op in _OPENERS]
    visible: list[tuple[int, int]] = []
    titles: list[tuple[int, int]] = []
    pos = steps = 0
    while steps < MAX_TOKENS:
        steps += 1
        live = [(at, i) for i, at in enumerate(nxt) if at >= 0]
        if not live:
            break
        at, i = min(live)
        if at < pos:
            nxt[i] = low.find(_OPENERS[i], pos)
            continue
        after = at + len(_OPENERS[i])
        if i and after < n and low[after] in _NAME_CHARS:
            nxt[i] = low.find(_OPENERS[i], after)
            continue
        if i and _HIDDEN[i - 1] == b"template" and b"shadowrootmode" in low[after:_tag_end(low, after)]:
            nxt[i] = low.find(_OPENERS[i], after)
            continue
        visible.append((pos, at))
        if i == 0:
            close = low.find(b"-->", after)
            pos = n if close < 0 else close + 3
        else:
            name = _HIDDEN[i - 1]
            open_end = _tag_end(low, after)
            close = after
            while True:
                close = low.find(b"</" + name, close)
                if close < 0 or close + 2 + len(name) >= n or low[close + 2 + len(name)] not in _NAME_CHARS:
                    break
                close += 2
            if close < 0:
                pos = n
            else:
                if name == b"title":
                    titles.append((open_end, close))
                pos = _tag_end(low, close + 2)
        nxt[i] = low.find(_OPENERS[i], pos)
    if pos < n:
        visible.append((pos, n))
    return visible, titles


def _tag_end(low: bytes, at: int) -> int:
    gt, lt = low.find(b">", at), low.find(b"<", at)
    if gt >= 0 and (lt < 0 or gt < lt):
        return gt + 1
    return lt if lt >= 0 else len(low)


# the pieces a hidden element is made and mistaken from, in any case
PIECES = [b"<", b">", b"<!--", b"-->", b"<!", b"-", b"/", b" ", b"x", b"s", b"1", b":", b"_", b"\xc3\xa9",
          b"shadowrootmode", b"ShadowRootMode=open", b"<p>", b"</p>", b"scripts"]
PIECES += [b + name for name in _HIDDEN for b in (b"<", b"</")] + [b"<SCRIPT", b"</Script", b"<TiTlE", b"</TITLE",
                                                                   b"<Template ", b"<svg:", b"<style-x"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_the_walk_finds_what_seven_finds_found(pieces: list[bytes]) -> None:
    html = b"".join(pieces)
    assert guard._hidden_parts(html) == seven_finds(html)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
def test_the_walk_agrees_on_any_bytes(html: bytes) -> None:
    assert guard._hidden_parts(html) == seven_finds(html)


def test_the_walk_agrees_on_a_rendered_page_and_past_the_token_budget() -> None:
    page = (b"<!doctype html><html><head><title>Shop</title><style>.a{}</style><script>if (a < b) x()</script>"
            b"</head><body><!-- nav -->" + b"".join(b'<div class="c"><a href="/p/%d">P %d</a><svg><title>i</title>'
                                                   b"</svg></div>\n" % (i, i) for i in range(500))
            + b'<template shadowrootmode="open"><p>s</p></template><template id=t>x</template></body></html>')
    budget = b"<style></style>" * (MAX_TOKENS + 10) + b"<p>tail text</p>"
    for html in (page, budget):
        assert guard._hidden_parts(html) == seven_finds(html)
