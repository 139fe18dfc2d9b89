"""The compiled per-URL path (prerender_ray/native): the guard that runs a source edited after the
build instead of its stale extension, and the build compiling where the machine can."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from prerender_ray import native
from prerender_ray.native import build

PATHS = native.listed()
PROBE = ("import json, prerender_ray.native as n, prerender_ray.api.bot.lane as lane, "
         "prerender_ray.identity.urls as urls; "
         "print(json.dumps([n.state, lane.__spec__.origin, urls.__spec__.origin, getattr(urls, 'EDITED', 0)]))")


def manifest() -> dict:
    try:
        return json.loads(native.MANIFEST.read_text())
    except (OSError, ValueError):
        return {}


def probe(root: Path, **env: str) -> list:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=root,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), **env})
    return json.loads(out.stdout)


def copy_checkout(dest: Path) -> Path:
    """The package and its mapped layers, built extensions included, under ``dest``."""
    for name in ("prerender_ray", "actors", "api", "cli", "worker"):
        shutil.copytree(native.ROOT / name, dest / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "static"))
    return dest


def test_the_list_names_modules_of_the_package() -> None:
    assert "prerender_ray/api/bot/lane.py" in PATHS and len(PATHS) == len(set(PATHS))
    for p in PATHS:
        assert (native.ROOT / p).is_file(), p
    assert native.module_name("prerender_ray/api/bot/lane.py") == "prerender_ray.api.bot.lane"


def test_stale_names_what_changed_since_the_build(tmp_path: Path) -> None:
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(f"# {name}\n")
    built = {"compiled": True, "sources": {p: native.digest(tmp_path / p) for p in ("a.py", "b.py")}}
    assert native.stale(built, tmp_path, ["a.py", "b.py"]) == []
    (tmp_path / "b.py").write_text("# edited\n")
    assert native.stale(built, tmp_path, ["a.py", "b.py"]) == ["b.py"]
    (tmp_path / "a.py").unlink()
    assert native.stale(built, tmp_path, ["a.py", "b.py"]) == ["a.py", "b.py"]
    # a build of another list, or one that compiled nothing, covers none of them
    assert native.stale(built, tmp_path, ["b.py"]) == ["b.py"]
    assert native.stale({"compiled": False, "reason": "no compiler"}, tmp_path, ["a.py"]) == ["a.py"]


def test_this_process_runs_what_the_manifest_allows() -> None:
    m = manifest()
    fresh = bool(m.get("compiled")) and not native.stale(m, native.ROOT, PATHS)
    origin = importlib.import_module("prerender_ray.identity.urls").__spec__.origin
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if fresh and native.state == "compiled":
        assert origin.endswith(suffix)
    else:
        assert native.state.startswith("source") and origin.endswith(".py")


def test_a_source_edited_after_the_build_runs_instead_of_its_extension(tmp_path: Path) -> None:
    if not manifest().get("compiled"):
        pytest.skip("no compiled build here (prerender_ray/native/manifest.json)")
    root = copy_checkout(tmp_path)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    state, lane, urls, edited = probe(root)
    assert state == "compiled" and lane.endswith(suffix) and urls.endswith(suffix) and edited == 0
    # the switch: the sources, every one
    state, lane, urls, _ = probe(root, PRERENDER_RAY_NATIVE="0")
    assert state == "source: PRERENDER_RAY_NATIVE=0" and lane.endswith(".py") and urls.endswith(".py")
    # one listed source edited: all of them from source (compiled callers would run its old code)
    with (root / "prerender_ray/identity/urls.py").open("a") as f:
        f.write("\nEDITED = 1\n")
    state, lane, urls, edited = probe(root)
    assert state == "source: changed since the build: prerender_ray/identity/urls.py"
    assert lane.endswith("lane.py") and urls.endswith("urls.py") and edited == 1


def test_a_c_source_edited_after_the_build_leaves_its_extension_unused(tmp_path: Path) -> None:
    if not manifest().get("compiled"):
        pytest.skip("no compiled build here (prerender_ray/native/manifest.json)")
    root = copy_checkout(tmp_path)
    answer = "import prerender_ray.api.bot.lane as lane; print(json.dumps([lane._answer.__module__ or '']))"
    run = [sys.executable, "-c", "import json; " + answer]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    out = subprocess.run(run, capture_output=True, text=True, check=True, cwd=root, env=env)
    assert json.loads(out.stdout) == ["prerender_ray.native.lane_page"]  # the C answer
    with (root / "prerender_ray/native/lane_page.c").open("a") as f:
        f.write("\n/* edited */\n")
    assert probe(root)[0] == "source: changed since the build: prerender_ray/native/lane_page.c"
    out = subprocess.run(run, capture_output=True, text=True, check=True, cwd=root, env=env)
    assert json.loads(out.stdout) == ["prerender_ray.api.bot.lane"]  # the reference, from source


def test_a_build_first_removes_every_extension_a_longer_list_left(tmp_path: Path, monkeypatch) -> None:
    """An extension left beside a module no longer listed would shadow its source (and fail at
    import, its shared library gone): the build removes every one, through the mapped layers too."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    package, layer = tmp_path / "prerender_ray", tmp_path / "api"
    (package / "storage").mkdir(parents=True)
    (layer / "bot").mkdir(parents=True)
    (package / "api").symlink_to(layer)
    left = [package / "storage" / f"pages{suffix}", layer / "bot" / f"lane{suffix}"]
    kept = [package / "storage" / "pages.py", package / "storage" / "notes.txt"]
    for p in left + kept:
        p.write_bytes(b"x")
    monkeypatch.setattr(build, "MANIFEST", tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text("{}")
    build.clean(package)
    assert not any(p.exists() for p in left) and all(p.exists() for p in kept)
    assert not (tmp_path / "manifest.json").exists()


def test_the_build_compiles_where_the_machine_can() -> None:
    """A machine with a C compiler and Python's headers runs the compiled path: the build must not
    fall back to the sources there unnoticed (CI installs gcc)."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("gcc") or shutil.which("cc")) or not headers.exists():
        pytest.skip("no C compiler or no Python headers: the sources run")
    m = manifest()
    assert m.get("compiled") is True, f"make install did not compile prerender_ray/native: {m}"
    assert all(p.exists() for p in build.outputs(PATHS))
