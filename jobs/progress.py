"""Progress of long work (a backfill's or a drift check's recomputation, a run
replaying after a rewind or rebuild): records done out of the total, and an ETA.

On a terminal, a progress bar (``rich``); otherwise (a pipe, an Airflow task log)
one line every ``LINE_EVERY_S`` seconds. A Spark job's progress is read from its
scan stage's finished tasks (``SparkJobProgress``): each task reads one range of
at most ``maxRecordsPerPartition`` records, so tasks measure records closely.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import TracebackType
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as Bar

log = logging.getLogger(__name__)
LINE_EVERY_S = 5.0
POLL_S = 1.0


def eta(done: int, total: int, elapsed: float) -> str:
    if done <= 0 or elapsed <= 0 or done >= total:
        return "-" if done < total else "0:00:00"
    seconds = int(elapsed * (total - done) / done)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """``with Progress("backfill", total) as p: p.update(done)``."""

    def __init__(
        self,
        what: str,
        total: int,
        unit: str = "records",
        stream: IO[str] | None = None,
        every_s: float = LINE_EVERY_S,
    ) -> None:
        self.what, self.total, self.unit = what, max(0, total), unit
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.done = 0
        self.started = time.monotonic()
        self._last_line = 0.0
        self._bar: Bar | None = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        if self.stream.isatty():
            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        else:
            self._line()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.update(self.total)
        if self._bar is not None:
            self._bar.stop()
        elif kind is None:
            self._line(force=True)

    def update(self, done: int) -> None:
        self.done = min(max(self.done, done), self.total)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
        else:
            self._line()

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_line < self.every_s and self._last_line:
            return
        self._last_line = now
        share = 100.0 * self.done / self.total if self.total else 100.0
        print(
            f"{self.what}: {self.done:,} of {self.total:,} {self.unit} ({share:.0f}%), "
            f"{now - self.started:.0f} s, ETA {eta(self.done, self.total, now - self.started)}",
            file=self.stream,
            flush=True,
        )


class SparkJobProgress:
    """Follows the Spark jobs started inside the ``with`` (a job group of their own)
    and reports ``total`` records in proportion to their first stage's finished
    tasks (the scan: one task per offset range)."""

    def __init__(self, spark: Any, what: str, total: int, stream: IO[str] | None = None) -> None:
        self.spark = spark
        self.group = f"platform-{what}-{time.monotonic_ns()}"
        self.progress = Progress(what, total, stream=stream)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="spark-progress", daemon=True)

    def __enter__(self) -> SparkJobProgress:
        self.spark.sparkContext.setJobGroup(self.group, self.progress.what)
        self.progress.__enter__()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        self.progress.__exit__(kind, exc, tb)

    def fraction(self) -> float:
        tracker = self.spark.sparkContext.statusTracker()
        jobs = sorted(tracker.getJobIdsForGroup(self.group))
        job = tracker.getJobInfo(jobs[0]) if jobs else None  # the first: it scans
        if job is None or not job.stageIds:
            return 0.0
        info = tracker.getStageInfo(min(job.stageIds))
        if info is None or not info.numTasks:
            return 0.0
        return float(info.numCompletedTasks) / float(info.numTasks)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.progress.update(int(self.progress.total * self.fraction()))
            except Exception as exc:  # progress must never fail the work
                log.debug("progress: %s", exc)
