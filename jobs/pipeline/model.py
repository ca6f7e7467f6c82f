"""A pipeline definition as the platform holds it: frozen dataclasses and the
names, limits and literals they are made of (no YAML, no Spark).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from jobs import sql_text
from jobs.warehouse import Location

APPLICATION_ID = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
DURATION = re.compile(r"^\s*(\d+)\s*(second|minute|hour|day)s?\s*$")
AggFunction = Literal["count", "sum", "min", "max", "avg", "approx_count_distinct"]
TimeUnit = Literal["seconds", "milliseconds", "microseconds"]
Guarantee = Literal["exactly_once", "at_least_once"]
TriggerMode = Literal["available-now", "continuous"]
AGG_FUNCTIONS: set[str] = set(get_args(AggFunction))
TIME_UNITS: dict[str, int] = {"seconds": 1, "milliseconds": 1000, "microseconds": 1_000_000}
GUARANTEES: set[str] = set(get_args(Guarantee))
TRIGGER_MODES: set[str] = set(get_args(TriggerMode))
# The Kafka record's own parts, for expressions, aggregations and event time.
KAFKA_COLUMNS = {
    "kafka.key": "string",
    "kafka.timestamp": "timestamp",
    "kafka.topic": "string",
    "kafka.partition": "int",
    "kafka.offset": "bigint",
    "kafka.headers": "array<struct<`key`:string,`value`:binary>>",
}
TIME_TYPES = {"timestamp", "timestamp_ntz", "date"}
# Columns the platform adds to state/changelog/dead-letter rows; user names may not
# clash with them in any case (Spark resolves column names case-insensitively).
# Every name starting with "_" is the platform's too, and "kafka" holds the record's
# Kafka metadata in expressions.
RESERVED = {
    "window_start",
    "window_end",
    "epoch",
    "batch_id",
    "commit_time",
    "updated_at",
    "kafka",
}
DEFAULT_MAX_AHEAD = "1 day"
DEFAULT_REWIND_HORIZON = "7 days"
MAX_REWIND_HORIZON_S = 365 * 86400
UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
# A decimal summed keeps at most this scale: the sum is a decimal(38, scale).
MAX_SUM_SCALE = 18


@dataclass(frozen=True)
class Aggregation:
    name: str
    function: AggFunction
    field: str | None  # None only for count


@dataclass(frozen=True)
class Derived:
    """A column computed per record by a Spark SQL expression over the record's
    fields, its Kafka metadata and the derived columns before it."""

    name: str
    expr: str


@dataclass(frozen=True)
class EventTime:
    column: str  # a field, a derived column, or kafka.timestamp
    unit: TimeUnit | None  # for a number; None for a timestamp or a date


@dataclass(frozen=True)
class Window:
    size_seconds: int
    slide_seconds: int  # == size for tumbling windows

    @property
    def windows_per_record(self) -> int:
        return self.size_seconds // self.slide_seconds


@dataclass(frozen=True)
class Output:
    """Where the state's changes are published, exactly once (``jobs/output/``)."""

    topic: str
    # Only used when the platform creates the topic (it does when it is missing).
    partitions: int = 1


MissingRow = Literal["dead_letter", "keep"]
MISSING_ROWS = ("dead_letter", "keep")
WAREHOUSE = "${warehouse}"
DIMENSIONS_DIR = "dims"  # <warehouse>/dims/<name>: the dimension tables (no application's)


@dataclass(frozen=True)
class Enrichment:
    """A Delta table joined to each record before its filter and expressions: the
    row whose ``table_key`` equals the record's ``record_key`` becomes a struct
    named ``name`` (``jobs/streaming/enrichment.py``)."""

    name: str
    table: str  # a Delta table's path; "${warehouse}/..." is the warehouse's
    record_key: str  # a field of the record (dotted into structs) or kafka.*
    table_key: str  # a column of the table
    missing: MissingRow = "dead_letter"  # a record whose key has no row; keep: NULL

    def path(self, warehouse: Location) -> str:
        if self.table.startswith(WAREHOUSE + "/"):
            return str(warehouse / self.table[len(WAREHOUSE) + 1 :])
        return self.table


@dataclass(frozen=True)
class Pipeline:
    application_id: str
    version: int
    topics: tuple[str, ...]
    starting_offsets: str
    max_offsets_per_trigger: int | None
    schema: dict[str, str]  # field -> Spark DDL type, normalized (``sql_text``)
    keys: tuple[str, ...]
    event_time: EventTime
    window: Window | None
    watermark_seconds: int | None
    derived: tuple[Derived, ...]
    aggregations: tuple[Aggregation, ...]
    processing_guarantee: Guarantee
    trigger_mode: TriggerMode
    trigger_interval_seconds: int
    shuffle_partitions: int
    schedule_minutes: int
    archive: bool = False  # keep every raw record in <app>/raw (backfill beyond retention)
    # Event-time sanity: records more than this ahead of their batch's time, or
    # before ``not_before_us``, are dead letters (a wrong unit, a broken clock).
    max_ahead_seconds: int = 86400
    not_before_us: int | None = None
    # ``maintain``: every batch boundary this recent (and the last one before) stays
    # a rewind target; removed files stay this many whole hours for readers and
    # writers still on an older snapshot (0 only when nothing else runs).
    rewind_horizon_seconds: int = 7 * 86400
    reader_grace_hours: int = 1
    source_path: Path | None = None
    description: str = ""
    output: Output | None = None
    filter: str | None = None  # a Spark SQL boolean: records for which it is false are filtered
    enrich: tuple[Enrichment, ...] = ()

    def column_type(self, name: str) -> str | None:
        """The Spark type of a field or ``kafka.*`` column, as the file says; None for a
        derived column (Spark's analyser decides it: ``jobs/resolution.py``)."""
        if name in self.schema:
            return self.schema[name]
        return KAFKA_COLUMNS.get(name)

    @property
    def expressions(self) -> list[tuple[str, str]]:
        """(where, SQL) of every expression, in evaluation order."""
        found = [(f"derived[{i}] ({d.name})", d.expr) for i, d in enumerate(self.derived)]
        return found + ([("filter", self.filter)] if self.filter is not None else [])

    @property
    def uses_headers(self) -> bool:
        """Whether the text reads ``kafka.headers``: the JVM-free answer (Spark's
        analysed plan gives the exact one, ``Resolved.uses_headers``)."""
        fields = [str(a.field) for a in self.aggregations if a.field]
        texts = [expr for _, expr in self.expressions] + fields
        return any(sql_text.mentions(text, "headers") for text in texts)

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The columns that identify one state row."""
        return self.keys + (("window_start", "window_end") if self.window else ())

    @property
    def state_shape(self) -> dict[str, Any]:
        """What Spark's state for this pipeline is made of: a checkpoint of one shape
        cannot continue under another (Spark fails deep in a batch, or a window
        change silently counts into the wrong windows). JSON-safe; cuts record it.

        ``window_key`` (hopping windows only): Spark keys such a window by its last
        pane (``streaming/query.aggregate``). An older checkpoint's keys, of the same
        type, hold window starts: continued, it would count into other rows."""
        shape: dict[str, Any] = {
            "keys": list(self.keys),
            "window": None
            if self.window is None
            else [self.window.size_seconds, self.window.slide_seconds],
            "aggregations": [[a.name, a.function, a.field] for a in self.aggregations],
            "shuffle_partitions": self.shuffle_partitions,
        }
        if self.window is not None and self.window.windows_per_record > 1:
            shape["window_key"] = "last_pane"
        return shape

    @property
    def definition(self) -> dict[str, str]:
        """A short hash of each part of the definition that decides results (what a
        record becomes, and how records aggregate); the cut and every batch record
        them, and a change under the same ``version`` is refused."""
        parts: dict[str, Any] = {
            "schema": self.schema,
            "filter": None if self.filter is None else _normalized(self.filter),
            "derived": [[d.name, _normalized(d.expr)] for d in self.derived],
            "keys": list(self.keys),
            "event_time": [
                self.event_time.column,
                self.event_time.unit,
                self.max_ahead_seconds,
                self.not_before_us,
            ],
            "window": self.state_shape["window"],
            "watermark": self.watermark_seconds,
            "aggregations": self.state_shape["aggregations"],
        }
        if self.enrich:  # (absent otherwise: earlier recorded definitions stay equal)
            parts["enrich"] = [
                [e.name, e.table, e.record_key, e.table_key, e.missing] for e in self.enrich
            ]
        return {
            name: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]
            for name, value in parts.items()
        }

    @property
    def value_columns(self) -> tuple[str, ...]:
        """Aggregate output columns in state/changelog, internal ones last."""
        hidden = tuple(stored_column(a) for a in self.aggregations if stored_column(a) != a.name)
        return tuple(a.name for a in self.aggregations) + hidden + ("_records",)


def stored_column(aggregation: Aggregation) -> str:
    """The state column an aggregation is kept in, algebraic so that a seed restores
    it: an average's sum, a distinct count's HLL sketch, else its own column."""
    if aggregation.function == "avg":
        return f"_sum_{aggregation.name}"
    if aggregation.function == "approx_count_distinct":
        return f"_sketch_{aggregation.name}"
    return aggregation.name


# Spark's HLL sketches (Apache DataSketches) with 2^12 buckets: the estimate's
# relative standard error is 1.04 / sqrt(4096) = 1.6% (3.3% at two sigmas); below a
# few hundred distinct values it is exact or close to it.
HLL_LG_K = 12


def _normalized(expr: str) -> str:
    """An expression without its spacing and comments (a cosmetic edit is no change)."""
    return " ".join(t.text for t in sql_text.tokens(expr))
