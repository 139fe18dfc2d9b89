"""The repository stands alone: no line cites a note that lives outside it, and every link into docs/
resolves to a file and a heading that exist (GitHub's anchor slugs)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

from tests.support import REPO

# Built from parts, so this file does not cite them itself.
OUTSIDE_NOTES = tuple(n + ".md" for n in ("bot-path", "queue-core", "sitemap-admin", "render-fleet-protocol", "DESIGN"))
SECTION_MARK = "\u00a7"
CHECKED = (".py", ".md", ".js", ".html", ".css", ".toml", ".yaml", ".yml", ".cfg", ".txt")
# docs/<file>.md[#anchor] anywhere; inside docs/ also relative links (<file>.md[#anchor]).
DOCS_LINK = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md)(?:#([\w-]+))?")
RELATIVE_LINK = re.compile(r"\]\(([\w.-]+\.md)?(?:#([\w-]+))?\)")
# "docs/queue.md#targets, #cadence": a bare anchor within two lines of a docs link names that file.
BARE_ANCHOR = re.compile(r"(?:^|(?<=[\s(,]))#([a-z][\w-]*)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def tracked() -> list[Path]:
    """Tracked (and new, not ignored) text files, else every file outside the usual build and venv dirs."""
    try:
        git = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        out = subprocess.run(git, cwd=REPO, capture_output=True, check=True, timeout=30).stdout
        paths = [REPO / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        skip = {".venv", ".git", "node_modules", "__pycache__", "prerender_ray.egg-info"}
        paths = [p for p in REPO.rglob("*") if not skip & set(p.relative_to(REPO).parts)]
    return sorted(p for p in paths if p.is_file() and (p.suffix in CHECKED or p.name == "Makefile"))


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (keeping - and _), spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(doc: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in lines_of(doc):
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str, str | None]]:
    """(line number, docs file name, anchor or None) of every link into docs/ in ``path``."""
    in_docs = path.parent == REPO / "docs"
    out = []
    last: tuple[int, str] | None = None  # (line, file) of the latest docs link
    for n, line in enumerate(lines_of(path), 1):
        found = [(n, m.group(1), m.group(2)) for m in DOCS_LINK.finditer(line)]
        name = found[-1][1] if found else last[1] if last and n - last[0] <= 2 else None
        if name:
            out += [(n, name, m.group(1)) for m in BARE_ANCHOR.finditer(line)]
        if found:
            last = (n, found[-1][1])
        out += found
        if in_docs:
            out += [(n, m.group(1) or path.name, m.group(2)) for m in RELATIVE_LINK.finditer(line)
                    if m.group(1) or m.group(2)]
    return out


def test_no_line_cites_a_note_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    bad = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
           for p in tracked() if p.resolve() != me
           for n, line in enumerate(lines_of(p), 1)
           if SECTION_MARK in line or any(note in line for note in OUTSIDE_NOTES)]
    assert not bad, "cite docs/ (or a test) instead:\n" + "\n".join(bad)


def test_every_link_into_docs_resolves_to_a_file_and_a_heading() -> None:
    bad = []
    count = 0
    for p in tracked():
        for n, name, anchor in links(p):
            count += 1
            doc = REPO / "docs" / name
            where = f"{p.relative_to(REPO)}:{n}: docs/{name}" + (f"#{anchor}" if anchor else "")
            if not doc.is_file():
                bad.append(where + " (no such file)")
            elif anchor is not None and anchor not in anchors(doc):
                bad.append(where + " (no such heading)")
    assert not bad, "\n".join(bad)
    assert count > 20  # the checker sees the links (a broken regex would pass vacuously)


def test_the_slugs_follow_github() -> None:
    assert slug("The bot hot path has no actor hop") == "the-bot-hot-path-has-no-actor-hop"
    assert slug("Planned direction: R holders per URL") == "planned-direction-r-holders-per-url"
    assert slug("`POST /render_queue/claim` answers") == "post-render_queueclaim-answers"
    assert slug("Headers to the origin") == "headers-to-the-origin"
