"""A continuous run through outages and stops, without Spark or Kafka: a stop asked
while a batch fails is kept, an operation during the wait for Kafka stops the run
(it may have recorded another definition), and Spark's late drops are checked for
batches of a query that failed (issue 42's suspected items, each confirmed here)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import bump_epoch
from jobs.errors import ConsistencyError, FencedError, KafkaUnavailableError, LeaseLostError
from jobs.lock import _Flocked
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming import outage, run
from jobs.streaming.batch import refuse_unrepaired_drops
from jobs.streaming.follow import follow
from tests import ledger_rows as ledger
from tests.unit.test_watermark_drops import committer, progress

PIPELINE = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")


@pytest.fixture
def layout(tmp_path: Path) -> AppLayout:
    layout = AppLayout(tmp_path, PIPELINE.application_id)
    ledger.append(layout, [ledger.batch_row(0, b, 100 * b, 100 * (b + 1), b + 1) for b in range(5)])
    return layout


def continuous(
    monkeypatch: pytest.MonkeyPatch, layout: AppLayout, attempts: list[Any], waits: list[Any]
) -> Any:
    """``run.run_pipeline`` with each attempt's outcome from ``attempts`` (a callable
    run in place of the locked run) and ``waits`` (what waiting for Kafka does)."""
    monkeypatch.setattr(run.analyser, "resolve", lambda *_a: SimpleNamespace(pipeline=PIPELINE))

    def attempt(*_args: Any) -> Any:
        return attempts.pop(0)()

    def wait(*_args: Any) -> outage.Answer:
        return waits.pop(0)()  # type: ignore[no-any-return]

    monkeypatch.setattr(run, "_run_once", attempt)
    monkeypatch.setattr(run, "wait_for_brokers", wait)
    settings = SimpleNamespace(
        warehouse=layout.warehouse, outage_wait_s=300, bootstrap_servers="x:1", kafka_client={}
    )
    return run.run_pipeline(None, PIPELINE, settings, "continuous")  # type: ignore[arg-type]


def kafka_gone() -> None:
    raise KafkaUnavailableError("Kafka did not answer", while_running=True)


def test_a_stop_asked_while_a_batch_fails_ends_the_run(
    monkeypatch: pytest.MonkeyPatch, layout: AppLayout
) -> None:
    """SIGTERM arrives, then the running batch fails because Kafka went away: the
    run ends, it neither waits for the brokers nor starts again."""
    previous = signal.signal(signal.SIGTERM, lambda *_a: None)  # the test's own, if lost

    def stopped_then_failed() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        kafka_gone()

    waits: list[Any] = [lambda: outage.Answer.LEADERS]
    attempts: list[Any] = [stopped_then_failed, lambda: pytest.fail("started again")]
    try:
        summary = continuous(monkeypatch, layout, attempts, waits)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert summary.application_id == PIPELINE.application_id
    assert len(waits) == 1 and len(attempts) == 1  # no wait, no second start


def test_an_operation_during_the_wait_for_kafka_stops_the_run(
    monkeypatch: pytest.MonkeyPatch, layout: AppLayout
) -> None:
    """A rewind or a backfill with a new pipeline version ran while the run waited:
    the run does not start again with the definition it resolved before (the cut
    may record another); it stops as a fenced run does, and its restart reads what
    the operation left."""

    def operation_ran() -> outage.Answer:
        bump_epoch([layout.table(tables.LEDGER)], layout.application_id, 1, "backfill")
        return outage.Answer.LEADERS

    attempts: list[Any] = [kafka_gone, lambda: pytest.fail("started again with the old definition")]
    with pytest.raises(FencedError, match="moved to epoch 1 while this run waited for Kafka"):
        continuous(monkeypatch, layout, attempts, [operation_ran])


def test_without_an_operation_the_run_starts_again_after_the_wait(
    monkeypatch: pytest.MonkeyPatch, layout: AppLayout
) -> None:
    done = SimpleNamespace(application_id=PIPELINE.application_id)
    attempts: list[Any] = [kafka_gone, lambda: done]
    assert continuous(monkeypatch, layout, attempts, [lambda: outage.Answer.LEADERS]) is done


class FailedQuery:
    """A query whose batch 4 dropped late rows, then failed (Kafka went away)."""

    def __init__(self) -> None:
        self.recentProgress = [progress(3, 0), progress(4, 2)]

    def awaitTermination(self, _timeout: float | None = None) -> bool:
        raise KafkaUnavailableError("Kafka did not answer", while_running=True)


def test_late_drops_of_a_query_that_failed_are_still_caught(layout: AppLayout) -> None:
    """The restart builds a new query whose progress never shows batch 4: the check
    runs as the failed query ends, and the next run refuses until the repair."""
    check = committer(layout)
    with pytest.raises(ConsistencyError, match="dropped 2 late row"):
        follow(FailedQuery(), check, layout, 0, outage.threading.Event(), _Flocked())  # type: ignore[arg-type]
    with pytest.raises(ConsistencyError, match="dropped 2 late row"):
        refuse_unrepaired_drops(layout)


class RefusedQuery:
    """A query woken from a pause inside batch 1: the store refused its ``commits/1``
    (another holder wrote it), and Spark failed."""

    recentProgress: tuple[Any, ...] = ()

    def awaitTermination(self, _timeout: float | None = None) -> bool:
        raise RuntimeError(
            "[STREAM_FAILED] ... [CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. "
            "Multiple streaming jobs detected for 1."
        )


class LostHold:
    generation = 3

    def check(self) -> None:
        raise LeaseLostError("the lease on application user_clicks was taken over by another")


class KeptHold(LostHold):
    def check(self) -> None:
        return None


@pytest.mark.parametrize(
    ("held", "says"), [(LostHold(), "taken over"), (KeptHold(), "another driver")]
)
def test_a_query_refused_by_the_store_stops_with_the_lost_holds_error(
    layout: AppLayout, held: Any, says: str
) -> None:
    """Found by the pause harness: a stream paused inside a batch past its lease,
    woken after another took over, failed with Spark's 60-line error and exit 1;
    the store had refused its write (the point), the run must say why in one line."""
    with pytest.raises(LeaseLostError, match=says):
        follow(RefusedQuery(), committer(layout), layout, 0, outage.threading.Event(), held)  # type: ignore[arg-type]
