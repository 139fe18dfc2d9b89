"""The per-URL path of a bot hit compiled with mypyc (issue 37), and the guard that keeps a stale
build from ever running.

``make install`` compiles the modules listed in ``modules.txt`` in place (``build.py``): each gets an
extension module beside its source, which Python's import prefers, and all share one library
(``prerender_ray/native__mypyc``). The build writes ``manifest.json`` with each source's hash, or,
when it could not compile (no C compiler, no Python headers), why not.

``install()`` runs when the package is first imported, before any listed module. The compiled
modules are used only when every listed source still has its manifest hash; otherwise (a source
edited after the build, a build that failed, ``PRERENDER_RAY_NATIVE=0``) every listed module is
loaded from its source. All or none: compiled modules call each other's functions directly, so one
module loaded from a newer source among compiled callers would still run old code for them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent  # prerender_ray/
ROOT = PACKAGE.parent  # the checkout: modules.txt lists paths from here
MODULES = HERE / "modules.txt"
MANIFEST = HERE / "manifest.json"
SWITCH = "PRERENDER_RAY_NATIVE"  # "0": run the sources even where a fresh build exists

state = "source"  # what this process runs: "compiled", or "source" and why (``install``)


def listed(modules: Path = MODULES) -> list[str]:
    """The listed source paths, relative to the checkout."""
    return [line.strip() for line in modules.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def module_name(path: str) -> str:
    """``prerender_ray/api/bot/lane.py`` -> ``prerender_ray.api.bot.lane`` (a C source's likewise)."""
    return path.rpartition(".")[0].replace("/", ".")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale(manifest: dict, root: Path, paths: Sequence[str]) -> list[str]:
    """The listed sources that differ from the build (every one, when the build compiled nothing
    or compiled another list)."""
    built = manifest.get("sources") if manifest.get("compiled") else None
    if not isinstance(built, dict) or sorted(built) != sorted(paths):
        return list(paths)
    out = []
    for p in paths:
        try:
            if digest(root / p) != built[p]:
                out.append(p)
        except OSError:
            out.append(p)
    return out


class SourceFirst(importlib.abc.MetaPathFinder):
    """Loads the listed modules from their sources, ahead of the extension modules beside them."""

    def __init__(self, sources: dict[str, Path]):
        self.sources = sources

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        src = self.sources.get(fullname)
        return None if src is None else importlib.util.spec_from_file_location(fullname, src)


def extension(name: str) -> ModuleType | None:
    """The C extension ``prerender_ray.native.<name>`` (``<name>.c`` in the list) where the listed
    modules run compiled; else None, and its caller keeps its Python reference."""
    if state != "compiled":
        return None
    return importlib.import_module(f"{__name__}.{name}")


def install() -> str:
    """Decide, once per process, whether the listed modules load compiled or from source; returns
    and keeps in ``state`` what was decided."""
    global state
    try:
        paths = listed()
    except OSError:  # not a checkout (no list): nothing was compiled
        state = "source: no list of compiled modules"
        return state
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        manifest = {}
    if os.environ.get(SWITCH) == "0":
        why = f"{SWITCH}=0"
    elif not manifest:
        why = "not built (make install builds it)"
    elif not manifest.get("compiled"):
        why = f"the build could not compile: {manifest.get('reason', 'unknown')}"
    else:
        changed = stale(manifest, ROOT, paths)
        why = f"changed since the build: {', '.join(changed[:3])}" if changed else ""
    if not why:
        state = "compiled"
        return state
    if not any(isinstance(f, SourceFirst) for f in sys.meta_path):
        # a C source's extension has no Python source: it is simply not imported (``state``)
        sys.meta_path.insert(0, SourceFirst({module_name(p): ROOT / p for p in paths if p.endswith(".py")}))
    state = f"source: {why}"
    return state


__all__ = ["MANIFEST", "MODULES", "SWITCH", "SourceFirst", "extension", "install", "listed", "module_name", "stale",
           "state"]
