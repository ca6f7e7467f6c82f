"""Spark's own late-row drops must stay zero: a drop stops the run naming the repair,
and is recorded in the ledger, so that the next run (an Airflow retry is a new
process) refuses too until the repair took the state from before the batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import bump_epoch
from jobs.errors import ConsistencyError
from jobs.lineage import History, Step
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming.batch import BatchCommitter, refuse_unrepaired_drops, unrepaired_drops
from tests import ledger_rows as ledger

PIPELINE = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
T = "clicks"


@pytest.fixture
def layout(tmp_path: Path) -> AppLayout:
    """Epoch 0 committed batches 0..4."""
    layout = AppLayout(tmp_path, PIPELINE.application_id)
    ledger.append(layout, [ledger.batch_row(0, b, 100 * b, 100 * (b + 1), b + 1) for b in range(5)])
    return layout


def committer(layout: AppLayout) -> BatchCommitter:
    made = object.__new__(BatchCommitter)  # only what the check reads
    made.pipeline = PIPELINE
    made.layout = layout
    made.epoch = 0
    made._checked_progress = set()
    return made


def progress(batch_id: int, dropped: int) -> dict[str, object]:
    return {"batchId": batch_id, "stateOperators": [{"numRowsDroppedByWatermark": dropped}]}


DROP_IN_BATCH_4 = r"dropped 2 late row\(s\) in batch 4 of epoch 0 of user_clicks"
REPAIR = r"python -m jobs backfill --pipeline user_clicks --from-earliest"


def test_no_drop_passes_and_each_batch_is_checked_once(layout: AppLayout) -> None:
    check = committer(layout)
    check.check_watermark_drops([progress(0, 0), progress(1, 0)])
    check.check_watermark_drops([progress(1, 5)])  # already checked: not read again
    assert check._checked_progress == {0, 1}
    refuse_unrepaired_drops(layout)  # nothing recorded


def test_a_drop_stops_the_run_naming_the_batch_and_the_repair(layout: AppLayout) -> None:
    with pytest.raises(ConsistencyError, match=f"{DROP_IN_BATCH_4}.*{REPAIR}"):
        committer(layout).check_watermark_drops([progress(3, 0), progress(4, 2)])


def test_the_next_run_refuses_until_the_repair(layout: AppLayout) -> None:
    with pytest.raises(ConsistencyError):
        committer(layout).check_watermark_drops([progress(4, 2)])
    # The retry: a new process, which never sees that batch's progress.
    committer(layout).check_watermark_drops([progress(5, 0)])
    with pytest.raises(ConsistencyError, match=f"{DROP_IN_BATCH_4}.*{REPAIR}"):
        refuse_unrepaired_drops(layout)
    # A later epoch is not enough: a rebuild keeps the state that misses the rows.
    bump_epoch([layout.table(tables.LEDGER)], layout.application_id, 1, "rebuild")
    keep = {"state_action": "keep", "boundary": {"epoch": 0, "batch_id": 4}}
    ledger.append(layout, [ledger.operation_done(1, "rebuild", keep, 6)])
    with pytest.raises(ConsistencyError, match=DROP_IN_BATCH_4):
        refuse_unrepaired_drops(layout)
    # The named repair recomputes the state from the application's first offsets.
    bump_epoch([layout.table(tables.LEDGER)], layout.application_id, 2, "backfill")
    earliest = {"state_action": "publish", "boundary": None}
    ledger.append(layout, [ledger.operation_done(2, "backfill", earliest, 7)])
    refuse_unrepaired_drops(layout)


def test_a_drop_stands_while_the_state_is_made_of_its_batch() -> None:
    recorded = [{"epoch": 0, "details": json.dumps({"batch_id": 4, "dropped": 2})}]

    def stands(step: Step | None) -> bool:
        history = History([], {} if step is None else {1: step}, 0 if step is None else 1)
        return bool(unrepaired_drops(recorded, history))

    assert stands(None)  # the same epoch
    assert stands(Step("keep", (0, 4)))  # a rebuild, a skip: the state kept
    assert stands(Step("publish", (0, 4)))  # a backfill from the batch's end
    assert not stands(Step("publish", (0, 3)))  # a backfill from before it
    assert not stands(Step("publish", None))  # a backfill --from-earliest
    assert not stands(Step("restore", (0, 3)))  # a rewind to before it (replayed)
    assert not stands(Step("empty", None))  # a rebuild --from-source
