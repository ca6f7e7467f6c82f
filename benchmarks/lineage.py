"""What replaying the coverage costs as the ledger grows (``jobs/lineage.py``):
every planner, ``verify`` and ``status`` build it from the ledger's batch rows.

    .venv/bin/python -m benchmarks.lineage [--batches 10000,100000] [--partitions 4]

A year of 5-minute batches is 105,000 rows. Each size: two epochs (a rebuild
between them), the history and its head, the boundaries and a rewind's choice
among them, and the judgments a backfill broadcasts. Pure Python, no Spark.
Writes its section of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime

from benchmarks.report import machine, write_section
from jobs.lineage import BatchEntry, History, Step


def measure(batches: int, partitions: int) -> dict[str, float]:
    parts = [("t", p) for p in range(partitions)]
    half = batches // 2
    rows = [
        BatchEntry(
            0 if b < half else 1,
            b if b < half else b - half,
            {tp: 10 * b for tp in parts},
            {tp: 10 * (b + 1) for tp in parts},
            0,
            b,
            b,
        )
        for b in range(batches)
    ]
    steps = {1: Step("keep", (0, half - 1), state_version=batches)}
    laps: dict[str, float] = {}
    started = time.perf_counter()
    history = History(rows, steps, 1)
    head = history.head
    laps["history and head"] = time.perf_counter() - started
    started = time.perf_counter()
    points = history.boundaries({1: ({tp: 10 * half for tp in parts}, 0)})
    history.latest_before(points, {tp: 10 * batches // 3 for tp in parts})
    laps["boundaries and a rewind's choice"] = time.perf_counter() - started
    started = time.perf_counter()
    head.decisions()
    head.judged()
    laps["a backfill's judgments and ranges"] = time.perf_counter() - started
    return laps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="10000,100000")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    sizes = [int(s) for s in args.batches.split(",")]
    results = {n: measure(n, args.partitions) for n in sizes}
    names = list(next(iter(results.values())))
    lines = [
        "## Coverage: its cost as the ledger grows",
        "",
        f"{datetime.now():%Y-%m-%d}, {machine()}: `python -m benchmarks.lineage --batches "
        f"{args.batches} --partitions {args.partitions}` (seconds, pure Python).",
        "",
        "| batch rows | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for n, laps in results.items():
        lines.append(f"| {n:,} | " + " | ".join(f"{laps[k]:.2f}" for k in names) + " |")
    write_section("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
