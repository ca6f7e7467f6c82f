"""Where an application's data lives, and its tables' fixed schemas (the others
follow from the pipeline's types: ``jobs/resolution.py``).

<warehouse>/<application_id>/changelog     append: every state change, per batch
<warehouse>/<application_id>/state         merge: current value per key (and window)
<warehouse>/<application_id>/dead_letter   append: records that could not be aggregated
<warehouse>/<application_id>/_ledger       append: one row per committed batch/operation
<warehouse>/<application_id>/_checkpoints/epoch=<n>/   Spark checkpoint of epoch n
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema

from jobs import sql_text
from jobs.delta.log import TABLE_CONFIGURATION
from jobs.errors import ConfigError
from jobs.pipeline.model import APPLICATION_ID, Pipeline
from jobs.warehouse import Location

TIMESTAMP = pa.timestamp("us", tz="UTC")
ATOMIC_ARROW = {
    "string": pa.string(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "smallint": pa.int16(),
    "tinyint": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": TIMESTAMP,
    "timestamp_ntz": pa.timestamp("us"),
    "binary": pa.binary(),
}
# A column whose type only Spark can tell (a derived column's, in a process without
# Spark): ``ensure_tables`` takes an existing table's type for it, and never
# creates a table with it.
UNKNOWN = pa.null()
# Order of a batch's commits; the ledger row is last: it marks the batch committed.
# delta-rs reads a local path as a URL's: "%41" in a folder's name is the letter A.
PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
DATA_TABLES = ("dead_letter", "changelog", "state")
LEDGER = "_ledger"


@dataclass(frozen=True)
class AppLayout:
    """An application's places in its warehouse (a local folder or ``s3://``;
    a ``Path`` or text given is parsed into a ``Location``)."""

    warehouse: Location
    application_id: str

    def __post_init__(self) -> None:
        if not isinstance(self.warehouse, Location):
            object.__setattr__(self, "warehouse", Location.parse(self.warehouse))
        # The id becomes a directory name: never let it escape the warehouse.
        if not APPLICATION_ID.fullmatch(self.application_id):
            raise ValueError(f"invalid application id {self.application_id!r}")
        check_table_path(self.warehouse, "the warehouse")

    @property
    def root(self) -> Location:
        return self.warehouse / self.application_id

    def table(self, name: str) -> Location:
        return self.root / name

    @property
    def checkpoints(self) -> Location:
        return self.root / "_checkpoints"

    def checkpoint(self, epoch: int) -> Location:
        return self.checkpoints / f"epoch={epoch}"


def check_table_path(path: Path | Location | str, what: str) -> None:
    """Refuse a folder delta-rs would read as another: spaces, '#', '%' and any
    Unicode are data, but '%' and two hex digits is an escaped character to it."""
    found = PERCENT_ESCAPE.search(str(path))
    if found:
        raise ConfigError(
            f"{what} {path} has {found.group()!r} in it, which delta-rs reads as an escaped "
            "character: rename the folder (a '%' not followed by two hex digits is fine)"
        )


def file_location(uri: str) -> Location:
    """A data file of ``DeltaTable.file_uris()`` as a location: delta-rs gives them
    percent-encoded (a space is %20), with or without ``file://``."""
    return Location.parse(unquote(uri.removeprefix("file://")), "a data file")


def arrow_type(kind: str | None) -> pa.DataType:
    """The Arrow (and Delta) type of a key or value column of Spark type ``kind``."""
    if kind is None:
        return UNKNOWN
    scale = sql_text.decimal_scale(kind)
    if scale is not None:
        return pa.decimal128(*scale)
    return ATOMIC_ARROW[kind]


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
        # Records the pipeline's filter left out (added in pipeline contract v3:
        # older ledgers gain the column, null in their rows, meaning none).
        pa.field("filtered", pa.int64()),
    ]
)


def table_names(pipeline: Pipeline) -> list[str]:
    """Every table an application writes."""
    return [*DATA_TABLES, LEDGER] + (["raw"] if pipeline.archive else [])


# A backfill republishes these under a new definition (a column added, removed or
# retyped): ``state`` is replaced in one commit, ``changelog`` gains the new
# columns and keeps the old ones, empty in new rows (it is the history).
REPUBLISHED = ("state", "changelog")


def column_problems(name: str, existing: DeltaSchema, needed: pa.Schema) -> list[str]:
    """Why rows of ``needed`` cannot go into a table of ``existing`` columns (a column
    of ``UNKNOWN`` type fits any type)."""
    have = {f.name: f for f in existing.fields}
    want = {f.name: _delta_type(f) for f in needed}
    if name != "changelog":  # exactly its columns, in order
        if [f.name for f in existing.fields] == list(want) and all(
            t == ANY or _type(have[c].type) == t for c, t in want.items()
        ):
            return []
        return [f"has columns {_columns(existing.fields)}, needs {_described(want)}"]
    problems = [f"lacks {c} {t}" for c, t in want.items() if c not in have]
    problems += [
        f"has {c} {_type(have[c].type)}, needs {c} {t}"
        for c, t in want.items()
        if c in have and t != ANY and _type(have[c].type) != t
    ]
    problems += [
        f"has {c} not null, which new rows would leave empty"
        for c, f in have.items()
        if c not in want and not f.nullable
    ]
    return problems


ANY = "(any type)"


def _delta_type(field: pa.Field) -> str:
    if field.type == UNKNOWN:
        return ANY
    return _type(DeltaSchema.from_arrow(pa.schema([field])).fields[0].type)


def _described(columns: dict[str, str]) -> str:
    return ", ".join(f"{c} {t}" for c, t in columns.items())


class TableSchemas(Protocol):
    """What the tables need of a resolved pipeline (``jobs/resolution.py``'s
    ``Resolved``): its definition and every table's columns."""

    @property
    def pipeline(self) -> Pipeline: ...

    @property
    def tables(self) -> Mapping[str, pa.Schema]: ...


def ensure_tables(layout: AppLayout, resolved: TableSchemas, republishing: bool = False) -> None:
    """Create missing tables; refuse an existing table whose columns do not fit the
    pipeline's. ``republishing``: a backfill about to publish a new definition,
    which makes ``state`` and ``changelog`` fit (a retyped or removed-and-not-null
    changelog column it cannot: that history would not hold the new rows)."""
    pipeline = resolved.pipeline
    for name, schema in resolved.tables.items():
        path = layout.table(name)
        if DeltaTable.is_deltatable(str(path)):
            if name == LEDGER:
                upgrade_ledger(path)
            problems = column_problems(name, DeltaTable(str(path)).schema(), schema)
            if republishing and name == "state":
                problems = []
            if republishing and name == "changelog":
                problems = [p for p in problems if not p.startswith("lacks ")]
            if problems:
                repair = (
                    f"; python -m jobs backfill --pipeline {pipeline.application_id} "
                    "--from-earliest --reason ... republishes the state under the new definition"
                    if name in REPUBLISHED and not republishing
                    else "; a new definition that reuses a column name with another type, or "
                    "drops a key, needs a new application id"
                )
                raise ConfigError(
                    f"table {path} does not fit pipeline {pipeline.application_id} "
                    f"v{pipeline.version}: it {'; '.join(problems)}" + repair
                )
            continue
        if UNKNOWN in schema.types:
            continue  # only Spark knows a column's type: the first run creates it
        configuration = dict(TABLE_CONFIGURATION)
        if name == "state":
            configuration["delta.enableChangeDataFeed"] = "true"
        DeltaTable.create(str(path), schema, configuration=configuration)


def upgrade_ledger(path: Location) -> None:
    """A ledger written by an older platform lacks the columns added since (always
    nullable, at the end): add them, so its history stays where it is and every
    writer's rows fit. Called before any write to the ledger."""
    if not DeltaTable.is_deltatable(str(path)):
        return
    ledger = DeltaTable(str(path))
    have = [f.name for f in ledger.schema().fields]
    wanted = LEDGER_SCHEMA.names
    if have == wanted[: len(have)] and len(have) < len(wanted):
        added = DeltaSchema.from_arrow(pa.schema(list(LEDGER_SCHEMA)[len(have) :])).fields
        ledger.alter.add_columns(list(added))


def state_redefined(layout: AppLayout, resolved: TableSchemas, version: int | None = None) -> bool:
    """The ``state`` table's columns (at ``version``, or the latest) are not the
    pipeline's (a new definition)."""
    path = layout.table("state")
    if not DeltaTable.is_deltatable(str(path)):
        return False
    schema = DeltaTable(str(path), version=version).schema()
    return bool(column_problems("state", schema, resolved.tables["state"]))


def _type(kind: object) -> str:
    return str(getattr(kind, "type", kind))  # PrimitiveType("long") -> long


def _columns(fields: Iterable[Any]) -> str:
    """``name type, ...`` of a Delta schema's fields."""
    return ", ".join(f"{f.name} {_type(f.type)}" for f in fields)
