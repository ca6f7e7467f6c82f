"""One holder per application across machines, on the S3 server: two drivers
with their own working directories and homes never both commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import lease
from jobs.settings import REPO_ROOT
from jobs.warehouse import Location

TTL_S = 2.0


def _driver(name: str, app: Location, tmp_path: Path) -> subprocess.Popen[str]:
    """A holder process as if on its own machine: its own cwd and HOME."""
    home = tmp_path / f"machine-{name}"
    home.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lease_holder", str(app / lease.LEASE), str(TTL_S), name],
        cwd=home,
        env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _held(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("held "), (line, proc.stderr.read() if proc.stderr else "")
    return int(line.split()[1])


def _commits(app: Location, name: str) -> list[str]:
    return [c.name for c in (app / "commits").iterdir() if c.name.startswith(f"{name}-")]


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_a_second_driver_is_refused_while_the_first_holds_and_takes_it_once_released(
    s3_warehouse: Location, tmp_path: Path
) -> None:
    app = s3_warehouse / "app"
    first = _driver("a", app, tmp_path)
    try:
        assert _held(first) == 1
        second = _driver("b", app, tmp_path)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 2
        assert err.strip().startswith("error: application app is busy: held by run of a")
        assert len(err.strip().splitlines()) == 1
    finally:
        _end(first)
    # A released lease is taken at once (no wait for expiry).
    other = s3_warehouse / "other-app" / lease.LEASE
    with lease.holding(other, "op", "me", TTL_S) as held:
        before = held.generation
    started = time.monotonic()
    with lease.holding(other, "op2", "me", TTL_S) as again:
        assert again.generation == before + 1
    assert time.monotonic() - started < TTL_S


def test_a_killed_holder_is_taken_over_after_its_lease_expires(
    s3_warehouse: Location, tmp_path: Path
) -> None:
    app = s3_warehouse / "app"
    first = _driver("a", app, tmp_path)
    assert _held(first) == 1
    time.sleep(0.5)  # mid-"batch"
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = time.monotonic()
    done = len(_commits(app, "a"))
    # Fresh by its record: refused at once, naming the holder and when it expires.
    with pytest.raises(lease.LeaseError, match=r"busy: held by run of a .*expires"):
        lease.take(app / lease.LEASE, "early", "me", TTL_S)
    deadline, generation = time.monotonic() + 30, None
    while generation is None:  # refused while fresh: run again, as a retry would
        assert time.monotonic() < deadline, "the second driver never took the lease"
        second = _driver("b", app, tmp_path)
        assert second.stdout is not None
        line = second.stdout.readline()
        if line.startswith("held "):
            generation = int(line.split()[1])
        else:
            second.wait()
    try:
        assert generation == 2
        # Taken only once a whole lease time passed without a renewal.
        assert time.monotonic() - killed_at >= TTL_S
        time.sleep(0.5)
        assert _commits(app, "b") and len(_commits(app, "a")) == done
    finally:
        _end(second)


def test_a_frozen_holder_resumed_after_a_takeover_commits_nothing(
    s3_warehouse: Location, tmp_path: Path
) -> None:
    app = s3_warehouse / "app"
    first = _driver("a", app, tmp_path)
    assert _held(first) == 1
    time.sleep(0.5)
    first.send_signal(signal.SIGSTOP)
    frozen = len(_commits(app, "a"))
    try:
        time.sleep(TTL_S)  # its record is stale now: a taker watches, then takes over
        taken = lease.take(app / lease.LEASE, "takeover", "me", TTL_S)
        assert taken.generation == 2
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=30)
        taken.release()
    finally:
        _end(first)
    assert first.returncode == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: the lease on application app ") and "commits nothing more" in err
    assert len(_commits(app, "a")) == frozen  # nothing after it was frozen


def test_a_renewed_lease_is_never_taken_over(s3_warehouse: Location) -> None:
    app = s3_warehouse / "app"
    with lease.holding(app / lease.LEASE, "long run", "me", TTL_S) as held:
        time.sleep(TTL_S * 2)  # renewed every TTL / 4 meanwhile
        held.check()
        with pytest.raises(lease.LeaseError, match="busy"):
            lease.take(app / lease.LEASE, "other", "you", TTL_S)
        held.check()


def test_releasing_twice_or_after_a_loss_changes_nothing(s3_warehouse: Location) -> None:
    where = s3_warehouse / "app" / lease.LEASE
    held = lease.take(where, "op", "me", TTL_S)
    held.release()
    after = where.read_bytes()
    held.release()
    assert where.read_bytes() == after
    with pytest.raises(lease.LeaseLostError, match="released"):
        held.check()


def test_an_application_on_s3_is_held_by_its_lease(s3_warehouse: Location) -> None:
    from jobs.delta.layout import AppLayout
    from jobs.errors import LockedError
    from jobs.lock import application_lock, holder

    layout = AppLayout(s3_warehouse, "user_clicks")
    assert holder(layout) is None
    with application_lock(layout, "run --trigger available-now") as held:
        held.check()
        found = holder(layout)
        assert found is not None and found["purpose"] == "run --trigger available-now"
        with (
            pytest.raises(LockedError, match=r"user_clicks is busy: held by run --trigger"),
            application_lock(layout, "rewind --reason x"),
        ):
            pass
    assert holder(layout) is None  # released
    with application_lock(layout, "rewind --reason x"):
        pass
