"""Soak: thousands of small batches with ``maintain`` scheduled in between. Batch
latency must stay flat and files on disk bounded.

    .venv/bin/python -m benchmarks.soak [--batches 2000] [--every 200] [--per-batch 200]

``user_clicks`` (windowed), ``--per-batch`` recent click events per batch. The
stream runs ``--every`` batches at a time (available-now over a backlog, one batch
per ``max_offsets_per_trigger``), then ``maintain`` runs (rewind horizon 2
minutes, reader grace 0: nothing else runs then), and so on. Reports p50/p99 batch
seconds of the first and the last 100 batches and the files on disk after each
round. Writes its section of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from benchmarks.report import machine, scratch_broker, write_section
from jobs import kafka_admin
from jobs.operations.maintain import files_on_disk, run_maintain
from jobs.pipeline.parser import load_pipeline
from jobs.settings import load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark
from jobs.warehouse import Location


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def disk(root: Path) -> tuple[int, int]:
    """(parquet files of every table, all files under the application)."""
    tables = sum(
        files_on_disk(Location.local_path(root / t))
        for t in ("state", "changelog", "dead_letter", "_ledger")
    )
    return tables, sum(1 for p in root.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--per-batch", type=int, default=200)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    latencies: list[float] = []
    rounds: list[dict[str, float]] = []
    with scratch_broker("bench-soak-") as (work, info):
        settings = dataclasses.replace(
            load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=work / "wh"
        )
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 2)
        base = load_pipeline("user_clicks", settings.pipelines_dir)
        pipeline = dataclasses.replace(
            base,
            max_offsets_per_trigger=args.per_batch,
            rewind_horizon_seconds=120,
            reader_grace_hours=0,
        )
        spark = get_spark("local[2]", "benchmark-soak")
        root = Path(settings.warehouse / pipeline.application_id)
        for round_ in range(args.batches // args.every):
            now = int(time.time())
            events = (
                (
                    None,
                    json.dumps({"user_id": f"u{i % 500}", "timestamp": now - i % 60}).encode(),
                    None,
                )
                for i in range(args.every * args.per_batch)
            )
            kafka_admin.produce_all(config, "clicks", events)
            summary = run_pipeline(spark, pipeline, settings)
            seconds = [
                json.loads(b.ledger["details"])["seconds"]
                for b in summary.batches
                if not b.skipped and b.ledger["records_in"]
            ]
            latencies += seconds
            before = disk(root)
            started = time.monotonic()
            run_maintain(pipeline, settings, f"soak round {round_}", False, echo=lambda _: None)
            after = disk(root)
            rounds.append(
                {
                    "batches": len(latencies),
                    "round_p50": statistics.median(seconds),
                    "table_files_before": before[0],
                    "table_files_after": after[0],
                    "all_files_after": after[1],
                    "maintain_s": time.monotonic() - started,
                }
            )
            print(rounds[-1], flush=True)
        spark.stop()
    report = render(args, latencies, rounds)
    print(report)
    if not args.no_write:
        write_section(report)


def render(args: argparse.Namespace, latencies: list[float], rounds: list[dict[str, float]]) -> str:
    first, last = latencies[:100], latencies[-100:]
    lines = [
        "## Soak: small batches with maintain scheduled",
        "",
        f"Command: `.venv/bin/python -m benchmarks.soak --batches {args.batches} "
        f"--every {args.every} --per-batch {args.per_batch}`",
        "",
        f"Machine: {machine()}; warm JVM. `user_clicks`, {args.per_batch} recent events per "
        f"batch, {len(latencies)} batches; `maintain` after every {args.every} batches "
        "(rewind horizon 2 minutes, reader grace 0 since nothing else runs then).",
        "",
        "| batches | p50 s | p99 s |",
        "|---|---|---|",
        f"| first 100 | {statistics.median(first):.2f} | {p99(first):.2f} |",
        f"| last 100 | {statistics.median(last):.2f} | {p99(last):.2f} |",
        "",
        "| after batch | round p50 s | table files before maintain | after | all files "
        "under the application | maintain s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rounds:
        lines.append(
            f"| {r['batches']:.0f} | {r['round_p50']:.2f} | {r['table_files_before']:.0f} "
            f"| {r['table_files_after']:.0f} | {r['all_files_after']:.0f} "
            f"| {r['maintain_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
