"""Pause points stop the thread that reaches them before its next step (no Spark):
the pause harness (tests/pause_harness.py) relies on it to pause a holder exactly
at a named point, and not a few writes later."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs import faults
from jobs.settings import REPO_ROOT

# The point is reached on the main thread, or on another one (as Spark's callback
# thread reaches it in a driver) while the main thread sleeps (the thread a stop
# sent to the process is most often given to); then a file is written: a step the
# stopped process must not take before it is resumed, and takes once it is. A child
# in the process group (a driver's JVM) is stopped and resumed with it.
REACHES_THE_POINT = """
import subprocess, sys, threading, time
from jobs.faults import maybe_crash

child = subprocess.Popen(["sleep", "60"])
print(child.pid, flush=True)

def reach() -> None:
    maybe_crash("after_changelog", 3)
    open(sys.argv[1], "w").close()

if sys.argv[2] == "main":
    reach()
else:
    threading.Thread(target=reach).start()
time.sleep(60)
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("thread", ["main", "another"])
def test_a_paused_point_stops_the_thread_that_reached_it_before_its_next_step(
    thread: str, tmp_path: Path
) -> None:
    for attempt in range(10):  # a race: the step ran on in most attempts before
        marker = tmp_path / f"stepped-{attempt}"
        proc = subprocess.Popen(
            [sys.executable, "-c", REACHES_THE_POINT, str(marker), thread],
            env={**os.environ, "PLATFORM_PAUSE": "after_changelog@3", "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            child = int(proc.stdout.readline())
            _until(lambda pid=proc.pid: _state(pid) == "T", "it never paused")
            time.sleep(0.2)  # a thread still running would have written by now
            assert not marker.exists(), f"attempt {attempt}: the step ran while paused"
            assert _state(child) == "T"
            os.killpg(proc.pid, signal.SIGCONT)
            _until(marker.exists, "it did not go on once resumed")
            assert _state(proc.pid) != "T" and _state(child) != "T"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]


def test_a_point_pauses_the_driver_once_whichever_of_its_workers_reaches_it(
    tmp_path: Path,
) -> None:
    """A batch's tasks, each in a worker process of its own group, all reach
    ``during_task``: the first stops the driver's group; one that gets there after
    the driver was resumed (it waited on the stopped JVM) must not stop it again."""
    driver = subprocess.Popen(["sleep", "60"], start_new_session=True)
    env = {
        **os.environ,
        "PLATFORM_PAUSE": "during_task@1",
        faults.GROUP_ENV: str(driver.pid),
        faults.DRIVER_ENV: "d1",
        "TMPDIR": str(tmp_path),
        "PYTHONPATH": str(REPO_ROOT),
    }
    task = "from jobs.faults import maybe_crash; maybe_crash('during_task', 1)"
    try:
        for worker in range(2):
            subprocess.run([sys.executable, "-c", task], env=env, check=True, timeout=60)
            time.sleep(0.3)
            assert _state(driver.pid) == ("T" if worker == 0 else "S"), worker
            os.kill(driver.pid, signal.SIGCONT)
    finally:
        driver.kill()
        driver.wait()
