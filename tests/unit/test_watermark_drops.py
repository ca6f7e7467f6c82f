"""Spark's own late-row drops must stay zero: a drop stops the run naming the repair."""

from __future__ import annotations

import pytest

from jobs.errors import ConsistencyError
from jobs.pipeline import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming.batch import BatchCommitter


def committer() -> BatchCommitter:
    made = object.__new__(BatchCommitter)  # only what the check reads
    made.pipeline = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    made.epoch = 3
    made._checked_progress = set()
    return made


def progress(batch_id: int, dropped: int) -> dict[str, object]:
    return {"batchId": batch_id, "stateOperators": [{"numRowsDroppedByWatermark": dropped}]}


def test_no_drop_passes_and_each_batch_is_checked_once() -> None:
    check = committer()
    check.check_watermark_drops([progress(0, 0), progress(1, 0)])
    check.check_watermark_drops([progress(1, 5)])  # already checked: not read again
    assert check._checked_progress == {0, 1}


def test_a_drop_stops_the_run_naming_the_batch_and_the_repair() -> None:
    with pytest.raises(ConsistencyError, match=r"dropped 2 late row\(s\) in batch 4 of epoch 3"):
        committer().check_watermark_drops([progress(3, 0), progress(4, 2)])
