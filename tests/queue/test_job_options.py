"""A job's renderOptions: the server's render.scroll / render.block with a route's overrides, on the
wire only where they differ from the worker's defaults, and read by the worker part by part."""

from __future__ import annotations

import json

import pytest

from prerender_ray.config.loading import parse as parse_config
from prerender_ray.identity.routes import compile_route_list
from prerender_ray.queue import job_options
from prerender_ray.queue.job_options import JobOptions, RouteOptions


def cfg(**sections):
    return parse_config({"domains": ["shop.test"], **sections}, {}).config


def route(**fields):
    compiled = compile_route_list([{"match": "prefix", "path": "/r/", **fields}], [])
    assert not compiled.warnings, compiled.warnings
    return compiled.routes[0]


def test_the_defaults_put_nothing_on_the_wire() -> None:
    assert RouteOptions(cfg().render).for_route(None) is None
    assert RouteOptions(cfg().render).for_route(route()) is None
    assert job_options.wire(JobOptions()) is None


def test_a_route_overrides_the_server_sections_field_by_field() -> None:
    render = cfg(render={"scroll": {"maxSteps": 5}, "block": {"hosts": ["a.example"]}}).render
    opts = RouteOptions(render)
    assert opts.for_route(None) == {"scroll": {"mode": "auto", "maxSteps": 5, "budgetMs": 3000},
                                    "block": {"hosts": ["a.example"], "defaults": True}}
    got = opts.for_route(route(scroll={"mode": "bottom"}, block={"defaults": False}))
    assert got == {"scroll": {"mode": "bottom", "maxSteps": 5, "budgetMs": 3000},
                   "block": {"hosts": ["a.example"], "defaults": False}}
    assert opts.for_route(route(scroll=False))["scroll"]["mode"] == "off"
    assert opts.for_route(route(block=False))["block"] == {"hosts": [], "defaults": False}


def test_the_worker_reads_what_the_server_wrote() -> None:
    wire = RouteOptions(cfg().render).for_route(route(scroll={"budgetMs": "2s"}, block={"hosts": ["x.example"]}))
    back = job_options.parse(json.loads(json.dumps(wire)))
    assert back.scroll.budget_ms == 2000 and back.block.hosts == ("x.example",) and not back.diagnostics
    assert job_options.parse({"diagnostics": True}).diagnostics


@pytest.mark.parametrize("bad", [
    None, 7, "x", [], {"scroll": "bottom"}, {"scroll": {"mode": "sideways"}}, {"scroll": {"maxSteps": 10**9}},
    {"scroll": {"budgetMs": -1}}, {"block": {"hosts": ["*.evil.example"]}}, {"block": {"hosts": "a.example"}},
    {"block": {"hosts": ["a.example"] * 201}}, {"diagnostics": "yes"}, {"scroll": {"mode": "off", "new": 1}},
])
def test_a_part_the_worker_cannot_read_is_left_at_its_default(bad) -> None:
    assert job_options.parse(bad) == JobOptions()


def test_bad_route_overrides_are_dropped_with_a_warning() -> None:
    compiled = compile_route_list([
        {"match": "prefix", "path": "/a/", "scroll": {"mode": "sideways"}},
        {"match": "prefix", "path": "/b/", "block": {"hosts": ["a b"]}},
        {"match": "prefix", "path": "/c/", "scroll": "yes"},
    ], [])
    assert [r.scroll for r in compiled.routes] == [None, None, None]
    assert compiled.routes[1].block is None
    assert len(compiled.warnings) == 3 and "scroll.mode" in compiled.warnings[0]
    assert "block.hosts.0" in compiled.warnings[1] and "boolean or a mapping" in compiled.warnings[2]


def test_the_config_refuses_a_block_host_that_is_not_a_host_name() -> None:
    with pytest.raises(Exception, match="not a host name"):
        cfg(render={"block": {"hosts": ["*"]}})
