"""The batch ledger (``<app>/_ledger``): where an application stands, without Spark.

One row per committed batch (offsets, counts, the Delta versions it produced) and
per operation (who, why, the plan, its phase). The epoch is the fence transaction
on the ledger table. Everything here reads Delta only: ``status``, the Airflow hook
and the planners use it without starting Spark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import table_epoch
from jobs.kafka_source import offsets as kafka_offsets
from jobs.lineage import BatchEntry, Boundary, History, Pin, Step, partition_of

Offsets = kafka_offsets.Offsets
BATCH = "batch"
# Audit rows of operations that change the epoch, and their two phases.
STARTED, DONE = "started", "done"
# Table maintenance: never changes the epoch; its "started" row records the oldest
# state version it keeps (the rewind horizon it promises).
MAINTAIN = "maintain"


@dataclass(frozen=True)
class UnfinishedOperation:
    """An operation that fenced the application (bumped the epoch) and did not finish."""

    operation: str
    epoch: int
    who: str
    when: str
    reason: str

    def describe(self) -> str:
        return (
            f"{self.operation} by {self.who} at {self.when} (reason: {self.reason!r}) moved "
            f"the application to epoch {self.epoch} and did not finish"
        )


def epoch_steps(rows: list[dict[str, Any]]) -> dict[int, Step]:
    """The completed operations (their "done" rows) by the epoch they began."""
    steps = {}
    for row in rows:
        if row["entry_type"] in (BATCH, MAINTAIN, "verify"):
            continue
        details = row["details"]
        details = json.loads(details or "{}") if isinstance(details, str | None) else details
        if details.get("phase") != DONE or details.get("dry_run"):
            continue
        plan = details.get("plan") or {}
        boundary = plan.get("boundary")
        version = (details.get("result") or {}).get("state_version")
        steps[int(row["epoch"])] = Step(
            action=str(plan.get("state_action", "keep")),
            boundary=None
            if boundary is None
            else (int(boundary["epoch"]), int(boundary["batch_id"])),
            skipped={
                partition_of(name): (int(r[0]), int(r[1]))
                for name, r in (plan.get("skipped") or {}).items()
            },
            state_version=None if version is None else int(version),
            done_us=_micros(row.get("commit_time")),
            watermark_ms=int((boundary or {}).get("watermark_ms") or 0),
            dimensions=tuple(
                sorted(
                    (str(k), pin)
                    for k, v in (plan.get("dimension_versions") or {}).items()
                    if (pin := Pin.of(v)) is not None
                )
            ),
        )
    return steps


def batch_entries(rows: list[dict[str, Any]]) -> list[BatchEntry]:
    """The ledger's batch rows as the coverage reads them."""
    found = []
    for row in rows:
        versions = json.loads(row.get("delta_versions") or "{}")
        details = json.loads(row.get("details") or "{}")
        state_after = versions.get("state_after")
        found.append(
            BatchEntry(
                epoch=int(row["epoch"]),
                batch_id=int(row["batch_id"]),
                start=kafka_offsets.from_json_dict(json.loads(row["start_offsets"] or "{}")),
                end=kafka_offsets.from_json_dict(json.loads(row["end_offsets"] or "{}")),
                watermark_ms=int(row["watermark_ms"] or 0),
                # Rows written before it was recorded: a batch without records
                # followed with the watermark moved on (0: its own).
                reached_ms=int(details.get("next_watermark_ms") or 0),
                # Rows written before the batch time was recorded: their commit time
                # (the same batch, seconds later).
                batch_time_ms=int(
                    details.get("batch_timestamp_ms") or _micros(row["commit_time"]) // 1000
                ),
                state_version=None if state_after is None else int(state_after),
                commit_time_us=_micros(row["commit_time"]),
                dimensions=pins(details.get("dimensions")),
                replayed=tuple(
                    ((str(t), int(p)), int(b), int(e), pins(v))
                    for t, p, b, e, v in details.get("replayed") or []
                ),
            )
        )
    return found


def pins(recorded: dict[str, Any] | None) -> tuple[tuple[str, Pin | None], ...]:
    """A batch row's ``{enrichment: pin}`` (``Pin.of``), sorted by name."""
    return tuple(sorted((str(k), Pin.of(v)) for k, v in (recorded or {}).items()))


class LedgerVersion:
    """The ledger at one version: every read from it agrees with the others and
    with its epoch (a batch committed meanwhile is in none of them)."""

    def __init__(self, layout: AppLayout, table: DeltaTable) -> None:
        self.layout = layout
        self.version = int(table.version())
        self.epoch = max(0, table_epoch(table, layout.application_id))
        self._dataset = table.to_pyarrow_dataset()
        self._histories: dict[frozenset[int], History] = {}

    def rows(
        self, columns: list[str] | None = None, where: ds.Expression | None = None
    ) -> pa.Table:
        """``columns`` of the rows matching ``where``; a column added to the ledger
        since this one was written reads as nulls."""
        have = set(self._dataset.schema.names)
        wanted = None if columns is None else [c for c in columns if c in have]
        rows = self._dataset.to_table(columns=wanted, filter=where)
        for name in [c for c in columns or [] if c not in have]:
            kind = tables.LEDGER_SCHEMA.field(name).type
            rows = rows.append_column(name, pa.nulls(rows.num_rows, kind))
        return rows if columns is None else rows.select(columns)

    def history(self, excluded: frozenset[int] = frozenset()) -> History:
        """The application's coverage and live lineage as of this read, without the
        epochs ``excluded`` (those that read a topic's deleted log)."""
        if excluded not in self._histories:
            steps = epoch_steps(
                self.rows(["entry_type", "epoch", "details"], ~IS_BATCH).to_pylist()
            )
            rows = batch_rows(self.rows([*BOUNDARY_COLUMNS, "details"], IS_BATCH))
            self._histories[excluded] = History(batch_entries(rows), steps, self.epoch, excluded)
        return self._histories[excluded]


def current_ledger(layout: AppLayout) -> LedgerVersion | None:
    path = layout.table(tables.LEDGER)
    if not DeltaTable.is_deltatable(str(path)):
        return None
    return LedgerVersion(layout, DeltaTable(str(path)))


def read_ledger(
    layout: AppLayout, columns: list[str] | None = None, where: ds.Expression | None = None
) -> pa.Table | None:
    """The ledger's rows (only ``columns``, only those matching ``where``: the ledger
    grows by a row per batch, so callers read what they need)."""
    ledger_now = current_ledger(layout)
    return None if ledger_now is None else ledger_now.rows(columns, where)


def ledger_dataset(layout: AppLayout) -> ds.Dataset | None:
    path = layout.table(tables.LEDGER)
    if not DeltaTable.is_deltatable(str(path)):
        return None
    return DeltaTable(str(path)).to_pyarrow_dataset()


IS_BATCH = ds.field("entry_type") == BATCH


def last_batch(layout: AppLayout, where: ds.Expression | None = None) -> dict[str, Any] | None:
    """The newest batch row by (epoch, batch_id) (of those matching ``where``), in
    bounded memory: a scan of two columns for its position, then a read of that row."""
    dataset = ledger_dataset(layout)
    if dataset is None:
        return None
    best: tuple[int, int] | None = None
    scope = IS_BATCH if where is None else IS_BATCH & where
    for chunk in dataset.to_batches(columns=["epoch", "batch_id"], filter=scope):
        if chunk.num_rows == 0:
            continue
        epoch = pc.max(chunk["epoch"]).as_py()
        in_epoch = pc.filter(chunk["batch_id"], pc.equal(chunk["epoch"], epoch))
        candidate = (int(epoch), int(pc.max(in_epoch).as_py()))
        best = candidate if best is None else max(best, candidate)
    if best is None:
        return None
    where = IS_BATCH & (ds.field("epoch") == best[0]) & (ds.field("batch_id") == best[1])
    rows = dataset.to_table(filter=where).to_pylist()
    return rows[0] if rows else None


def current_epoch(layout: AppLayout) -> int:
    """The application's epoch: the fence on its ledger (0 before any bump)."""
    ledger = layout.table(tables.LEDGER)
    if not DeltaTable.is_deltatable(str(ledger)):
        return 0
    return max(0, table_epoch(DeltaTable(str(ledger)), layout.application_id))


def batch_rows(ledger: pa.Table | None) -> list[dict[str, Any]]:
    """The ledger's batch rows in commit order: (epoch, batch_id), not wall-clock time."""
    if ledger is None:
        return []
    batches = ledger.filter(pc.equal(ledger["entry_type"], BATCH))
    rows = batches.to_pylist()
    return sorted(rows, key=lambda r: (int(r["epoch"]), int(r["batch_id"])))


def last_batches(ledger: pa.Table | None) -> dict[int, int]:
    """The last committed batch id of every epoch that committed one."""
    last: dict[int, int] = {}
    for row in batch_rows(ledger):
        last[int(row["epoch"])] = max(last.get(int(row["epoch"]), -1), int(row["batch_id"]))
    return last


BOUNDARY_COLUMNS = [
    "entry_type",
    "epoch",
    "batch_id",
    "start_offsets",
    "end_offsets",
    "delta_versions",
    "watermark_ms",
    "commit_time",
]


def batch_boundaries(layout: AppLayout, ledger_now: LedgerVersion | None = None) -> list[Boundary]:
    """Every committed batch end of the application's live lineage, oldest first."""
    ledger_now = ledger_now or current_ledger(layout)
    return [] if ledger_now is None else ledger_now.history().boundaries({})


def _micros(value: Any) -> int:
    """A ledger timestamp (datetime from Arrow, or epoch micros) as epoch micros."""
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1_000_000)
    return int(value or 0)


def last_boundary(layout: AppLayout, ledger_now: LedgerVersion | None = None) -> Boundary | None:
    boundaries = batch_boundaries(layout, ledger_now)
    return boundaries[-1] if boundaries else None


def kept_state_version(layout: AppLayout) -> int | None:
    """The oldest state version ``maintain`` promised to keep (None: never maintained)."""
    ledger = read_ledger(layout, ["details"], ds.field("entry_type") == MAINTAIN)
    if ledger is None:
        return None
    rows = ledger.to_pylist()
    details = [json.loads(r["details"] or "{}") for r in rows]
    versions = [
        int(d["kept_state_version"])
        for d in details
        if d.get("phase") == STARTED
        and not d.get("dry_run")
        and d.get("kept_state_version") is not None
    ]
    return max(versions) if versions else None


def _operations_by_epoch(
    layout: AppLayout, since: int, ledger_now: LedgerVersion | None = None
) -> dict[int, list[dict[str, Any]]]:
    """The applied (not dry-run, not maintain) operation rows of epochs ``since`` and
    later, oldest first, with their details parsed."""
    where = (ds.field("epoch") >= since) & ~IS_BATCH
    ledger = (
        read_ledger(layout, where=where) if ledger_now is None else ledger_now.rows(where=where)
    )
    found: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(ledger.to_pylist() if ledger else [], key=lambda r: r["commit_time"]):
        details = json.loads(row["details"] or "{}")
        if not details.get("dry_run") and row["entry_type"] != MAINTAIN:
            found.setdefault(int(row["epoch"]), []).append({**row, "details": details})
    return found


def _died(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and not any(r["details"].get("phase") == DONE for r in rows)


def beyond_horizon(layout: AppLayout, state_version: int | None) -> int | None:
    """The oldest state version ``maintain`` kept, when ``state_version`` is older
    (its files are gone: nothing can restore it); else None. The one horizon check
    of rewinds and of saved plans."""
    kept = kept_state_version(layout)
    if kept is None or state_version is None or state_version >= kept:
        return None
    return kept


def unfinished_operation(
    layout: AppLayout, ledger_now: LedgerVersion | None = None
) -> UnfinishedOperation | None:
    """The operation that moved the application to its current epoch, if it has not
    recorded that it finished (it died after the fence: its cut may be incomplete)."""
    epoch = current_epoch(layout) if ledger_now is None else ledger_now.epoch
    if epoch == 0:
        return None
    applied = _operations_by_epoch(layout, epoch, ledger_now).get(epoch, [])
    if not _died(applied):
        return None
    # The epoch's first row: the operation's bump ("started"), or the fence it put
    # on a running stream before it died.
    first = applied[0]
    details = first["details"]
    operation = str(details.get("for") or first["entry_type"])
    return UnfinishedOperation(
        operation=operation,
        epoch=epoch,
        who=str(details.get("who", "unknown")),
        when=str(first["commit_time"]),
        reason=str(details.get("reason", "")),
    )


def unfinished_epochs(layout: AppLayout) -> list[int]:
    """The current epoch if its operation died after its fence, and before it each
    epoch whose operation died too (an attempt to complete one that died itself;
    no batch runs in between), oldest first. Empty when nothing is unfinished."""
    epoch = current_epoch(layout)
    by_epoch = _operations_by_epoch(layout, 1)
    chain: list[int] = []
    while epoch > 0 and _died(by_epoch.get(epoch, [])):
        chain.insert(0, epoch)
        epoch -= 1
    return chain
