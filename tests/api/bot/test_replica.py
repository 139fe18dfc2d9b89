"""The bot path's modules and the replica's state: the imports run one way (nothing imports the
middleware back, the request paths never import the state that builds them), and a config change
swaps the whole state in one assignment, leaving the state a request already holds as it was."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from pathlib import Path

from prerender_ray.api.bot import replica
from prerender_ray.api.bot.replica import (
    ReplicaState,
    apply_overrides,
    close_replica,
    open_replica,
)
from prerender_ray.api.context import NodeContext, ReplicaConfig
from prerender_ray.config.model import Config
from prerender_ray.config.overrides import Overrides
from prerender_ray.identity.nodes import NodeInfo
from prerender_ray.serving.classify import RESOLVED_KEY_BYTES, BotRequest
from prerender_ray.serving.tally import LABEL_OVERFLOW

BOT = Path(replica.__file__).parent
PACKAGE = "prerender_ray.api.bot"
MODULES = sorted(p.stem for p in BOT.glob("*.py") if p.stem != "__init__")
# What a request path may lean on; the state module builds them and the middleware calls them.
LEAVES = ("hit", "miss", "page_reader", "origin", "peer", "holders", "counters", "markdown", "key_directory", "llms", "signals",
          "memo", "decisions", "lane")
# What the leaves and the middleware share, built by nothing: an answer as the bytes uvicorn writes, a
# stored page as served.
HELPERS = ("wire", "pages")


def imported(module: str) -> set[str]:
    """Every prerender_ray module ``module`` imports, at any depth of its body (in functions and
    ``if TYPE_CHECKING`` blocks too): ``from a import b`` counts as both ``a`` and ``a.b``."""
    tree = ast.parse((BOT / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f"{PACKAGE}.{node.module}"
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("prerender_ray.")}


def test_every_module_of_the_bot_path_is_known() -> None:
    assert set(MODULES) == {*LEAVES, *HELPERS, "middleware", "replica"}


def test_nothing_imports_the_middleware_and_the_request_paths_import_no_state() -> None:
    graph = {m: {d.removeprefix(f"{PACKAGE}.") for d in imported(m) if d.startswith(f"{PACKAGE}.")}
             for m in MODULES}
    for m, deps in graph.items():
        assert "middleware" not in deps, m
    for leaf in (*LEAVES, *HELPERS):
        assert not graph[leaf] & {"middleware", "replica"}, (leaf, graph[leaf])
    assert set(LEAVES) <= graph["replica"]
    assert "replica" in graph["middleware"]

    def visit(m: str, path: tuple[str, ...]) -> None:  # depth-first: a module met again on its own path is a cycle
        assert m not in path, " -> ".join((*path, m))
        for d in graph.get(m, ()):
            if d in graph:
                visit(d, (*path, m))

    for m in MODULES:
        visit(m, ())


def test_each_module_imports_alone_in_a_fresh_interpreter() -> None:
    """A cycle hidden behind import order would fail here for whichever module is imported first."""
    runs = {m: subprocess.Popen([sys.executable, "-c", f"import {PACKAGE}.{m}"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for m in MODULES}
    for m, run in runs.items():
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, (m, err)


# ------------------------------------------------------------------------------- the state swap


def context(tmp_path: Path) -> NodeContext:
    cfg = Config.model_validate({"domains": ["x.example"], "server": {"data_dir": str(tmp_path)}})
    return NodeContext(cfg=cfg, node=NodeInfo("n1", "127.0.0.1", 1), data_dir=str(tmp_path))


async def test_a_config_change_swaps_the_whole_state_in_one_assignment(tmp_path) -> None:
    ctx = context(tmp_path)
    assert type(ctx.state) is ReplicaConfig
    old = open_replica(ctx)
    try:
        assert ctx.state is old and open_replica(ctx) is old and ctx.cfg is old.cfg
        first = old.resolve("GET", "/p/https://x.example/live/1", "", {})
        assert isinstance(first, BotRequest) and first.route is None
        before = dict(vars(ctx))
        old_fields = dict(vars(old))
        route = {"match": "prefix", "path": "/live/"}
        assert apply_overrides(ctx, Overrides({"ingress.routes": [route]}).encode())

        new = ctx.state
        assert isinstance(new, ReplicaState) and new is not old
        changed = {k for k, v in vars(ctx).items() if before.get(k) is not v}
        assert changed == {"state"}  # ctx.cfg, ctx.rules and ctx.findings read through it
        assert ctx.cfg is new.cfg and ctx.rules is new.rules and ctx.findings is new.findings
        assert [r["path"] for r in new.cfg.ingress.routes] == ["/live/"]
        assert new.rules.cfg is new.cfg and new.miss.cfg is new.cfg and new.hit.keys is new.ingress.keys
        decision = new.resolve("GET", "/p/https://x.example/live/1", "", {})
        assert isinstance(decision, BotRequest) and decision.route is not None and decision.route.path == "/live/"
        # What outlives a config change is the very same; what is built from the config is new.
        assert new.services is old.services and new.live is old.live
        assert new.hit.pages is old.hit.pages and new.miss.origin is old.miss.origin
        assert new.miss.peer is old.miss.peer and new.miss.discovery is old.miss.discovery
        assert new.ingress is not old.ingress and new.hit is not old.hit and new.miss is not old.miss
        # The state a request already holds is as it was, its remembered decisions included.
        assert all(vars(old)[k] is v for k, v in old_fields.items()) and len(old.resolved) == 1
        assert old.cfg.ingress.routes == [] and old.resolve("GET", "/p/https://x.example/live/1", "", {}) is first
        assert not apply_overrides(ctx, Overrides({"ingress.routes": [route]}).encode())  # unchanged row
        assert ctx.state is new
    finally:
        await close_replica(ctx)
        await asyncio.sleep(0)  # its timers finish cancelling: no pending task is left to the collector
    assert type(ctx.state) is ReplicaConfig and ctx.cfg is new.cfg


def test_a_config_change_before_the_bot_path_opens_swaps_the_compiled_config(tmp_path) -> None:
    ctx = context(tmp_path)
    old = ctx.state
    route = {"match": "prefix", "path": "/live/"}
    assert apply_overrides(ctx, Overrides({"ingress.routes": [route]}).encode())
    assert type(ctx.state) is ReplicaConfig and ctx.state is not old and ctx.state.live is old.live
    assert old.cfg.ingress.routes == [] and [r["path"] for r in ctx.cfg.ingress.routes] == ["/live/"]
    assert ctx.rules is ctx.state.rules and ctx.rules.cfg is ctx.cfg


async def test_long_ingress_inputs_are_decided_but_never_remembered(tmp_path) -> None:
    ctx = context(tmp_path)
    state = open_replica(ctx)
    try:
        long = "/p/https://x.example/" + "a" * RESOLVED_KEY_BYTES
        assert isinstance(state.resolve("GET", long, "", {}), BotRequest)
        assert isinstance(state.resolve("GET", "/p/https://x.example/", "q=" + "b" * RESOLVED_KEY_BYTES, {}), BotRequest)
        assert len(state.resolved) == 0  # a head may be 64 KiB: such keys would pin memory
        assert isinstance(state.resolve("GET", "/p/https://x.example/short", "", {}), BotRequest)
        assert len(state.resolved) == 1
    finally:
        await close_replica(ctx)


async def test_made_up_bot_names_spend_the_label_budget_but_registry_names_always_pass(tmp_path) -> None:
    ctx = context(tmp_path)
    state = open_replica(ctx)
    try:
        bots, label = state.services.bots, state.services.bot_label
        made_up = [bots.name(f"Madeup{i}Bot/1.0") for i in range(replica.BOT_LABELS)]
        assert len(set(made_up)) == replica.BOT_LABELS and all(label(n) == n for n in made_up)
        google = bots.name("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)")
        assert google == "Googlebot" and label(google) == "Googlebot"
        assert label(bots.name("Other")) == "other"
        assert label(bots.name("Madeup201Bot/1.0")) == LABEL_OVERFLOW
    finally:
        await close_replica(ctx)
