"""What ``run`` prints when it finishes: the state table and a ledger summary."""

from __future__ import annotations

from deltalake import DeltaTable

from jobs.delta.layout import AppLayout
from jobs.pipeline import Pipeline
from jobs.settings import Settings
from jobs.status import application_status, format_status
from jobs.streaming.run import RunSummary

MAX_ROWS = 20


def print_run_report(pipeline: Pipeline, settings: Settings, summary: RunSummary) -> None:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    state = DeltaTable(str(layout.table("state"))).to_pandas()
    shown = [*pipeline.state_keys, *(a.name for a in pipeline.aggregations)]
    state = state.sort_values(list(pipeline.state_keys))[shown]
    print(f"state table {layout.table('state')} ({len(state)} rows, first {MAX_ROWS}):")
    print(state.head(MAX_ROWS).to_string(index=False))
    committed = [b for b in summary.batches if not b.skipped]
    with_data = [b for b in committed if b.ledger.get("records_in")]
    print(
        f"\nthis run: {len(committed)} batches committed ({len(with_data)} with records, the "
        f"rest move the watermark on), {summary.records_in} records in {summary.seconds:.1f} s "
        f"including Spark's start-up, epoch {summary.epoch}"
    )
    print(format_status(application_status(pipeline, settings)))
