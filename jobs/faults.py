"""Fault injection for crash tests: ``PLATFORM_FAULT=<point>[@<batch_id>]``.

At the named point the driver's whole process group (driver, JVM, Python
workers) is killed with SIGKILL, as a machine failure would. Python workers run
in process groups of their own, so the driver records its group in the
environment they inherit (``arm``). Unset in production: a no-op.
"""

from __future__ import annotations

import os
import signal

from jobs.errors import refused

ENV = "PLATFORM_FAULT"
GROUP_ENV = "PLATFORM_FAULT_PGID"
POINTS = (
    "after_dead_letter",
    "after_changelog",
    "after_state",
    "after_ledger",
    "during_task",  # a Spark task of the batch half-way through its changelog file
    "during_output",  # the output transaction's records sent, not committed
    "after_output",  # the output transaction committed
    "during_operation",  # a backfill's first table written, not its second
    "after_fence",  # an operation's cut written (the stream fenced), its state untouched
)


def spec() -> tuple[str, int | None] | None:
    """The fault to inject: (point, batch id or None: the first batch that gets
    there), or None. ``ConfigError``: not a point and batch id (checked by
    ``load_settings``, so a run never fails on it half-way)."""
    raw = os.environ.get(ENV, "")
    if not raw:
        return None
    point, at_sign, at = raw.partition("@")
    if point not in POINTS or (at_sign and not (at.isascii() and at.isdigit())):
        raise refused(ENV, f"POINT or POINT@BATCH_ID, a POINT of {', '.join(POINTS)}", raw)
    return point, int(at) if at_sign else None


def arm() -> None:
    """Called by the driver before Spark starts, so workers can kill the driver too."""
    if os.environ.get(ENV):
        os.environ[GROUP_ENV] = str(os.getpgrp())


def maybe_crash(point: str, batch_id: int | None = None) -> None:
    fault = spec()
    if fault is None or fault[0] != point:
        return
    if fault[1] is not None and batch_id is not None and fault[1] != batch_id:
        return
    group = int(os.environ.get(GROUP_ENV, os.getpgrp()))
    os.killpg(group, signal.SIGKILL)
