"""A pipeline resolved once: every column's Spark type and every table's schema.

The YAML says what a record's fields are; Spark's analyser decides the rest (a
derived column's type, an enrichment's columns, whether an expression reads the
Kafka headers: ``jobs/streaming/analyser.resolve``). ``Resolved`` carries those
answers and everything that follows from them (the Delta tables' schemas, the
seed's columns, each stored value's type) to every module that needs a type, so
none of them works it out again.

The run stores Spark's answers beside the cuts (``<app>/_checkpoints/
pipeline-v<version>.json``); tools without a JVM (planners, ``status``) read them
with ``load_stored``. Before the first run there are none: a derived column's type is
then unknown (None, an ``UNKNOWN`` Arrow column), and ``analysed`` is False.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from jobs import sql_settings, sql_text
from jobs.delta.layout import (
    DEAD_LETTER_SCHEMA,
    LEDGER,
    LEDGER_SCHEMA,
    RAW_SCHEMA,
    TIMESTAMP,
    AppLayout,
    arrow_type,
    table_names,
)
from jobs.errors import ConfigError
from jobs.pipeline.checks import aggregate_type, average_type
from jobs.pipeline.model import KAFKA_COLUMNS, Pipeline, stored_column
from jobs.state_seed import RECORDS, contribution, sketch_input
from jobs.warehouse import Location


@dataclass(frozen=True)
class DimensionTable:
    """An enrichment's table as Spark's analyser found it before the run."""

    path: str
    row_type: str  # its columns, a Spark struct type (as StructType.json())
    key_type: str  # the key column's type


@dataclass(frozen=True)
class Resolved:
    """A pipeline and what its columns and tables are. Build it with ``of``."""

    pipeline: Pipeline
    # Spark's answers (all the stored copy keeps; the rest follows from them):
    derived_types: Mapping[str, str] = field(default_factory=dict)
    dimensions: Mapping[str, DimensionTable] = field(default_factory=dict)
    headers_read: bool | None = None  # None: not analysed, the text decides
    # The result-changing SQL settings it was computed with (``jobs/sql_settings.py``).
    sql_settings: Mapping[str, str] = field(default_factory=dict)
    # What follows, filled by ``of``:
    columns: Mapping[str, str | None] = field(default_factory=dict)
    values: Mapping[str, str | None] = field(default_factory=dict)
    tables: Mapping[str, pa.Schema] = field(default_factory=dict)
    aggregate_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))

    @property
    def application_id(self) -> str:
        return self.pipeline.application_id

    @property
    def analysed(self) -> bool:
        """Spark decided every type (a run or a stored copy); else derived columns'
        types are unknown."""
        return self.headers_read is not None

    def column_type(self, name: str) -> str | None:
        """The Spark type of a field, derived or ``kafka.*`` column (None: unknown)."""
        return self.columns.get(name)

    def value_type(self, name: str) -> str | None:
        """The Spark type of a stored value column (None: unknown)."""
        return self.values[name]

    @property
    def state_schema(self) -> pa.Schema:
        return self.tables["state"]

    @property
    def changelog_schema(self) -> pa.Schema:
        return self.tables["changelog"]

    @property
    def uses_headers(self) -> bool:
        """Whether anything reads ``kafka.headers`` (the source then includes them):
        from Spark's analysed plan, or the text before a run."""
        if self.headers_read is None:
            return self.pipeline.uses_headers
        fields = [str(a.field) for a in self.pipeline.aggregations if a.field]
        return self.headers_read or any(sql_text.mentions(f, "headers") for f in fields)

    @property
    def contributions(self) -> dict[str, str]:
        """The Spark type of each contribution column (what a record or a seed row
        adds to each aggregation: ``jobs/state_seed.py``), by name."""
        types: dict[str, str] = {}
        for agg in self.pipeline.aggregations:
            kind = self.values[stored_column(agg)]
            if kind is None:
                raise ConfigError(
                    f"{self.application_id}: the type of {agg.field!r} is known once Spark "
                    "has analysed the pipeline"
                )
            types[contribution(agg)] = kind
            if agg.function == "approx_count_distinct":
                types[sketch_input(agg)] = "string"
        types[RECORDS] = "bigint"
        return types

    @property
    def seed_ddl(self) -> str:
        """The Spark schema of the seed stream: keys, event time, contributions."""
        columns = [f"`{k}` {self.columns[k]}" for k in self.pipeline.keys]
        columns.append("`_event_time` timestamp")
        columns += [f"`{name}` {kind}" for name, kind in self.contributions.items()]
        return ", ".join(columns)

    def stored(self) -> dict[str, Any]:
        """Spark's answers, JSON-safe, with the definition they hold for."""
        return {
            "application_id": self.application_id,
            "version": self.pipeline.version,
            "definition": self.pipeline.definition,
            "derived_types": dict(self.derived_types),
            "dimensions": {n: dataclasses.asdict(t) for n, t in self.dimensions.items()},
            "headers_read": self.headers_read,
            "sql_settings": dict(self.sql_settings),
        }


def of(
    pipeline: Pipeline,
    derived_types: Mapping[str, str] | None = None,
    dimensions: Mapping[str, DimensionTable] | None = None,
    headers_read: bool | None = None,
    settings: Mapping[str, str] | None = None,
) -> Resolved:
    """``pipeline`` with Spark's answers (none: not analysed) and all that follows."""
    derived = dict(derived_types or {})
    columns: dict[str, str | None] = {**pipeline.schema, **KAFKA_COLUMNS}
    columns |= {d.name: derived.get(d.name) for d in pipeline.derived}
    values = {name: _value_type(pipeline, columns, name) for name in pipeline.value_columns}
    # A key of unknown type (no Spark here) is nullable: ``ensure_tables`` takes the
    # existing table's type for it.
    fields = [
        pa.field(k, kind, nullable=kind == pa.null())
        for k, kind in ((k, arrow_type(columns.get(k))) for k in pipeline.keys)
    ]
    if pipeline.window:
        fields += [
            pa.field("window_start", TIMESTAMP, False),
            pa.field("window_end", TIMESTAMP, False),
        ]
    aggregate = pa.schema(fields + [pa.field(v, arrow_type(values[v])) for v in values])
    committed = [pa.field("epoch", pa.int64(), False), pa.field("batch_id", pa.int64(), False)]
    schemas = {
        "dead_letter": DEAD_LETTER_SCHEMA,
        "changelog": pa.schema([*aggregate, *committed, pa.field("commit_time", TIMESTAMP, False)]),
        "state": pa.schema([*aggregate, *committed, pa.field("updated_at", TIMESTAMP, False)]),
        LEDGER: LEDGER_SCHEMA,
        "raw": RAW_SCHEMA,
    }
    tables = {name: schemas[name] for name in table_names(pipeline)}
    return Resolved(
        pipeline,
        derived_types=derived,
        dimensions=dict(dimensions or {}),
        headers_read=headers_read,
        sql_settings=dict(settings or {}),
        columns=columns,
        values=values,
        tables=tables,
        aggregate_schema=aggregate,
    )


def _value_type(pipeline: Pipeline, columns: Mapping[str, str | None], name: str) -> str | None:
    if name == "_records":
        return "bigint"
    for agg in pipeline.aggregations:
        if agg.function == "approx_count_distinct" and name == stored_column(agg):
            return "binary"  # the sketch
        if name in (agg.name, stored_column(agg)):
            if agg.function in ("count", "approx_count_distinct"):
                return "bigint"
            source = None if agg.field is None else columns.get(agg.field)
            if source is None:
                return None
            kind = aggregate_type(agg, source)
            return average_type(kind) if agg.function == "avg" and name == agg.name else kind
    raise KeyError(name)


def stored_file(layout: AppLayout, version: int) -> Location:
    return layout.checkpoints / f"pipeline-v{version}.json"


def store(layout: AppLayout, resolved: Resolved) -> None:
    """Keep Spark's answers for tools without a JVM (atomically; only on a change).
    A definition whose batches were computed with other SQL settings is refused."""
    path = stored_file(layout, resolved.pipeline.version)
    text = json.dumps(resolved.stored(), indent=1, sort_keys=True)
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        before = None
    if isinstance(before, dict) and before.get("definition") == resolved.pipeline.definition:
        origin = f"{resolved.application_id} version {resolved.pipeline.version}"
        sql_settings.check_recorded(origin, before.get("sql_settings") or {})
    if path.stat() is not None and path.read_text() == text:
        return
    path.write_text(text)  # whole


def load_stored(layout: AppLayout, pipeline: Pipeline) -> Resolved:
    """``pipeline`` with the answers a run stored for this very definition; without
    them (no run yet, or the file changed since), not analysed."""
    path = stored_file(layout, pipeline.version)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return of(pipeline)
    if not isinstance(data, dict) or data.get("definition") != pipeline.definition:
        return of(pipeline)
    return of(
        pipeline,
        derived_types=data["derived_types"],
        dimensions={n: DimensionTable(**t) for n, t in data["dimensions"].items()},
        headers_read=data["headers_read"],
        settings=data.get("sql_settings"),
    )
