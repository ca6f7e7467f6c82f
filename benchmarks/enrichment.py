"""The cost of ``enrich:``: ``orders_by_category`` (orders joined to the merchants
dimension) against the same pipeline with the category computed from an inline
map of the same 40 merchants (no table), and against ``orders_revenue``, on the
same events.

    .venv/bin/python -m benchmarks.enrichment [--events 500000] [--per-batch 100000] [--rounds 2]

Starts its own broker on a free loopback port, produces sample orders
(``include.sample_data.order_events``) into a 4-partition topic, loads the sample
merchants file with the ``dimension`` job, then runs each variant to completion
from a fresh warehouse, after one warm-up run, ``--per-batch`` records per batch
(so the dimension is read once per batch, several times per run). Writes the
numbers to docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import best_runs, machine, scratch_broker, table, write_section
from include.sample_data import encoded, merchant_rows, order_events, write_merchants
from jobs import kafka_admin
from jobs.dimension_load import load_dimension, refresh
from jobs.pipeline.model import Derived, Pipeline
from jobs.pipeline.parser import load_pipeline
from jobs.settings import Settings, load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

MERCHANTS = 40


def inline(p: Pipeline) -> Pipeline:
    """The category and region from a map literal of the same merchants: no join."""
    rows = merchant_rows(MERCHANTS, 7, {})
    categories = ", ".join(f"'{r['id']}', '{r['category']}'" for r in rows)
    regions = ", ".join(f"'{r['id']}', '{r['region']}'" for r in rows)
    derived = (
        Derived("category", f"element_at(map({categories}), merchant.id)"),
        Derived("region", f"element_at(map({regions}), merchant.id)"),
        *(d for d in p.derived if d.name not in ("category", "region")),
    )
    return dataclasses.replace(p, enrich=(), derived=derived)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--per-batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    with scratch_broker("bench-enrich-") as (work, info):
        settings = dataclasses.replace(
            load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=work / "shared"
        )
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "orders", 4)
        now_s = int(time.time())
        events = order_events(args.events, MERCHANTS, 2000, 1, now_s - 3600, 3600)
        kafka_admin.produce_all(config, "orders", encoded(events, [], 0, "buyer"))
        spark = get_spark(settings.spark_master, "benchmark")
        write_merchants(settings.warehouse / "incoming" / "merchants.jsonl", {}, 7)
        refresh(spark, load_dimension("merchants", settings.dimensions_dir), settings.warehouse)
        enriched = batched(load_pipeline("orders_by_category", settings.pipelines_dir), args)
        variants: dict[str, Callable[[], Pipeline]] = {
            "orders_by_category: enriched from the merchants table": lambda: enriched,
            "the same, category from an inline map (no table)": lambda: inline(enriched),
            "orders_revenue (hopping windows, per merchant)": lambda: batched(
                load_pipeline("orders_revenue", settings.pipelines_dir), args
            ),
        }
        run(spark, enriched, settings, work / "warmup")
        for round_ in range(args.rounds):
            for name, variant in variants.items():
                warehouse = work / f"run-{round_}-{len(results.get(name, []))}"
                result = run(spark, variant(), settings, warehouse)
                results.setdefault(name, []).append(result)
                print(f"{name} round {round_}: {result}", flush=True)
                shutil.rmtree(warehouse, ignore_errors=True)
        spark.stop()
    report = render(args, results)
    print(report)
    if not args.no_write:
        write_section(report)


def batched(p: Pipeline, args: argparse.Namespace) -> Pipeline:
    return dataclasses.replace(p, max_offsets_per_trigger=args.per_batch, output=None)


def run(spark, pipeline: Pipeline, settings: Settings, warehouse: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    # The dimension stays where the pipeline reads it: only the app's tables move.
    if pipeline.enrich:
        (warehouse / "dims").mkdir(parents=True, exist_ok=True)
        source = settings.warehouse / "dims" / "merchants"
        if not (warehouse / "dims" / "merchants").exists():
            (warehouse / "dims" / "merchants").symlink_to(source)
    summary = run_pipeline(spark, pipeline, dataclasses.replace(settings, warehouse=warehouse))
    details = [
        json.loads(b.ledger["details"])
        for b in summary.batches
        if not b.skipped and b.ledger["records_in"]
    ]
    return {
        "events_per_s": summary.records_in / summary.seconds,
        "seconds": summary.seconds,
        "batches": len(details),
        "batch_p50_s": statistics.median(d["seconds"] for d in details),
    }


def render(args: argparse.Namespace, results: dict[str, list[dict[str, float]]]) -> str:
    lines = [
        "## Enrichment: the cost of joining a dimension table (`orders_by_category`)",
        "",
        f"Command: `.venv/bin/python -m benchmarks.enrichment --events {args.events} "
        f"--per-batch {args.per_batch} --rounds {args.rounds}`",
        "",
        f"Machine: {machine()}; Spark local[2]; the broker on the same two cores.",
        "",
        f"Input: {args.events:,} nested JSON orders of {MERCHANTS} merchants (one hour of "
        f"event time), {args.per_batch:,} per batch, in a 4-partition topic; the merchants "
        "dimension is a Delta table of 40 rows, read (pinned to one version) once per "
        "batch and broadcast. Each run from a fresh warehouse, warm JVM, no output topic; "
        f"best of {args.rounds} rounds.",
        "",
        *table(
            ["variant", "events/s", "run s", "batches", "batch p50 s"],
            best_runs(
                results,
                {"events_per_s": ",.0f", "seconds": ".2f", "batches": ".0f", "batch_p50_s": ".2f"},
            ),
        ),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
