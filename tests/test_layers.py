"""The layers: the core loads no Ray and no HTTP; the mapped layers are importable under the package."""

import subprocess
import sys
from pathlib import Path

import prerender_ray

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
