"""A job's optional ``renderOptions``: what prerender-ray's worker does for the URL's route beyond the
reference render: scroll for lazy content, the blocklist, a diagnostics report.

The reference fleet ignores job fields it does not know. The field is left out when every value is
the worker's default, so a job for a route with no overrides stays byte-for-byte the reference's.
The worker reads it with ``parse`` (worker/outcome.py): a part it cannot read is ignored, never the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from prerender_ray.config.render import Block, Render, Scroll

FIELD = "renderOptions"
DEFAULT_SCROLL = Scroll()
DEFAULT_BLOCK = Block()


@dataclass(frozen=True)
class JobOptions:
    """What one job asks of the worker beyond the reference render (its defaults when the job says nothing)."""

    scroll: Scroll = DEFAULT_SCROLL
    block: Block = DEFAULT_BLOCK
    diagnostics: bool = False


def effective(render: Render, route: Any) -> JobOptions:
    """``render.scroll`` / ``render.block`` with the route's overrides on top."""
    scroll, block = render.scroll, render.block
    if route is not None and route.scroll:
        scroll = scroll.model_copy(update=dict(route.scroll))
    if route is not None and route.block:
        block = block.model_copy(update=dict(route.block))
    return JobOptions(scroll, block)


def wire(opts: JobOptions) -> dict[str, Any] | None:
    """The job field for ``opts``; None when the worker's defaults would do the same."""
    out: dict[str, Any] = {}
    if opts.scroll != DEFAULT_SCROLL:
        out["scroll"] = opts.scroll.model_dump(by_alias=True)
    if opts.block != DEFAULT_BLOCK:
        out["block"] = {"hosts": list(opts.block.hosts), "defaults": opts.block.defaults}
    if opts.diagnostics:
        out["diagnostics"] = True
    return out or None


def parse(value: Any) -> JobOptions:
    """A job's ``renderOptions`` as the worker reads it: each part that is not valid is left at its
    default (a newer server's field, or a bad value, never costs the render)."""
    if not isinstance(value, dict):
        return JobOptions()
    scroll, block = DEFAULT_SCROLL, DEFAULT_BLOCK
    if isinstance(value.get("scroll"), dict):
        try:
            scroll = Scroll.model_validate(value["scroll"])
        except ValidationError:
            pass
    if isinstance(value.get("block"), dict):
        try:
            block = Block.model_validate(value["block"])
        except ValidationError:
            pass
    return JobOptions(scroll, block, value.get("diagnostics") is True)


class RouteOptions:
    """The wire field per route, computed once per distinct override (claims build a job per grant)."""

    def __init__(self, render: Render):
        self.render = render
        self._by_override: dict[tuple, dict[str, Any] | None] = {}

    def for_route(self, route: Any) -> dict[str, Any] | None:
        slot = (route.scroll, route.block) if route is not None else (None, None)
        if slot not in self._by_override:
            self._by_override[slot] = wire(effective(self.render, route))
        return self._by_override[slot]
