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

A test pauses one holder after another on the same application: each stream
point in an order (and at a batch) a seed chooses, each operation's points in
turn. The fixed seed pauses at every stream point; one new seed per run pauses
at ``NEW_SEED_POINTS`` of them, printed on failure (``PLATFORM_PAUSE_SEED``
replays it)."""

from __future__ import annotations

import contextlib
import json
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
import yaml

from jobs import kafka_admin
from jobs.settings import REPO_ROOT
from jobs.storage_server import StorageInfo
from jobs.streaming.jvm import archive_dir, archive_name
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
# Every point of a batch (``jobs/faults.py``), in the order a batch meets them.
STREAM_POINTS = [
    "after_dead_letter",
    "during_task",
    "after_changelog",
    "after_state",
    "after_ledger",
    "during_output",
    "after_output",
]
# The seed every run pauses a stream with at every point, and the number of points
# the run's new seed (``SEED``; ``PLATFORM_PAUSE_SEED`` replays it) pauses at.
FIXED_SEED = 0
NEW_SEED_POINTS = 1
# Each operation's points: the cut's (``jobs.cut.apply_cut``, the same code for
# every operation up to the fence: a rebuild pauses at both, a rewind after the
# fence, where it changes the state its own way), and a backfill's own (between
# its commits).
OPERATION_POINTS = {
    "rebuild": ["before_bump", "after_fence"],
    "rewind": ["after_fence"],
    "backfill": ["during_operation"],
}
# Points where nothing is held, so nothing is taken over: a backfill's shadow
# computed beside the running stream (tests/integration/test_backfill.py pauses
# there while the stream commits on).
UNHELD_POINTS = ["after_shadow"]
SEED = int(os.environ.get("PLATFORM_PAUSE_SEED") or random.SystemRandom().randrange(10**6))
# A long run: this many new seeds (SEED, SEED + 1, ...), each a test of its own
# (``PLATFORM_PAUSE_RUNS=200 pytest tests/integration/test_stream_pauses.py -k new``).
NEW_RUNS = int(os.environ.get("PLATFORM_PAUSE_RUNS") or 1)


@dataclass
class Paused:
    """The machine whose holder is paused: its own working directory, home and
    temporary folder, and its own road to the store (``proxy``: whose writes they are)."""

    env: dict[str, str]
    proxy: StoreProxy

    def start(self, args: list[str], point: str | None) -> subprocess.Popen[str]:
        """``python -m jobs args`` on this machine, stopping itself at ``point``
        (None: the test stops it)."""
        return subprocess.Popen(
            [sys.executable, "-m", "jobs", *args],
            cwd=self.env["HOME"],
            env={**self.env, **({} if point is None else {"PLATFORM_PAUSE": point})},
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
    archive_shared = share_jvm_archives(home / "tmp")
    with StoreProxy(s3_server.port) as proxy:
        env = {
            **os.environ,
            **s3_server.environment(),
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "PYTHONPATH": str(REPO_ROOT),
            # A holder stopped by its lost lease never adopts the class-data-sharing
            # archive its JVM writes at exit, so with none to start from each paused
            # holder would write one as it ends: 15-19 s of a cycle's 60 (measured).
            # Without the archive its JVM starts a little slower instead.
            **({} if archive_shared else {"PLATFORM_SPARK_CDS": "off"}),
        }
        yield Paused(env, proxy)


def share_jvm_archives(tmp: Path) -> bool:
    """The other machine starts its JVM from this one's class-data-sharing archives
    (hard links, as a machine set up alike has its own): a run that stops on its
    lost lease never adopts the archive it dumps, so each paused holder would
    otherwise start cold and dump one at exit, seconds of CPU each."""
    mine = archive_dir()
    theirs = tmp / f"platform-{os.getuid()}" / "jvm"
    theirs.mkdir(mode=0o700, parents=True)
    theirs.parent.chmod(0o700)
    shared = False
    for found in mine.iterdir():
        with contextlib.suppress(OSError):
            os.link(found, theirs / found.name)
            shared = shared or found.name == archive_name()
    return shared


def run_here(spark: Any, args: list[str], timeout: float = 300) -> None:
    """Run on this machine to its end, again while the application is busy (the
    paused holder's lease expiring)."""
    deadline = time.monotonic() + timeout
    while True:
        done = run_in_process(spark, args)
        if done.returncode == 0:
            return
        if os.environ.get("PAUSE_DEBUG"):
            Path(os.environ["PAUSE_DEBUG"]).write_text(done.stderr)
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
    if os.environ.get("PAUSE_DEBUG"):
        Path(os.environ["PAUSE_DEBUG"]).write_text(err)
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), last
    assert re.search(r"lease|moved to epoch|overtaken|fenced", last), last
    assert not any(line.startswith("Traceback") for line in err.splitlines()), err[-3000:]


def assert_no_write_after(proxy: StoreProxy, woke: float, err: str = "") -> None:
    after = [
        (method, path, status)
        for at, method, path, status in proxy.writes
        if at >= woke and 200 <= status < 300 and not IN_FLIGHT.search(path)
    ]
    assert not after, (
        f"the woken holder wrote after the takeover: {after}; "
        + str(
            [
                (round(at - woke, 2), m, p[-40:], st)
                for at, m, p, st in proxy.writes
                if at >= woke - 30
            ]
        )
        + f"; its error output: {err[-5000:]}"
    )


def check_exact(
    warehouse: Location, topic: str, config: dict[str, str], values: list[bytes]
) -> None:
    marks = kafka_admin.watermarks(config, [(topic, 0), (topic, 1)])
    highs = {p: high for (_t, p), (_low, high) in marks.items()}
    batches = ledger_batches(warehouse)  # type: ignore[arg-type]
    # The lineage: from the last batch that began at the first offsets (a rewind
    # to the earliest judges every record again).
    starts = [
        i
        for i, b in enumerate(batches)
        if not any(int(o) for o in json.loads(b["start_offsets"]).get(topic, {}).values())
    ]
    assert_ledger_tiles(batches[starts[-1] if starts else 0 :], topic, highs)
    assert_exact_clicks(warehouse, values)  # type: ignore[arg-type]


def quick_trigger(path: Path) -> Path:
    """The pipeline at ``path`` triggered every second (a continuous run's next batch,
    and the check of its lease between batches, after a second, not the reference
    pipeline's ten), still ``available-now`` unless a run asks for ``continuous``."""
    definition = yaml.safe_load(path.read_text())
    definition["trigger"] = {"mode": "available-now", "interval": "1 second"}
    path.write_text(yaml.safe_dump(definition))
    return path


def stream_schedule(seed: int, points: int) -> list[tuple[str, int]]:
    """``points`` stream pause points, each with how many batches after the next
    one (0 or 1) it pauses at, in an order chosen by ``seed``."""
    rng = random.Random(seed)
    return [(point, rng.randrange(2)) for point in rng.sample(STREAM_POINTS, points)]


def next_batch(warehouse: Location) -> int:
    """The batch id the application's next run starts with (one epoch here)."""
    return max((b["batch_id"] for b in ledger_batches(warehouse)), default=-1) + 1  # type: ignore[arg-type]


def produce_all(config: dict[str, str], topic: str, values: list[bytes]) -> list[bytes]:
    produce(config, topic, list(values))
    return list(values)
