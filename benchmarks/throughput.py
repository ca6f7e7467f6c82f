"""End-to-end throughput of ``user_clicks``: exactly-once against at-least-once.

    .venv/bin/python -m benchmarks.throughput [--events 1000000] [--max-per-batch 250000]

Starts its own broker on a free loopback port, produces the events into a
4-partition topic, then runs the pipeline to completion from a fresh warehouse
for each guarantee (after one warm-up run, so both see a warm JVM), and writes
the numbers to docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil

from include.sample_data import click_events, encoded
from jobs import broker, kafka_admin
from jobs.pipeline import load_pipeline
from jobs.settings import REPO_ROOT, load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

RESULTS = REPO_ROOT / "docs" / "benchmarks.md"


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
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)
            time.sleep(0.2)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--max-per-batch", type=int, default=250_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-"))
    port = broker.find_free_port()
    info = broker.start(work / "broker", port)
    try:
        base = load_settings()
        settings = dataclasses.replace(base, bootstrap_servers=info.bootstrap_servers)
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 4)
        now_s = int(time.time())
        t0 = time.monotonic()
        kafka_admin.produce_all(
            config,
            "clicks",
            encoded(click_events(args.events, 10_000, 1, now_s - 3600, 3600), [], 0, "user_id"),
        )
        produce_s = time.monotonic() - t0
        spark = get_spark(settings.spark_master, "benchmark")
        pipeline = load_pipeline("user_clicks", settings.pipelines_dir)
        pipeline = dataclasses.replace(pipeline, max_offsets_per_trigger=args.max_per_batch)
        results: dict[str, list[dict[str, float]]] = {"exactly_once": [], "at_least_once": []}
        # Warm-up: JIT, Python workers, first Delta writes.
        run_pipeline(spark, pipeline, dataclasses.replace(settings, warehouse=work / "warmup"))
        for round_ in range(args.rounds):
            for guarantee in ("exactly_once", "at_least_once"):
                warehouse = work / f"{guarantee}-{round_}"
                variant = dataclasses.replace(pipeline, processing_guarantee=guarantee)
                with PeakMemory() as memory:
                    summary = run_pipeline(
                        spark, variant, dataclasses.replace(settings, warehouse=warehouse)
                    )
                details = [
                    json.loads(b.ledger["details"]) for b in summary.batches if not b.skipped
                ]
                latencies = [d["seconds"] for d in details]
                print([d["timings"] for d in details])
                rate = summary.records_in / summary.seconds
                results[guarantee].append(
                    {
                        "events_per_s": rate,
                        "seconds": summary.seconds,
                        "batches": len(latencies),
                        "commit_p50_s": statistics.median(latencies),
                        "commit_max_s": max(latencies),
                        "peak_rss_mib": memory.peak / 2**20,
                    }
                )
                print(
                    guarantee,
                    round_,
                    {k: round(v, 3) for k, v in results[guarantee][-1].items()},
                    flush=True,
                )
                shutil.rmtree(warehouse, ignore_errors=True)
    finally:
        broker.stop(work / "broker")
    report = render(args, results, produce_s)
    print(report)
    if not args.no_write:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(report)


def render(
    args: argparse.Namespace, results: dict[str, list[dict[str, float]]], produce_s: float
) -> str:
    best = {g: max(r, key=lambda x: x["events_per_s"]) for g, r in results.items()}
    eo, alo = best["exactly_once"]["events_per_s"], best["at_least_once"]["events_per_s"]
    lines = [
        "# Benchmarks",
        "",
        "## Streaming throughput: `user_clicks`, exactly-once vs at-least-once",
        "",
        f"Command: `.venv/bin/python -m benchmarks.throughput --events {args.events} "
        f"--max-per-batch {args.max_per_batch} --rounds {args.rounds}`",
        "",
        f"Machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"{platform.platform()}, Python {platform.python_version()}; broker: embedded noida-db on "
        "loopback (same machine, sharing the cores); Spark local[2].",
        "",
        f"Input: {args.events:,} click events in a 4-partition topic "
        f"(produced in {produce_s:.1f} s); at most {args.max_per_batch:,} per micro-batch; "
        f"{args.rounds} rounds after a warm-up run, "
        "best round shown; time from query start to the last committed batch, JVM already warm.",
        "",
        "| guarantee | events/s | run s | batches | batch commit p50 s | max s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for guarantee, r in best.items():
        lines.append(
            f"| {guarantee} | {r['events_per_s']:,.0f} | {r['seconds']:.2f} | {r['batches']:.0f} | "
            f"{r['commit_p50_s']:.2f} | {r['commit_max_s']:.2f} | {r['peak_rss_mib']:,.0f} |"
        )
    lines += [
        "",
        f"Exactly-once costs {100 * (1 - eo / alo):.1f}% of at-least-once throughput here "
        "(negative: within noise).",
        "",
        "All rounds:",
        "",
    ]
    for guarantee, runs in results.items():
        for i, r in enumerate(runs):
            lines.append(
                f"- {guarantee} round {i}: {r['events_per_s']:,.0f} events/s, {r['seconds']:.2f} s"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
