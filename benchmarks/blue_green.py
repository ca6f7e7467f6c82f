"""A backfill next to a continuous stream: the stream's longest gap between commits,
its lag, and the repair's time, computed beside the stream (blue-green) against
stop-the-world.

    .venv/bin/python -m benchmarks.blue_green [--events 1000000] [--rate 10000]

Own broker on a free port. ``user_clicks`` (trigger every second) first judges
``--events`` events of history; then a continuous run (its own process) reads a
feed of ``--rate`` events/s. Each form backfills the whole history to the next
pipeline version, in this process, while the stream runs; the stream is then
started again on that version, as an operator (or the stream's DAG) does once the
backfill printed ``next: ...``. The stream's gap is the longest time between two of
its batch commits from the backfill's start until the restarted stream's tenth
batch; its lag is the records produced and not yet committed, sampled every
second meanwhile. Appends a section to docs/benchmarks.md. Not a test: it asserts
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from deltalake import DeltaTable

from benchmarks.report import machine, scratch_broker, table, write_section
from include.sample_data import click_events, encoded
from jobs import kafka_admin
from jobs.operations.backfill import run_backfill
from jobs.operations.targets import TargetSpec
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, Settings, load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

MARKER = "## A backfill next to a continuous stream: blue-green against stop-the-world"
TOPIC = "clicks"
PARTITIONS = 4


def pipeline_file(work: Path, version: int) -> Path:
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "user_clicks.yaml").read_text())
    data["version"] = version
    data["trigger"] = {"mode": "available-now", "interval": "1 second"}
    folder = work / f"v{version}"
    folder.mkdir(exist_ok=True)
    path = folder / "user_clicks.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Feed:
    """``rate`` events/s into the topic, in tenths of a second, until stopped."""

    def __init__(self, config: dict[str, str], rate: int) -> None:
        self.config, self.rate = config, rate
        self.produced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        step = max(1, self.rate // 10)
        seed = 1000
        while not self._stop.is_set():
            started = time.monotonic()
            now = int(time.time())
            events = click_events(step, 10_000, seed, now - 5, 5)
            kafka_admin.produce_all(self.config, TOPIC, encoded(events, [], 0, "user_id"))
            self.produced += step
            seed += 1
            self._stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))

    def __enter__(self) -> Feed:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def stream(path: Path, settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    args = ["--pipeline", str(path), "--trigger", "continuous", "--quiet"]
    args += ["--bootstrap-servers", settings.bootstrap_servers]
    args += ["--warehouse", str(settings.warehouse)]
    return subprocess.Popen(
        [sys.executable, "-m", "jobs", "run", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
        start_new_session=True,
    )


def batch_times(settings: Settings) -> list[tuple[datetime, dict[str, Any]]]:
    ledger = DeltaTable(str(settings.warehouse / "user_clicks" / "_ledger"))
    rows = ledger.to_pyarrow_table().to_pylist()
    return sorted((r["commit_time"], r) for r in rows if r["entry_type"] == "batch")


def committed(settings: Settings) -> int:
    """Records the stream has committed: the sum of its last batch's end offsets."""
    found = batch_times(settings)
    if not found:
        return 0
    ends = json.loads(found[-1][1]["end_offsets"]).get(TOPIC, {})
    return sum(int(v) for v in ends.values())


def until_batches(settings: Settings, after: datetime, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for t, _ in batch_times(settings) if t > after) >= count:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the stream committed fewer than {count} batches in {timeout:.0f} s")


def end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def measure(
    spark: Any, settings: Settings, work: Path, config: dict[str, str], form: str, version: int
) -> dict[str, float]:
    """One backfill of ``form`` to ``version`` beside a stream of ``version - 1``."""
    log = work / f"stream-{form}.log"
    running = stream(pipeline_file(work, version - 1), settings, log)
    lag: list[int] = []
    sampling = threading.Event()
    try:
        until_batches(settings, datetime.now(UTC), 5, 300)  # steady
        marks = kafka_admin.watermarks
        partitions = [(TOPIC, p) for p in range(PARTITIONS)]

        def sample() -> None:
            while not sampling.wait(1.0):
                high = sum(h for _low, h in marks(config, partitions).values())
                lag.append(high - committed(settings))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        began = datetime.now(UTC)
        started = time.monotonic()
        v_next = load_pipeline(str(pipeline_file(work, version)), settings.pipelines_dir)
        run_backfill(
            spark,
            v_next,
            settings,
            "benchmark",
            TargetSpec("earliest"),
            echo=lambda line: print(f"  {form}: {line}"[:300], flush=True),
            form=form,  # type: ignore[arg-type]
        )
        applied = time.monotonic() - started
        done = datetime.now(UTC)
        running.wait(timeout=120)
        running = stream(pipeline_file(work, version), settings, log)  # the operator's restart
        until_batches(settings, datetime.now(UTC), 10, 300)
        total = time.monotonic() - started
        sampling.set()
        sampler.join()
    finally:
        sampling.set()
        end(running)
    times = [t for t, _ in batch_times(settings) if t >= began]
    before = max(t for t, _ in batch_times(settings) if t < began)
    stamps = [before, *times]
    gap = max((b - a).total_seconds() for a, b in itertools.pairwise(stamps))
    last_old = max(t for t in stamps if t <= done)
    return {
        "gap_s": gap,
        "down_s": (done - last_old).total_seconds(),
        "backfill_s": applied,
        "total_s": total,
        "max_lag": max(lag, default=0),
        "beside": sum(1 for t in times if t <= done),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=10_000, help="events/s fed to the stream")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with scratch_broker("bench-bg-") as (work, info):
        settings = dataclasses.replace(
            load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=work / "wh"
        )
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), TOPIC, PARTITIONS)
        now = int(time.time())
        history = click_events(args.events, 10_000, 1, now - 3600, 3600)
        kafka_admin.produce_all(config, TOPIC, encoded(history, [], 0, "user_id"))
        spark = get_spark(settings.spark_master, "benchmark-blue-green")
        run_pipeline(spark, load_pipeline(str(pipeline_file(work, 1)), work), settings)
        with Feed(config, args.rate):
            for version, form in ((2, "stop-the-world"), (3, "blue-green")):
                results[form] = measure(spark, settings, work, config, form, version)
                print(form, results[form], flush=True)
        spark.stop()
    report = render(args.events, args.rate, results)
    print(report)
    if not args.no_write:
        write_section(report)


def render(events: int, rate: int, results: dict[str, dict[str, float]]) -> str:
    rows = [
        [
            form,
            f"{r['down_s']:.1f}",
            f"{r['gap_s']:.1f}",
            f"{r['max_lag']:,.0f}",
            f"{r['backfill_s']:.1f}",
            f"{r['total_s']:.1f}",
            f"{r['beside']:.0f}",
        ]
        for form, r in results.items()
    ]
    return "\n".join(
        [
            f"{MARKER} ({events:,} events)",
            "",
            f"Command: `.venv/bin/python -m benchmarks.blue_green --events {events} "
            f"--rate {rate}`. Machine: {machine()}.",
            "",
            f"`user_clicks` (trigger every second) after judging {events:,} events of "
            f"history, then fed {rate:,} events/s while each form backfills the whole "
            "history to the next version; the stream is started again on that version "
            "when the backfill ends. Down: from the stream's last commit before the fence "
            "to the backfill's end. Gap: the longest time between two of the stream's "
            "batch commits from the backfill's start until the restarted stream's tenth "
            "batch (it includes the restarted process's start). Lag: the largest number "
            "of records produced and not committed, sampled every second. Beside: the "
            "stream's commits while the backfill ran.",
            "",
            *table(
                [
                    "form",
                    "down (s)",
                    "longest gap (s)",
                    "largest lag (records)",
                    "backfill (s)",
                    "total (s)",
                    "beside (batches)",
                ],
                rows,
            ),
            "",
        ]
    )


if __name__ == "__main__":
    main()
