"""``python -m prerender_ray.native.build``: compile the modules of ``modules.txt`` with mypyc, in
place, and write the manifest the import guard reads (``prerender_ray/native/__init__.py``).

``make install`` runs it. Where it cannot compile (no C compiler, no Python headers, mypyc refusing
a module) it says why, removes what a previous build left, writes a manifest saying so, and exits 0:
the service then runs the same modules from source. ``--require`` exits 1 instead.

The manifest is removed first and written last, with the hashes of the sources as they were when
the build began: an interrupted build, or a source edited while it ran, leaves the sources in use.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

from prerender_ray.native import MANIFEST, PACKAGE, ROOT, digest, listed, module_name

GROUP = "prerender_ray.native"  # the shared library: prerender_ray/native__mypyc.<abi>.so
BUILD_DIR = ROOT / "build" / "native"
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def outputs(paths: list[str]) -> list[Path]:
    """What a build leaves in the tree: an extension module beside each source, the shared library."""
    return [ROOT / (module_name(p).replace(".", "/") + SUFFIX) for p in paths] + \
        [ROOT / (GROUP.replace(".", "/") + "__mypyc" + SUFFIX)]


def clean(package: Path = PACKAGE) -> None:
    """Remove the manifest, then every extension module in the package, the shared library and the
    mapped layers' included: one left from a build of a longer list would shadow its source and fail
    at import."""
    MANIFEST.unlink(missing_ok=True)
    for top, _, names in os.walk(package, followlinks=True):
        for name in names:
            if name.endswith(SUFFIX):
                (Path(top) / name).unlink(missing_ok=True)


def compile_in_place(paths: list[str], log: io.StringIO) -> None:
    from mypyc.build import mypycify  # mypy's compiler: in the lock with the test tools
    from setuptools import Extension, setup

    with contextlib.chdir(ROOT), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        extensions = mypycify([p for p in paths if p.endswith(".py")], opt_level="3", group_name=GROUP,
                              target_dir=str(BUILD_DIR))
        # a C source is an extension of its own, named by its path (native/lane_page.c)
        extensions += [Extension(module_name(p), [p], extra_compile_args=["-O2"]) for p in paths if p.endswith(".c")]
        setup(name="prerender-ray-native", packages=[], ext_modules=extensions,
              script_args=["build_ext", "--inplace", "--build-temp", str(BUILD_DIR / "temp"),
                           "--build-lib", str(BUILD_DIR / "lib")])


def build(require: bool = False) -> int:
    paths = listed()
    clean()
    sources = {p: digest(ROOT / p) for p in paths}
    started = time.monotonic()
    log = io.StringIO()
    try:
        compile_in_place(paths, log)
        missing = [str(p.relative_to(ROOT)) for p in outputs(paths) if not p.exists()]
        if missing:
            raise RuntimeError(f"the build left no extension for {', '.join(missing[:3])}")
    except (Exception, SystemExit) as e:  # setuptools reports a compiler failure as SystemExit
        clean()
        tail = [line for line in log.getvalue().splitlines() if line.strip()][-5:]
        reason = f"{type(e).__name__}: {str(e)[:300]}"
        MANIFEST.write_text(json.dumps({"compiled": False, "reason": reason}, indent=1) + "\n")
        print(f"prerender-ray: the native build could not compile ({reason}); the same modules run from "
              "source", *tail, sep="\n  ", file=sys.stderr)
        return 1 if require else 0
    MANIFEST.write_text(json.dumps({"compiled": True, "sources": sources}, indent=1) + "\n")
    print(f"prerender-ray: {len(paths)} modules compiled (mypyc, C) in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prerender_ray.native.build", description=__doc__)
    parser.add_argument("--require", action="store_true", help="exit 1 when the modules cannot be compiled")
    return build(parser.parse_args(argv).require)


if __name__ == "__main__":
    sys.exit(main())
