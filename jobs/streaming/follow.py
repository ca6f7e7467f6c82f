"""Following a running query to its end: its input done (available-now), a stop
asked (SIGTERM/SIGINT), the application's hold lost (a lease taken over while this
driver was paused or cut off: checked at every poll, so the query stops before it
plans another batch, idle or not), or an operation that moved the application on
(a fence, seen in the ledger even while the stream is idle). Spark's drops of late records
are checked for every batch the query ran, also when it failed."""

from __future__ import annotations

import logging
import threading
import time

from pyspark.sql.streaming.query import StreamingQuery

from jobs.delta.layout import AppLayout
from jobs.errors import ConsistencyError, FencedError, LeaseError, LeaseLostError, PlatformError
from jobs.ledger import current_epoch
from jobs.lock import Holding
from jobs.streaming.batch import BatchCommitter

log = logging.getLogger(__name__)
POLL_S = 0.2
FENCE_CHECK_S = 5.0
# Spark's error when a checkpoint log file it creates exists already.
CONCURRENT_UPDATE = "CONCURRENT_STREAM_LOG_UPDATE"


def follow(
    running: StreamingQuery,
    committer: BatchCommitter,
    layout: AppLayout,
    epoch: int,
    stop: threading.Event,
    held: Holding,
) -> None:
    """Wait for the query to end: its input done (available-now), ``stop`` set, the
    hold on the application lost (``held.check`` raises: the query is stopped and
    that error raised), or an operation that moved the application on (a fence).
    Spark's drops of late records are checked for every batch it ran, also when the
    query failed: the restart's new query has no progress of them."""
    finished = False
    try:
        _follow(running, layout, epoch, stop, held)
        finished = True
    except Exception as exc:
        _lost_to_another_holder(exc, held)
        raise
    finally:
        if finished:
            committer.check_watermark_drops(running.recentProgress)
        else:
            _check_drops_of_a_failed_query(running, committer)


def _follow(
    running: StreamingQuery, layout: AppLayout, epoch: int, stop: threading.Event, held: Holding
) -> None:
    checked = time.monotonic()
    # A short wait: a scheduled run exits as soon as its last batch is in
    # (PySpark takes float seconds, though typed int).
    while not running.awaitTermination(POLL_S):  # type: ignore[arg-type]
        if stop.is_set():
            _stop(running)
            continue
        try:
            held.check()  # no request: this holder's own clock and renewals
        except LeaseError:
            _stop(running)
            raise
        if time.monotonic() - checked > FENCE_CHECK_S:
            checked = time.monotonic()
            if current_epoch(layout) > epoch:  # an idle stream would never commit
                _stop(running)
                raise FencedError(
                    f"{layout.application_id} moved to epoch {current_epoch(layout)}; "
                    f"this run of epoch {epoch} stopped without committing anything more"
                )
    running.awaitTermination()


def _lost_to_another_holder(failure: Exception, held: Holding) -> None:
    """A query that failed while (or because) another holder had taken the
    application over stops with the lost hold's error, not Spark's: woken from a
    pause inside a batch, the driver's next checkpoint write (``commits/N``) is
    refused by the store, since the newer holder wrote it (put-if-absent), and
    Spark fails with ``CONCURRENT_STREAM_LOG_UPDATE``."""
    if isinstance(failure, PlatformError):
        return
    held.check()  # raises the lost hold's error when it is lost
    if CONCURRENT_UPDATE in str(failure):
        raise LeaseLostError(
            "another driver wrote this application's checkpoint for a batch this one was "
            "running (the store refused this one's write): this run stopped without "
            "committing it; the other driver holds the application"
        ) from None


def _stop(running: StreamingQuery) -> None:
    """Stop the query; a batch in flight that does not end within Spark's
    ``stopTimeout`` is left behind: a fenced one cannot commit, any other commits
    only what a replay would."""
    try:
        running.stop()
    except Exception as exc:
        if "TimeoutException" not in str(exc):
            raise
        log.warning("the batch in flight did not end in time; the run stops without it: %s", exc)


def _check_drops_of_a_failed_query(running: StreamingQuery, committer: BatchCommitter) -> None:
    """A drop found stops the run (``ConsistencyError``, recorded first) in place of
    the failure on its way; a check that cannot be made leaves that failure as it is
    (an outage or a fence must reach the run's loop as what it is)."""
    try:
        committer.check_watermark_drops(running.recentProgress)
    except ConsistencyError:
        raise
    except Exception as exc:
        log.warning("could not check the failed query's batches for late drops: %s", exc)
