"""Progress of long work: lines with counts and an ETA where no terminal is."""

from __future__ import annotations

import io

from jobs.progress import Progress, eta


def test_eta_from_the_rate_so_far() -> None:
    assert eta(250, 1000, 10.0) == "0:00:30"
    assert eta(0, 1000, 10.0) == "-"
    assert eta(1000, 1000, 10.0) == "0:00:00"


def test_lines_every_few_seconds_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("backfill", 1000, stream=out, every_s=3600) as progress:
        progress.update(100)  # inside the interval: no line
        progress.update(400)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("backfill: 0 of 1,000 records (0%)")
    assert lines[-1].startswith("backfill: 1,000 of 1,000 records (100%)")
    assert len(lines) == 2


def test_a_failed_run_is_not_reported_complete() -> None:
    out = io.StringIO()
    progress = Progress("rewind replay", 1000, stream=out, every_s=0)
    progress.__enter__()
    progress.update(300)
    progress.__exit__(RuntimeError, None, None)
    assert "300 of 1,000" in out.getvalue().splitlines()[-1]
