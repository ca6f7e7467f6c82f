"""Fault injection for crash tests: ``PLATFORM_FAULT=<point>[@<batch_id>]``.

At the named point the whole process group (driver, JVM, Python workers) is
killed with SIGKILL, as a machine failure would. Unset in production: a no-op.
"""

from __future__ import annotations

import os
import signal

ENV = "PLATFORM_FAULT"
POINTS = ("after_dead_letter", "after_changelog", "after_state", "after_ledger", "during_read")


def maybe_crash(point: str, batch_id: int | None = None) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, at = spec.partition("@")
    if name != point:
        return
    if at and batch_id is not None and int(at) != batch_id:
        return
    os.killpg(os.getpgrp(), signal.SIGKILL)
