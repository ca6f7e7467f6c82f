"""What every benchmark shares: docs/benchmarks.md, where each owns one ``## ``
section and replaces only that (appended when new), and a scratch broker."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil

from jobs import broker
from jobs.broker import BrokerInfo
from jobs.settings import REPO_ROOT

RESULTS = REPO_ROOT / "docs" / "benchmarks.md"
TITLE = "# Benchmarks"


def machine() -> str:
    memory_gib = psutil.virtual_memory().total / 2**30
    return (
        f"{os.cpu_count()} cores, {memory_gib:.0f} GiB RAM, {platform.platform()}, "
        f"Python {platform.python_version()}"
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def best_runs(
    results: dict[str, list[dict[str, float]]], columns: dict[str, str]
) -> list[list[str]]:
    """Per variant, its fastest run (events/s): the variant's name and each of
    ``columns`` (a measure and its format)."""
    rows = []
    for name, runs in results.items():
        best = max(runs, key=lambda r: r["events_per_s"])
        rows.append([name, *(format(best[key], spec) for key, spec in columns.items())])
    return rows


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


@contextmanager
def scratch_broker(prefix: str) -> Iterator[tuple[Path, BrokerInfo]]:
    """A scratch directory with a fresh embedded broker in it, both gone afterwards
    (every benchmark measures on its own broker, as a scheduled run finds one)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    info = broker.start(work / "broker", broker.find_free_port())
    try:
        yield work, info
    finally:
        broker.stop(work / "broker")
        shutil.rmtree(work, ignore_errors=True)
