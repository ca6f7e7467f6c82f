"""The path every scheduled ``stream_<app>`` DAG run takes: a cold
``python -m jobs run`` (new process, new JVM) of ``user_clicks`` over 1,000,000
events, Spark start-up included, and one with nothing to do.

    .venv/bin/python -m benchmarks.cold_path [--events 1000000] [--runs 2]

Each run starts from a fresh warehouse; where the seconds go comes from the job's
own log lines (session ready, query started, each batch) and its ledger. Runs with
the JVM's class-data-sharing archive and without (``PLATFORM_SPARK_CDS=off``), on
JDK 25, where the archive is an AOT cache (``--modes aot``, ``--java-home``), and
sent to a warm driver (``python -m jobs serve``, ``PLATFORM_DRIVER_URL``): the run's
process is then a client; the driver's own start-up is reported apart.
Writes its section of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from deltalake import DeltaTable

from benchmarks.report import machine, scratch_broker, write_section
from include.sample_data import click_events, encoded
from jobs import kafka_admin
from jobs.local_server import find_free_port
from jobs.settings import REPO_ROOT

MODES = "off,on,warm"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO (\S+): (.*)$")


def one_run(env: dict[str, str]) -> dict[str, float]:
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "jobs", "run", "--pipeline", "user_clicks", "--quiet"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    marks: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        found = STAMP.match(line)
        if not found:
            continue
        at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - started
        if found.group(2) == "jobs.streaming.spark":
            marks.setdefault("session", at)
        elif "starts from the" in found.group(3):
            marks["query"] = at
        elif "committed:" in found.group(3):
            marks.setdefault("first_batch_done", at)
            marks["last_batch_done"] = at
    return {"wall": wall, **marks}


def batch_seconds(warehouse: Path) -> float:
    ledger = DeltaTable(str(warehouse / "user_clicks" / "_ledger")).to_pyarrow_table()
    return float(
        sum(
            json.loads(r["details"])["seconds"]
            for r in ledger.to_pylist()
            if r["entry_type"] == "batch" and r["records_in"]
        )
    )


@contextmanager
def warm_driver(
    env: dict[str, str], train_events: int = 0
) -> Iterator[tuple[str, subprocess.Popen[bytes], float]]:
    """A new ``python -m jobs serve`` with ``env`` (trained on ``train_events``), once
    it answers: (its URL, its process, the seconds it took to answer); stopped
    afterwards."""
    port = find_free_port(18100, 19000)
    started = time.time()
    server = subprocess.Popen(
        [sys.executable, "-m", "jobs", "serve", "--port", str(port)]
        + ["--train-events", str(train_events)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/health", timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.time() - started > 120 + train_events / 5000:
                    raise RuntimeError("the warm driver did not start") from None
                time.sleep(0.2)
        yield url, server, time.time() - started
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=120)


def warm_driver_runs(
    env: dict[str, str], work: Path, runs: int, train_events: int = 0
) -> list[dict[str, float]]:
    """Start a warm driver (trained on ``train_events``), then ``runs`` + 1 client
    runs, each over a fresh application folder: the first on the new driver (its JIT
    still cold unless trained), then warm."""
    warehouse = work / "wh-warm"
    env = {**env, "PLATFORM_WAREHOUSE": str(warehouse)}
    with warm_driver(env, train_events) as (url, _server, ready):
        results = []
        for _ in range(runs + 1):
            client = {**env, "PLATFORM_DRIVER_URL": url}
            run = one_run(client)
            run["batch"] = batch_seconds(warehouse)
            run["idle_wall"] = one_run(client)["wall"]
            run["driver_start"] = ready
            results.append(run)
            print("warm driver", {k: round(v, 2) for k, v in run.items()}, flush=True)
            shutil.rmtree(warehouse / "user_clicks", ignore_errors=True)
        return results


def on_java(base: dict[str, str], java_home: str) -> dict[str, str]:
    """The runs' environment with ``java_home``'s Java for the driver (Spark's
    ``JAVA_HOME``): on Java 25 the platform's archive is an AOT cache."""
    return {**base, "JAVA_HOME": java_home, "PATH": f"{java_home}/bin{os.pathsep}{base['PATH']}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--modes",
        default=MODES,
        help="comma list: off, on (CDS), aot (JDK 25's AOT cache), warm (warm driver)",
    )
    parser.add_argument(
        "--java-home",
        default="/usr/lib/jvm/temurin-25-jdk-amd64",
        help="the JDK 25+ of the aot mode",
    )
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    with scratch_broker("bench-cold-") as (work, info):
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 4)
        now = int(time.time())
        events = click_events(args.events, 10_000, 1, now - 3600, 3600)
        kafka_admin.produce_all(config, "clicks", encoded(events, [], 0, "user_id"))
        base = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PLATFORM_BOOTSTRAP_SERVERS": info.bootstrap_servers,
        }
        modes = [m.strip() for m in args.modes.split(",")]
        if "warm" in modes:
            warm = warm_driver_runs(base, work, args.runs)
            results["warm driver, first run"] = warm[:1]
            results["warm driver, later runs"] = warm[1:]
        for cds in [m for m in modes if m in ("off", "on", "aot")]:
            env = {**base, "PLATFORM_SPARK_CDS": "off" if cds == "off" else "on"}
            if cds == "aot":
                env = on_java(env, args.java_home)
            if cds != "off":  # the first run writes the archive (or the AOT cache)
                warmup = one_run({**env, "PLATFORM_WAREHOUSE": str(work / f"warmup-{cds}")})
                print(cds, "writing run", round(warmup["wall"], 2), flush=True)
                time.sleep(65)  # the dump settles (jobs/streaming/jvm.py)
            for round_ in range(args.runs):
                warehouse = work / f"wh-{cds}-{round_}"
                env["PLATFORM_WAREHOUSE"] = str(warehouse)
                cold = one_run(env)
                cold["batch"] = batch_seconds(warehouse)
                cold["idle_wall"] = one_run(env)["wall"]  # nothing to do
                results.setdefault(cds, []).append(cold)
                print(cds, {k: round(v, 2) for k, v in cold.items()}, flush=True)
                shutil.rmtree(warehouse, ignore_errors=True)
    report = render(args, results)
    print(report)
    if not args.no_write:
        write_section(report)


def render(args: argparse.Namespace, results: dict[str, list[dict[str, float]]]) -> str:
    lines = [
        "## Cold path: a scheduled `available-now` run, Spark start-up included",
        "",
        f"Command: `.venv/bin/python -m benchmarks.cold_path --events {args.events} "
        f"--runs {args.runs}" + (f" --modes {args.modes}" if args.modes != MODES else "") + "`",
        "",
        f"Machine: {machine()}. `python -m jobs run --pipeline user_clicks` in a new process "
        f"over {args.events:,} events (4 partitions, 10,000 users, one hour), from a fresh "
        "warehouse; median of the runs. Seconds from the process start: Spark session "
        "ready, query started (tables, cut, broker checks, query built), first batch "
        "committed, process exit.",
        "",
        "A warm driver (`python -m jobs serve`) started once; its own start-up "
        "(until it answers) is the last column. The runs sent to it are client processes "
        "(`PLATFORM_DRIVER_URL`): session and query columns are the driver's business "
        "there (-).",
        "",
        "| driver | session s | query s | batch committed s | exit s "
        "| batch s | events/s (whole process) | events/s (batch) | nothing to do s "
        "| driver start-up s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, runs in results.items():

        def p50(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r.get(key, float("nan")) for r in runs)

        def cell(key: str) -> str:
            value = p50(key)
            return "-" if value != value else f"{value:.1f}"  # NaN: not measured

        name = {"aot": "cold process, JDK 25 AOT cache"}.get(
            mode, mode if mode.startswith("warm") else f"cold process, CDS {mode}"
        )
        lines.append(
            f"| {name} | {cell('session')} | {cell('query')} "
            f"| {cell('first_batch_done')} | {p50('wall'):.1f} | {p50('batch'):.1f} "
            f"| {args.events / p50('wall'):,.0f} | {args.events / p50('batch'):,.0f} "
            f"| {p50('idle_wall'):.1f} | {cell('driver_start')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
