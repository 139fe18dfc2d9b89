"""The layers: the core loads no Ray and no HTTP; the mapped layers are importable under the package."""

import ast
import subprocess
import sys
from pathlib import Path

import prerender_ray
from tests.support import parse_python

CORE = Path(prerender_ray.__file__).parent
LAYERS = ("actors", "api", "worker", "cli")  # symlinks into the package (pyproject.toml)


def core_modules() -> list[str]:
    names = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE)
        if rel.parts[0] in LAYERS:
            continue
        parts = ["prerender_ray", *rel.with_suffix("").parts]
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_core_loads_no_ray_and_no_http() -> None:
    modules = core_modules()
    assert "prerender_ray.queue.ranking" in modules and len(modules) > 40
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {m.split(".")[0] for m in out.stdout.split()}
    assert not loaded & {"ray", "httpx", "fastapi", "starlette", "uvicorn", "playwright", "paho"}


def test_the_layers_are_mapped_into_the_package() -> None:
    for layer in LAYERS:
        link = CORE / layer
        assert link.is_symlink() and link.resolve() == (CORE.parent / layer).resolve()


# ------------------------------------------------------------------------------------------- imports

# What the config package may import from the rest of the core: the loader runs the checks that need
# URL, domain and proxy parsing after the model parses. The model itself (the root and its sections'
# modules) imports nothing of ours but itself, so every other module can import it without a cycle.
MODEL_MODULES = {f"prerender_ray.config.{m}" for m in ("model", "base", "service", "origin", "render", "bots",
                                                        "outputs")}
CONFIG_MAY_IMPORT = {
    "prerender_ray.config.loading": {"prerender_ray.identity.routes", "prerender_ray.identity.urls",
                                     "prerender_ray.serving.bots", "prerender_ray.serving.origin_policy",
                                     "prerender_ray.serving.proxies"},
    "prerender_ray.config.overrides": {"prerender_ray.identity.routes"},
}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The core modules a module imports, at any depth (a function's late import counts: it runs),
    except under ``if TYPE_CHECKING:``, which never runs."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:  # `from pkg import module` imports the module, else names from pkg
                sub = f"{node.module}.{a.name}"
                if sub in modules:
                    out.add(sub)
                elif node.module in modules:
                    out.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = set(core_modules())
    graph = {}
    for name in modules:
        rel = Path(*name.split(".")[1:])
        path = CORE / rel / "__init__.py" if (CORE / rel).is_dir() else (CORE / rel).with_suffix(".py")
        graph[name] = _imported(parse_python(path.read_text(encoding="utf-8")), modules) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)):
            return found
    return None


def test_the_core_has_no_import_cycle() -> None:
    graph = import_graph()
    assert graph["prerender_ray.identity.routes"] >= {"prerender_ray.config.model"}  # the walk sees imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    tree = ast.parse("if TYPE_CHECKING:\n    import x\nelse:\n    import y\ndef f():\n    import z\n")
    assert _imported(tree, {"x", "y", "z"}) == {"y", "z"}


def test_the_config_package_sits_below_the_rest_of_the_core() -> None:
    graph = import_graph()
    for name, imports in sorted(graph.items()):
        if name.startswith("prerender_ray.config."):
            outside = {m for m in imports if not m.startswith("prerender_ray.config")}
            assert outside <= CONFIG_MAY_IMPORT.get(name, set()), f"{name} imports {sorted(outside)}"
    for name in MODEL_MODULES:
        assert graph[name] <= MODEL_MODULES, f"{name} imports {sorted(graph[name] - MODEL_MODULES)}"
