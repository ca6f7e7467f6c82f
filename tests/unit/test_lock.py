"""Per-application mutual exclusion, also against processes Airflow cannot see."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.delta.layout import AppLayout
from jobs.errors import LockedError
from jobs.lock import application_lock, holder
from jobs.settings import REPO_ROOT

HOLD = """
import sys, time
from pathlib import Path
from jobs.delta.layout import AppLayout
from jobs.lock import application_lock
with application_lock(AppLayout(Path(sys.argv[1]), "user_clicks"), "rebuild --reason test"):
    print("held", flush=True)
    time.sleep(120)
"""


def hold_in_other_process(warehouse: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(warehouse)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_holder_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    layout = AppLayout(tmp_path, "user_clicks")
    proc = hold_in_other_process(tmp_path)
    try:
        with pytest.raises(LockedError) as error, application_lock(layout, "run"):
            pass
        message = str(error.value)
        assert "application user_clicks is busy" in message
        assert "rebuild --reason test" in message and f"pid {proc.pid}" in message
        info = holder(layout)
        assert info is not None and info["pid"] == proc.pid
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # The kernel released the dead holder's lock: no stale lock to clean up.
    assert holder(layout) is None
    with application_lock(layout, "run"):
        info = holder(layout)
        assert info is not None and info["pid"] == os.getpid()
    assert holder(layout) is None


def test_cli_run_is_refused_while_held(tmp_path: Path) -> None:
    proc = hold_in_other_process(tmp_path)
    try:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "jobs", "run", "--pipeline", "user_clicks"]
            + ["--warehouse", str(tmp_path), "--bootstrap-servers", "127.0.0.1:1"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        assert "user_clicks is busy: held by rebuild --reason test" in result.stderr
        assert time.monotonic() - started < 30  # refused before Spark starts
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_probing_the_lock_never_makes_a_real_taker_fail(tmp_path: Path) -> None:
    import threading

    layout = AppLayout(tmp_path, "app")
    with application_lock(layout, "first"):
        pass  # the lock file exists from here on
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            holder(layout)

    probers = [threading.Thread(target=probe) for _ in range(2)]
    for thread in probers:
        thread.start()
    try:
        for i in range(200):
            with application_lock(layout, f"taker {i}"):
                pass
    finally:
        stop.set()
        for thread in probers:
            thread.join()


TABLE_HOLD = """
import sys, time
from jobs.lock import table_lock
from jobs.warehouse import Location
with table_lock(Location.parse(sys.argv[1]), "dimension --dimension merchants"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_table_spark_writes_has_one_writer_at_a_time(tmp_path: Path) -> None:
    """A dimension or a daily summary: Delta-spark's log store is single-writer."""
    from jobs.lock import table_lock
    from jobs.warehouse import Location

    table = tmp_path / "dims" / "merchants"
    proc = subprocess.Popen(
        [sys.executable, "-c", TABLE_HOLD, str(table)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with (
            pytest.raises(LockedError, match=r"table merchants is busy: held by dimension"),
            table_lock(Location.local_path(table), "summarize"),
        ):
            pass
    finally:
        proc.kill()
        proc.wait()
    with table_lock(Location.local_path(table), "again"):
        pass  # free once its holder is gone
    assert not table.exists()  # beside it: Delta creates a table only in an empty folder
