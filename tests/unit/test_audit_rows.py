"""An audit row is appended at most once, and an operation's own rows only while
its epoch is the application's (real delta-rs tables; no Spark).

A commit whose reply was lost is retried on the snapshot it was made on (an S3
client's retry of the PUT, delta-rs' own loop): a blind append then commits the
row a second time. Every audit commit carries the ``<app>/audit`` transaction
and an id of its own, so the retry conflicts and finds its first commit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs import audit
from jobs.audit import append_audit, audit_row
from jobs.delta import layout as tables
from jobs.delta.writer import bump_epoch
from jobs.errors import FencedError
from tests.output_tables import StateWriter, clicks_pipeline


def ledger(writer: StateWriter) -> list[dict[str, Any]]:
    rows = DeltaTable(str(writer.layout.table(tables.LEDGER))).to_pyarrow_table().to_pylist()
    return [r for r in rows if r["entry_type"] != "batch"]


def test_a_retried_audit_commit_whose_first_reply_was_lost_adds_one_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = StateWriter(tmp_path / "warehouse", clicks_pipeline())
    real = audit.write_deltalake

    def reply_lost_then_retried(table: Any, *args: Any, **kwargs: Any) -> None:
        read = table.version()
        real(table, *args, **kwargs)  # applied; its answer never came back
        # The retry, made on the snapshot the first attempt read.
        real(DeltaTable(table.table_uri, version=read), *args, **kwargs)

    monkeypatch.setattr(audit, "write_deltalake", reply_lost_then_retried)
    row = audit_row(writer.pipeline, "rewind", 0, {"reason": "dry", "dry_run": True})
    append_audit(writer.layout, row)
    assert len(ledger(writer)) == 1


def test_an_operations_row_of_an_epoch_another_holder_moved_past_is_refused(
    tmp_path: Path,
) -> None:
    writer = StateWriter(tmp_path / "warehouse", clicks_pipeline())
    layout, pipeline = writer.layout, writer.pipeline
    done = audit_row(pipeline, "rewind", 1, {"phase": "done", "reason": "zombie"})
    bump_epoch([layout.table(tables.LEDGER)], pipeline.application_id, 2, "a newer holder")
    with pytest.raises(FencedError, match="moved to epoch 2"):
        append_audit(layout, done, fenced=True)
    assert ledger(writer) == []
    # A dry run's row is not fenced: it must not disturb a running stream.
    dry = audit_row(pipeline, "rewind", 2, {"reason": "look", "dry_run": True})
    append_audit(layout, dry)
    assert [json.loads(r["details"])["reason"] for r in ledger(writer)] == ["look"]


def test_concurrent_audit_rows_all_land(tmp_path: Path) -> None:
    """Two writers' rows (an operation's and a dry run's) on one snapshot: the
    second conflicts, finds the first is not its own, and commits again."""
    writer = StateWriter(tmp_path / "warehouse", clicks_pipeline())
    path = writer.layout.table(tables.LEDGER)
    stale = DeltaTable(str(path))
    append_audit(writer.layout, audit_row(writer.pipeline, "maintain", 0, {"reason": "a"}))
    real = audit.write_deltalake
    calls = []

    def on_the_stale_snapshot_first(table: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        real(stale if len(calls) == 1 else table, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(audit, "write_deltalake", on_the_stale_snapshot_first)
        append_audit(writer.layout, audit_row(writer.pipeline, "maintain", 0, {"reason": "b"}))
    assert sorted(json.loads(r["details"])["reason"] for r in ledger(writer)) == ["a", "b"]
    assert len(calls) == 2
