"""Local Airflow for trying the platform: ``airflow standalone``, offline, SQLite,
on a loopback port, with the project's DAGs, plugins, Spark connection and
platform settings.

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

from jobs.broker import port_is_free
from jobs.errors import ConfigError, PlatformError
from jobs.settings import REPO_ROOT, load_settings

HOME = load_settings().local_airflow_home
STATE = HOME / "standalone.json"
LOG = HOME / "standalone.log"
# URL-encoded, or the provider silently falls back to YARN (measured).
SPARK_CONNECTION = "spark://local%5B2%5D?deploy-mode=client&spark-binary=spark-submit"


def environment(port: int) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "AIRFLOW_HOME": str(HOME),
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


def _running() -> dict[str, int] | None:
    if not STATE.exists():
        return None
    info: dict[str, int] = json.loads(STATE.read_text())
    try:
        os.killpg(info["pgid"], 0)
    except ProcessLookupError:
        return None
    return info


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2
        ) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def password() -> str:
    generated = HOME / "simple_auth_manager_passwords.json.generated"
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


def start(port: int, timeout_s: float = 180.0) -> dict[str, int]:
    running = _running()
    if running is not None:
        return running
    for p in (port, port + 1, port + 2):
        if not port_is_free(p):
            raise ConfigError(f"port {p} on 127.0.0.1 is in use; choose another with --port")
    HOME.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(LOG, "ab") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "standalone"],
            env=environment(port),
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop ends all of it
        )
    info = {"pgid": proc.pid, "port": port}
    STATE.write_text(json.dumps(info))
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            raise PlatformError(f"airflow standalone exited ({proc.returncode}); see {LOG}")
        if _healthy(port):
            info["seconds"] = int(time.monotonic() - started)
            return info
        time.sleep(1)
    stop()
    raise PlatformError(f"Airflow was not healthy within {timeout_s:.0f} s; see {LOG}")


def stop(timeout_s: float = 30.0) -> bool:
    info = _running()
    STATE.unlink(missing_ok=True)
    if info is None:
        return False
    os.killpg(info["pgid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(info["pgid"], 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    os.killpg(info["pgid"], signal.SIGKILL)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m include.local_airflow", description=__doc__)
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--port", type=int, default=load_settings().local_airflow_port)
    args = parser.parse_args(argv)
    try:
        if not 1024 <= args.port <= 65533:
            raise ConfigError(f"--port must be 1024-65533, got {args.port}")
        if args.action == "start":
            info = start(args.port)
            rss = group_rss_mib(info["pgid"])
            print(
                f"Airflow is up at http://127.0.0.1:{info['port']} (started in "
                f"{info.get('seconds', 0)} s, {rss:,.0f} MiB)"
            )
            print(f"login: admin / {password()}   logs: {LOG}")
            print("stop it with: make airflow-stop")
        elif args.action == "stop":
            print("Airflow stopped" if stop() else "Airflow was not running")
        else:
            running = _running()
            if running is None:
                print("Airflow is not running")
                return 1
            print(
                f"Airflow is running at http://127.0.0.1:{running['port']} (process group "
                f"{running['pgid']}, {group_rss_mib(running['pgid']):,.0f} MiB)"
            )
    except PlatformError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
