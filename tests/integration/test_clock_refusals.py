"""A replay is the same computation: every function of Spark's registry is
classified, and no spelling that Spark evaluates to the clock passes ``resolve``.

The oracle of the property test is Spark itself, independent of the platform's
checks: an expression whose value Spark computes as today, yesterday, tomorrow or
now reads the clock, and ``resolve`` must refuse it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs import spark_functions, sql_text
from jobs.errors import ConfigError
from jobs.pipeline.model import Derived
from jobs.pipeline.parser import parse_pipeline

pytestmark = pytest.mark.integration

PIPELINE = parse_pipeline(
    {
        "application_id": "clock",
        "source": {"topics": ["t"]},
        "schema": {"id": "string", "created_at": "timestamp"},
        "keys": ["id"],
        "event_time": {"field": "created_at"},
        "window": {"type": "tumbling", "size": "1 minute"},
        "watermark": "1 minute",
        "aggregations": [{"name": "n", "function": "count"}],
    },
    "clock.yaml",
)


def test_every_function_of_spark_s_registry_is_classified(spark) -> None:  # type: ignore[no-untyped-def]
    # Spark's own functions only: another test may have registered a UDF in the session.
    system = {r[0].lower() for r in spark.sql("SHOW SYSTEM FUNCTIONS").collect()}
    registry = {
        f.name.lower(): f.className
        for f in spark.catalog.listFunctions()
        if f.name.lower() in system
    }
    unclassified = sorted(set(registry) - spark_functions.CLASSIFIED)
    assert not unclassified, (
        f"Spark has functions the platform has not classified: {unclassified} "
        "(jobs/spark_functions.py)"
    )
    assert not spark_functions.PER_RECORD & spark_functions.REFUSED_BY_NAME
    # What the analyser takes for Spark's own without listing the registry: a new
    # Spark is reviewed (and REVIEWED_SPARK moved) before it is trusted so.
    assert spark.version == spark_functions.REVIEWED_SPARK
    missing = sorted(spark_functions.IN_REGISTRY - system)
    assert not missing, f"not in this Spark's registry: {missing}"
    # What Spark's own classes say is never reviewed as per record.
    jvm = spark._jvm
    traits = [
        jvm.java.lang.Class.forName(f"org.apache.spark.sql.catalyst.expressions.{name}")
        for name in ("Nondeterministic", "aggregate.AggregateFunction", "Generator")
    ]
    wrong = []
    for name in spark_functions.PER_RECORD:
        class_name = registry.get(name)
        if class_name:
            kind = jvm.java.lang.Class.forName(class_name)
            wrong += [name for trait in traits if trait.isAssignableFrom(kind)]
    assert not wrong


def test_a_function_the_platform_has_not_reviewed_is_refused(spark, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from jobs.streaming import analyser

    monkeypatch.setattr(spark_functions, "CLASSIFIED", spark_functions.CLASSIFIED - {"upper"})
    with pytest.raises(ConfigError) as error:
        analyser.resolve(spark, dataclasses.replace(PIPELINE, derived=(Derived("d", "upper(id)"),)))
    assert "calls upper, a function this Spark has and the platform has not reviewed" in str(
        error.value
    )


# Ways to spell a constant string: every piece is a Spark string expression whose
# value is the text it was built from.
def _spelled(text: str) -> st.SearchStrategy[str]:
    def literal(piece: str) -> st.SearchStrategy[str]:
        def escaped(c: str) -> str:
            return c if c.isdigit() or c in "- :" else f"\\u{ord(c):04x}"

        return st.sampled_from(
            [
                "'" + piece + "'",
                '"' + piece + '"',
                "'" + "".join(escaped(c) for c in piece) + "'",
                "r'" + piece + "'",
            ]
        )

    def split(text: str) -> st.SearchStrategy[list[str]]:
        if len(text) < 2:
            return st.just([text])
        return st.integers(1, len(text) - 1).map(lambda i: [text[:i], text[i:]])

    @st.composite
    def build(draw: Any) -> str:
        cased = "".join(draw(st.sampled_from([c.lower(), c.upper()])) for c in text)
        padded = draw(st.sampled_from([cased, f" {cased} ", cased]))
        pieces = draw(split(padded))
        parts = [draw(literal(p)) for p in pieces]
        how = draw(st.sampled_from(["adjacent", "concat", "pipes", "trim", "lower", "single"]))
        if how == "adjacent" or (len(parts) == 1 and how != "single"):
            return " ".join(parts)
        if how == "concat":
            return f"concat({', '.join(parts)})"
        if how == "pipes":
            return " || ".join(parts)
        if how == "trim":
            return f"trim({' '.join(parts)})"
        if how == "lower":
            return f"lower({' '.join(parts)})"
        return str(draw(literal(padded)))

    return build()


# Spark functions and syntax that read a string as a date or a time.
READERS = [
    "CAST({} AS DATE)",
    "CAST({} AS TIMESTAMP)",
    "CAST({} AS TIMESTAMP_NTZ)",
    "try_cast({} AS DATE)",
    "({})::date",
    "to_date({})",
    "try_to_date({})",
    "to_timestamp({})",
    "try_to_timestamp({})",
    "to_timestamp_ntz({})",
    "to_timestamp_ltz({})",
    "date({})",
    "timestamp({})",
    "date_add({}, 0)",
    "datediff({}, DATE '2001-01-01')",
    "year({})",
    "day({})",
]
WRAPPERS = ["{}", "coalesce({}, DATE '2001-01-01')", "string({})", "nvl({}, NULL)"]


def _reads_the_clock(value: Any) -> bool:
    """Spark's answer near today or now (the test's data are all from 2001)."""
    today = datetime.now(UTC).date()
    near = {today + timedelta(days=d) for d in (-1, 0, 1)}
    if isinstance(value, datetime):
        return value.date() in near
    if isinstance(value, date):
        return value in near
    if isinstance(value, int):  # year(), day(), datediff()
        return value in {d.year for d in near} | {d.day for d in near} or abs(value) > 9000
    if isinstance(value, str):
        return any(str(d) in value for d in near)
    return False


@st.composite
def expressions(draw: Any) -> tuple[str, bool]:
    word = draw(st.sampled_from(["now", "today", "yesterday", "tomorrow", "2001-02-03", "epoch"]))
    reader = draw(st.sampled_from(READERS))
    wrapper = draw(st.sampled_from(WRAPPERS))
    return wrapper.format(reader.format(draw(_spelled(word)))), word[0].isalpha()


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(expressions())
def test_no_spelling_of_the_clock_passes(spark, monkeypatch, case: tuple[str, bool]) -> None:  # type: ignore[no-untyped-def]
    from jobs.streaming import analyser

    expr, _ = case
    try:
        value = spark.sql(f"SELECT {expr} AS v").collect()[0][0]
    except Exception:  # Spark refused it: nothing to judge
        return
    clock = _reads_the_clock(value)
    # Spark's tree alone (the text check sees no special word), then both together.
    for words in (set(), sql_text.SPECIAL_TIMES):
        monkeypatch.setattr(sql_text, "SPECIAL_TIMES", words)
        pipeline = dataclasses.replace(PIPELINE, derived=(Derived("d", expr),))
        try:
            analyser.resolve(spark, pipeline)
            refused = None
        except ConfigError as error:
            refused = str(error)
        assert not clock or refused, f"{expr} = {value!r} reads the clock and passed"
        if refused:
            assert "\n" not in refused
