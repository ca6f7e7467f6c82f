"""A run starts Spark's Python workers ahead of its batch's Python tasks
(``changelog_files.start_workers``): a job of one task per slot, whose workers
Spark keeps for the batch."""

from __future__ import annotations

import psutil
from pyspark.sql import SparkSession

from jobs.streaming.changelog_files import WORKERS_JOB_GROUP, start_workers


def _python_workers() -> list[psutil.Process]:
    """The workers Spark's Python daemon forked (children of the daemon process)."""
    daemons = [
        p
        for p in psutil.Process().children(recursive=True)
        if "pyspark.daemon" in " ".join(p.cmdline())
    ]
    return [child for daemon in daemons for child in daemon.children()]


def test_the_workers_are_started_by_a_job_of_their_own(spark: SparkSession) -> None:
    start_workers(spark).join(120)
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(WORKERS_JOB_GROUP)]
    assert jobs and all(job is not None and job.status == "SUCCEEDED" for job in jobs)
    assert len(_python_workers()) >= spark.sparkContext.defaultParallelism
