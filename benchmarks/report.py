"""docs/benchmarks.md is shared by every benchmark: each owns one ``## `` section
and replaces only that section (appended when new), keeping the others."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil

from jobs.settings import REPO_ROOT

RESULTS = REPO_ROOT / "docs" / "benchmarks.md"
TITLE = "# Benchmarks"


def machine() -> str:
    memory_gib = psutil.virtual_memory().total / 2**30
    return (
        f"{os.cpu_count()} cores, {memory_gib:.0f} GiB RAM, {platform.platform()}, "
        f"Python {platform.python_version()}"
    )


def write_section(section: str, path: Path = RESULTS) -> None:
    """``section`` starts with its ``## heading`` line."""
    heading = section.splitlines()[0]
    assert heading.startswith("## "), heading
    text = path.read_text() if path.exists() else TITLE + "\n"
    parts = text.split("\n## ")
    head, sections = parts[0], ["## " + p for p in parts[1:]]
    body = section.rstrip() + "\n"
    for i, existing in enumerate(sections):
        if existing.splitlines()[0] == heading:
            sections[i] = body
            break
    else:
        sections.append(body)
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join([head.rstrip() + "\n", *[s.rstrip() + "\n" for s in sections]]))
