"""Pipeline definitions: ``include/pipelines/<name>.yaml``, loaded and validated.

A definition says what to read (topics, JSON value schema), how to aggregate
(keys, event time, optional window and watermark, aggregations) and how to run
(processing guarantee, trigger, shuffle partitions). Every error names the file
and the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml

from jobs import sql_text
from jobs.errors import ConfigError
from jobs.pipeline.checks import (
    TypeProblem,
    aggregate_type,
    event_time_unit,
)
from jobs.pipeline.model import (
    AGG_FUNCTIONS,
    APPLICATION_ID,
    DEFAULT_MAX_AHEAD,
    DEFAULT_REWIND_HORIZON,
    DIMENSIONS_DIR,
    DURATION,
    FIELD_NAME,
    GUARANTEES,
    KAFKA_COLUMNS,
    MAX_REWIND_HORIZON_S,
    MISSING_ROWS,
    RESERVED,
    TIME_UNITS,
    TOPIC_NAME,
    TRIGGER_MODES,
    UNIT_SECONDS,
    WAREHOUSE,
    AggFunction,
    Aggregation,
    Derived,
    Enrichment,
    EventTime,
    Guarantee,
    MissingRow,
    Output,
    Pipeline,
    TimeUnit,
    TriggerMode,
    Window,
)


class _Reader:
    """Pulls typed values out of a YAML mapping, with errors that name the field."""

    def __init__(self, origin: str, data: Any, where: str = "") -> None:
        self.origin = origin
        self.where = where
        if not isinstance(data, dict):
            raise self.error(f"must be a mapping, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def error(self, message: str, key: str | None = None) -> ConfigError:
        path = ".".join(p for p in (self.where, key) if p)
        return ConfigError(f"{self.origin}: {path + ': ' if path else ''}{message}")

    def get(
        self,
        key: str,
        kind: type | tuple[type, ...],
        default: Any = ...,
    ) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.error("is required", key)
            return default
        value = self.data[key]
        # bool is an int in Python: refuse it where a number is wanted.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.error(f"must be {_kind_name(kind)}, got {value!r}", key)
        if not isinstance(value, kind):
            raise self.error(f"must be {_kind_name(kind)}, got {value!r}", key)
        return value

    def sub(self, key: str, default: Any = ...) -> _Reader | None:
        value = self.get(key, dict, default)
        if value is None:
            return None
        return _Reader(self.origin, value, ".".join(p for p in (self.where, key) if p))

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.error(f"unknown field(s) {', '.join(unknown)}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping"}
    names[list] = "a list"
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def parse_duration(text: str, origin: str, key: str) -> int:
    """'10 minutes' -> 600. Spark-style interval strings, whole units only."""
    match = DURATION.fullmatch(text)
    if not match or int(match.group(1)) <= 0:
        raise ConfigError(
            f"{origin}: {key}: must be a positive duration like '30 seconds' or '1 minute', "
            f"got {text!r}"
        )
    return int(match.group(1)) * UNIT_SECONDS[match.group(2)]


def parse_pipeline(data: Any, origin: str) -> Pipeline:
    """A pipeline definition's data (parsed YAML), checked section by section in
    the file's order: the first problem is the one error."""
    top = _Reader(origin, data)
    app_id, version, description = _parse_identity(top)
    topics, starting, max_offsets, archive = _parse_source(top)
    schema = _parse_schema(top)
    enrich = _parse_enrich(top, schema)
    record_filter = _expression(top, "filter", top.get("filter", str, None))
    derived = _parse_derived(top, schema, [e.name for e in enrich])
    names = {n.lower(): n for n in [*schema, *(d.name for d in derived)]}

    def column(name: str) -> str | None:
        """A field or derived column's type (None: derived, Spark's to say)."""
        return schema.get(name) or KAFKA_COLUMNS.get(name)

    keys = _parse_keys(top, set(names.values()), column)
    event_time, max_ahead, not_before_us = _parse_event_time(top, set(names.values()), column)
    window, watermark = _parse_window(top)
    aggregations = _parse_aggregations(top, keys, set(names.values()), column)
    _check_output_names(top, list(schema), [d.name for d in derived], aggregations)
    guarantee = top.get("processing_guarantee", str, "exactly_once")
    if guarantee not in GUARANTEES:
        raise top.error(f"must be one of {', '.join(sorted(GUARANTEES))}", "processing_guarantee")
    mode, interval = _parse_trigger(top)
    shuffle = top.get("shuffle_partitions", int, 2)
    if not 1 <= shuffle <= 10000:
        raise top.error("must be between 1 and 10000", "shuffle_partitions")
    schedule_minutes = top.get("schedule_minutes", int, 5)  # the Airflow DAG's interval
    if not 1 <= schedule_minutes <= 1440:
        raise top.error("must be between 1 and 1440", "schedule_minutes")
    horizon, grace = _parse_maintenance(top)
    output = _parse_output(top, topics)
    top.finish()
    pipeline = Pipeline(
        application_id=app_id,
        version=version,
        topics=tuple(topics),
        starting_offsets=starting,
        max_offsets_per_trigger=max_offsets,
        schema=schema,
        keys=tuple(keys),
        event_time=event_time,
        window=window,
        watermark_seconds=watermark,
        derived=tuple(derived),
        aggregations=tuple(aggregations),
        processing_guarantee=cast(Guarantee, guarantee),
        trigger_mode=mode,
        trigger_interval_seconds=interval,
        shuffle_partitions=shuffle,
        schedule_minutes=schedule_minutes,
        archive=archive,
        max_ahead_seconds=max_ahead,
        not_before_us=not_before_us,
        rewind_horizon_seconds=horizon,
        reader_grace_hours=grace,
        description=description,
        output=output,
        filter=record_filter,
        enrich=tuple(enrich),
    )
    if pipeline.archive and pipeline.uses_headers:
        raise top.error(
            "the raw archive does not keep Kafka headers: a backfill from it could not "
            "recompute what reads kafka.headers",
            "source.archive",
        )
    return pipeline


ColumnType = Callable[[str], str | None]


def _parse_identity(top: _Reader) -> tuple[str, int, str]:
    app_id = top.get("application_id", str)
    if not APPLICATION_ID.fullmatch(app_id):
        raise top.error(
            "must be 1-63 characters of lowercase letters, digits and '_', starting with a "
            f"letter (it names directories), got {app_id!r}",
            "application_id",
        )
    if app_id == DIMENSIONS_DIR:
        raise top.error(
            f"{app_id!r} is the warehouse's folder of dimension tables (jobs/dimension_load.py)",
            "application_id",
        )
    version = top.get("version", int, 1)
    if version < 1:
        raise top.error(f"must be a positive integer, got {version}", "version")
    return app_id, version, top.get("description", str, "")


def _parse_source(top: _Reader) -> tuple[list[str], str, int | None, bool]:
    """The topics, the starting offsets, the per-trigger limit and the archive flag."""
    source = top.sub("source")
    assert source is not None
    topics = source.get("topics", list)
    if not topics or not all(isinstance(t, str) and TOPIC_NAME.fullmatch(t) for t in topics):
        raise source.error(
            f"must be a non-empty list of Kafka topic names, got {topics!r}", "topics"
        )
    if len(set(topics)) != len(topics):
        raise source.error("lists a topic twice", "topics")
    starting = source.get("starting_offsets", str, "earliest")
    if starting not in ("earliest", "latest"):
        raise source.error(f"must be 'earliest' or 'latest', got {starting!r}", "starting_offsets")
    max_offsets = source.get("max_offsets_per_trigger", int, None)
    if max_offsets is not None and max_offsets < 1:
        raise source.error("must be a positive integer", "max_offsets_per_trigger")
    archive = source.get("archive", bool, False)
    source.finish()
    return topics, starting, max_offsets, archive


def _parse_keys(top: _Reader, names: set[str], column: ColumnType) -> list[str]:
    keys: list[str] = top.get("keys", list)
    if not keys:
        raise top.error("must list at least one group key", "keys")
    for key in keys:
        if not isinstance(key, str):
            raise top.error(f"each key must be a field name, got {key!r}", "keys")
        if key in KAFKA_COLUMNS:
            raise top.error(
                f"key {key!r}: name a column, e.g. derived: [{{name: "
                f'{key.split(".")[1]}, expr: "{key}"}}] and keys: [{key.split(".")[1]}]',
                "keys",
            )
        if key not in names:
            raise top.error(f"key {key!r} is not a field of the schema or a derived column", "keys")
        kind = column(key)
        if kind is not None and not sql_text.is_atomic(kind):
            raise top.error(
                f"key {key!r} is a {kind}: a key must be a single value (derive one from it)",
                "keys",
            )
    if len(set(keys)) != len(keys):
        raise top.error("lists a key twice", "keys")
    return keys


def _parse_event_time(
    top: _Reader, names: set[str], column: ColumnType
) -> tuple[EventTime, int, int | None]:
    """The event-time column and unit, how far ahead of now an event may be, and the
    instant before which none counts."""
    origin = top.origin
    event = top.sub("event_time")
    assert event is not None
    event_column = event.get("field", str)
    unit = event.get("unit", str, None)
    max_ahead = parse_duration(
        event.get("max_ahead", str, DEFAULT_MAX_AHEAD), origin, "event_time.max_ahead"
    )
    not_before = event.get("not_before", str, None)
    not_before_us = None if not_before is None else _parse_instant(not_before, origin)
    event.finish()
    if event_column not in names and event_column != "kafka.timestamp":
        raise top.error(
            f"{event_column!r} is not a field of the schema, a derived column or kafka.timestamp",
            "event_time.field",
        )
    if unit is not None and unit not in TIME_UNITS:
        raise top.error(f"must be one of {', '.join(TIME_UNITS)}, got {unit!r}", "event_time.unit")
    kind = column(event_column)
    if kind is not None:
        try:
            unit = event_time_unit(kind, cast(TimeUnit | None, unit), repr(event_column))
        except TypeProblem as exc:
            raise top.error(str(exc), f"event_time.{exc.key}") from None
    return EventTime(event_column, cast(TimeUnit | None, unit)), max_ahead, not_before_us


def _parse_window(top: _Reader) -> tuple[Window | None, int | None]:
    """The window and the watermark (seconds), which come together."""
    origin = top.origin
    window = None
    window_reader = top.sub("window", None)
    if window_reader is not None:
        kind = window_reader.get("type", str)
        size = parse_duration(window_reader.get("size", str), origin, "window.size")
        slide = size
        if kind == "hopping":
            slide = parse_duration(window_reader.get("slide", str), origin, "window.slide")
            if slide > size or size % slide:
                raise window_reader.error("must divide the window size", "slide")
        elif kind != "tumbling":
            raise window_reader.error(f"must be 'tumbling' or 'hopping', got {kind!r}", "type")
        window_reader.finish()
        window = Window(size, slide)
    watermark_text = top.get("watermark", str, None)
    watermark = None
    if watermark_text is not None:
        watermark = parse_duration(watermark_text, origin, "watermark")
    if window is not None and watermark is None:
        raise top.error("is required with a window (it bounds the state it keeps)", "watermark")
    if window is None and watermark is not None:
        raise top.error("only applies to windowed pipelines; remove it", "watermark")
    return window, watermark


def _parse_aggregations(
    top: _Reader, keys: list[str], names: set[str], column: ColumnType
) -> list[Aggregation]:
    aggregations: list[Aggregation] = []
    for i, item in enumerate(top.get("aggregations", list)):
        a = _Reader(top.origin, item, f"aggregations[{i}]")
        name = a.get("name", str)
        function = a.get("function", str)
        src = a.get("field", str, None)
        a.finish()
        if not _is_new_name(name) or name in keys:
            raise a.error(f"{name!r} must be an identifier that is not a key or reserved", "name")
        if function not in AGG_FUNCTIONS:
            raise a.error(f"must be one of {', '.join(sorted(AGG_FUNCTIONS))}", "function")
        if function == "count":
            if src is not None:
                raise a.error("count takes no field", "field")
        elif src is None or (src not in names and src not in KAFKA_COLUMNS):
            raise a.error(
                f"{function} needs a field, a derived column or a kafka.* column, got {src!r}",
                "field",
            )
        aggregation = Aggregation(name, cast(AggFunction, function), src)
        kind = None if src is None else column(src)
        if function == "count" or kind is not None:
            try:
                aggregate_type(aggregation, kind or "")
            except TypeProblem as exc:
                raise a.error(str(exc), exc.key) from None
        aggregations.append(aggregation)
    if not aggregations:
        raise top.error("must list at least one aggregation", "aggregations")
    return aggregations


def _parse_trigger(top: _Reader) -> tuple[TriggerMode, int]:
    trigger = top.sub("trigger", {})
    assert trigger is not None
    mode = trigger.get("mode", str, "available-now")
    if mode not in TRIGGER_MODES:
        raise trigger.error(f"must be one of {', '.join(sorted(TRIGGER_MODES))}", "mode")
    interval = parse_duration(
        trigger.get("interval", str, "10 seconds"), top.origin, "trigger.interval"
    )
    trigger.finish()
    return cast(TriggerMode, mode), interval


def _parse_maintenance(top: _Reader) -> tuple[int, int]:
    """The rewind horizon (seconds) and the readers' grace (hours)."""
    maintenance = top.sub("maintenance", {})
    assert maintenance is not None
    horizon = parse_duration(
        maintenance.get("rewind_horizon", str, DEFAULT_REWIND_HORIZON),
        top.origin,
        "maintenance.rewind_horizon",
    )
    if horizon > MAX_REWIND_HORIZON_S:
        raise maintenance.error("must be at most 365 days", "rewind_horizon")
    grace = maintenance.get("reader_grace_hours", int, 1)
    if not 0 <= grace <= 24 * 30:
        raise maintenance.error("must be between 0 and 720", "reader_grace_hours")
    maintenance.finish()
    return horizon, grace


def _is_new_name(name: str) -> bool:
    """A name the pipeline may give a field, derived column or aggregate."""
    return bool(FIELD_NAME.fullmatch(name)) and name.lower() not in RESERVED


def _expression(top: _Reader, where: str, text: str | None) -> str | None:
    """A Spark SQL expression, checked as far as text allows (no JVM here)."""
    if text is None:
        return None
    try:
        sql_text.check_expression(text)
    except sql_text.SqlTextError as exc:
        raise top.error(f"{exc} (in {text!r})", where) from None
    return text


def _parse_schema(top: _Reader) -> dict[str, str]:
    return parse_columns(top, "schema", RESERVED)


def parse_columns(top: _Reader, key: str, reserved: set[str]) -> dict[str, str]:
    """``key``: a mapping of names to Spark SQL types (DDL), normalized; none of the
    names ``reserved``."""
    columns: dict[str, str] = {}
    for name, kind in top.get(key, dict).items():
        if not isinstance(name, str) or not FIELD_NAME.fullmatch(name):
            raise top.error(
                f"field name {name!r} must start with a letter and hold letters, digits and "
                "'_' (names starting with '_' are the platform's)",
                key,
            )
        if name.lower() in reserved:
            raise top.error(f"field name {name!r} is reserved by the platform", key)
        if not isinstance(kind, str):
            raise top.error(f"type of {name!r} must be a Spark SQL type, got {kind!r}", key)
        try:
            columns[name] = sql_text.parse_type(kind)
        except sql_text.SqlTextError as exc:
            raise top.error(f"type of {name!r}: {exc}", key) from None
    if not columns:
        raise top.error("must name at least one field", key)
    return columns


PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _parse_enrich(top: _Reader, schema: dict[str, str]) -> list[Enrichment]:
    """``enrich:``: checked here as far as names and the form of ``on`` go; the
    tables' columns and types are Spark's to check (``analyser.resolve``)."""
    found: list[Enrichment] = []
    taken = {n.lower() for n in schema} | {"kafka"}
    for i, item in enumerate(top.get("enrich", list, [])):
        if isinstance(item, dict) and True in item and "on" not in item:
            # YAML 1.1 reads a bare ``on`` key as the boolean true.
            item = {("on" if k is True else k): v for k, v in item.items()}
        e = _Reader(top.origin, item, f"enrich[{i}]")
        name = e.get("name", str)
        table = e.get("table", str)
        on = e.get("on", str)
        missing = e.get("missing", str, "dead_letter")
        e.finish()
        if not _is_new_name(name) or name.lower() in taken:
            raise e.error(
                f"{name!r} must be a new identifier (not a field, kafka, an earlier "
                "enrichment, reserved, or starting with '_')",
                "name",
            )
        taken.add(name.lower())
        rest = table[len(WAREHOUSE) :] if table.startswith(WAREHOUSE + "/") else table
        if not rest.startswith("/") or "${" in rest or ".." in rest.split("/"):
            raise e.error(
                f"must be an absolute path or start with {WAREHOUSE}/ (no '..', no other "
                f"${{...}}), got {table!r}",
                "table",
            )
        if missing not in MISSING_ROWS:
            raise e.error(f"must be one of {', '.join(MISSING_ROWS)}, got {missing!r}", "missing")
        sides = [side.strip() for side in on.split("=")]
        ours = [s for s in sides if s.lower().startswith(name.lower() + ".")]
        theirs = [s for s in sides if s not in ours]
        if (
            len(sides) != 2
            or len(ours) != 1
            or len(theirs) != 1
            or not all(PATH.fullmatch(s) for s in sides)
        ):
            raise e.error(f"must be '<record field> = {name}.<column>', got {on!r}", "on")
        table_key = ours[0].split(".", 1)[1]
        record_key = theirs[0]
        root = record_key.split(".")[0]
        if "." in table_key:
            raise e.error(f"{ours[0]!r}: the key must be a column of the table", "on")
        if root not in schema and root != "kafka":
            raise e.error(
                f"{record_key!r} is not a field of the record (the schema's, or kafka.*): "
                "enrichment runs before derived columns",
                "on",
            )
        found.append(Enrichment(name, table, record_key, table_key, cast(MissingRow, missing)))
    return found


def _parse_derived(
    top: _Reader, schema: dict[str, str], enrichments: list[str] | None = None
) -> list[Derived]:
    derived: list[Derived] = []
    taken = {n.lower() for n in [*schema, *(enrichments or [])]}
    for i, item in enumerate(top.get("derived", list, [])):
        d = _Reader(top.origin, item, f"derived[{i}]")
        name = d.get("name", str)
        expr = d.get("expr", str)
        d.finish()
        if not _is_new_name(name) or name.lower() in taken:
            raise d.error(
                f"{name!r} must be a new identifier (not a field, an earlier derived column, "
                "reserved, or starting with '_')",
                "name",
            )
        taken.add(name.lower())
        checked = _expression(top, f"derived[{i}].expr", expr)
        assert checked is not None
        derived.append(Derived(name, checked))
    return derived


def _parse_output(top: _Reader, source_topics: list[str]) -> Output | None:
    out = top.sub("output", None)
    if out is None:
        return None
    topic = out.get("topic", str)
    if not TOPIC_NAME.fullmatch(topic):
        raise out.error(f"must be a Kafka topic name, got {topic!r}", "topic")
    if topic in source_topics:
        raise out.error(
            f"{topic!r} is a source topic: the stream would read its own output", "topic"
        )
    partitions = out.get("partitions", int, 1)
    if not 1 <= partitions <= 10000:
        raise out.error("must be between 1 and 10000", "partitions")
    out.finish()
    return Output(topic, partitions)


def _parse_instant(text: str, origin: str) -> int:
    """'2000-01-01' or an ISO 8601 time (UTC unless it says otherwise) -> epoch micros."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{origin}: event_time.not_before: must be an ISO 8601 date or time like "
            f"'2020-01-01' or '2020-01-01T00:00:00Z', got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment.year < 1000:
        raise ConfigError(f"{origin}: event_time.not_before: must be after the year 1000")
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _check_output_names(
    top: _Reader, fields: list[str], derived: list[str], aggregations: list[Aggregation]
) -> None:
    """Every column of the state and changelog tables must be unique, ignoring case
    (Spark resolves names case-insensitively); the platform's own start with "_"."""
    names = [a.name for a in aggregations]
    seen: dict[str, str] = {}
    for name in [*fields, *derived, *names]:
        if name.lower() in seen and seen[name.lower()] != name:
            raise top.error(
                f"names {seen[name.lower()]!r} and {name!r} differ only in case", "aggregations"
            )
        seen.setdefault(name.lower(), name)
    if len({n.lower() for n in names}) != len(names):
        raise top.error("output names must be unique", "aggregations")


Loaded = TypeVar("Loaded")


def definition_file(name_or_path: str, directory: Path, kind: str) -> tuple[Path, Any]:
    """A definition (``kind``: pipeline, dimension) by name in ``directory`` or by path
    to its YAML file: the path and the YAML's data."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        if not APPLICATION_ID.fullmatch(name_or_path):
            what = "application id" if kind == "pipeline" else "name"
            raise ConfigError(f"{kind} name {name_or_path!r} is not a valid {what}")
        path = directory / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml"))) or "none"
        raise ConfigError(f"no {kind} file {path} (defined {kind}s: {known})")
    return path, read_yaml(path, path.read_text())


def read_yaml(path: Path, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def load_each(
    directory: Path, load: Callable[[str, Path], Loaded]
) -> tuple[list[Loaded], dict[str, ConfigError]]:
    """Every definition in ``directory`` that loads, and the error of each file that
    does not (by file stem): one broken definition must not take the others down."""
    loaded: list[Loaded] = []
    broken: dict[str, ConfigError] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            loaded.append(load(str(path), directory))
        except ConfigError as exc:
            broken[path.stem] = exc
    return loaded, broken


def load_pipeline(name_or_path: str, pipelines_dir: Path) -> Pipeline:
    """A pipeline by name (``user_clicks``) or by path to its YAML file."""
    path, data = definition_file(name_or_path, pipelines_dir, "pipeline")
    return _with_source(parse_pipeline(data, str(path)), path)


def pipeline_from_text(path: Path, text: str) -> Pipeline:
    """The pipeline in ``text``, which the caller read from ``path`` (once: what it
    checked is what runs)."""
    return _with_source(parse_pipeline(read_yaml(path, text), str(path)), path)


def _with_source(pipeline: Pipeline, path: Path) -> Pipeline:
    object.__setattr__(pipeline, "source_path", path)
    return pipeline


def list_pipelines(pipelines_dir: Path) -> list[Pipeline]:
    return [load_pipeline(str(p), pipelines_dir) for p in sorted(pipelines_dir.glob("*.yaml"))]


def load_each_pipeline(pipelines_dir: Path) -> tuple[list[Pipeline], dict[str, ConfigError]]:
    return load_each(pipelines_dir, load_pipeline)
