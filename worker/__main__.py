"""``python -m prerender_ray.worker --queue URL ...``: the same as ``prerender-ray render``."""

import argparse
import sys

from prerender_ray.worker.main import main
from prerender_ray.worker.options import add_arguments


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prerender-ray render", description="Run a render worker.")
    add_arguments(p)
    return main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
