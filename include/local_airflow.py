"""Local Airflow for trying the platform: ``airflow standalone``, offline, SQLite,
on a loopback port, with the project's DAGs, plugins, Spark connection and
platform settings, and beside it a warm driver (``python -m jobs serve`` on
``PLATFORM_DRIVER_PORT``) that the stream DAGs send their scheduled runs to,
trained first on ``PLATFORM_DRIVER_TRAIN_EVENTS`` events (here 1,000,000 unless
set, on a local Spark master; 0: none, ``jobs/driver_training.py``).

    python -m include.local_airflow start [--port 8085]   # prints URL and login
    python -m include.local_airflow status
    python -m include.local_airflow stop                  # stops the process group

State lives under ``.local/airflow`` (AIRFLOW_HOME); the DAGs submit jobs with
the project's ``.venv`` (its ``spark-submit`` is first on PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from jobs.errors import ConfigError, PlatformError
from jobs.local_server import port_is_free
from jobs.settings import REPO_ROOT, load_settings

STATE = "standalone.json"
LOG = "standalone.log"
DRIVER_LOG = "warm-driver.log"
TRAIN_EVENTS = "1000000"  # the warm driver's training, unless the user set another


def home() -> Path:
    """Where it keeps its state (``PLATFORM_AIRFLOW_HOME``): read when a command
    runs, so that a bad setting is one ``error:`` line, not an import traceback."""
    return load_settings().local_airflow_home


# URL-encoded, or the provider silently falls back to YARN (measured).
SPARK_CONNECTION = "spark://local%5B2%5D?deploy-mode=client&spark-binary=spark-submit"


def environment(port: int, driver_port: int) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    # The driver trains its JIT first where it can (jobs/driver_training.py).
    settings = load_settings()
    trains = settings.spark_master.startswith("local") and not os.environ.get("PLATFORM_FAULT")
    return {
        **({"PLATFORM_DRIVER_TRAIN_EVENTS": TRAIN_EVENTS} if trains else {}),
        **os.environ,
        # The tasks' runs go to the warm driver started beside Airflow.
        "PLATFORM_DRIVER_URL": f"http://127.0.0.1:{driver_port}",
        "AIRFLOW_HOME": str(home()),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # A laptop-sized executor: 4 task slots, not 32 idle worker processes.
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port + 1),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(port + 2),
        "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_CONNECTION,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO_ROOT), str(REPO_ROOT / "plugins"), os.environ.get("PYTHONPATH")])
        ),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def _groups(info: dict[str, int]) -> list[int]:
    """The process groups of a start: Airflow's and its warm driver's."""
    return [info[key] for key in ("pgid", "driver_pgid") if key in info]


def _alive(pgid: int) -> bool:
    """Whether a process of the group still runs (a zombie that no one reaps, as
    under a container's bare PID 1, does not)."""
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _running() -> dict[str, int] | None:
    state = home() / STATE
    if not state.exists():
        return None
    info: dict[str, int] = json.loads(state.read_text())
    return info if any(_alive(g) for g in _groups(info)) else None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def password() -> str:
    generated = home() / "simple_auth_manager_passwords.json.generated"
    if generated.exists():
        return str(json.loads(generated.read_text()).get("admin", "?"))
    return "?"


def group_rss_mib(pgid: int) -> float:
    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                total += proc.memory_info().rss
        except (ProcessLookupError, psutil.Error):
            continue
    return total / 2**20


def start(port: int, timeout_s: float = 300.0) -> dict[str, int]:
    running = _running()
    if running is not None:
        return running
    driver_port = load_settings().driver_port
    for p in (port, port + 1, port + 2, driver_port):
        if not port_is_free(p):
            raise ConfigError(
                f"port {p} on 127.0.0.1 is in use; choose another with --port "
                "(PLATFORM_DRIVER_PORT for the warm driver's)"
            )
    folder = home()
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env = environment(port, driver_port)
    info = {"port": port, "driver_port": driver_port}
    commands = {
        "pgid": ([str(Path(sys.executable).parent / "airflow"), "standalone"], folder / LOG),
        "driver_pgid": (
            [sys.executable, "-m", "jobs", "serve", "--port", str(driver_port)],
            folder / DRIVER_LOG,
        ),
    }
    processes = {}
    for key, (command, log_path) in commands.items():
        with open(log_path, "ab") as log:
            processes[key] = proc = subprocess.Popen(
                command,
                env=env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop ends all of it
            )
        info[key] = proc.pid
        (folder / STATE).write_text(json.dumps(info))  # before the next start: stop finds it
    checks = {
        "Airflow": ("pgid", f"http://127.0.0.1:{port}/api/v2/monitor/health", folder / LOG),
        "the warm driver": (
            "driver_pgid",
            f"http://127.0.0.1:{driver_port}/v1/health",
            folder / DRIVER_LOG,
        ),
    }
    while time.monotonic() - started < timeout_s:
        for name, (key, _url, log_path) in checks.items():
            code = processes[key].poll()
            if code is not None:
                stop()
                raise PlatformError(f"{name} exited ({code}); see {log_path}")
        if all(_answers(url) for _key, url, _log in checks.values()):
            info["seconds"] = int(time.monotonic() - started)
            return info
        time.sleep(1)
    stop()
    raise PlatformError(
        f"Airflow or its warm driver was not up within {timeout_s:.0f} s; see {folder}"
    )


def stop(timeout_s: float = 30.0) -> bool:
    info = _running()
    (home() / STATE).unlink(missing_ok=True)
    if info is None:
        return False
    groups = [g for g in _groups(info) if _alive(g)]
    for pgid in groups:
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(g) for g in groups):
        time.sleep(0.5)
    for pgid in groups:
        if _alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m include.local_airflow", description=__doc__)
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--port", type=int, help="default: $PLATFORM_AIRFLOW_PORT or 8085")
    args = parser.parse_args(argv)
    try:
        if args.port is None:
            args.port = load_settings().local_airflow_port
        if not 1024 <= args.port <= 65533:
            raise ConfigError(f"--port must be 1024-65533, got {args.port}")
        if args.action == "start":
            info = start(args.port)
            rss = sum(group_rss_mib(g) for g in _groups(info))
            print(
                f"Airflow is up at http://127.0.0.1:{info['port']} (started in "
                f"{info.get('seconds', 0)} s, {rss:,.0f} MiB)"
            )
            driver = f"http://127.0.0.1:{info.get('driver_port')}"
            print(f"scheduled runs go to the warm driver at {driver} (log: {home() / DRIVER_LOG})")
            print(f"login: admin / {password()}   logs: {home() / LOG}")
            print("stop it with: make airflow-stop")
        elif args.action == "stop":
            print("Airflow stopped" if stop() else "Airflow was not running")
        else:
            running = _running()
            if running is None:
                print("Airflow is not running")
                return 1
            rss = sum(group_rss_mib(g) for g in _groups(running))
            print(
                f"Airflow is running at http://127.0.0.1:{running['port']}, its warm driver at "
                f"http://127.0.0.1:{running.get('driver_port')} (process groups "
                f"{', '.join(map(str, _groups(running)))}, {rss:,.0f} MiB)"
            )
    except PlatformError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
