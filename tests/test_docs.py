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


# [text](target) in Markdown, outside code; a target with a scheme (https:, mailto:) is not ours.
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def markdown_docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def relative_links(path: Path) -> list[tuple[int, str]]:
    out = []
    fenced = False
    for n, line in enumerate(lines_of(path), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out += [(n, m.group(1)) for m in MD_LINK.finditer(INLINE_CODE.sub("", line))
                    if not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1))]
    return out


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    bad = []
    count = 0
    for doc in markdown_docs():
        for n, target in relative_links(doc):
            count += 1
            name, _, anchor = target.partition("#")
            dest = (doc.parent / name).resolve() if name else doc
            where = f"{doc.relative_to(REPO)}:{n}: {target}"
            if not dest.exists():
                bad.append(where + " (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(where + " (no such heading)")
    assert not bad, "\n".join(bad)
    assert count > 50


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# Top\n[ok](#top) [gone](nowhere.md) `[code](skipped.md)` [web](https://example.com)\n"
                   "```\n[fenced](skipped.md)\n```\n")
    assert relative_links(doc) == [(2, "#top"), (2, "nowhere.md")]


ARCHITECTURE = REPO / "docs/architecture.md"
MAPPED = ("prerender_ray", "actors", "api", "worker", "cli")  # the trees whose every module is mapped
PATH_IN_CODE = re.compile(r"`((?:prerender_ray|actors|api|worker|cli|tests|bench|docs)/[\w./-]*)`")


def module_map() -> set[str]:
    """Every file and folder the module map names, as a path: a folder at the start of a line (at the
    top level, or indented two more than the folder it sits in) holds the names that follow it; a line
    indented as a folder but naming none holds names of the folder above it, and a line indented
    further continues the folder before it."""
    text = ARCHITECTURE.read_text()
    block = text[text.index("## Module map"):]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```")]
    named: set[str] = set()
    folders: dict[int, str] = {}  # indent -> folder path at that depth
    base = ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        head = re.match(r"\s*([\w.]+/)(?=\s)", line)
        rest = line
        if head and indent % 2 == 0 and indent <= 2 * len(folders):
            folders = {k: v for k, v in folders.items() if k < indent}
            base = folders[indent] = folders.get(indent - 2, "") + head.group(1)
            rest = line[head.end():]
        elif indent in folders:
            base = folders.get(indent - 2, "")
        named |= {base + f for f in re.findall(r"(?<![\w/])([a-z_]\w*\.py)\b", rest)}
        named |= {base + d for d in re.findall(r"(?<![\w/])([a-z_]\w*/)(?=[\s,)])", rest)}
        named.add(base)
    return named


def test_every_module_the_architecture_names_exists() -> None:
    named = module_map() | {m.group(1) for line in lines_of(ARCHITECTURE) for m in PATH_IN_CODE.finditer(line)}
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, "docs/architecture.md names what the tree lacks:\n" + "\n".join(missing)
    assert len(named) > 100


def test_every_module_of_the_tree_is_in_the_module_map() -> None:
    named = module_map()
    modules = {p.relative_to(REPO).as_posix() for top in MAPPED for p in (REPO / top).rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py") and ".venv" not in p.parts}
    modules = {m for m in modules if not any(m.startswith(f"prerender_ray/{t}/") for t in MAPPED[1:])}  # symlinks
    unlisted = sorted(modules - named)
    assert not unlisted, "add to the module map in docs/architecture.md:\n" + "\n".join(unlisted)
