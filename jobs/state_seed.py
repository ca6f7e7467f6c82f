"""A cut's state (the ``state`` table at the cut's version) as rows Spark can
absorb, with pyarrow only (planners, ``status`` and the Airflow hook import this
without starting Spark).

Aggregations are kept algebraic, so a snapshot of the ``state`` table becomes
"contributions": per key (and window) what the row adds to a fresh aggregation.
``jobs/streaming/seed.py`` feeds them to Spark in a new epoch's first batch.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from jobs.delta.layout import TIMESTAMP
from jobs.pipeline.model import Aggregation, Pipeline, stored_column
from jobs.warehouse import Location


def seed_rows(state: pa.Table, pipeline: Pipeline) -> pa.Table:
    """State rows -> contributions: what each row adds to a fresh aggregation. The
    columns keep the state table's types (a process without Spark cannot tell a
    derived column's type; the state table was written with it)."""
    n = state.num_rows
    columns: dict[str, Any] = {k: state[k] for k in pipeline.keys}
    if pipeline.window is not None:
        columns["_event_time"] = seed_time(state, pipeline)
    else:
        columns["_event_time"] = pa.array([0] * n, TIMESTAMP)
    for agg in pipeline.aggregations:
        added, sketch = contribution(agg), sketch_input(agg)
        columns[added] = state[stored_column(agg)]
        if agg.function == "approx_count_distinct":
            columns[sketch] = pa.nulls(n, pa.string())
    columns[RECORDS] = state["_records"]
    return pa.table(columns)


def seed_time(state: pa.Table, pipeline: Pipeline) -> pa.ChunkedArray:
    """The event time a window row is seeded at, inside that window's key only: a
    tumbling window's start; a hopping window's last pane (end - slide), by which
    ``query.aggregate`` keys it (its start would fall in the panes of n windows)."""
    assert pipeline.window is not None
    window = pipeline.window
    if window.windows_per_record == 1:
        return state["window_start"]
    end = state["window_end"]
    last_pane = pc.subtract(pc.cast(end, pa.int64()), window.slide_seconds * 1_000_000)
    return pc.cast(last_pane, end.type)


def open_windows(state: pa.Table, pipeline: Pipeline) -> pa.Table:
    """The state rows Spark still needs: windows the seeded watermark keeps open.

    Spark's watermark after the seed batch is the newest seeded window start minus
    the delay (a hopping window's seed time and Spark's delay are both size - slide
    more), and it drops windows that end at or before it (they stay in the Delta
    ``state`` table, closed, as they were). Unwindowed state is needed whole.
    """
    if pipeline.window is None or state.num_rows == 0:
        return state
    assert pipeline.watermark_seconds is not None
    newest = pc.max(state["window_start"]).value  # microseconds
    watermark = newest - pipeline.watermark_seconds * 1_000_000
    ends = pc.cast(state["window_end"], pa.int64())
    return state.filter(pc.greater(ends, watermark))


RECORDS = "_in__records"


def contribution(aggregation: Aggregation) -> str:
    """The column holding what a row adds to ``aggregation``'s stored column."""
    return f"_in_{aggregation.name}"


def sketch_input(aggregation: Aggregation) -> str:
    """A distinct count's value per record, which Spark adds to the sketch (a seed
    row brings a whole sketch in ``contribution`` instead)."""
    return f"_value_{aggregation.name}"


def seed_at(
    state_path: Location, pipeline: Pipeline, version: int | None, rows: pa.Table | None
) -> pa.Table | None:
    """The rows a new epoch's Spark state is seeded with: ``rows`` (a backfill's
    recomputed state) or the ``state`` table at ``version``, its closed windows
    left out; None for an empty state."""
    if rows is None and version is not None:
        rows = DeltaTable(str(state_path), version=version).to_pyarrow_table()
    if rows is not None:
        rows = open_windows(pa.table(rows), pipeline)
    return seed_rows(rows, pipeline) if rows is not None and rows.num_rows else None
