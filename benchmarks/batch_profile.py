"""Where a warm 1,000,000-event batch of ``user_clicks`` spends its CPU: Spark's
stages from the event log (wall, task time, JVM CPU, GC). Task time beyond JVM CPU
is waiting (the broker serves the fetches on the same cores) and Python workers.

    .venv/bin/python -m benchmarks.batch_profile [--events 1000000] [--runs 2] [--pin-broker]

``--pin-broker`` keeps the broker's threads on the last core (``taskset``) and Spark
on the others: what the batch waits for is then the broker, not a shared core.

One session runs ``runs`` + 1 available-now runs, each into a fresh warehouse; the
first (JIT cold) is left out of the stages' medians. Each run's CPU is split by
thread role (Spark's tasks, the JIT compiler, GC, Python, the broker). Writes its
section of docs/benchmarks.md. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

from benchmarks.report import machine, scratch_broker, write_section
from include.sample_data import click_events, encoded
from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, load_settings

TOPIC = "clicks"
PARTITIONS = 4
# What each stage of a windowed available-now run is (Spark names them after the
# call that started them: "start" for the query's batch, "call" inside foreachBatch).
STAGE_ROLES = [
    "the batch watermark (JVM source, one row, broadcast)",
    "Kafka scan (Spark's source), parse, classify, partial aggregate",
    "stateful aggregate (RocksDB), changelog files (Python tasks)",
]  # (no batch without records follows: the batch records the watermark it leaves)


# The JVM's threads by the name the kernel keeps (15 characters).
THREAD_ROLES = [
    ("Executor task", "Spark tasks"),
    ("C2 CompilerThre", "JIT compiler"),
    ("C1 CompilerThre", "JIT compiler"),
    ("GC Thread", "GC"),
    ("G1 ", "GC"),
]
CPU_COLUMNS = ["Spark tasks", "JIT compiler", "GC", "JVM, other", "Python", "broker"]


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def thread_cpu(jvm: int, broker_pid: int) -> dict[str, float]:
    """CPU seconds so far of the processes a run uses, the JVM's split by thread
    role (``/proc/<pid>/task/*/comm``). The JVM's total counts threads that ended
    too; what live named threads do not account for is "JVM, other". Python is this
    process and the JVM's workers, ended ones included."""
    groups: dict[str, float] = defaultdict(float)
    process = psutil.Process(jvm)
    for thread in process.threads():
        try:
            name = Path(f"/proc/{jvm}/task/{thread.id}/comm").read_text()
        except OSError:  # ended since the listing
            continue
        role = next((r for prefix, r in THREAD_ROLES if name.startswith(prefix)), None)
        if role is not None:
            groups[role] += thread.user_time + thread.system_time
    times = process.cpu_times()
    groups["JVM, other"] = times.user + times.system - sum(groups.values())
    workers = process.children(recursive=True)
    groups["Python"] = (
        cpu_seconds(psutil.Process())
        + sum(map(cpu_seconds, workers))
        + times.children_user
        + times.children_system
    )
    groups["broker"] = cpu_seconds(psutil.Process(broker_pid))
    return groups


def stages(event_log: Path) -> list[dict[str, Any]]:
    """Completed stages with their tasks' totals, in submission order. ``event_log``
    is Spark 4's folder of rolled ``events_N_*`` files."""
    tasks: dict[int, list[dict[str, Any]]] = defaultdict(list)
    done: list[dict[str, Any]] = []
    parts = sorted(event_log.glob("events_*"), key=lambda p: int(p.name.split("_")[1]))
    for line in (line for part in parts for line in part.read_text().splitlines()):
        event = json.loads(line)
        if event["Event"] == "SparkListenerTaskEnd":
            tasks[event["Stage ID"]].append(event["Task Metrics"])
        elif event["Event"] == "SparkListenerStageCompleted":
            done.append(event["Stage Info"])
    rows = []
    for info in sorted(done, key=lambda s: s["Submission Time"]):
        metrics = tasks[info["Stage ID"]]
        rows.append(
            {
                "submitted": info["Submission Time"] / 1000,
                "tasks": len(metrics),
                "wall": (info["Completion Time"] - info["Submission Time"]) / 1000,
                "run": sum(m["Executor Run Time"] for m in metrics) / 1000,
                "jvm_cpu": sum(m["Executor CPU Time"] for m in metrics) / 1e9,
                "gc": sum(m["JVM GC Time"] for m in metrics) / 1000,
                "name": info["Stage Name"].split(" at ")[0],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=60, help="the events' span")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--pin-broker", action="store_true", help="the broker on the last core, Spark on the rest"
    )
    args = parser.parse_args()
    with scratch_broker("bench-profile-") as (work, info):
        if args.pin_broker:
            last = max(os.sched_getaffinity(0))
            subprocess.run(["taskset", "-a", "-cp", str(last), str(info.pid)], check=True)
            # Spark's JVM is started by this process below and inherits the rest.
            os.sched_setaffinity(0, os.sched_getaffinity(0) - {last})
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), TOPIC, PARTITIONS)
        now = int(time.time())
        span = args.minutes * 60
        events = click_events(args.events, args.users, 1, now - span, span)
        kafka_admin.produce_all(config, TOPIC, encoded(events, [], 0, "user_id"))

        log_dir = work / "event-log"
        log_dir.mkdir()
        # Read when the JVM starts; get_spark sets none of these keys.
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={log_dir} "
            "--conf spark.eventLog.compress=false pyspark-shell"
        )
        os.environ["PLATFORM_BOOTSTRAP_SERVERS"] = info.bootstrap_servers
        from jobs.streaming.run import run_pipeline
        from jobs.streaming.spark import get_spark

        spark = get_spark()
        pipeline = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
        jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
        windows: list[tuple[float, float]] = []
        cpu: list[dict[str, float]] = []
        for round_ in range(args.runs + 1):
            os.environ["PLATFORM_WAREHOUSE"] = str(work / f"wh-{round_}")
            before = thread_cpu(jvm, info.pid)
            started = time.time()
            run_pipeline(spark, pipeline, load_settings(), "available-now")
            windows.append((started, time.time()))
            after = thread_cpu(jvm, info.pid)
            cpu.append({k: after[k] - before.get(k, 0.0) for k in after})
            print("run", round_, round(windows[-1][1] - started, 2), flush=True)
            shutil.rmtree(work / f"wh-{round_}", ignore_errors=True)
        spark.stop()
        all_stages = stages(next(log_dir.iterdir()))
    runs = [[s for s in all_stages if start <= s["submitted"] <= end] for start, end in windows[1:]]
    report = render(args, runs, [end - start for start, end in windows], cpu)
    print(report)
    if not args.no_write:
        write_section(report)


def render(
    args: argparse.Namespace,
    runs: list[list[dict[str, Any]]],
    all_walls: list[float],
    cpu: list[dict[str, float]],
) -> str:
    walls = all_walls[1:]
    lines = [
        "## Profile: where a warm 1M-event batch's CPU goes"
        + (", the broker on its own core" if args.pin_broker else ""),
        "",
        f"Command: `.venv/bin/python -m benchmarks.batch_profile --events {args.events} "
        f"--runs {args.runs} --users {args.users} --minutes {args.minutes}"
        f"{' --pin-broker' if args.pin_broker else ''}`",
        "",
        f"Machine: {machine()}. `user_clicks` over {args.events:,} events (4 partitions, "
        f"{args.users:,} users, {args.minutes} minutes, one batch), run available-now in a "
        "warm session into a "
        f"fresh warehouse; median of {len(runs)} runs (a first, JIT-cold run left out). "
        f"Whole run: {statistics.median(walls):.1f} s wall "
        f"({args.events / statistics.median(walls):,.0f} events/s)"
        + (
            "; the broker pinned to the last core, Spark to the other (`taskset`)."
            if args.pin_broker
            else "; the broker and Spark share the cores."
        ),
        "",
        "Spark's stages (event log). Task time is the tasks' wall summed over 2 cores; "
        "JVM CPU is the task threads' CPU only: a Python worker's CPU is not in it.",
        "",
        "| stage | tasks | wall s | task time s | JVM CPU s | GC s |",
        "|---|---|---|---|---|---|",
    ]
    for index in range(min(len(r) for r in runs)):

        def p50(key: str, index: int = index) -> float:
            return float(statistics.median(r[index][key] for r in runs))

        first = runs[0][index]
        role = STAGE_ROLES[index] if index < len(STAGE_ROLES) else ""
        lines.append(
            f"| {index + 1}. `{first['name']}`: {role} | {first['tasks']} | {p50('wall'):.2f} "
            f"| {p50('run'):.2f} | {p50('jvm_cpu'):.2f} | {p50('gc'):.2f} |"
        )
    lines += [
        "",
        "CPU seconds of each run by who spent them (`/proc`, the JVM's threads by name; "
        "Python is the driver process and Spark's Python workers), the JIT-cold first "
        "run included: on a warm driver the JIT keeps compiling for several runs.",
        "",
        "| run | wall s | " + " | ".join(f"{c} s" for c in CPU_COLUMNS) + " | all s |",
        "|---|---|" + "---|" * (len(CPU_COLUMNS) + 1),
    ]
    for index, (wall, used) in enumerate(zip(all_walls, cpu, strict=True)):
        cells = " | ".join(f"{used.get(c, 0.0):.2f}" for c in CPU_COLUMNS)
        lines.append(f"| {index + 1} | {wall:.2f} | {cells} | {sum(used.values()):.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
