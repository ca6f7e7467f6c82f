"""Cost of a 1,000-record batch as the state grows: ``inventory`` (no window: every
batch updates random keys anywhere in the state).

    .venv/bin/python -m benchmarks.state_cost [--sizes 200000,2000000,10000000] [--batches 5]

For each size N, on a fresh broker and warehouse: N movements of N distinct SKUs
build N state rows (in batches of at most 2,000,000 records), then ``--batches``
runs of 1,000 movements of random existing SKUs, one batch each. Reports the
batch's own seconds (from its ledger row: Spark, then each Delta commit) and the
whole run's; warm JVM (one Spark session for everything). Writes its section of
docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

from deltalake import DeltaTable

from benchmarks.report import machine, scratch_broker, write_section
from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.settings import load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

TOPIC = "inventory_movements"
BUILD_BATCH = 2_000_000
SMALL_BATCH = 1_000


def movements(skus: Iterator[int], now_s: int) -> Iterator[tuple[bytes, bytes, int]]:
    now_ms = now_s * 1000
    for sku in skus:
        event = {"sku": f"S{sku:09d}", "qty": 1, "kind": "receipt", "timestamp": now_s}
        yield event["sku"].encode(), json.dumps(event).encode(), now_ms  # type: ignore[attr-defined]


def measure(spark, size: int, batches: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    with scratch_broker("bench-state-") as (work, info):
        settings = dataclasses.replace(
            load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=work / "wh"
        )
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), TOPIC, 4)
        now = int(time.time())
        kafka_admin.produce_all(config, TOPIC, movements(iter(range(size)), now))
        base = load_pipeline("inventory", settings.pipelines_dir)
        pipeline = dataclasses.replace(base, max_offsets_per_trigger=BUILD_BATCH)
        started = time.monotonic()
        run_pipeline(spark, pipeline, settings)
        build_s = time.monotonic() - started
        rng = random.Random(size)
        warm = consecutive_batches(spark, pipeline, settings, config, size, batches, now, rng)
        seconds, runs, parts = [], [], []
        for _ in range(batches):
            picks = (rng.randrange(size) for _ in range(SMALL_BATCH))
            kafka_admin.produce_all(config, TOPIC, movements(picks, now))
            started = time.monotonic()
            summary = run_pipeline(spark, pipeline, settings)
            runs.append(time.monotonic() - started)
            done = [b for b in summary.batches if not b.skipped and b.ledger["records_in"]]
            details = json.loads(done[0].ledger["details"])
            seconds.append(details["seconds"])
            parts.append(details["timings"])
        median = statistics.median(seconds)
        chosen = parts[seconds.index(min(seconds, key=lambda s: abs(s - median)))]
        return {
            "build_s": build_s,
            "batch_p50_s": median,
            "batch_max_s": max(seconds),
            "run_p50_s": statistics.median(runs),
            "spark_s": chosen.get("spark", 0.0),
            "state_s": chosen.get("state", 0.0),
            "other_s": median - chosen.get("spark", 0.0) - chosen.get("state", 0.0),
            "warm_p50_s": statistics.median(warm),
            "warm_max_s": max(warm),
        }


def consecutive_batches(  # type: ignore[no-untyped-def]
    spark, pipeline, settings, config, size: int, batches: int, now: int, rng: random.Random
) -> list[float]:
    """Batch seconds in one continuous run (the state stays loaded between batches)."""
    continuous = dataclasses.replace(
        pipeline, trigger_mode="continuous", trigger_interval_seconds=1
    )
    result: list[Any] = []
    runner = threading.Thread(
        target=lambda: result.append(run_pipeline(spark, continuous, settings))
    )
    runner.start()
    ledger = settings.warehouse / pipeline.application_id / "_ledger"
    seen = DeltaTable(str(ledger)).version()
    produced = 0
    deadline = time.monotonic() + 60 + 30 * batches
    while produced < batches + 1 and time.monotonic() < deadline:  # the first one loads
        picks = (rng.randrange(size) for _ in range(SMALL_BATCH))
        kafka_admin.produce_all(config, TOPIC, movements(picks, now))
        produced += 1
        while DeltaTable(str(ledger)).version() == seen and time.monotonic() < deadline:
            time.sleep(0.2)
        seen = DeltaTable(str(ledger)).version()
    for query in spark.streams.active:
        query.stop()
    runner.join()
    done = [b for b in result[0].batches if not b.skipped and b.ledger["records_in"]]
    return [json.loads(b.ledger["details"])["seconds"] for b in done[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="200000,2000000,10000000")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--label", default="", help="a name for this code version")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    spark = get_spark("local[2]", "benchmark-state")
    results = {}
    for size in sizes:
        results[size] = measure(spark, size, args.batches)
        print(size, {k: round(v, 3) for k, v in results[size].items()}, flush=True)
    spark.stop()
    report = render(args, results)
    print(report)
    if not args.no_write:
        write_section(report)


def render(args: argparse.Namespace, results: dict[int, dict[str, float]]) -> str:
    lines = [
        "## Cost of a 1,000-record batch as the state grows",
        "",
        f"Command: `.venv/bin/python -m benchmarks.state_cost --sizes {args.sizes} "
        f"--batches {args.batches}`{f' ({args.label})' if args.label else ''}",
        "",
        f"Machine: {machine()}; warm JVM. `inventory` (no window) with N state rows; "
        f"each batch: 1,000 movements of random existing SKUs; median of {args.batches}.",
        "",
        "A scheduled run (`available-now`, one batch per run) loads Spark's RocksDB state "
        "from the snapshot the run before it left in the checkpoint; a continuous run keeps "
        "it loaded between batches. The first scheduled run after the continuous one (the "
        "max column) replays the continuous run's changelog files, which it left without a "
        "snapshot.",
        "",
        "| state rows | scheduled: batch p50 s | max s | Spark s | state merge s | other s | "
        "run p50 s | continuous: batch p50 s | max s | build s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size, r in results.items():
        lines.append(
            f"| {size:,} | {r['batch_p50_s']:.2f} | {r['batch_max_s']:.2f} | {r['spark_s']:.2f} "
            f"| {r['state_s']:.2f} | {r['other_s']:.2f} | {r['run_p50_s']:.2f} "
            f"| {r['warm_p50_s']:.2f} | {r['warm_max_s']:.2f} | {r['build_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
