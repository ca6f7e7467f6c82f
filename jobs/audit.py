"""Audit entries: every operation, dry or applied, is a row in the ledger."""

from __future__ import annotations

import getpass
import json
import os
import time
import uuid
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import MAX_ATTEMPTS, OperationFence, check_hold, own_commit
from jobs.errors import ConsistencyError
from jobs.pipeline.model import Pipeline

# The commit info key of an audit row's own id (``append_audit``).
AUDIT_ID = "audit_id"


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


def append_audit(layout: AppLayout, row: pa.Table, fenced: bool = False) -> None:
    """Append an audit row, at most once: every audit commit carries the
    ``<app>/audit`` transaction and an id of its own, so that a commit whose answer
    was lost and that is tried again conflicts (delta-rs' check of app transactions)
    and finds its first commit, instead of appending the row twice. Audits of dry
    runs carry no fence: they must not disturb a running stream. An operation's own
    rows (``fenced``) carry the fence of the row's epoch and are refused
    (``FencedError``) once another holder moved the application past it. A holder
    that lost its hold on the application records nothing more."""
    check_hold()
    path = layout.table(tables.LEDGER)
    tables.upgrade_ledger(path)
    epoch = int(row.column("epoch")[0].as_py())
    audit_id = uuid.uuid4().hex
    for _attempt in range(MAX_ATTEMPTS):
        table = DeltaTable(str(path))
        read = table.version()
        if fenced:
            props = OperationFence(layout.application_id, epoch, "audit").on(table)
            txns = list(props.app_transactions or [])
        else:
            txns = []
        txns.append(Transaction(audit_txn_id(layout.application_id), epoch))
        props = CommitProperties(
            app_transactions=txns,
            custom_metadata={"application_id": layout.application_id, AUDIT_ID: audit_id},
        )
        try:
            write_deltalake(table, row, mode="append", commit_properties=props)
            return
        except CommitFailedError:
            if own_commit(path, read, AUDIT_ID, audit_id):
                return  # this row's own commit, whose answer was lost
    raise ConsistencyError(
        f"could not append an audit row to {path} after {MAX_ATTEMPTS} concurrent conflicts"
    )


def audit_txn_id(application_id: str) -> str:
    return f"{application_id}/audit"
