"""``status``'s reading of the Spark checkpoint against the ledger, without Spark: a
hand-written ledger and offset/commit logs in Spark's file format.

A batch in flight is normal: Spark writes ``offsets/<n>`` before the batch, the
platform's ledger row inside it, ``commits/<n>`` after it. Only a gap that Spark
itself could not have left (a planned batch before the newest without its commit)
means the commit log is gone."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from jobs import resolution
from jobs.delta.layout import DEAD_LETTER_SCHEMA, AppLayout, ensure_tables
from jobs.lock import application_lock
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, Settings, load_settings
from jobs.status import application_status
from tests import ledger_rows as ledger

PIPELINE = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    ensure_tables(AppLayout(tmp_path, PIPELINE.application_id), resolution.of(PIPELINE))
    return dataclasses.replace(load_settings(), warehouse=tmp_path)


@pytest.fixture
def layout(settings: Settings) -> AppLayout:
    return AppLayout(settings.warehouse, PIPELINE.application_id)


def ledger_rows(layout: AppLayout, batch_ids: range) -> None:
    ledger.append(layout, [ledger.batch_row(0, b, 100 * b, 100 * (b + 1), 0) for b in batch_ids])


def spark_logs(layout: AppLayout, planned: range, committed: range) -> None:
    checkpoint = Path(layout.checkpoint(0))
    for name, ids in (("offsets", planned), ("commits", committed)):
        (checkpoint / name).mkdir(parents=True, exist_ok=True)
        for b in ids:
            lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0})]
            if name == "offsets":
                lines.append(json.dumps({"clicks": {"0": 100 * (b + 1)}}))
            (checkpoint / name / str(b)).write_text("\n".join(lines) + "\n")
    (checkpoint / "state" / "0").mkdir(parents=True, exist_ok=True)
    (checkpoint / "state" / "0" / "1.changelog").write_text("")


@pytest.fixture
def running(layout: AppLayout) -> Iterator[None]:
    with application_lock(layout, "run --trigger continuous"):
        yield


@pytest.mark.usefixtures("running")
def test_the_first_batch_of_an_epoch_in_flight_is_no_problem(
    settings: Settings, layout: AppLayout
) -> None:
    # The ledger row of batch 0 is written; Spark's commits/0 comes when it returns.
    ledger_rows(layout, range(1))
    spark_logs(layout, planned=range(1), committed=range(0))
    status = application_status(PIPELINE, settings, with_broker=False)
    assert status.repair is None
    assert status.problems == []


@pytest.mark.usefixtures("running")
def test_a_later_batch_in_flight_is_no_problem(settings: Settings, layout: AppLayout) -> None:
    ledger_rows(layout, range(3))
    spark_logs(layout, planned=range(4), committed=range(3))
    status = application_status(PIPELINE, settings, with_broker=False)
    assert status.repair is None
    assert status.problems == []


def test_a_batch_cut_off_by_a_crash_is_replayed_not_rebuilt(
    settings: Settings, layout: AppLayout
) -> None:
    ledger_rows(layout, range(1))
    spark_logs(layout, planned=range(1), committed=range(0))
    status = application_status(PIPELINE, settings, with_broker=False)
    assert status.repair is None
    assert any("replays" in p for p in status.problems), status.problems


def test_planned_batches_without_their_commits_mean_the_commit_log_is_gone(
    settings: Settings, layout: AppLayout
) -> None:
    # Spark plans batch n+1 only after commits/n: a gap below the newest is damage.
    ledger_rows(layout, range(3))
    spark_logs(layout, planned=range(3), committed=range(0))
    status = application_status(PIPELINE, settings, with_broker=False)
    assert status.repair == "rebuild"
    assert any("commit log is gone" in p for p in status.problems), status.problems


def dead_letters(layout: AppLayout, epoch: int, batch_id: int, count: int) -> None:
    rows = [
        {
            "topic": "clicks",
            "partition": 0,
            "offset": 100 * batch_id + i,
            "reason": "bad json",
            "epoch": epoch,
            "batch_id": batch_id,
            "commit_time": 0,
        }
        for i in range(count)
    ]
    write_deltalake(
        str(layout.table("dead_letter")),
        pa.Table.from_pylist(rows, DEAD_LETTER_SCHEMA),
        mode="append",
    )


def test_the_ledgers_dead_letter_counts_are_checked_against_the_table(
    settings: Settings, layout: AppLayout
) -> None:
    def batch(batch_id: int, dead: int, **columns: object) -> dict[str, object]:
        valid = {"records_valid": 100 - dead, "aggregated": 100 - dead, "dead_lettered": dead}
        return ledger.batch_row(
            0, batch_id, 100 * batch_id, 100 * (batch_id + 1), 0, **valid, **columns
        )

    ledger.append(
        layout,
        [batch(0, 2), batch(1, 1), batch(2, 1, processing_guarantee="at_least_once")],
    )
    spark_logs(layout, planned=range(3), committed=range(3))
    dead_letters(layout, 0, 0, 2)
    dead_letters(layout, 0, 2, 2)  # at least once: a replay may append them again
    dead_letters(layout, 0, 3, 5)  # a batch in flight: not in the ledger yet
    status = application_status(PIPELINE, settings, with_broker=False)
    assert status.problems == [
        "batch (0, 1): 1 dead-lettered per the ledger, 0 rows in dead_letter"
    ]
    dead_letters(layout, 0, 1, 2)  # twice, under exactly once
    status = application_status(PIPELINE, settings, with_broker=False)
    assert status.problems == [
        "batch (0, 1): 1 dead-lettered per the ledger, 2 rows in dead_letter"
    ]


def test_a_hopping_checkpoint_keyed_by_window_start_names_a_seeded_rebuild(
    tmp_path: Path,
) -> None:
    """A hopping pipeline's epoch began before Spark's state keyed its windows by
    their last pane: ``status`` names the rebuild the recovery DAG applies."""
    import yaml

    from jobs.cut import Cut

    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "user_clicks.yaml").read_text())
    data["window"] = {"type": "hopping", "size": "2 minutes", "slide": "1 minute"}
    (tmp_path / "hopping.yaml").write_text(yaml.safe_dump(data))
    hopping = load_pipeline(str(tmp_path / "hopping.yaml"), tmp_path)
    where = AppLayout(tmp_path, hopping.application_id)
    ensure_tables(where, resolution.of(hopping))
    old_shape = {k: v for k, v in hopping.state_shape.items() if k != "window_key"}
    ledger.record_cut(where, Cut(0, {"clicks": {"0": 0}}, "pipeline", state_shape=old_shape))
    ledger.append(where, [ledger.batch_row(0, 0, 0, 100, 0)])
    spark_logs(where, range(1), range(1))
    settings = dataclasses.replace(load_settings(), warehouse=tmp_path)
    found = application_status(hopping, settings, with_broker=False)
    assert found.repair == "rebuild"
    assert any("last pane" in p for p in found.problems)
    ledger.record_cut(
        where, Cut(0, {"clicks": {"0": 0}}, "pipeline", state_shape=hopping.state_shape)
    )
    assert application_status(hopping, settings, with_broker=False).repair is None


def test_a_partition_added_mid_epoch_starts_at_0_and_is_no_gap(
    settings: Settings, layout: AppLayout
) -> None:
    """Found by a random sequence: the batch that first read an added partition
    starts it at 0, which the previous batch's end does not name."""
    added = {
        "start_offsets": json.dumps({"clicks": {"0": 100, "1": 0}}),
        "end_offsets": json.dumps({"clicks": {"0": 200, "1": 30}}),
        "records_in": 130,
        "records_valid": 130,
        "aggregated": 130,
    }
    ledger.append(
        layout, [ledger.batch_row(0, 0, 0, 100, 0), ledger.batch_row(0, 1, 0, 0, 0, **added)]
    )
    spark_logs(layout, planned=range(2), committed=range(2))
    assert application_status(PIPELINE, settings, with_broker=False).problems == []
    gap = {**added, "start_offsets": json.dumps({"clicks": {"0": 200, "1": 5}})}
    ledger.append(
        layout,
        [
            ledger.batch_row(
                0, 2, 0, 0, 0, **{**gap, "end_offsets": json.dumps({"clicks": {"0": 300, "1": 40}})}
            )
        ],
    )
    problems = application_status(PIPELINE, settings, with_broker=False).problems
    assert problems and "batch (0, 2): starts at" in problems[0]


def test_after_a_fence_the_next_read_is_the_newest_cut_not_the_deleted_logs_batch(
    settings: Settings, layout: AppLayout
) -> None:
    """A skip moved the application onto a recreated topic's new log (epoch 1, no
    batch since); a recovery DAG's fence began epoch 2, which has no cut. The next
    run reads from the skip's cut, not from the last batch's end in the deleted log."""
    from jobs.cut import Cut
    from jobs.delta.writer import bump_epoch
    from jobs.ledger import last_batch
    from jobs.status import reading_from

    ledger.append(layout, [ledger.batch_row(0, 0, 0, 900, 1)])
    for epoch in (1, 2):
        bump_epoch([layout.table("_ledger")], PIPELINE.application_id, epoch, "test")
    ledger.record_cut(layout, Cut(1, {"clicks": {"0": 40}}, "rewind", topic_ids={"clicks": "new"}))
    keep = {"state_action": "keep", "boundary": {"epoch": 0, "batch_id": 0}}
    ledger.append(layout, [ledger.operation_done(1, "rewind", keep, 2)])
    fence = {"reason": "recovery", "for": "rebuild"}
    ledger.append(layout, [{"entry_type": "fence", "epoch": 2, "details": json.dumps(fence)}])
    offsets, topic_ids = reading_from(layout, 2, last_batch(layout), [])
    assert offsets == {("clicks", 0): 40}
    assert topic_ids == {"clicks": "new"}


def test_a_log_that_ends_below_the_committed_offset_is_reported_when_ids_cannot_be_read(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Describing the topics (their ids) failed; the offsets still say the log was cut."""
    from jobs import kafka_admin, status
    from jobs.errors import SourceError

    def no_ids(*_args: object) -> dict[str, str]:
        raise SourceError("cannot describe topics ['clicks']: timed out")

    monkeypatch.setattr(kafka_admin, "topic_partitions", lambda *_a: {"clicks": [0]})
    monkeypatch.setattr(kafka_admin, "watermarks", lambda *_a: {("clicks", 0): (0, 50)})
    monkeypatch.setattr(kafka_admin, "topic_ids", no_ids)
    problems: list[str] = []
    status._lags(PIPELINE, settings, {("clicks", 0): 100}, problems, {"clicks": "id"})
    assert any("cannot describe topics" in p for p in problems)
    assert any("below the committed offset 100" in p for p in problems), problems
