"""Maintenance timings on ``user_clicks``: rebuild from Delta vs recompute from Kafka,
and backfill throughput.

    .venv/bin/python -m benchmarks.operations [--events 1000000]

Own broker on a free port; the events (10,000 users over an hour) are streamed
once, then each operation is timed from the command's start until the restarted
stream has verified its state and processed one new event. Appends a section to
docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from benchmarks.report import scratch_broker, write_section
from include.sample_data import click_events, encoded
from jobs import kafka_admin
from jobs.operations.backfill import run_backfill
from jobs.operations.restart import plan_rebuild
from jobs.operations.runner import run_operation
from jobs.operations.targets import TargetSpec
from jobs.pipeline.parser import load_pipeline
from jobs.settings import load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

MARKER = "## Maintenance operations"


def quiet(_text: str) -> None:
    """Plans are not printed during the benchmark."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    timings: dict[str, float] = {}
    with scratch_broker("bench-ops-") as (work, info):
        settings = dataclasses.replace(
            load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=work / "wh"
        )
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 4)
        now = int(time.time())
        events = click_events(args.events, 10_000, 1, now - 3600, 3600)
        kafka_admin.produce_all(config, "clicks", encoded(events, [], 0, "user_id"))
        spark = get_spark(settings.spark_master, "benchmark-operations")
        pipeline = load_pipeline("user_clicks", settings.pipelines_dir)
        run_pipeline(spark, pipeline, settings)
        state_rows = 0

        def one_more_event() -> None:
            record = json.dumps({"user_id": "bench", "timestamp": int(time.time())}).encode()
            kafka_admin.produce_all(config, "clicks", [(None, record, None)])

        for label, from_source in (("rebuild from Delta", False), ("recompute from Kafka", True)):
            one_more_event()
            started = time.monotonic()
            plan = run_operation(
                pipeline,
                settings,
                lambda fs=from_source: plan_rebuild(pipeline, settings, "benchmark", fs),
                quiet,
            )
            summary = run_pipeline(spark, pipeline, settings)
            timings[label] = time.monotonic() - started
            details = [json.loads(b.ledger["details"]) for b in summary.batches]
            state_rows = max([d.get("seed_verified_rows", 0) for d in details] + [state_rows])
            print(label, round(timings[label], 2), "s", plan.state_action, flush=True)

        pipeline_v2 = dataclasses.replace(pipeline, version=2)
        started = time.monotonic()
        run_backfill(spark, pipeline_v2, settings, "benchmark", TargetSpec("earliest"), echo=quiet)
        timings["backfill"] = time.monotonic() - started
        print("backfill", round(timings["backfill"], 2), "s", flush=True)
        spark.stop()
    report = render(args.events, state_rows, timings)
    print(report)
    if not args.no_write:
        write_section(report)


def render(events: int, state_rows: int, timings: dict[str, float]) -> str:
    rebuild, recompute = timings["rebuild from Delta"], timings["recompute from Kafka"]
    return "\n".join(
        [
            MARKER,
            "",
            "Command: `.venv/bin/python -m benchmarks.operations "
            f"--events {events}` (same machine and broker as above).",
            "",
            f"`user_clicks` after streaming {events:,} events; the rebuild seeds Spark with "
            f"the {state_rows:,} windows its watermark keeps open (the closed ones stay "
            "only in Delta). "
            "Each time runs from the operation's start until the restarted stream has "
            "committed one new event (for the rebuild: after checking Spark's restored "
            "state against Delta row by row).",
            "",
            "| operation | seconds |",
            "|---|---|",
            f"| rebuild: restore Spark state from Delta | {rebuild:.1f} |",
            f"| rebuild --from-source: recompute from Kafka | {recompute:.1f} |",
            f"| backfill --from-earliest (recompute in batch, preview, publish) | "
            f"{timings['backfill']:.1f} ({events / timings['backfill']:,.0f} events/s) |",
            "",
            f"Restoring from Delta took {rebuild / recompute:.0%} of the time of recomputing.",
            "",
        ]
    )


if __name__ == "__main__":
    main()
