"""The pause harness, in the manner of Jepsen (tests/integration/test_stream_pauses.py
and test_operation_pauses.py): a holder is stopped with SIGSTOP at a
named point (``PLATFORM_PAUSE``) past its lease; another machine (its own working
directory, home and temporary folder, sharing only Kafka and the S3 server) takes
the application over and finishes a run or an operation; then the first holder is
resumed. It must stop with the lease's one ``error:`` line (exit 2) and make no
successful write to the store after it woke (its requests go through a proxy of
its own), and the tables must be exactly what plain Python computes from the
records produced: every click counted once, every bad record one dead letter, the
ledger's offset ranges tiling every partition.

Every operation point runs in CI; the stream points are chosen by seeds, a fixed
list and one new per run, printed on failure (``PLATFORM_PAUSE_SEED`` replays it)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobs import kafka_admin
from jobs.settings import REPO_ROOT
from jobs.storage_server import StorageInfo
from jobs.warehouse import Location
from tests.conftest import produce, run_in_process
from tests.live import assert_exact_clicks, assert_ledger_tiles, ledger_batches
from tests.s3_proxy import StoreProxy

LEASE_S = 2
BAD = [b"not json", b'{"user_id": 7, "timestamp": 1}']
# Writes a woken stream may still land: Spark's state store files whose upload was
# in flight when it was stopped (docs/architecture.md, the write map: a stale
# driver's state files hold the same state), and lease writes the store refuses.
IN_FLIGHT = re.compile(r"/state/")
STREAM_POINTS = ["after_changelog@1", "after_state@1", "after_ledger@1"]
# The seeds every run pauses a stream with (each a point and a batch), and one new
# per run (``SEED``; ``PLATFORM_PAUSE_SEED`` replays it).
FIXED_SEEDS = [0, 17]
OPERATION_POINTS = ["before_bump", "after_fence"]
SEED = int(os.environ.get("PLATFORM_PAUSE_SEED") or random.SystemRandom().randrange(10**6))


@dataclass
class Paused:
    """The machine whose holder is paused: its own working directory, home and
    temporary folder, and its own road to the store (``proxy``: whose writes they are)."""

    env: dict[str, str]
    proxy: StoreProxy

    def start(self, args: list[str], point: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "jobs", *args],
            cwd=self.env["HOME"],
            env={**self.env, "PLATFORM_PAUSE": point},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


@contextlib.contextmanager
def paused_machine(
    s3_server: StorageInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Paused]:
    """The machine to pause; the other machine is the test process (its shared Spark
    session, the S3 server reached directly): the two share only Kafka and the store."""
    monkeypatch.setenv("PLATFORM_LEASE_SECONDS", str(LEASE_S))
    home = tmp_path / "machine-a"
    (home / "tmp").mkdir(parents=True)
    with StoreProxy(s3_server.port) as proxy:
        env = {
            **os.environ,
            **s3_server.environment(),
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "PYTHONPATH": str(REPO_ROOT),
        }
        yield Paused(env, proxy)


def run_here(spark: Any, args: list[str], timeout: float = 300) -> None:
    """Run on this machine to its end, again while the application is busy (the
    paused holder's lease expiring)."""
    deadline = time.monotonic() + timeout
    while True:
        done = run_in_process(spark, args)
        if done.returncode == 0:
            return
        assert "is busy" in done.stderr and time.monotonic() < deadline, done.stderr[-3000:]
        time.sleep(1)


def stopped(proc: subprocess.Popen[str], timeout: float = 180) -> None:
    """Wait until the process is stopped (SIGSTOP: state T), or fail with its output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"it ended instead of pausing: {err[-3000:]}")
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.2)
    raise AssertionError("the process never reached its pause point")


def resume_and_end(proc: subprocess.Popen[str]) -> tuple[float, str]:
    woke = time.time()
    os.killpg(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=180)
    return woke, err


def end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def assert_stopped_by_its_lease(proc: subprocess.Popen[str], err: str) -> None:
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), last
    assert re.search(r"lease|moved to epoch|overtaken|fenced", last), last
    assert not any(line.startswith("Traceback") for line in err.splitlines()), err[-3000:]


def assert_no_write_after(proxy: StoreProxy, woke: float) -> None:
    landed = [
        (method, path, status)
        for at, method, path, status in proxy.writes
        if at >= woke and 200 <= status < 300 and not IN_FLIGHT.search(path)
    ]
    assert not landed, f"the woken holder wrote after the takeover: {landed}"


def check_exact(
    warehouse: Location, topic: str, config: dict[str, str], values: list[bytes]
) -> None:
    marks = kafka_admin.watermarks(config, [(topic, 0), (topic, 1)])
    highs = {p: high for (_t, p), (_low, high) in marks.items()}
    assert_ledger_tiles(ledger_batches(warehouse), topic, highs)  # type: ignore[arg-type]
    assert_exact_clicks(warehouse, values)  # type: ignore[arg-type]


def random_point(seed: int) -> str:
    """A stream pause point and the batch it pauses at, chosen by ``seed``."""
    rng = random.Random(seed)
    point = rng.choice(STREAM_POINTS).split("@")[0]
    return f"{point}@{rng.randrange(3)}"


def produce_all(config: dict[str, str], topic: str, values: list[bytes]) -> list[bytes]:
    produce(config, topic, list(values))
    return list(values)
