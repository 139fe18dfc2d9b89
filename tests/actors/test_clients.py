"""Calls between processes go through the typed clients: ``.remote(`` is written only in a client
class (``*Client``) or in ``spawn`` (where an actor is created), and every client method has its
deadline built in. Read from the source, so a raw call added anywhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import prerender_ray
from tests.support import parse_python

ROOT = Path(prerender_ray.__file__).resolve().parent.parent
TREES = ("actors", "api", "cli", "worker", "prerender_ray")


def _sources() -> list[Path]:
    out = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[0] == "prerender_ray" and len(rel.parts) > 1 and rel.parts[1] in TREES:
                continue  # the layers' symlinks: read once, under their own name
            out.append(path)
    return out


def raw_calls(source: str, name: str = "<source>") -> list[str]:
    """``x.remote(...)`` calls outside a ``*Client`` class and outside ``spawn``; ``ray.remote(Cls)``
    (an actor class's Ray shell) is not a call to an actor."""
    found: list[str] = []

    def visit(node: ast.AST, allowed: bool) -> None:
        if isinstance(node, ast.ClassDef):
            allowed = allowed or node.name.endswith("Client")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "spawn":
            allowed = True
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remote"
              and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "ray") and not allowed):
            found.append(f"{name}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, allowed)

    visit(parse_python(source), False)
    return found


def test_remote_is_written_only_in_the_typed_clients() -> None:
    sources = _sources()
    assert len(sources) > 100
    found = [hit for path in sources for hit in raw_calls(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


def test_the_check_finds_a_raw_call() -> None:
    """The check above can fail: a raw call in an actor's method, in a plain function and in a
    lambda is found; the same call in a client, in ``spawn`` or as ``ray.remote(Cls)`` is not."""
    raw = '''
class Walker:
    async def run(self):
        await self.store.get.remote([b"k"])

def helper(handle):
    return handle.status.remote()

later = lambda h: h.close.remote()
'''
    assert raw_calls(raw) == ["<source>:4", "<source>:7", "<source>:9"]
    allowed = '''
import ray

class StoreClient:
    async def get(self, keys):
        return await call(self.handle.get.remote(keys), self.deadline_s)

def spawn(actor, options, *args):
    return actor.options(**options).remote(*args)

Shell = ray.remote(Walker)
'''
    assert raw_calls(allowed) == []
