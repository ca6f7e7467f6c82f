"""One writer per application: an exclusive hold every run and operation takes.

Airflow pools cannot see a ``spark-submit`` started by hand, so the platform
itself decides. On a local warehouse ``<warehouse>/<application_id>/_lock`` is
locked with ``flock`` for as long as a run or a maintenance operation works on
the application: the kernel drops the lock when the holder dies, so a crash never
leaves it stuck. On object storage, shared by machines that share nothing else,
the hold is a lease (``jobs/lease.py``), ``<application_id>/_lease``. Either names
its holder, and a refused run says who it is. A holder ``check``s before each
commit (a lease can be lost; a ``flock`` cannot).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from jobs import lease
from jobs.delta.layout import AppLayout
from jobs.delta.writer import commits_checked_by
from jobs.errors import LockedError
from jobs.settings import lease_seconds
from jobs.warehouse import Location

LOCK = "_lock"


def lock_path(layout: AppLayout) -> Path:
    return layout.root.path / LOCK


# ``holder`` probes by taking the lock for an instant: a taker that meets a probe
# tries again for this long before it calls the application busy.
PROBE_GRACE_S = 2.0


def _read_info(handle: Any) -> dict[str, Any]:
    """The holder's description; a file being rewritten at this instant reads as
    unknown instead of failing."""
    handle.seek(0)
    text = handle.read()
    try:
        info = json.loads(text) if text.strip() else {}
    except ValueError:
        info = {}
    return info if isinstance(info, dict) and info else {"purpose": "unknown"}


class Holding(Protocol):
    @property
    def generation(self) -> int | None:
        """The fencing token (a lease's generation; None for a flock, which no other
        holder can take while this one lives): a commit that carries it is refused
        by the store once a newer holder committed with a higher one."""

    def check(self) -> None:
        """Raise when this holder may no longer commit."""

    def advance_past(self, recorded: int) -> int | None:
        """The fencing token, raised above ``recorded`` (one a table recorded from an
        earlier hold) only while this holder still holds; LeaseLostError otherwise."""


class _Flocked:
    """A ``flock`` is held until this process ends or lets it go."""

    generation: int | None = None

    def check(self) -> None:
        return None

    def advance_past(self, recorded: int) -> int | None:
        return None  # no token: no store compares one


def lease_location(layout: AppLayout) -> Location:
    return layout.root / lease.LEASE


def holder(layout: AppLayout) -> dict[str, Any] | None:
    """Who holds the application now, or None."""
    if layout.root.is_s3:
        return lease.current(lease_location(layout))
    path = lock_path(layout)
    if not path.exists():
        return None
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_info(handle)
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def describe(info: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("since", 0)))
    return (
        f"{info.get('purpose', 'unknown')} (pid {info.get('pid', '?')} on "
        f"{info.get('host', '?')}, user {info.get('user', '?')}, since {since})"
    )


@contextmanager
def application_lock(layout: AppLayout, purpose: str) -> Iterator[Holding]:
    """Hold the application exclusively, or raise LockedError naming the holder."""
    root = layout.root
    what = f"application {layout.application_id}"
    with _exclusive(root / lease.LEASE, root / LOCK, what, purpose) as held:
        yield held


@contextmanager
def table_lock(table: Location, purpose: str) -> Iterator[Holding]:
    """Hold a table Spark writes outside an application (a dimension, a daily
    summary): Delta-spark's log stores for S3 and local files are safe for one
    writer at a time only. LockedError names the holder. The lock is beside the table
    (``_<name>.lease``, ``_<name>.lock``): Delta refuses to create a table in a folder
    that holds other files."""
    lease_at, lock_at = (table.parent / f"_{table.name}.{kind}" for kind in ("lease", "lock"))
    with _exclusive(lease_at, lock_at, f"table {table.name}", purpose) as held:
        yield held


@contextmanager
def _exclusive(lease_at: Location, lock_at: Location, what: str, purpose: str) -> Iterator[Holding]:
    """The lease ``lease_at`` on object storage, flock on ``lock_at`` on a local disk;
    every commit of this thread in the block checks the hold first."""
    if lease_at.is_s3:
        try:
            held = lease.take(lease_at, purpose, _user(), lease_seconds())
        except lease.LeaseError as exc:
            raise LockedError(str(exc)) from None
        try:
            with commits_checked_by(held.check):
                yield held
        finally:
            held.release()
        return
    lock_at.path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_at.path, "a+")  # noqa: SIM115 - held for the whole block
    try:
        deadline = time.monotonic() + PROBE_GRACE_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockedError(
                        f"{what} is busy: held by {describe(_read_info(handle))}; try again "
                        "when it has finished"
                    ) from None
                time.sleep(0.02)
        info = {
            "purpose": purpose,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "user": _user(),
            "since": time.time(),
        }
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(info))
        handle.flush()
        held_here = _Flocked()
        with commits_checked_by(held_here.check):
            yield held_here
    finally:
        handle.close()  # releases the lock


def _user() -> str:
    return os.environ.get("AIRFLOW_CTX_DAG_OWNER") or _os_user()


def _os_user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())
