"""Hand-written ledger rows for tests without Spark: batch rows and operations'
"done" rows, appended to a real Delta ledger (one topic, partition 0)."""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout


def batch_row(
    epoch: int,
    batch_id: int,
    start: int,
    end: int,
    state_after: int,
    topic: str = "clicks",
    **columns: Any,
) -> dict[str, Any]:
    """A committed batch that read ``topic[0]`` from ``start`` to ``end``."""
    records = end - start
    return {
        "entry_type": "batch",
        "epoch": epoch,
        "batch_id": batch_id,
        "start_offsets": json.dumps({topic: {"0": start}}),
        "end_offsets": json.dumps({topic: {"0": end}}),
        "records_in": records,
        "records_valid": records,
        "dead_lettered": 0,
        "aggregated": records,
        "late_dropped": 0,
        "windows_per_record": 1,
        "delta_versions": json.dumps({"state_after": state_after}),
        "watermark_ms": 0,
        **columns,
    }


def operation_done(
    epoch: int, operation: str, plan: dict[str, Any], state_version: int
) -> dict[str, Any]:
    """The row an operation writes when it is done (its plan, the state it left)."""
    details = {"phase": "done", "plan": plan, "result": {"state_version": state_version}}
    return {"entry_type": operation, "epoch": epoch, "details": json.dumps(details)}


def append(layout: AppLayout, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` (of ``layout``'s application) to its ledger, creating it."""
    path = layout.table(tables.LEDGER)
    if not DeltaTable.is_deltatable(str(path)):
        DeltaTable.create(str(path), tables.LEDGER_SCHEMA)
    full = [
        {
            "application_id": layout.application_id,
            "pipeline_version": 1,
            "processing_guarantee": "exactly_once",
            "commit_time": int(time.time() * 1_000_000),
            **row,
        }
        for row in rows
    ]
    write_deltalake(str(path), pa.Table.from_pylist(full, tables.LEDGER_SCHEMA), mode="append")


def record_cut(layout: AppLayout, cut: Any) -> None:
    """Set an epoch's cut as a test's scene needs it (replacing one: the platform's
    ``write_cut`` never replaces the cut of a begun epoch)."""
    from jobs.cut import cut_file

    cut_file(layout, cut.epoch).write_text(cut.to_json())


def rebuild_cut(pipeline: Any, epoch: int = 1, offset: int = 4) -> Any:
    """The cut a rebuild of ``pipeline`` (one partition of ``clicks``) makes for ``epoch``."""
    from jobs.cut import Cut, recorded_definition

    return Cut(
        epoch=epoch,
        starting_offsets={"clicks": {"0": offset}},
        origin="rebuild",
        state_shape=pipeline.state_shape,
        definition=recorded_definition(pipeline),
    )
