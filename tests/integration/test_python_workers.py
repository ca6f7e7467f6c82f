"""A run starts Spark's Python workers ahead of its batch's Python tasks
(``changelog_files.start_workers``): a job of one task per slot, whose workers
Spark keeps for the batch."""

from __future__ import annotations

import subprocess
import time

import psutil
from pyspark.sql import SparkSession

from jobs.streaming.changelog_files import WORKERS_JOB_GROUP, start_workers


def _command_line(process: psutil.Process) -> str:
    """A process's command line; empty for one that ended (a zombie has none to read)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def _python_workers() -> list[psutil.Process]:
    """The workers Spark's Python daemon forked (children of the daemon process)."""
    daemons = [
        p for p in psutil.Process().children(recursive=True) if "pyspark.daemon" in _command_line(p)
    ]
    return [child for daemon in daemons for child in daemon.children()]


def test_the_workers_are_started_by_a_job_of_their_own(spark: SparkSession) -> None:
    # A child that ended and is not reaped yet (in CI: another test's, in this worker) is
    # a zombie among the process's children; counting must step over it.
    ended = subprocess.Popen(["true"])
    zombie = psutil.Process(ended.pid)
    deadline = time.monotonic() + 30
    while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zombie.status() == psutil.STATUS_ZOMBIE
    start_workers(spark).join(120)
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(WORKERS_JOB_GROUP)]
    assert jobs and all(job is not None and job.status == "SUCCEEDED" for job in jobs)
    try:
        assert len(_python_workers()) >= spark.sparkContext.defaultParallelism
    finally:
        ended.wait()
