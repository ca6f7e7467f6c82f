"""The platform side by side with what a user would run instead, in one sitting, on
one broker, over the same events: Kafka Streams (the design's origin,
``benchmarks/kafka_streams/ClickCounts.java``), the Spark job a user would write by
hand (``benchmarks/hand_written_spark.py``), that job's query into Spark's ``noop``
sink (``spark-floor``: what any Spark job of this kind spends from a cold process
before it writes anything), and the platform, cold (a scheduled
``python -m jobs run``: a new process and JVM; on Java 17 and on Java 25, where its
archive is an AOT cache) and on its warm driver: a new one, whose first run is left
out (its JIT's warm-up), and one trained first (``serve --train-events``), whose
every run counts.

    .venv/bin/python -m benchmarks.anchors [--events 1000000] [--runs 3]
        [--systems kafka-streams,hand-written,spark-floor,cold,cold-java25,warm,trained]
        [--no-write]

Every system counts clicks per user per 1-minute tumbling event-time window (10
minutes' grace), exactly-once, over ``--events`` click events of 1,000 users over
10 minutes in 4 partitions; each run starts from nothing (a new application id,
table, checkpoint or warehouse) and is timed as a whole process, start-up
included. Kafka Streams runs with 2 stream threads (the machine's cores) and
``exactly_once_v2``; the Spark jobs with the platform's engine settings. Writes its
section of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.cold_path import on_java, one_run, warm_driver_runs
from benchmarks.report import machine, scratch_broker, table, write_section
from include.sample_data import click_events, encoded
from jobs import kafka_admin
from jobs.broker import BrokerInfo
from jobs.jars import spark_jars
from jobs.settings import REPO_ROOT, jars_dir
from jobs.streaming.jvm import CDS, driver_java_options

HERE = Path(__file__).resolve().parent
SYSTEMS = "kafka-streams,hand-written,spark-floor,cold,cold-java25,warm,trained"
USERS, SPAN_S, PARTITIONS = 1_000, 600, 4
TRAIN_EVENTS = 1_000_000  # the trained driver's (serve --train-events)
Runner = Callable[[BrokerInfo, Path, int], dict[str, float]]


def kafka_streams_classpath() -> str:
    """``ClickCounts`` compiled against its pinned jars (resolved with ``mvn`` once
    per version of the pom and the source)."""
    pom, source = HERE / "kafka_streams" / "pom.xml", HERE / "kafka_streams" / "ClickCounts.java"
    key = hashlib.sha256(pom.read_bytes() + source.read_bytes()).hexdigest()[:12]
    folder = jars_dir() / f"bench-kafka-streams-{key}"
    classes = folder / "classes"
    if not (classes / "ClickCounts.class").exists():
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(
            ["mvn", "-q", "-B", "-f", str(pom), f"-Djars.dir={folder}", "package"], check=True
        )
        subprocess.run(
            ["javac", "-nowarn", "-cp", f"{folder}/*", "-d", str(classes), str(source)],
            check=True,
        )
    return f"{classes}{os.pathsep}{folder}/*"


def kafka_streams_run(info: BrokerInfo, work: Path, i: int) -> dict[str, float]:
    classpath = kafka_streams_classpath()
    config = kafka_admin.client_config(info.bootstrap_servers)
    kafka_admin.create_topic(kafka_admin.admin(config), f"ks_counts_{i}", PARTITIONS)
    started = time.monotonic()
    done = subprocess.run(
        ["java", "-cp", classpath, "ClickCounts", info.bootstrap_servers, "clicks"]
        + [f"ks_counts_{i}", f"ks_clicks_{i}", str(work / f"ks-state-{i}"), "2", "100"],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    wall = time.monotonic() - started
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall": wall, "session": marks["start_s"], "last_batch_done": marks["processed_s"]}


def platform_java_options() -> str:
    """The platform's driver JVM options for a short process (its JIT's directives),
    its archive mapped, for the hand-written job and the floor. The warm-up run wrote
    the archive; were it missing, this process would become the one that writes it,
    and while it lives no platform run would map or write one (seen: every cold
    Java 17 run without its archive)."""
    options = driver_java_options("short")
    if CDS.map_option not in options:
        raise SystemExit("error: the warm-up run left no class-data-sharing archive")
    return options


def hand_written_run(info: BrokerInfo, work: Path, i: int, sink: str = "delta") -> dict[str, float]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(HERE / "hand_written_spark.py")]
        + ["--bootstrap-servers", info.bootstrap_servers, "--topic", "clicks"]
        + ["--table", str(work / f"hw-{sink}-table-{i}")]
        + ["--checkpoint", str(work / f"hw-{sink}-cp-{i}")]
        + ["--jars", ",".join(str(j) for j in spark_jars())]
        + ["--driver-java-options", platform_java_options(), "--sink", sink],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "wall": wall,
        "session": marks["session_s"],
        "query": marks["query_s"],
        "last_batch_done": marks["done_s"],
    }


def platform_env(info: BrokerInfo, warehouse: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PLATFORM_BOOTSTRAP_SERVERS": info.bootstrap_servers,
        "PLATFORM_WAREHOUSE": str(warehouse),
    }


def cold_run(info: BrokerInfo, work: Path, i: int) -> dict[str, float]:
    return one_run(platform_env(info, work / f"wh-cold-{i}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--systems", default=SYSTEMS, help=f"comma list of {SYSTEMS}")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--java-home",
        default="/usr/lib/jvm/temurin-25-jdk-amd64",
        help="the Java 25+ of cold-java25 (where the archive is an AOT cache)",
    )
    args = parser.parse_args()
    systems = [s.strip() for s in args.systems.split(",")]
    unknown = set(systems) - set(SYSTEMS.split(","))
    if unknown:
        parser.error(f"unknown systems: {sorted(unknown)}")
    runners: dict[str, Runner] = {
        "kafka-streams": kafka_streams_run,
        "hand-written": hand_written_run,
        "spark-floor": lambda info, work, i: hand_written_run(info, work, i, "noop"),
        "cold": cold_run,
        "cold-java25": lambda info, work, i: one_run(
            on_java(platform_env(info, work / f"wh-cold25-{i}"), args.java_home)
        ),
    }
    if "kafka-streams" in systems:
        kafka_streams_classpath()  # built before any clock starts
    results: dict[str, list[dict[str, float]]] = {}
    with scratch_broker("bench-anchors-") as (work, info):
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", PARTITIONS)
        start = int(time.time()) - SPAN_S - 60
        events = click_events(args.events, USERS, 1, start, SPAN_S)
        kafka_admin.produce_all(config, "clicks", encoded(events, [], 0, "user_id"))
        # One untimed platform run: the page cache holds the topic and the jars, and
        # the JVM's class-data-sharing archive exists (jobs/streaming/jvm.py).
        one_run(platform_env(info, work / "wh-warm-up"))
        if "cold-java25" in systems:  # and Java 25's AOT cache
            one_run(on_java(platform_env(info, work / "wh-warm-up-25"), args.java_home))
        time.sleep(65)
        platform_java_options()  # the archive adopted before any clock starts
        for round_ in range(args.runs):  # interleaved: a drift of the machine hits all
            for name in [s for s in systems if s in runners]:
                run = runners[name](info, work, round_)
                results.setdefault(name, []).append(run)
                print(name, {k: round(v, 2) for k, v in run.items()}, flush=True)
        if "warm" in systems:
            warm = warm_driver_runs(platform_env(info, work / "unused"), work, args.runs)
            results["warm"] = warm[1:]  # the driver's first run is its JIT's warm-up
            results["warm-first"] = warm[:1]
        if "trained" in systems:  # every run counts: the training was the warm-up
            trained = warm_driver_runs(
                platform_env(info, work / "unused"), work, args.runs - 1, TRAIN_EVENTS
            )
            results["trained"] = trained
    report = render(args, results)
    print(report)
    if not args.no_write:
        write_section(report)


NAMES = {
    "kafka-streams": "Kafka Streams 4.3.1 (`exactly_once_v2`, 2 threads, RocksDB)",
    "hand-written": "hand-written Spark job (`foreachBatch` MERGE, `txnAppId`/`txnVersion`)",
    "spark-floor": "the same Spark query into the `noop` sink (no table: the floor)",
    "cold": "the platform, cold (`python -m jobs run`)",
    "cold-java25": "the platform, cold on Java 25 (its archive an AOT cache)",
    "warm": "the platform, warm driver (later runs)",
    "warm-first": "the platform, warm driver (its first run)",
    "trained": f"the platform, a warm driver trained on {TRAIN_EVENTS:,} events (every run)",
}


def render(args: argparse.Namespace, results: dict[str, list[dict[str, float]]]) -> str:
    def median(name: str, key: str) -> float:
        values = [r[key] for r in results.get(name, []) if key in r]
        return statistics.median(values) if values else float("nan")

    def cell(value: float) -> str:
        return "-" if value != value else f"{value:.1f}"

    streams = median("kafka-streams", "wall")
    hand = median("hand-written", "wall")
    rows = []
    for name, runs in results.items():
        wall = median(name, "wall")
        rows.append(
            [
                NAMES[name],
                " / ".join(f"{r['wall']:.1f}" for r in runs),
                f"{args.events / wall:,.0f}",
                cell(median(name, "session")),
                cell(median(name, "query")),
                cell(median(name, "last_batch_done")),
                "-" if streams != streams else f"{wall / streams:.2f}",
                "-" if hand != hand else f"{wall / hand:.2f}",
            ]
        )
    lines = [
        "## Anchors: Kafka Streams and the hand-written Spark job, side by side",
        "",
        f"Command: `.venv/bin/python -m benchmarks.anchors --events {args.events} "
        f"--runs {args.runs}"
        + (f" --systems {args.systems}" if args.systems != SYSTEMS else "")
        + "`",
        "",
        f"Machine: {machine()}. One sitting, one embedded broker, the same {args.events:,} "
        f"click events ({USERS:,} users, {SPAN_S // 60} minutes, {PARTITIONS} partitions), "
        "clicks per user per 1-minute tumbling window with 10 minutes' grace, exactly-once; "
        "each run from nothing. Whole process: seconds from the process start to its exit. "
        "Phases (medians, seconds from the process start): the engine ready (Spark's "
        "session; Kafka Streams' topology built), the query started, the last input "
        "committed. The warm driver's runs are client processes: its phases are the "
        "driver's (-).",
        "",
        *table(
            [
                "system",
                "whole process s (each run)",
                "events/s",
                "engine ready s",
                "query started s",
                "last input committed s",
                "x Kafka Streams",
                "x hand-written",
            ],
            rows,
        ),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
