"""A real Spark standalone cluster on loopback, from pyspark's own scripts: one
master and one worker, for trying (and testing) the platform on a cluster.

    python -m include.local_spark start [--cores 2] [--memory 3g]   # prints the master URL
    python -m include.local_spark stop

Then ``PLATFORM_SPARK_MASTER=spark://127.0.0.1:PORT python -m jobs run ...``.
State (pids, logs, the worker's directory) lives under ``.local/spark``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import pyspark

from jobs.errors import PlatformError
from jobs.local_server import find_free_port
from jobs.settings import REPO_ROOT

SPARK_HOME = Path(pyspark.__file__).parent
HOME = REPO_ROOT / ".local" / "spark"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Cluster:
    master_url: str
    web_ui: str
    pgids: tuple[int, ...]  # each daemon runs in its own process group
    directory: str


def _daemon(args: list[str], log: Path) -> int:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # stop() ends the wrapper and its java together
        )
    return proc.pid


def alive_workers(web_ui: str) -> int:
    try:
        with urllib.request.urlopen(f"{web_ui}/json/", timeout=2) as response:
            return int(json.load(response).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


def start(directory: Path, cores: int = 2, memory: str = "3g") -> Cluster:
    """Start a master and a worker on free loopback ports; return once the worker
    has registered (a job submitted earlier would wait for resources)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = find_free_port(11000, 11300)
    web_port = find_free_port(11300, 11600)
    master_url = f"spark://127.0.0.1:{port}"
    web_ui = f"http://127.0.0.1:{web_port}"
    master = _daemon(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        + ["--port", str(port), "--webui-port", str(web_port)],
        directory / "master.log",
    )
    worker_ui = find_free_port(11600, 11900)
    worker = _daemon(
        ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1"]
        + ["--cores", str(cores), "--memory", memory, "--webui-port", str(worker_ui)]
        + ["--work-dir", str(directory / "work")],
        directory / "worker.log",
    )
    cluster = Cluster(master_url, web_ui, (master, worker), str(directory))
    deadline = time.monotonic() + START_TIMEOUT_S
    while alive_workers(web_ui) < 1:
        if time.monotonic() > deadline:
            stop(cluster)
            raise PlatformError(
                f"the local Spark cluster did not come up within {START_TIMEOUT_S:.0f} s; "
                f"see {directory}/master.log and worker.log"
            )
        time.sleep(0.5)
    (directory / "cluster.json").write_text(json.dumps(asdict(cluster)))
    return cluster


def stop(cluster: Cluster) -> None:
    """End the daemons this module started (their own process groups only)."""
    for pgid in cluster.pgids:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    for pgid in cluster.pgids:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            # Started by this process: reap it (a zombie still counts as alive).
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pgid, os.WNOHANG)
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.killpg(pgid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m include.local_spark")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--memory", default="3g")
    args = parser.parse_args()
    state = HOME / "cluster.json"
    if args.action == "start":
        if state.exists():
            print(f"error: a cluster is already recorded in {state}; stop it first")
            return 2
        cluster = start(HOME, args.cores, args.memory)
        print(f"Spark master: {cluster.master_url} (web UI {cluster.web_ui})")
        print(f"next: PLATFORM_SPARK_MASTER={cluster.master_url} python -m jobs run ...")
        return 0
    if not state.exists():
        print("no local Spark cluster is running")
        return 0
    data = json.loads(state.read_text())
    stop(Cluster(data["master_url"], data["web_ui"], tuple(data["pgids"]), data["directory"]))
    state.unlink()
    print("local Spark cluster stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
