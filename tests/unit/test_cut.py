"""The cut module and the ledger, without Spark or a broker (Delta tables only)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.cut import (
    Cut,
    StateAction,
    read_cut,
    replay_from_origin,
    starting_offsets,
    unfinished_state_version,
    write_cut,
)
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import OperationFence, bump_epoch
from jobs.errors import ConsistencyError, SourceError
from jobs.ledger import batch_boundaries, unfinished_epochs, unfinished_operation
from jobs.settings import REPO_ROOT

APP = "app"


def layout(tmp_path: Path) -> AppLayout:
    return AppLayout(tmp_path, APP)


def ledger_row(epoch: int, batch_id: int | None, entry: str = "batch", **kw: object) -> dict:  # type: ignore[type-arg]
    return {
        "application_id": APP,
        "entry_type": entry,
        "epoch": epoch,
        "batch_id": batch_id,
        "end_offsets": json.dumps({"t": {"0": 10 * (batch_id or 0)}}),
        "pipeline_version": 1,
        "processing_guarantee": "exactly_once",
        "delta_versions": json.dumps({"state_after": batch_id}),
        "commit_time": int(kw.pop("at", time.time()) * 1_000_000),  # type: ignore[call-overload]
        **kw,
    }


def write_ledger(where: AppLayout, rows: list[dict]) -> None:  # type: ignore[type-arg]
    path = where.table(tables.LEDGER)
    if not DeltaTable.is_deltatable(str(path)):
        DeltaTable.create(str(path), tables.LEDGER_SCHEMA)
    write_deltalake(str(path), pa.Table.from_pylist(rows, tables.LEDGER_SCHEMA), mode="append")


def test_a_malformed_cut_file_is_one_error_naming_the_repair(tmp_path: Path) -> None:
    where = layout(tmp_path)
    write_cut(where, Cut(epoch=3, starting_offsets={"t": {"0": 5}}, origin="rebuild"))
    assert read_cut(where, 3) == Cut(3, {"t": {"0": 5}}, "rebuild")
    for text in ["{", "[]", '{"epoch": 3}', '{"epoch": 3, "starting_offsets": {"t": 5}}']:
        (where.checkpoints / "epoch=3.json").write_text(text)
        with pytest.raises(ConsistencyError, match=r"unreadable.*repair: python -m jobs rebuild"):
            read_cut(where, 3)


def test_new_partitions_join_a_cut_at_their_log_start_and_vanished_ones_stop_it() -> None:
    cut = Cut(1, {"t": {"0": 5, "1": 7}}, "rebuild")
    marks = {("t", 0): (0, 9), ("t", 1): (2, 7), ("t", 2): (4, 6)}
    assert starting_offsets(cut, marks) == {("t", 0): 5, ("t", 1): 7, ("t", 2): 4}
    with pytest.raises(SourceError, match=r"t\[1\] was processed up to offset 7"):
        starting_offsets(cut, {("t", 0): (0, 9)})
    with pytest.raises(SourceError, match=r"no longer on the broker"):
        starting_offsets(cut, {("t", 0): (6, 9), ("t", 1): (0, 7)})


def test_a_vanished_partition_of_a_topic_with_the_same_id_is_a_broker_behind() -> None:
    # Kafka never removes a partition: with the id unchanged, the listing came from a
    # broker that has not applied the partition's addition. The recreated topic's
    # repair (read it from its start, state kept) would count it twice.
    from jobs.errors import KafkaUnavailableError

    cut = Cut(1, {"t": {"0": 5, "1": 7}}, "rebuild", topic_ids={"t": "id"})
    behind = {("t", 0): (0, 9)}
    with pytest.raises(KafkaUnavailableError, match=r"t\[1\].*run again"):
        starting_offsets(cut, behind, ids_now={"t": "id"})
    with pytest.raises(SourceError, match=r"recreated with fewer partitions"):
        starting_offsets(cut, behind, ids_now={"t": "other"})
    with pytest.raises(SourceError, match=r"recreated with fewer partitions"):
        starting_offsets(cut, behind, ids_now={})  # a broker without ids: cannot tell


def test_a_replay_from_the_start_reads_from_the_origin_or_refuses(tmp_path: Path) -> None:
    where = layout(tmp_path)
    write_cut(where, Cut(0, {"t": {"0": 3}}, "pipeline"))
    assert replay_from_origin(where, {("t", 0): (0, 50), ("t", 1): (2, 9)}, "x") == {
        ("t", 0): 3,
        ("t", 1): 2,
    }
    with pytest.raises(SourceError, match=r"t\[0\].*3\.\.9.*no longer on the broker"):
        replay_from_origin(where, {("t", 0): (10, 50)}, "rebuild --from-source")


def test_batch_boundaries_follow_epoch_and_batch_not_the_wall_clock(tmp_path: Path) -> None:
    where = layout(tmp_path)
    now = time.time()
    # A clock that went backwards between two batches must not reorder them.
    write_ledger(where, [ledger_row(0, 0, at=now), ledger_row(0, 1, at=now - 3600)])
    bump_epoch([where.table(tables.LEDGER)], APP, 1, "a fence")
    write_ledger(where, [ledger_row(1, 0, at=now - 7200)])
    assert [(b.epoch, b.batch_id) for b in batch_boundaries(where)] == [(0, 0), (0, 1), (1, 0)]


def test_an_operation_without_its_done_row_is_unfinished(tmp_path: Path) -> None:
    where = layout(tmp_path)
    write_ledger(where, [ledger_row(0, 0)])
    started = ledger_row(1, None, "rewind", details=json.dumps({"phase": "started", "who": "ann"}))
    bump_epoch(
        [where.table(tables.LEDGER)],
        APP,
        1,
        "why",
        pa.Table.from_pylist([started], tables.LEDGER_SCHEMA),
    )
    found = unfinished_operation(where)
    assert found is not None and found.operation == "rewind" and found.who == "ann"
    done = ledger_row(1, None, "rewind", details=json.dumps({"phase": "done"}))
    write_ledger(where, [done])
    assert unfinished_operation(where) is None
    assert StateAction("restore") is StateAction.RESTORE


def test_attempts_that_died_one_after_another_are_undone_together(tmp_path: Path) -> None:
    """A backfill died after its state merge (epoch 1); the one run to complete it
    died after undoing that (epoch 2): the next goes back before both."""
    where = layout(tmp_path)
    write_ledger(where, [ledger_row(0, 0)])
    state = where.table("state")
    write_deltalake(str(state), pa.table({"k": ["a"], "v": [1]}))  # version 0: the batch

    def begin(epoch: int) -> None:
        details = json.dumps({"phase": "started"})
        started = ledger_row(epoch, None, "backfill", details=details)
        rows = pa.Table.from_pylist([started], tables.LEDGER_SCHEMA)
        bump_epoch([where.table(tables.LEDGER), state], APP, epoch, "why", rows)

    def write(epoch: int, value: int) -> None:
        table = DeltaTable(str(state))
        write_deltalake(
            table,
            pa.table({"k": ["a"], "v": [value]}),
            mode="overwrite",
            commit_properties=OperationFence(APP, epoch, "backfill").on(table),
        )

    assert unfinished_epochs(where) == [] and unfinished_state_version(where, []) is None
    begin(1)  # state version 1: the bump
    assert unfinished_epochs(where) == [1]
    assert unfinished_state_version(where, [1]) is None  # it wrote nothing yet
    write(1, 2)  # version 2: its merge; then it died
    begin(2)  # version 3
    write(2, 1)  # version 4: its undo; then it died too
    assert unfinished_epochs(where) == [1, 2]
    assert unfinished_state_version(where, [1, 2]) == 1  # before epoch 1's merge
    write_ledger(where, [ledger_row(2, None, "backfill", details=json.dumps({"phase": "done"}))])
    assert unfinished_epochs(where) == []


def test_status_and_the_planners_do_not_import_spark() -> None:
    code = (
        "import sys; sys.path.insert(0, 'plugins'); "
        "import jobs.status, jobs.ledger, jobs.cut, jobs.state_seed, jobs.operations.plan, "
        "jobs.operations.restart, platform_airflow.hooks; "
        "print('pyspark' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_watermark_ranges_take_the_later_epochs_decision(tmp_path: Path) -> None:
    from jobs.ledger import batch_entries, batch_rows, read_ledger
    from jobs.lineage import History, Step

    where = layout(tmp_path)

    def decisions(epoch: int, steps: dict[int, Step]) -> list[tuple[str, int, int, int, int, int]]:
        rows = batch_entries(batch_rows(read_ledger(where)))
        return History(rows, steps, epoch).head.decisions()

    def batch(epoch: int, batch_id: int, begin: int, end: int, watermark: int) -> dict:  # type: ignore[type-arg]
        return {
            **ledger_row(epoch, batch_id, at=1000.0),
            "start_offsets": json.dumps({"t": {"0": begin}}),
            "end_offsets": json.dumps({"t": {"0": end}}),
            "watermark_ms": watermark,
            "details": json.dumps({"batch_timestamp_ms": 7 * watermark}),
        }

    # Epoch 0 read 0..100 and 100..200; a rewind made epoch 1 read 50..150 again.
    write_ledger(where, [batch(0, 0, 0, 100, 10), batch(0, 1, 100, 200, 20)])
    write_ledger(where, [batch(1, 0, 50, 150, 30)])
    assert decisions(1, {}) == [
        ("t", 0, 0, 50, 10, 70),
        ("t", 0, 50, 150, 30, 210),
        ("t", 0, 150, 200, 20, 140),
    ]
    # Epoch 1 continued from epoch 0's batch 0: batch 1's decision was discarded.
    assert decisions(1, {1: Step("restore", (0, 0))}) == [
        ("t", 0, 0, 50, 10, 70),
        ("t", 0, 50, 150, 30, 210),
    ]
    # A row from before the batch time was recorded: its commit time stands in.
    old = {**batch(2, 0, 200, 210, 40), "details": None}
    write_ledger(where, [old])
    last = decisions(2, {})[-1]
    assert last == ("t", 0, 200, 210, 40, 1_000_000)


def test_a_partition_added_later_replays_from_where_the_application_first_read_it(
    tmp_path: Path,
) -> None:
    from jobs.cut import fill_from_first, first_offsets

    where = layout(tmp_path)
    write_cut(where, Cut(0, {"t": {"0": 3}}, "pipeline"))

    def batch(batch_id: int, start: dict, end: dict) -> dict:  # type: ignore[type-arg]
        return {
            **ledger_row(0, batch_id),
            "start_offsets": json.dumps({"t": start}),
            "end_offsets": json.dumps({"t": end}),
        }

    # Batch 1 discovered partition 1 (at its log start 40); batch 2 read it from there.
    write_ledger(
        where,
        [
            batch(0, {"0": 3}, {"0": 10}),
            batch(1, {"0": 10}, {"0": 20, "1": 40}),
            batch(2, {"0": 20, "1": 40}, {"0": 30, "1": 45}),
        ],
    )
    assert first_offsets(where) == {("t", 0): 3, ("t", 1): 40}
    marks = {("t", 0): (0, 30), ("t", 1): (0, 45), ("t", 2): (7, 9)}
    assert replay_from_origin(where, marks, "x") == {("t", 0): 3, ("t", 1): 40, ("t", 2): 7}
    # A boundary from before partition 1 existed: it is read from 40, not skipped.
    assert fill_from_first(where, {("t", 0): 10}, marks) == {
        ("t", 0): 10,
        ("t", 1): 40,
        ("t", 2): 7,
    }
    with pytest.raises(SourceError, match=r"t\[1\].*40\.\.41"):
        replay_from_origin(where, {**marks, ("t", 1): (42, 45)}, "rebuild --from-source")


def test_every_table_of_the_layout_is_fenced_ledger_first_raw_included(tmp_path: Path) -> None:
    import dataclasses

    from jobs.cut import fenced_tables
    from jobs.pipeline.parser import load_pipeline

    clicks = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    archived = dataclasses.replace(clicks, archive=True)
    where = AppLayout(tmp_path, "user_clicks")
    names = [p.name for p in fenced_tables(where, archived)]
    assert names[0] == tables.LEDGER
    assert set(names) == {tables.LEDGER, "dead_letter", "changelog", "state", "raw"}
    assert "raw" not in [p.name for p in fenced_tables(where, clicks)]


def test_the_last_batch_is_found_by_epoch_and_batch_in_bounded_reads(tmp_path: Path) -> None:
    from jobs.ledger import kept_state_version, last_batch

    where = layout(tmp_path)
    assert last_batch(where) is None
    now = time.time()
    write_ledger(where, [ledger_row(0, b, at=now - 100 + b) for b in range(5)])
    write_ledger(where, [ledger_row(1, 0, at=now - 3600), ledger_row(1, 1, at=now - 3500)])
    write_ledger(where, [ledger_row(1, None, entry="rewind", at=now)])  # not a batch
    found = last_batch(where)
    assert found is not None and (found["epoch"], found["batch_id"]) == (1, 1)
    assert kept_state_version(where) is None
    dry = {"phase": "started", "kept_state_version": 9, "dry_run": True}
    write_ledger(where, [ledger_row(1, None, entry="maintain", details=json.dumps(dry))])
    assert kept_state_version(where) is None  # a dry run promises nothing
    write_ledger(
        where,
        [
            ledger_row(
                1,
                None,
                entry="maintain",
                details=json.dumps({"phase": "started", "kept_state_version": 3}),
            ),
            ledger_row(
                1,
                None,
                entry="maintain",
                details=json.dumps({"phase": "done", "kept_state_version": 7}),
            ),
        ],
    )
    assert kept_state_version(where) == 3


def test_an_orphan_a_completed_operation_undid_counts_no_more(tmp_path: Path) -> None:
    from deltalake import CommitProperties

    from jobs.cut import state_behind
    from tests.output_tables import StateWriter, clicks_pipeline

    state = StateWriter(tmp_path, clicks_pipeline())
    where = state.layout
    versions = [state.batch({"a": n}) for n in (1, 2, 3)]

    def batch(batch_id: int) -> dict:  # type: ignore[type-arg]
        return {
            **ledger_row(0, batch_id),
            "application_id": where.application_id,
            "delta_versions": json.dumps({"state_after": versions[batch_id]}),
        }

    # Batches 0 and 1 reached the ledger; batch 2 merged and was fenced before its row.
    write_ledger(where, [batch(0), batch(1)])
    assert state_behind(where) == versions[1]
    # A backfill undid it (restore), published its corrections and finished.
    bump_epoch([where.table(tables.LEDGER)], where.application_id, 1, "backfill")
    props = CommitProperties(custom_metadata={"epoch": "1", "platform_operation": "backfill"})
    DeltaTable(str(state.path)).restore(versions[1], commit_properties=props)
    left = state.batch({"a": 9})  # stands in for the backfill's publish (a merge)
    write_cut(where, Cut(1, {"t": {"0": 20}}, "backfill"))
    done = {
        "phase": "done",
        "plan": {"state_action": "publish", "boundary": {"epoch": 0, "batch_id": 1}},
        "result": {"state_version": left},
    }
    write_ledger(
        where,
        [
            {
                **ledger_row(1, None, entry="backfill"),
                "application_id": where.application_id,
                "details": json.dumps(done),
            }
        ],
    )
    assert state_behind(where) is None
