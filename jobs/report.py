"""What ``run`` prints when it finishes: the state table and a ledger summary."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from jobs.delta.layout import AppLayout
from jobs.pipeline.model import Pipeline
from jobs.settings import Settings
from jobs.status import application_status, format_status
from jobs.streaming.summary import RunSummary

MAX_ROWS = 20


def first_rows(table: DeltaTable, columns: list[str], keys: list[str], n: int) -> pa.Table:
    """The first ``n`` rows by ``keys``, streamed (bounded memory at any state size)."""
    order = [(k, "ascending") for k in keys]
    best = None
    for chunk in table.to_pyarrow_dataset().to_batches(columns=columns):
        candidates = pa.Table.from_batches([chunk])
        if best is not None:
            candidates = pa.concat_tables([best, candidates])
        best = candidates.sort_by(order).slice(0, n)
    return (
        best
        if best is not None
        else table.to_pyarrow_dataset().schema.empty_table().select(columns)
    )


def print_run_report(pipeline: Pipeline, settings: Settings, summary: RunSummary) -> None:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    table = DeltaTable(str(layout.table("state")))
    shown = [*pipeline.state_keys, *(a.name for a in pipeline.aggregations)]
    first = first_rows(table, shown, list(pipeline.state_keys), MAX_ROWS)
    print(f"state table {layout.table('state')} ({table.count()} rows, first {MAX_ROWS}):")
    print(first.to_pandas().to_string(index=False))
    committed = [b for b in summary.batches if not b.skipped]
    with_data = [b for b in committed if b.ledger.get("records_in")]
    print(
        f"\nthis run: {len(committed)} batches committed ({len(with_data)} with records), "
        f"{summary.records_in} records in {summary.seconds:.1f} s including Spark's "
        f"start-up, epoch {summary.epoch}"
    )
    print(format_status(application_status(pipeline, settings)))
