"""Audit entries: every operation, dry or applied, is a row in the ledger."""

from __future__ import annotations

import getpass
import json
import os
import time
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import check_hold
from jobs.pipeline.model import Pipeline


def who() -> str:
    """The Airflow user who triggered the run, else the OS user."""
    for name in ("PLATFORM_TRIGGERED_BY", "AIRFLOW_CTX_DAG_OWNER"):
        if os.environ.get(name):
            return f"airflow:{os.environ[name]}"
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def audit_row(
    pipeline: Pipeline,
    operation: str,
    epoch: int,
    details: dict[str, Any],
    start_offsets: dict[str, Any] | None = None,
    end_offsets: dict[str, Any] | None = None,
) -> pa.Table:
    row = {
        "application_id": pipeline.application_id,
        "entry_type": operation,
        "epoch": epoch,
        "batch_id": None,
        "start_offsets": None
        if start_offsets is None
        else json.dumps(start_offsets, sort_keys=True),
        "end_offsets": None if end_offsets is None else json.dumps(end_offsets, sort_keys=True),
        "pipeline_version": pipeline.version,
        "processing_guarantee": pipeline.processing_guarantee,
        "details": json.dumps({"who": who(), **details}, sort_keys=True, default=str),
        "commit_time": int(time.time() * 1_000_000),
    }
    return pa.Table.from_pylist([row], tables.LEDGER_SCHEMA)


def append_audit(layout: AppLayout, row: pa.Table) -> None:
    """A blind append (no fence): audits of dry runs must not disturb a running stream.
    A holder that lost its hold on the application records nothing more."""
    check_hold()
    tables.upgrade_ledger(layout.table(tables.LEDGER))
    write_deltalake(str(layout.table(tables.LEDGER)), row, mode="append")
