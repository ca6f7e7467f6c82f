"""The embedded Kafka-protocol broker (noida-db) for local runs and tests.

It runs as a detached process whose pid and port are kept in
``<data-dir>/broker.json``; ``stop`` signals exactly that pid. Production uses a
real Apache Kafka cluster (see docker-compose.yml) through the same settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import noida_db

from jobs.errors import BrokerError

BINARY = Path(noida_db.__file__).resolve().parent / "noida-db"
STATE_FILE = "broker.json"


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    port: int
    data_dir: Path

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_free_port(start: int = 20000, end: int = 40000) -> int:
    """A free loopback port from a range, for tests that start their own broker."""
    for port in range(start + os.getpid() % 1000, end):
        if port_is_free(port):
            return port
    raise BrokerError(f"no free loopback port in {start}-{end}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def status(data_dir: Path) -> BrokerInfo | None:
    """The running broker of this data directory, or None."""
    state = data_dir / STATE_FILE
    if not state.exists():
        return None
    info = json.loads(state.read_text())
    if not _alive(int(info["pid"])):
        return None
    return BrokerInfo(pid=int(info["pid"]), port=int(info["port"]), data_dir=data_dir)


def start(data_dir: Path, port: int, timeout_s: float = 30.0) -> BrokerInfo:
    """Start the broker on 127.0.0.1:port with its data under data_dir."""
    running = status(data_dir)
    if running is not None:
        if running.port != port:
            raise BrokerError(
                f"a broker for {data_dir} already runs on port {running.port} (pid {running.pid})"
            )
        return running
    if not port_is_free(port):
        raise BrokerError(f"port {port} on 127.0.0.1 is already in use; choose another port")
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "broker.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [str(BINARY), "start", "--data-dir", str(data_dir), "--host", "127.0.0.1"]
        + ["--only", "kafka", "--kafka-port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    (data_dir / STATE_FILE).write_text(json.dumps({"pid": proc.pid, "port": port}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerError(
                f"broker exited with code {proc.returncode}; see {data_dir / 'broker.log'}"
            )
        if _accepts(port):
            return BrokerInfo(pid=proc.pid, port=port, data_dir=data_dir)
        time.sleep(0.1)
    proc.terminate()
    raise BrokerError(f"broker did not accept connections on port {port} within {timeout_s:.0f} s")


def stop(data_dir: Path, timeout_s: float = 20.0) -> bool:
    """Stop the broker of data_dir with SIGTERM (it persists its data). False if none ran."""
    info = status(data_dir)
    if info is None:
        (data_dir / STATE_FILE).unlink(missing_ok=True)
        return False
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(info.pid):
        with contextlib.suppress(ChildProcessError):  # reap it if it is our child
            os.waitpid(info.pid, os.WNOHANG)
        time.sleep(0.1)
    if _alive(info.pid):
        os.kill(info.pid, signal.SIGKILL)
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    return True
