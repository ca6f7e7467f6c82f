"""Processes of the local servers the platform starts for runs and tests (the
embedded broker, the S3 server): loopback ports, and whether a recorded pid is
still the process that was started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import psutil

from jobs.errors import PlatformError


def read_state(path: Path) -> dict[str, object] | None:
    """A server's state file (a JSON object), or None when it is missing or torn."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_free_port(
    start: int = 20000, end: int = 32000, avoid: tuple[int, ...] = (), run: int = 1
) -> int:
    """The first of ``run`` consecutive free loopback ports in [start, end), for
    tests and local tools. Keep ranges below the kernel's ephemeral range
    (32768-60999 by default): a port there may be taken by any outgoing
    connection between this check and the bind."""
    span = end - start - run + 1
    if span <= 0:
        raise PlatformError(f"no free loopback port in {start}-{end}")
    # Parallel processes (test workers: consecutive pids) start far apart: scanning
    # up from neighbouring places, one would take the port another's server left
    # for a moment (a broker restarted on its port).
    offset = (os.getpid() * 2654435761) % span
    for i in range(span):
        port = start + (offset + i) % span
        ports = range(port, port + run)
        if all(p not in avoid and port_is_free(p) for p in ports):
            return port
    raise PlatformError(f"no free loopback port in {start}-{end}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (ended, not yet reaped: reaped here if it is our child) is not a broker.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def started(pid: int) -> int:
    """When a process started (ms): with the pid, it names the process, whose pid
    alone the system may give to another process after it ends."""
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except psutil.Error:
        return 0


def ended(pids: list[int], timeout_s: float) -> None:
    """Wait for ``pids`` to end; SIGKILL what is left after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            raise PlatformError(f"process(es) {pids} did not end after SIGKILL")
        time.sleep(0.05)
