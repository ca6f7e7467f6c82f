"""Fault injection for crash and pause tests: ``PLATFORM_FAULT=<point>[@<batch_id>]``
and ``PLATFORM_PAUSE=<point>[@<batch_id>]``.

At the named point the driver's whole process group (driver, JVM, Python
workers) is killed with SIGKILL, as a machine failure would (``PLATFORM_FAULT``),
or stopped with SIGSTOP, as a long GC pause, a suspended VM or a debugger would
(``PLATFORM_PAUSE``, once per driver: the test resumes it with SIGCONT, typically
after another holder took the application over). Python workers run in process
groups of their own, so the driver records its group in the environment they
inherit (``arm``), and a marker file of its own: a batch's tasks (each in a
worker process) all reach ``during_task``, and one that gets there after the
wake must not stop the driver again. Unset in production: a no-op.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import uuid

from jobs.errors import refused

ENV = "PLATFORM_FAULT"
PAUSE_ENV = "PLATFORM_PAUSE"
GROUP_ENV = "PLATFORM_FAULT_PGID"
# The driver's own id for its pause markers (``arm``): a process group id is reused.
DRIVER_ENV = "PLATFORM_FAULT_DRIVER"
POINTS = (
    "after_dead_letter",
    "after_changelog",
    "after_state",
    "after_ledger",
    "during_task",  # a Spark task of the batch half-way through its changelog file
    "during_output",  # the output transaction's records sent, not committed
    "after_output",  # the output transaction committed
    "during_operation",  # a backfill's first table written, not its second
    "before_bump",  # an operation's seed and cut written, the epoch not bumped yet
    "after_fence",  # an operation's cut written (the stream fenced), its state untouched
    "after_shadow",  # a blue/green backfill's shadow computed beside the stream, nothing fenced
)
_paused: set[str] = set()


def spec(variable: str = ENV) -> tuple[str, int | None] | None:
    """The fault ``variable`` asks for: (point, batch id or None: the first batch
    that gets there), or None. ``ConfigError``: not a point and batch id (checked by
    ``load_settings``, so a run never fails on it half-way)."""
    raw = os.environ.get(variable, "")
    if not raw:
        return None
    point, at_sign, at = raw.partition("@")
    if point not in POINTS or (at_sign and not (at.isascii() and at.isdigit())):
        raise refused(variable, f"POINT or POINT@BATCH_ID, a POINT of {', '.join(POINTS)}", raw)
    return point, int(at) if at_sign else None


def arm() -> None:
    """Called by the driver before Spark starts, so workers can kill the driver too."""
    if os.environ.get(ENV) or os.environ.get(PAUSE_ENV):
        os.environ[GROUP_ENV] = str(os.getpgrp())
        os.environ[DRIVER_ENV] = uuid.uuid4().hex


def maybe_crash(point: str, batch_id: int | None = None) -> None:
    """At ``point`` (of batch ``batch_id``): kill the driver's process group, or stop
    it, as the environment asks."""
    for variable, signal_number in ((ENV, signal.SIGKILL), (PAUSE_ENV, signal.SIGSTOP)):
        fault = spec(variable)
        if fault is None or fault[0] != point:
            continue
        if fault[1] is not None and batch_id is not None and fault[1] != batch_id:
            continue
        if signal_number == signal.SIGSTOP and not _first_pause(point):
            continue
        group = int(os.environ.get(GROUP_ENV, os.getpgrp()))
        if signal_number == signal.SIGSTOP and group == os.getpgrp():
            _stop_group_and_this_thread(group)
        else:
            os.killpg(group, signal_number)


def _first_pause(point: str) -> bool:
    """True the first time any process of this driver pauses at ``point``."""
    if point in _paused:
        return False
    _paused.add(point)
    driver = os.environ.get(DRIVER_ENV)
    if driver is None:  # not armed: this process alone
        return True
    marker = os.path.join(tempfile.gettempdir(), f"platform-paused-{driver}-{point}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def _stop_group_and_this_thread(group: int) -> None:
    """Stop this process's group with this thread first in line. A stop sent to a
    process wakes one of its threads to stop them all, not necessarily the sender,
    which may run on meanwhile: past its point, through a hold check and into a
    write that lands once it is resumed. So the group's other processes are
    stopped one by one, and this process by a stop sent to this very thread,
    which takes it before its next step, once. (A kill ends every thread at once.)"""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == group:  # its process group
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGSTOP)
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
