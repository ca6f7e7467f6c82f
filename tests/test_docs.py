"""The documentation: README.md and docs/.

Every relative link resolves to a file inside the repository (and its anchor to a
heading of that file), no page refers to material outside the repository, the
README stays one page, and every code block marked ```bash runnable runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
README_MAX_LINES = 250
PAGES = [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]
RUNNABLE = "bash runnable"  # the info string that marks a block the test runs
RUNNABLE_TIMEOUT_S = 60
OUTSIDE = ("../shared", "DESIGN.md")  # material that is not part of this repository

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARKDOWN_LINK = re.compile(  # [text](target "title") and ![alt](target)
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"
    r"\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
HTML_LINK = re.compile(
    r"<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*[\"'](?P<target>[^\"']+)[\"']", re.I
)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1)(?!\n\n)[\s\S])+?\1")  # within a paragraph
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(?P<text>.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    info: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}: {self.target}"


def split_page(page: Path) -> tuple[str, list[Block]]:
    """The page's prose (code blocks blanked, so line numbers stay) and its fenced
    code blocks."""
    lines = page.read_text().splitlines()
    prose = list(lines)
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            line = lines[j]
            body.append(line[indent:] if line[:indent].isspace() else line.lstrip())
            j += 1
        blocks.append(Block(page, i + 1, opening["info"].strip(), "\n".join(body) + "\n"))
        for k in range(i, min(j + 1, len(lines))):
            prose[k] = ""
        i = j + 1
    return "\n".join(prose), blocks


def links(page: Path) -> list[Link]:
    text = split_page(page)[0]
    # Inline code is not a link; blank it (newlines kept, so line numbers stay).
    text = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    return [
        Link(page, text.count("\n", 0, m.start()) + 1, m["target"])
        for pattern in (MARKDOWN_LINK, HTML_LINK)
        for m in pattern.finditer(text)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped except hyphens
    and underscores, spaces to hyphens (markup such as backticks is dropped too)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets -1, -2, ..."""
    names: set[str] = set()
    seen: dict[str, int] = {}
    for line in split_page(page)[0].splitlines():
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading["text"])
        count = seen.get(base, 0)
        names.add(f"{base}-{count}" if count else base)
        seen[base] = count + 1
    return names


def runnable_blocks() -> list[Block]:
    return [b for page in PAGES for b in split_page(page)[1] if b.info == RUNNABLE]


ALL_LINKS = [link for page in PAGES for link in links(page)]
RUNNABLE_BLOCKS = runnable_blocks()


def test_the_pages_exist() -> None:
    names = {p.relative_to(REPO_ROOT).as_posix() for p in PAGES}
    for name in (
        "README.md",
        "docs/architecture.md",
        "docs/pipelines.md",
        "docs/operations.md",
        "docs/deployment.md",
        "docs/monitoring.md",
        "docs/benchmarks.md",
    ):
        assert name in names, f"{name} is missing"


def test_readme_is_one_page() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}"


def test_the_readme_keeps_its_two_commands() -> None:
    """CI's .ci/run runs the README's test command: `make test`."""
    text = README.read_text()
    assert re.search(r"^make demo\b", text, re.M)
    assert re.search(r"^make test\b", text, re.M)
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()


def test_the_pages_have_links() -> None:
    assert len(ALL_LINKS) > 20, "the link extraction found next to nothing"


@pytest.mark.parametrize("link", ALL_LINKS, ids=lambda link: link.where)
def test_relative_links_resolve_inside_the_repository(link: Link) -> None:
    if SCHEME.match(link.target):
        assert link.target.startswith(("http://", "https://")), f"{link.where}: not a web link"
        return
    path, _, anchor = link.target.partition("#")
    assert not path.startswith("/"), f"{link.where}: an absolute path"
    target = (link.page.parent / unquote(path)).resolve() if path else link.page.resolve()
    assert target.is_relative_to(REPO_ROOT), f"{link.where}: leaves the repository"
    assert target.exists(), f"{link.where}: {target.relative_to(REPO_ROOT)} does not exist"
    if anchor:
        assert target.suffix == ".md", f"{link.where}: an anchor into a file that is not a page"
        assert unquote(anchor) in anchors(target), (
            f"{link.where}: no heading of {target.relative_to(REPO_ROOT)} has the anchor #{anchor}"
        )


def test_every_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README.resolve()}, [README]
    while todo:
        page = todo.pop()
        for link in links(page):
            path = link.target.partition("#")[0]
            if not path or SCHEME.match(link.target):
                continue
            target = (page.parent / unquote(path)).resolve()
            if target.suffix == ".md" and target.exists() and target not in reached:
                reached.add(target)
                todo.append(target)
    unreached = [p.relative_to(REPO_ROOT) for p in PAGES if p.resolve() not in reached]
    assert not unreached, f"no link leads to {unreached}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_page_refers_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    for needle in OUTSIDE:
        assert needle not in text, f"{page.relative_to(REPO_ROOT)} mentions {needle}"


def test_the_slug_rule() -> None:
    assert slug("Configuration (environment, prefix `PLATFORM_`)") == (
        "configuration-environment-prefix-platform_"
    )
    assert slug('A pipeline change is refused ("changed but version is still N")') == (
        "a-pipeline-change-is-refused-changed-but-version-is-still-n"
    )
    assert slug("Issue 19: delta-spark (summary, written by hand)") == (
        "issue-19-delta-spark-summary-written-by-hand"
    )


def test_some_blocks_are_runnable() -> None:
    assert len(RUNNABLE_BLOCKS) >= 3, [b.where for b in RUNNABLE_BLOCKS]


@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=lambda b: b.where)
def test_runnable_block_runs(block: Block, tmp_path: Path) -> None:
    home, scratch = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    venv_bin = REPO_ROOT / ".venv" / "bin"
    bin_dir = venv_bin if venv_bin.is_dir() else Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(home),
        TMPDIR=str(scratch),
    )
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUNNABLE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )
