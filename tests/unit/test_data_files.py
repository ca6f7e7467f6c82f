"""Data files the tasks write: row groups small enough for any reader's memory."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.delta.files import ROW_GROUP_BYTES, DataFileWriter, staging
from jobs.warehouse import Location


def test_large_records_are_split_into_small_row_groups(tmp_path: Path) -> None:
    schema = pa.schema([("offset", pa.int64()), ("value", pa.binary())])
    rows = pa.table(
        {"offset": list(range(10_000)), "value": [os.urandom(10_000) for _ in range(10_000)]},
        schema=schema,
    )  # one Arrow batch of Spark's default size: 100 MB
    table = Location.local_path(tmp_path)
    out = DataFileWriter(table, "part-e0-b0-c00000-aa.parquet", schema)
    out.write(rows)
    written = out.close()
    assert written is not None and written.num_records == 10_000
    meta = pq.read_metadata(staging(table) / written.name)
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    assert sum(g.num_rows for g in groups) == 10_000
    assert max(g.total_byte_size for g in groups) <= ROW_GROUP_BYTES * 1.1
    back = pq.read_table(staging(table) / written.name)
    assert back["offset"].to_pylist() == list(range(10_000))
    assert back["value"].to_pylist() == rows["value"].to_pylist()
