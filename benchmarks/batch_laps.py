"""Where a small batch's seconds go, table by table: ``user_clicks`` with the raw
archive on, 30,000 events on 2 partitions, 2,000 per trigger (15 batches), in one
warm session; the medians of the ledger's per-batch laps (batch 0, JIT-cold,
left out).

    .venv/bin/python -m benchmarks.batch_laps [--events 30000] [--per-batch 2000]

Laps: ``spark`` (the batch's one action: Kafka scan, aggregation, the changelog's
files), ``prepare``, ``dead_letter``, ``raw`` (the offset range read again and
appended), ``changelog`` (its commit), ``state`` (the MERGE). Writes its section
of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import yaml
from deltalake import DeltaTable

from benchmarks.report import machine, scratch_broker, write_section
from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

LAPS = ("spark", "prepare", "dead_letter", "raw", "changelog", "state")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--per-batch", type=int, default=2_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with scratch_broker("bench-laps-") as (work, info):
        config = {"bootstrap.servers": info.bootstrap_servers}
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 2)
        now = int(time.time())
        values = [
            json.dumps({"user_id": f"u{i % 300}", "timestamp": now - 250 + i % 200}).encode()
            for i in range(args.events)
        ]
        kafka_admin.produce_all(config, "clicks", ((None, v, now * 1000) for v in values))
        data = yaml.safe_load((REPO_ROOT / "include/pipelines/user_clicks.yaml").read_text())
        data["source"].update(
            {"topics": ["clicks"], "archive": True, "max_offsets_per_trigger": args.per_batch}
        )
        (work / "user_clicks.yaml").write_text(yaml.safe_dump(data))
        settings = replace(
            load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=work / "wh"
        )
        spark = get_spark("local[2]", "bench-laps")
        run_pipeline(spark, load_pipeline(str(work / "user_clicks.yaml"), work), settings)
        rows = DeltaTable(str(work / "wh" / "user_clicks" / "_ledger")).to_pyarrow_table()
        details = [
            json.loads(r["details"]) for r in rows.to_pylist() if r["entry_type"] == "batch"
        ][1:]
        spark.stop()
    medians = {lap: statistics.median(d["timings"].get(lap, 0.0) for d in details) for lap in LAPS}
    batch = statistics.median(d["seconds"] for d in details)
    lines = [
        "## Where a small batch's seconds go, table by table",
        "",
        f"Command: `.venv/bin/python -m benchmarks.batch_laps --events {args.events} "
        f"--per-batch {args.per_batch}`",
        "",
        f"Machine: {machine()}. `user_clicks` with the raw archive, {args.events:,} events on "
        f"2 partitions, {args.per_batch:,} per trigger, one warm session; medians of "
        f"{len(details)} batches (batch 0 left out), seconds.",
        "",
        "| batch | " + " | ".join(LAPS) + " |",
        "|---" * (len(LAPS) + 1) + "|",
        f"| {batch:.2f} | " + " | ".join(f"{medians[lap]:.3f}" for lap in LAPS) + " |",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.no_write:
        write_section(report)


if __name__ == "__main__":
    main()
