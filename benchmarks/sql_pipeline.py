"""Throughput of a Spark SQL pipeline: ``orders_revenue`` (nested JSON, a filter,
three derived expressions, a hopping window and an HLL distinct count).

    .venv/bin/python -m benchmarks.sql_pipeline [--events 500000] [--rounds 2]

Starts its own broker on a free loopback port, produces sample orders
(``include.sample_data.order_events``: 40 merchants, 2,000 buyers as Kafka keys,
one hour of event time) into a 4-partition topic, then runs variants of the
pipeline to completion from a fresh warehouse each, after one warm-up run: as
shipped, without the distinct count, and without the filter and derived
expressions too (plain fields only), to show what each part costs. Writes the
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

from benchmarks.report import best_runs, machine, scratch_broker, table, write_section
from include.sample_data import encoded, order_events
from jobs import kafka_admin
from jobs.pipeline.model import Aggregation, Derived, Pipeline
from jobs.pipeline.parser import load_pipeline
from jobs.settings import load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark


def without_distinct(p: Pipeline) -> Pipeline:
    kept = tuple(a for a in p.aggregations if a.function != "approx_count_distinct")
    return dataclasses.replace(p, aggregations=kept)


def plain(p: Pipeline) -> Pipeline:
    """Keyed by a plain field, no filter, no expressions: parsing and aggregation only."""
    return dataclasses.replace(
        p,
        filter=None,
        derived=(Derived("merchant_id", "merchant.id"),),
        aggregations=(
            Aggregation("orders", "count", None),
            Aggregation("cents", "sum", "amount_cents"),
        ),
    )


VARIANTS: dict[str, Callable[[Pipeline], Pipeline]] = {
    "as shipped (filter, 3 expressions, sum x2, count, distinct count)": lambda p: p,
    "without the distinct count": without_distinct,
    "one expression (the key), count and sum of a field": plain,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    with scratch_broker("bench-sql-") as (work, info):
        settings = dataclasses.replace(load_settings(), bootstrap_servers=info.bootstrap_servers)
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "orders", 4)
        now_s = int(time.time())
        t0 = time.monotonic()
        events = order_events(args.events, 40, 2000, 1, now_s - 3600, 3600)
        kafka_admin.produce_all(config, "orders", encoded(events, [], 0, "buyer"))
        produce_s = time.monotonic() - t0
        spark = get_spark(settings.spark_master, "benchmark")
        base = load_pipeline("orders_revenue", settings.pipelines_dir)
        run_pipeline(spark, base, dataclasses.replace(settings, warehouse=work / "warmup"))
        for round_ in range(args.rounds):
            for name, variant in VARIANTS.items():
                warehouse = work / f"run-{round_}-{len(results.get(name, []))}"
                summary = run_pipeline(
                    spark, variant(base), dataclasses.replace(settings, warehouse=warehouse)
                )
                details = [
                    json.loads(b.ledger["details"])
                    for b in summary.batches
                    if not b.skipped and b.ledger["records_in"]
                ]
                filtered = sum(int(b.ledger.get("filtered") or 0) for b in summary.batches)
                result = {
                    "events_per_s": summary.records_in / summary.seconds,
                    "seconds": summary.seconds,
                    "batch_p50_s": statistics.median(d["seconds"] for d in details),
                    "filtered": filtered,
                }
                results.setdefault(name, []).append(result)
                print(f"{name} round {round_}: {result}", flush=True)
                shutil.rmtree(warehouse, ignore_errors=True)
        spark.stop()
    report = render(args, results, produce_s)
    print(report)
    if not args.no_write:
        write_section(report)


def render(
    args: argparse.Namespace, results: dict[str, list[dict[str, float]]], produce_s: float
) -> str:
    share = max(r["filtered"] for runs in results.values() for r in runs) / args.events
    lines = [
        "## A Spark SQL pipeline: `orders_revenue`",
        "",
        f"Command: `.venv/bin/python -m benchmarks.sql_pipeline --events {args.events} "
        f"--rounds {args.rounds}`",
        "",
        f"Machine: {machine()}; Spark local[2]; the broker on the same two cores.",
        "",
        f"Input: {args.events:,} nested JSON orders (40 merchants, 2,000 buyers as Kafka "
        f"keys, one hour of event time; {share:.0%} unpaid or of test shops, so filtered), "
        f"in a 4-partition topic, produced in {produce_s:.1f} s. Hopping 10-minute windows "
        "every 5 minutes: each aggregated order adds to two windows. One batch per run, "
        f"from a fresh warehouse, warm JVM; best of {args.rounds} rounds.",
        "",
        *table(
            ["variant", "events/s", "run s", "filtered"],
            best_runs(results, {"events_per_s": ",.0f", "seconds": ".2f", "filtered": ",.0f"}),
        ),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
