"""What the README promises: the CI script runs its test command, and its quickstart shows how to tell
a rendered answer from the origin's. (The generated references live in docs/: tests/test_docs_reference.py.)"""

from __future__ import annotations

import re

from tests.support import REPO


def test_the_ci_script_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = [ln for ln in (REPO / ".ci/run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert ci[-1] == "make test"
    assert re.search(r"^make test\b", readme, re.M)


def test_the_quickstart_shows_how_to_tell_a_rendered_answer_from_the_origins() -> None:
    """The header every answer from a rendered page carries (``queue/results.py`` stores it with the
    page; tests/api/bot/test_middleware.py sees it on a hit), asked for by a curl in the Quickstart."""
    readme = (REPO / "README.md").read_text()
    quickstart = readme[readme.index("## Quickstart"):readme.index("\n## ", readme.index("## Quickstart"))]
    shown = [ln for ln in quickstart.splitlines() if ln.startswith("curl ") and "x-harper-rendered" in ln]
    assert shown, "the Quickstart names no header that marks a rendered answer"
    results = (REPO / "prerender_ray/queue/results.py").read_text()
    assert 'headers["x-harper-rendered"] = "1"' in results

