"""Shared fixtures. Ray is started once per session, lazily, on loopback, with its own token."""

from __future__ import annotations

import functools
import os
import secrets
from pathlib import Path
from typing import Any

# Before anything imports ray: loopback only, and a token of this session (never one left behind).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.pop("PRERENDER_CONFIG", None)
# A Ray call in a process that never joined Ray fails instead of starting (or joining) a Ray instance
# from whatever thread made it: a test's harness would otherwise leave the next module's cluster
# start "connected already" (docs/testing.md).
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"

import httpx._transports.default as _httpx_transport  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from tests.support import RayCluster  # noqa: E402


def _shared_default_ssl_context() -> Any:
    """Every ``httpx.get`` of a test builds a client, and with it an SSL context that loads certifi's
    CA bundle: 250-290 ms a call on two loaded cores (0.4 ms shared), most of some modules' time.
    The default context (verify=True, no client cert) is the same every time, so the tests share one;
    any other ``verify`` is built as httpx builds it. Tests only: the service's clients are long-lived."""
    build = _httpx_transport.create_ssl_context
    shared: list[Any] = []

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env)
        if not shared:
            shared.append(build(verify=True, cert=None, trust_env=trust_env))
        return shared[0]

    return create_ssl_context


if hasattr(_httpx_transport, "create_ssl_context"):
    _httpx_transport.create_ssl_context = _shared_default_ssl_context()

# Hypothesis's per-example deadline (200 ms) is a wall-clock assertion: on two shared cores a property
# that parses a config per example failed it once under load. Tests never assert speed.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# `make test` runs the suite on four pytest-xdist workers (Makefile). A worker is a session of its own, with its own
# Ray: every module with a test on the session's cluster is in one group, on one worker, in file order,
# so one shared cluster runs at a time on two cores (a module that needs one node and not Ray runs the
# node in process, tests/localnode.py, outside that group). Every other module is a group of its own (its
# tests in file order, its module fixtures set up once), dealt to whichever worker is free: the core, the
# keeper's parts, `up` with a local Ray of its own, the render worker with Chromium, and
# tests/actors/test_cluster.py, which grows a cluster of its own nodes on its worker's Ray (its tests
# each set up the membership they need), and the keeper's crash tests, which deploy on whichever Ray
# their worker has (they kill and restart that node's processes: a group of their own keeps the
# shared group, the suite's longest, shorter), and tests/actors/test_netns_cluster.py, which runs a Ray of
# its own in network namespaces (tests/netns.py) and never touches its worker's. xdist's own
# `--dist loadgroup` does not take here (pytest 9.2 no longer lets it rename test ids), so the groups are
# a scheduler's, drawn from each module's source.
TESTS = Path(__file__).resolve().parent
OWN_CLUSTER = {"tests/actors/test_cluster.py", "tests/actors/keeper/test_actor.py",
               "tests/actors/test_netns_cluster.py"}
# Modules that skip where the machine cannot run them (no root, no namespaces): the summary says why,
# even without -rs.
SAYS_WHY_SKIPPED = {"tests/actors/test_netns_cluster.py"}


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


@functools.cache
def shares_cluster(module: str) -> bool:
    """A module names the shared cluster's fixture itself (the collection checks that no other does)."""
    path = TESTS.parent / module
    return module not in OWN_CLUSTER and path.is_file() and "ray_cluster" in path.read_text()


# Longest groups first (longest processing time first): the scheduler deals groups in collection order
# to whichever worker is free, so a long group dealt last decides when the suite ends. Seconds each in
# a clean run on four workers, two cores (2026-12-05): the namespace cluster ~150, the shared Ray
# cluster's group ~70, the keeper's crash tests ~55, the render worker with Chromium ~75, `up` with its
# own Ray ~110-165, the grown cluster ~75, then the modules that wait most (a grace, a timeout, a window
# of real time: 8-60 s each, most of it asleep); the rest keep file order and fill the ends. `up` is
# dealt fifth, once a lane is free: its `ray start` waits a fixed 30 s for its raylet to register, and
# the first minute, when the other Ray groups start their own and four workers collect, is the
# busiest of the run.
LONGEST_FIRST = ("tests/actors/test_netns_cluster.py", "ray", "tests/actors/keeper/test_actor.py",
                 "tests/worker/test_render.py", "tests/cli/test_main.py", "tests/actors/test_cluster.py",
                 "tests/sim/test_sim.py", "tests/actors/test_deploy.py", "tests/worker/test_e2e.py",
                 "tests/api/test_render_queue.py",
                 "tests/api/bot/test_middleware.py", "tests/worker/test_pool.py", "tests/api/admin/test_console.py",
                 "tests/api/admin/test_routes.py", "tests/actors/store/test_rebalance.py", "tests/api/test_sitemaps.py",
                 "tests/api/bot/test_unchanged_renders.py", "tests/serving/test_markdown_inert.py",
                 "tests/worker/test_client.py", "tests/api/bot/test_memo_protocol.py", "tests/api/bot/test_memo.py",
                 "tests/worker/test_cli.py", "tests/sitemaps/test_parser.py", "tests/api/test_render_guard.py",
                 "tests/actors/store/test_catchup.py", "tests/actors/walker/test_walk.py")


def longest_first(module: str) -> int:
    group = "ray" if shares_cluster(module) else module
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: longest_first(module_of(item.nodeid)))  # stable: file order within a rank
    hidden = sorted({module_of(i.nodeid) for i in items if "ray_cluster" in getattr(i, "fixturenames", ())
                     and not shares_cluster(module_of(i.nodeid)) and module_of(i.nodeid) not in OWN_CLUSTER})
    if hidden:
        raise pytest.UsageError(f"{', '.join(hidden)}: reach the shared Ray cluster through another fixture; "
                                "take `ray_cluster` in the module too, so it runs in the cluster's group")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    said = sorted({(module_of(r.nodeid), str(r.longrepr[2])) for r in terminalreporter.stats.get("skipped", [])
                   if module_of(r.nodeid) in SAYS_WHY_SKIPPED and isinstance(r.longrepr, tuple)})
    for module, reason in said:
        terminalreporter.write_line(f"SKIPPED {module}: {reason.removeprefix('Skipped: ')}", yellow=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = module_of(nodeid)
            return "ray" if shares_cluster(module) else module

    return ModuleGroups(config, log)


@pytest.fixture(scope="session")
def ray_cluster():
    cluster = RayCluster.start()
    yield cluster
    cluster.shutdown()
