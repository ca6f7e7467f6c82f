"""Where an application's data lives, and the schemas of its tables.

<warehouse>/<application_id>/changelog     append: every state change, per batch
<warehouse>/<application_id>/state         merge: current value per key (and window)
<warehouse>/<application_id>/dead_letter   append: records that could not be aggregated
<warehouse>/<application_id>/_ledger       append: one row per committed batch/operation
<warehouse>/<application_id>/_checkpoints/epoch=<n>/   Spark checkpoint of epoch n
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema

from jobs.delta.log import TABLE_CONFIGURATION
from jobs.pipeline import APPLICATION_ID, Pipeline

TIMESTAMP = pa.timestamp("us", tz="UTC")
FIELD_ARROW = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
# Order of a batch's commits; the ledger row is last: it marks the batch committed.
DATA_TABLES = ("dead_letter", "changelog", "state")
LEDGER = "_ledger"


@dataclass(frozen=True)
class AppLayout:
    warehouse: Path
    application_id: str

    def __post_init__(self) -> None:
        # The id becomes a directory name: never let it escape the warehouse.
        if not APPLICATION_ID.match(self.application_id):
            raise ValueError(f"invalid application id {self.application_id!r}")

    @property
    def root(self) -> Path:
        return self.warehouse / self.application_id

    def table(self, name: str) -> Path:
        return self.root / name

    @property
    def checkpoints(self) -> Path:
        return self.root / "_checkpoints"

    def checkpoint(self, epoch: int) -> Path:
        return self.checkpoints / f"epoch={epoch}"


def value_type(pipeline: Pipeline, name: str) -> pa.DataType:
    columns = {**pipeline.schema, **{d.name: pipeline.schema[d.field] for d in pipeline.derived}}
    for agg in pipeline.aggregations:
        if name == agg.name:
            if agg.function == "count":
                return pa.int64()
            if agg.function == "avg":
                return pa.float64()
            source = columns[agg.field or ""]
            if agg.function == "sum":
                return pa.float64() if source == "double" else pa.int64()
            return FIELD_ARROW[source]
        if name == f"_sum_{agg.name}":
            return pa.float64() if columns[agg.field or ""] == "double" else pa.int64()
    if name == "_records":
        return pa.int64()
    raise KeyError(name)


def key_fields(pipeline: Pipeline) -> list[pa.Field]:
    fields = [pa.field(k, FIELD_ARROW[pipeline.schema[k]], nullable=False) for k in pipeline.keys]
    if pipeline.window:
        fields += [
            pa.field("window_start", TIMESTAMP, False),
            pa.field("window_end", TIMESTAMP, False),
        ]
    return fields


def aggregate_schema(pipeline: Pipeline) -> pa.Schema:
    """What one batch's aggregation yields: state keys and value columns."""
    values = [pa.field(v, value_type(pipeline, v)) for v in pipeline.value_columns]
    return pa.schema(key_fields(pipeline) + values)


def state_schema(pipeline: Pipeline) -> pa.Schema:
    return (
        aggregate_schema(pipeline)
        .append(pa.field("epoch", pa.int64(), False))
        .append(pa.field("batch_id", pa.int64(), False))
        .append(pa.field("updated_at", TIMESTAMP, False))
    )


def changelog_schema(pipeline: Pipeline) -> pa.Schema:
    return (
        aggregate_schema(pipeline)
        .append(pa.field("epoch", pa.int64(), False))
        .append(pa.field("batch_id", pa.int64(), False))
        .append(pa.field("commit_time", TIMESTAMP, False))
    )


DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("kafka_timestamp", TIMESTAMP),
        pa.field("reason", pa.string(), False),
        pa.field("epoch", pa.int64(), False),
        pa.field("batch_id", pa.int64(), False),
        pa.field("commit_time", TIMESTAMP, False),
    ]
)

RAW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", TIMESTAMP),
        pa.field("timestampType", pa.int32()),
        pa.field("epoch", pa.int64(), False),
        pa.field("batch_id", pa.int64(), False),
    ]
)

LEDGER_SCHEMA = pa.schema(
    [
        pa.field("application_id", pa.string(), False),
        pa.field("entry_type", pa.string(), False),  # "batch" or an operation name
        pa.field("epoch", pa.int64(), False),
        pa.field("batch_id", pa.int64()),
        pa.field("start_offsets", pa.string()),  # JSON topic -> partition -> offset
        pa.field("end_offsets", pa.string()),
        pa.field("records_in", pa.int64()),
        pa.field("records_valid", pa.int64()),
        pa.field("dead_lettered", pa.int64()),
        pa.field("aggregated", pa.int64()),  # (record, window) pairs added to state
        pa.field("late_dropped", pa.int64()),  # (record, window) pairs behind the watermark
        pa.field("windows_per_record", pa.int64()),
        pa.field("state_rows_changed", pa.int64()),
        pa.field("watermark_ms", pa.int64()),
        pa.field("pipeline_version", pa.int64(), False),
        pa.field("processing_guarantee", pa.string(), False),
        pa.field("delta_versions", pa.string()),  # JSON table -> version written
        pa.field("details", pa.string()),  # JSON: operations' who/why/plan/result
        pa.field("commit_time", TIMESTAMP, False),
    ]
)


def table_schemas(pipeline: Pipeline) -> dict[str, pa.Schema]:
    schemas = {
        "dead_letter": DEAD_LETTER_SCHEMA,
        "changelog": changelog_schema(pipeline),
        "state": state_schema(pipeline),
        LEDGER: LEDGER_SCHEMA,
    }
    if pipeline.archive:
        schemas["raw"] = RAW_SCHEMA
    return schemas


def ensure_tables(layout: AppLayout, pipeline: Pipeline) -> None:
    """Create missing tables; refuse an existing table whose schema differs."""
    for name, schema in table_schemas(pipeline).items():
        path = layout.table(name)
        if DeltaTable.is_deltatable(str(path)):
            existing = [(f.name, _type(f.type)) for f in DeltaTable(str(path)).schema().fields]
            needed = [(f.name, _type(f.type)) for f in DeltaSchema.from_arrow(schema).fields]
            if existing != needed:
                from jobs.errors import ConfigError

                raise ConfigError(
                    f"table {path} has columns {_columns(existing)} but pipeline "
                    f"{pipeline.application_id} v{pipeline.version} needs {_columns(needed)}"
                )
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        configuration = dict(TABLE_CONFIGURATION)
        if name == "state":
            configuration["delta.enableChangeDataFeed"] = "true"
        DeltaTable.create(str(path), schema, configuration=configuration)


def _type(kind: object) -> str:
    return str(getattr(kind, "type", kind))  # PrimitiveType("long") -> long


def _columns(fields: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in fields)
