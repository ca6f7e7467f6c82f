"""Output records: a version's changes as Kafka key, value, headers and partition.

* key: JSON of the state row's identity, the pipeline's keys and, for a windowed
  pipeline, ``window_start`` and ``window_end`` (a compacted topic keeps the last
  value of every key and window);
* value: JSON ``{"window": {"start", "end"}, "aggregates": {...}, "updated_at"}``,
  or no value (a tombstone) when the version removed the row;
* partition: from the pipeline's keys only (not the window), so every window of a
  key lands in one partition, in order, as Kafka Streams partitions windowed keys;
* headers: application, epoch, batch, pipeline version, state version, and the
  kind: ``change`` (a batch's), ``correction`` (an operation's), ``snapshot``.

Times are ISO 8601 in UTC, to the microsecond (``2026-11-23T10:00:00.000000Z``).
A non-finite number cannot be JSON: it is an error.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from jobs.errors import ConsistencyError
from jobs.output.changes import VersionChanges
from jobs.pipeline.model import Pipeline

HEADER_PREFIX = "platform."
CHUNK_ROWS = 10_000
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # Arrow's %S has the microseconds: ...T10:00:00.000000Z

Record = tuple[bytes, bytes | None, int]  # key, value, partition


def headers(application_id: str, changes: VersionChanges) -> list[tuple[str, str | bytes | None]]:
    return [
        (HEADER_PREFIX + name, str(value).encode())
        for name, value in (
            ("application", application_id),
            ("kind", changes.kind),
            ("operation", changes.operation),
            ("epoch", changes.epoch),
            ("batch", changes.batch_id),
            ("pipeline_version", changes.pipeline_version),
            ("state_version", changes.version),
        )
    ]


# One encoder: json.dumps with options builds a new one per call (a third of the time).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _dumps(data: dict[str, Any]) -> bytes:
    return _ENCODER.encode(data).encode()


def partition_of(pipeline: Pipeline, row: dict[str, Any], partitions: int) -> int:
    """Stable across processes and versions (crc32, not Python's salted hash)."""
    identity = _dumps({k: row[k] for k in pipeline.keys})
    return zlib.crc32(identity) % partitions


def check_finite(pipeline: Pipeline, changes: VersionChanges) -> None:
    """JSON has no NaN or infinity: such a value stops publishing, named."""
    rows = changes.upserts
    for name in rows.column_names:
        if not pa.types.is_floating(rows.schema.field(name).type):
            continue
        bad = pc.invert(pc.fill_null(pc.is_finite(rows[name]), True))
        if pc.any(bad).as_py():
            row = rows.filter(bad).slice(0, 1).to_pylist()[0]
            raise ConsistencyError(
                f"state version {changes.version}: {name} of {row_key(pipeline, row)} is "
                f"{row[name]}, which JSON cannot carry; fix the pipeline (or its input) and "
                "backfill"
            )


def _columns(batch: pa.RecordBatch, names: list[str]) -> dict[str, list[Any]]:
    """Columns as Python lists; times as fixed-width ISO 8601 UTC text, formatted
    by Arrow (a datetime per value cost most of the encoding)."""
    found = {}
    for name in names:
        column = batch.column(name)
        if pa.types.is_timestamp(column.type):
            column = pc.strftime(column, format=TIME_FORMAT)
        elif pa.types.is_decimal(column.type) or pa.types.is_date(column.type):
            # Exact decimals as text (a JSON number would pass through a double).
            column = pc.cast(column, pa.string())
        found[name] = column.to_pylist()
    return found


def encode(pipeline: Pipeline, changes: VersionChanges, partitions: int) -> Iterator[Record]:
    """The version's records: new rows, then removed keys (tombstones)."""
    check_finite(pipeline, changes)
    public = [a.name for a in pipeline.aggregations]
    state_keys = list(pipeline.state_keys)
    windowed = pipeline.window is not None
    partition: dict[tuple[Any, ...], int] = {}  # per key: its windows repeat it
    for table, removed in ((changes.upserts, False), (changes.deletes, True)):
        names = state_keys if removed else [*state_keys, *public, "updated_at"]
        for batch in table.to_batches(max_chunksize=CHUNK_ROWS):
            columns = _columns(batch, names)
            for i in range(batch.num_rows):
                row = {name: columns[name][i] for name in names}
                key = {k: row[k] for k in state_keys}
                value = None
                if not removed:
                    data: dict[str, Any] = {}
                    if windowed:
                        data["window"] = {"start": row["window_start"], "end": row["window_end"]}
                    data["aggregates"] = {name: row[name] for name in public}
                    data["updated_at"] = row["updated_at"]
                    value = _dumps(data)
                identity = tuple(row[k] for k in pipeline.keys)
                if identity not in partition:
                    partition[identity] = partition_of(pipeline, row, partitions)
                yield _dumps(key), value, partition[identity]


def row_key(pipeline: Pipeline, row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={row[k]!r}" for k in pipeline.state_keys)
