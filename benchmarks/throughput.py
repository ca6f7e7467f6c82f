"""End-to-end throughput of ``user_clicks``: exactly-once against at-least-once.

    .venv/bin/python -m benchmarks.throughput [--events 1000000] [--limits 0,250000]

Starts its own broker on a free loopback port, produces the events (10,000 users
over one hour of event time) into a 4-partition topic, then, for each per-batch
limit (0 = none: one batch) and each guarantee, runs the pipeline to completion
from a fresh warehouse, after one warm-up run so every measured run sees a warm
JVM. Writes the numbers to docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import threading
import time

import psutil

from benchmarks.report import machine, scratch_broker, write_section
from include.sample_data import click_events, encoded
from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.settings import load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

GUARANTEES = ("exactly_once", "at_least_once")
USERS = 10_000


class PeakMemory:
    """Samples the RSS of this process and all its children (JVM, Python workers)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    continue
            self.peak = max(self.peak, total)
            time.sleep(0.1)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


Result = dict[str, float]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--limits", default="0,250000", help="max events per batch; 0 = none")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    limits = [int(x) for x in args.limits.split(",")]

    results: dict[tuple[int, str], list[Result]] = {}
    with scratch_broker("bench-") as (work, info):
        settings = dataclasses.replace(load_settings(), bootstrap_servers=info.bootstrap_servers)
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 4)
        now_s = int(time.time())
        t0 = time.monotonic()
        events = click_events(args.events, USERS, 1, now_s - 3600, 3600)
        kafka_admin.produce_all(config, "clicks", encoded(events, [], 0, "user_id"))
        produce_s = time.monotonic() - t0
        spark = get_spark(settings.spark_master, "benchmark")
        base = load_pipeline("user_clicks", settings.pipelines_dir)
        run_pipeline(spark, base, dataclasses.replace(settings, warehouse=work / "warmup"))
        for round_ in range(args.rounds):
            for limit in limits:
                for guarantee in GUARANTEES:
                    pipeline = dataclasses.replace(
                        base, processing_guarantee=guarantee, max_offsets_per_trigger=limit or None
                    )
                    warehouse = work / f"{guarantee}-{limit}-{round_}"
                    with PeakMemory() as memory:
                        summary = run_pipeline(
                            spark, pipeline, dataclasses.replace(settings, warehouse=warehouse)
                        )
                    details = [
                        json.loads(b.ledger["details"])
                        for b in summary.batches
                        if not b.skipped and b.ledger["records_in"]
                    ]
                    latencies = [d["seconds"] for d in details]
                    result = {
                        "events_per_s": summary.records_in / summary.seconds,
                        "seconds": summary.seconds,
                        "batches": len(latencies),
                        "batch_p50_s": statistics.median(latencies),
                        "batch_max_s": max(latencies),
                        "delta_s": sum(
                            sum(v for k, v in d["timings"].items() if k != "spark") for d in details
                        ),
                        "peak_rss_mib": memory.peak / 2**20,
                    }
                    results.setdefault((limit, guarantee), []).append(result)
                    shown = {k: round(v, 3) for k, v in result.items()}
                    print(f"limit={limit} {guarantee} round {round_}: {shown}", flush=True)
                    shutil.rmtree(warehouse, ignore_errors=True)
        spark.stop()
    report = render(args, limits, results, produce_s)
    print(report)
    if not args.no_write:
        write_section(report)


def render(
    args: argparse.Namespace,
    limits: list[int],
    results: dict[tuple[int, str], list[Result]],
    produce_s: float,
) -> str:
    lines = [
        "## Streaming throughput: `user_clicks`, exactly-once vs at-least-once",
        "",
        f"Command: `make bench` (= `.venv/bin/python -m benchmarks.throughput --events "
        f"{args.events} --limits {args.limits} --rounds {args.rounds}`)",
        "",
        f"Machine: {machine()}; Spark local[2] with RocksDB state; the broker "
        "(Apache Kafka 4.3, KRaft, one node) runs on the same two cores.",
        "",
        f"Input: {args.events:,} click events from {USERS:,} users over one hour of event time "
        f"(about {min(args.events, USERS * 60):,} distinct (user, minute) windows), in a "
        f"4-partition topic, produced in {produce_s:.1f} s. Each run starts a query from a "
        "fresh warehouse and checkpoint and ends when the last batch is committed "
        "(availableNow); events/s = events / (query start to end). The JVM is warm (one "
        f"warm-up run first); best of {args.rounds} rounds. Batch latency = one micro-batch "
        "from Spark's read to the ledger commit; Delta = time spent in delta-rs commits; "
        "peak RSS = the whole process tree: Python driver, JVM (2 GiB heap plus RocksDB), "
        "Python workers and the broker.",
        "",
        "| batch limit | guarantee | events/s | run s | batches | batch p50 s | batch max s "
        "| Delta s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for limit in limits:
        for guarantee in GUARANTEES:
            r = max(results[(limit, guarantee)], key=lambda x: x["events_per_s"])
            lines.append(
                f"| {limit or 'none'} | {guarantee} | {r['events_per_s']:,.0f} | "
                f"{r['seconds']:.2f} | {r['batches']:.0f} | {r['batch_p50_s']:.2f} | "
                f"{r['batch_max_s']:.2f} | {r['delta_s']:.2f} | {r['peak_rss_mib']:,.0f} |"
            )
    lines.append("")
    for limit in limits:
        eo = max(r["events_per_s"] for r in results[(limit, "exactly_once")])
        alo = max(r["events_per_s"] for r in results[(limit, "at_least_once")])
        lines.append(
            f"- batch limit {limit or 'none'}: exactly-once costs {100 * (1 - eo / alo):.1f}% "
            "of at-least-once throughput (negative: within noise)."
        )
    lines += ["", "All rounds (events/s):", ""]
    for (limit, guarantee), runs in results.items():
        rates = ", ".join(f"{r['events_per_s']:,.0f}" for r in runs)
        lines.append(f"- limit {limit or 'none'}, {guarantee}: {rates}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
