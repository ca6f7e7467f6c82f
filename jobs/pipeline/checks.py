"""What a pipeline's columns may be (the types an event time and an aggregation
take) and what changed against a recorded definition or state shape.
"""

from __future__ import annotations

from typing import Any

from jobs import sql_text
from jobs.pipeline.model import (
    MAX_SUM_SCALE,
    TIME_TYPES,
    Aggregation,
    Pipeline,
    TimeUnit,
)


def event_time_unit(kind: str, unit: TimeUnit | None, what: str) -> TimeUnit | None:
    """The unit event time is read with from a column of Spark type ``kind``: none
    for a timestamp or date, ``unit`` (seconds by default) for a number. Raises
    ``TypeProblem`` when the column cannot be an event time."""
    if kind in TIME_TYPES:
        if unit is not None:
            raise TypeProblem("unit", f"{what} is a {kind}; unit applies to numbers only")
        return None
    if sql_text.is_numeric(kind):
        return unit or "seconds"
    raise TypeProblem(
        "field", f"{what} is a {kind}; event time must be a timestamp, a date or an epoch number"
    )


class TypeProblem(ValueError):
    """A column of the wrong type for its use; ``key`` is the field to name."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


def aggregate_type(aggregation: Aggregation, kind: str) -> str:
    """The Spark type an aggregation yields over a column of type ``kind`` (its
    contributions and state column). Raises ``TypeProblem``."""
    function = aggregation.function
    what = f"{function} of {aggregation.field!r}"
    if function == "approx_count_distinct":
        if not sql_text.is_atomic(kind):
            raise TypeProblem("field", f"{what} needs a single value, got {kind}")
        return "bigint"
    if function == "count":
        return "bigint"
    if function in ("min", "max"):
        if not sql_text.is_atomic(kind) or kind == "binary":
            raise TypeProblem(
                "field", f"{what} needs a number, string, date or timestamp, got {kind}"
            )
        return kind
    if kind in sql_text.INTEGRAL:
        return "bigint"
    if kind in sql_text.FRACTIONAL:
        return "double"
    scale = sql_text.decimal_scale(kind)
    if scale is None:
        raise TypeProblem("field", f"{what} needs a numeric column, got {kind}")
    if scale[1] > MAX_SUM_SCALE:
        raise TypeProblem(
            "field",
            f"{what}: a summed decimal keeps at most {MAX_SUM_SCALE} digits after the point, "
            f"got {kind}",
        )
    return f"decimal(38,{scale[1]})"


def average_type(sum_type: str) -> str:
    """An average's type from its sum's: decimals keep 4 more digits, the rest double."""
    scale = sql_text.decimal_scale(sum_type)
    return "double" if scale is None else f"decimal(38,{scale[1] + 4})"


def definition_changes(recorded: dict[str, Any], pipeline: Pipeline) -> list[str]:
    """The parts of ``pipeline``'s definition that differ from a recorded one
    (``{"version": v, "parts": {...}}``) under the same version; none when the
    version differs or nothing was recorded."""
    if not recorded or int(recorded.get("version", -1)) != pipeline.version:
        return []
    before = dict(recorded.get("parts") or {})
    return [
        name for name, digest in pipeline.definition.items() if before.get(name, digest) != digest
    ]


def shape_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two ``state_shape``s, in words (each starts with the key)."""
    names = {
        "keys": "keys",
        "window": "window [size, slide] (seconds)",
        "aggregations": "aggregations [name, function, field]",
        "shuffle_partitions": "shuffle_partitions",
        "window_key": "window_key (Spark's key of a hopping window; None: its start)",
    }
    return [
        f"{label} {before.get(key)} -> {now.get(key)}"
        for key, label in names.items()
        if before.get(key) != now.get(key)
    ]


def state_shape_changes(
    recorded: dict[str, Any] | None, now: dict[str, Any], new_checkpoint: bool
) -> list[str]:
    """What differs between the ``state_shape`` an epoch's state was recorded with
    and ``now``. ``new_checkpoint``: the state is seeded into a fresh checkpoint,
    whose shuffle partitions and hopping window keys may differ."""
    before = recorded
    if before is None:
        if new_checkpoint or "window_key" not in now:
            return []
        # Recorded before shapes were: Spark keys its hopping windows by their start.
        before = {**now, "window_key": None}
    changes = shape_changes(before, now)
    if new_checkpoint:
        changes = [c for c in changes if not c.startswith(("shuffle_partitions", "window_key"))]
    return changes


def only_rekeying(changes: list[str]) -> bool:
    """The changes are the hopping windows' key alone (``state_shape_changes``)."""
    return bool(changes) and all(c.startswith("window_key") for c in changes)
