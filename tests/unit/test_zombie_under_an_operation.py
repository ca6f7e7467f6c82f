"""A stream paused past its lease wakes while an operation applies its cut: its
batch's MERGE into ``state`` (fenced in its old epoch, allowed until the bump
reaches ``state``) must not survive the cut. What the state holds beyond the
ledger is judged after every table is fenced, not before (real Delta tables, the
platform's own writers; no Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs import cut as cuts
from jobs.audit import audit_row
from jobs.cut import StateAction, StateChange, apply_cut
from tests import ledger_rows
from tests.output_tables import StateWriter, clicks_pipeline, state_rows


def test_a_zombie_batch_merged_before_the_bump_reaches_state_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = StateWriter(tmp_path / "warehouse", clicks_pipeline())
    layout, pipeline = writer.layout, writer.pipeline
    committed = writer.batch({"u1": 3, "u2": 1})  # batch 0, in the ledger
    ledger_rows.append(layout, [ledger_rows.batch_row(0, 0, 0, 4, committed)])
    expected = DeltaTable(str(writer.path), version=committed).to_pyarrow_table().to_pylist()
    bump = cuts.bump_epoch

    def zombie_wakes_during_the_bump(paths: list[Any], *args: Any, **kwargs: Any) -> None:
        # The ledger is fenced first; before ``state`` is, the paused stream's batch 1
        # (epoch 0) lands its MERGE, and its ledger row is refused.
        bump(paths[:1], *args, **kwargs)
        rows = state_rows(pipeline, {"u1": 7}, 1)
        batch = {"platform_operation": "batch", "pipeline_version": "1"}  # as a batch commits
        writer.writer.merge(writer.path, 1, rows, pipeline.state_keys, batch)
        bump(paths[1:], *args, **{k: v for k, v in kwargs.items() if k != "first_rows"})

    monkeypatch.setattr(cuts, "bump_epoch", zombie_wakes_during_the_bump)
    cut = ledger_rows.rebuild_cut(pipeline)
    audit = audit_row(pipeline, "rebuild", 1, {"phase": "started", "reason": "test"})
    done = apply_cut(
        layout, pipeline, cut, {}, "test", audit, None, [], StateChange(StateAction.KEEP)
    )
    assert done["state_undone_to_version"] == committed
    state = DeltaTable(str(writer.path)).to_pyarrow_table().to_pylist()
    key = lambda row: row["user_id"]  # noqa: E731
    assert sorted(state, key=key) == sorted(expected, key=key)
