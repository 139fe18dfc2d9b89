"""The generated references in docs/ are current: the config table (docs/configuration.md, from the
config model) and the route list (docs/admin.md, from the app's OpenAPI schema).

Regenerate both with: .venv/bin/python -m tests.test_docs_reference
"""

from __future__ import annotations

from pathlib import Path

from prerender_ray.config.loading import reference_markdown
from tests.support import REPO

CONFIG = (REPO / "docs/configuration.md", "<!-- config-reference:start -->", "<!-- config-reference:end -->")
ROUTES = (REPO / "docs/admin.md", "<!-- route-reference:start -->", "<!-- route-reference:end -->")
COMMAND = ".venv/bin/python -m tests.test_docs_reference"


def route_markdown() -> str:
    """Every route of the ingress app, as its OpenAPI schema has it: method, path and the first
    paragraph of the endpoint's docstring. The app is built in process on the default config (no Ray:
    create_app only assembles routers); the schema is built even though the port never serves it."""
    from prerender_ray.api.app import create_app
    from prerender_ray.api.context import NodeContext
    from prerender_ray.config.model import Config
    from prerender_ray.identity.nodes import NodeInfo

    ctx = NodeContext(cfg=Config(), node=NodeInfo("n1", "127.0.0.1", 1), data_dir="/nonexistent")
    schema = create_app(ctx).openapi()
    rows = ["| method | path | what it does (the endpoint's docstring) |", "|---|---|---|"]
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            doc = (op.get("description") or "").strip().split("\n\n")[0]
            doc = " ".join(doc.split()).replace("``", "`").replace("|", "\\|") or op.get("summary", "")
            rows.append(f"| {method.upper()} | `{path}` | {doc} |")
    return "\n".join(rows) + "\n"


def _section(path: Path, start: str, end: str) -> str:
    text = path.read_text()
    return text[text.index(start) + len(start):text.index(end)].strip("\n")


def test_the_config_reference_matches_the_model() -> None:
    assert _section(*CONFIG) == reference_markdown().strip("\n"), f"run: {COMMAND}"


def test_the_route_reference_matches_the_app() -> None:
    assert _section(*ROUTES) == route_markdown().strip("\n"), f"run: {COMMAND}"


def test_the_route_reference_lists_the_admin_fleet_and_health_routes() -> None:
    listed = _section(*ROUTES)
    for row in ("| POST | `/render_queue/claim` |", "| POST | `/prerender_admin/explain` |", "| GET | `/healthz` |"):
        assert row in listed  # the generator sees the routers (an empty schema would pass the check above)


def _regenerate(path: Path, start: str, end: str, body: str) -> None:
    text = path.read_text()
    path.write_text(text[:text.index(start) + len(start)] + "\n" + body + text[text.index(end):])


if __name__ == "__main__":
    _regenerate(*CONFIG, reference_markdown())
    _regenerate(*ROUTES, route_markdown())
