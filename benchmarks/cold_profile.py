"""Where a cold run's extra seconds go: the same 1M-event ``user_clicks`` run in a
new process (the JVM archive mapped) and on a warm driver, each recorded by the
JDK's Flight Recorder, compared by what the driver JVM did.

    .venv/bin/python -m benchmarks.cold_profile [--events 1000000] [--no-write]

Per run: its phases; the JIT's compilations (count, and the seconds its compiler
threads spent); the Java samples of Spark's task threads, by how
their top frame ran (interpreted, compiled, native); the collector's pauses; the
classes loaded. Both JVMs are recorded from their start (``JAVA_TOOL_OPTIONS``,
which the archive's key does not read: a recording started later deoptimises what
the JIT compiled); the warm driver's figures are its third run's (``jcmd
JFR.dump``). Writes its section of
docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from benchmarks.cold_path import one_run, warm_driver
from benchmarks.report import machine, scratch_broker, table, write_section
from include.sample_data import click_events, encoded
from jobs import kafka_admin

TASK_THREAD = "Executor task launch worker"


def jfr_events(recording: Path, events: str) -> list[dict[str, Any]]:
    """``events`` (comma list) of ``recording``, as ``jfr print --json`` gives them
    (top frame only)."""
    printed = subprocess.run(
        ["jfr", "print", "--json", "--stack-depth", "1", "--events", events, str(recording)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: list[dict[str, Any]] = json.loads(printed)["recording"]["events"]
    return found


def seconds(duration: str) -> float:
    """A JFR duration ("PT0.012S", "PT1M2.5S") in seconds."""
    text = duration.removeprefix("PT")
    total = 0.0
    for unit, factor in (("H", 3600), ("M", 60), ("S", 1)):
        if unit in text:
            value, text = text.split(unit, 1)
            total += float(value) * factor
    return total


def summary(recording: Path, since: str = "") -> dict[str, float]:
    """What the driver JVM did over ``recording``, or only from ``since`` (an ISO
    time, UTC) on: its counters then grow from their last value before it."""

    def after(event: str) -> list[dict[str, Any]]:
        return [e for e in jfr_events(recording, event) if e["values"]["startTime"] >= since]

    def grown(event: str, field: str, value: Any = float) -> float:
        every = jfr_events(recording, event)
        before = [value(e["values"][field]) for e in every if e["values"]["startTime"] < since]
        found = [value(e["values"][field]) for e in every if e["values"]["startTime"] >= since]
        return found[-1] - (before[-1] if before else 0) if found else 0.0

    samples = [
        e
        for e in after("jdk.ExecutionSample")
        if TASK_THREAD in ((e["values"].get("sampledThread") or {}).get("javaName") or "")
    ]
    kinds = Counter(
        ((e["values"]["stackTrace"] or {}).get("frames") or [{}])[0].get("type", "?")
        for e in samples
    )
    return {
        "compilations": grown("jdk.CompilerStatistics", "compileCount"),
        "jit_s": grown("jdk.CompilerStatistics", "totalTimeSpent", seconds),
        "task_samples": len(samples),
        "interpreted": kinds["Interpreted"] / max(1, len(samples)),
        "compiled": (kinds["JIT compiled"] + kinds["Inlined"]) / max(1, len(samples)),
        "native": kinds["Native"] / max(1, len(samples)),
        "gc_pause_s": sum(
            seconds(e["values"]["sumOfPauses"]) for e in after("jdk.GarbageCollection")
        ),
        "classes_loaded": grown("jdk.ClassLoadingStatistics", "loadedClassCount"),
    }


def cold(env: dict[str, str], work: Path) -> dict[str, float]:
    recording = work / "cold.jfr"
    options = f"-XX:StartFlightRecording=settings=profile,filename={recording}"
    run = one_run(
        {**env, "PLATFORM_WAREHOUSE": str(work / "wh-cold"), "JAVA_TOOL_OPTIONS": options}
    )
    return {**run, **summary(recording)}


def warm(env: dict[str, str], work: Path) -> dict[str, float]:
    """Two runs to warm a new driver, then the third recorded."""
    recording = work / "warm.jfr"
    options = f"-XX:StartFlightRecording=settings=profile,name=w,filename={recording}"
    warehouse = {**env, "PLATFORM_WAREHOUSE": str(work / "wh-warm")}
    with warm_driver({**warehouse, "JAVA_TOOL_OPTIONS": options}) as (url, server, _ready):
        client = {**warehouse, "PLATFORM_DRIVER_URL": url}
        java = next(
            p.pid for p in psutil.Process(server.pid).children(recursive=True) if "java" in p.name()
        )
        for _ in range(2):
            one_run(client)
            shutil.rmtree(work / "wh-warm" / "user_clicks", ignore_errors=True)
        since = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        run = one_run(client)
        subprocess.run(
            ["jcmd", str(java), "JFR.dump", "name=w", f"filename={recording}"],
            check=True,
            capture_output=True,
        )
        return {**run, **summary(recording, since)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with scratch_broker("bench-cold-profile-") as (work, info):
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 4)
        now = int(time.time())
        events = click_events(args.events, 10_000, 1, now - 3600, 3600)
        kafka_admin.produce_all(config, "clicks", encoded(events, [], 0, "user_id"))
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PLATFORM_BOOTSTRAP_SERVERS": info.bootstrap_servers,
        }
        # The run that writes the JVM archive if there is none; then it settles.
        one_run({**env, "PLATFORM_WAREHOUSE": str(work / "wh-archive")})
        time.sleep(65)
        results = {"cold process": cold(env, work), "warm driver, third run": warm(env, work)}
    for name, found in results.items():
        print(name, {k: round(v, 3) for k, v in found.items()}, flush=True)
    report = render(args, results)
    print(report)
    if not args.no_write:
        write_section(report)


def render(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> str:
    def cell(found: dict[str, float], key: str, spec: str = ".1f") -> str:
        return format(found[key], spec) if key in found else "-"

    rows = [
        [
            name,
            cell(found, "wall"),
            cell(found, "query"),
            cell(found, "last_batch_done"),
            f"{found['compilations']:,.0f}",
            cell(found, "jit_s"),
            f"{found['interpreted']:.0%} / {found['compiled']:.0%} / {found['native']:.0%}",
            f"{found['task_samples']:,.0f}",
            cell(found, "gc_pause_s", ".2f"),
            f"{found['classes_loaded']:,.0f}",
        ]
        for name, found in results.items()
    ]
    lines = [
        "## Profile: a cold run against a warm driver's, by the JDK's Flight Recorder",
        "",
        f"Command: `.venv/bin/python -m benchmarks.cold_profile --events {args.events}`",
        "",
        f"Machine: {machine()}. `user_clicks` over {args.events:,} events from a fresh "
        "warehouse, recorded with JFR's `profile` settings: the cold process from its JVM's "
        "start (the class-data-sharing archive mapped), the warm driver from its start, "
        "counted over its third run only. Phases: seconds from the process's start (a "
        "warm driver's client logs none: -). JIT: compilations and the seconds the "
        "compiler threads spent in them. Task "
        "threads' samples: how each sample's top frame ran.",
        "",
        *table(
            [
                "run",
                "whole process s",
                "query started s",
                "last batch committed s",
                "JIT compilations",
                "JIT compile s",
                "task samples: interpreted / compiled / native",
                "task samples",
                "GC pauses s",
                "classes loaded",
            ],
            rows,
        ),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
