"""The Spark SQL parts of a pipeline, validated without Spark (as DAG parsing does):
DDL types, names, expressions' functions, keys, event time, aggregations, and a
definition changed under the same version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs import sql_text
from jobs.cut import Cut, check_pipeline, recorded_definition, write_cut
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError
from jobs.pipeline.checks import definition_changes
from jobs.pipeline.parser import load_pipeline, parse_pipeline
from jobs.settings import REPO_ROOT
from tests.unit.test_pipeline import changed

PIPELINES = REPO_ROOT / "include" / "pipelines"
ORDERS: dict[str, Any] = yaml.safe_load((PIPELINES / "orders_revenue.yaml").read_text())


def orders(**changes: Any) -> dict[str, Any]:
    return changed(ORDERS, **changes)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("long", "bigint"),
        ("INTEGER", "int"),
        ("decimal", "decimal(10,0)"),
        ("DECIMAL(18, 2)", "decimal(18,2)"),
        ("struct<id: string, country: string>", "struct<`id`:string,`country`:string>"),
        ("array<struct<sku string, qty int>>", "array<struct<`sku`:string,`qty`:int>>"),
        ("map<string, array<bigint>>", "map<string,array<bigint>>"),
        ("struct<`odd name`: timestamp>", "struct<`odd name`:timestamp>"),
    ],
)
def test_ddl_types_normalize_to_sparks_names(text: str, normalized: str) -> None:
    assert sql_text.parse_type(text) == normalized


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("varchar", "unknown type 'varchar'"),
        ("decimal(40,2)", "precision <= 38"),
        ("decimal(5,6)", "scale <= precision"),
        ("struct<id: string, ID: int>", "appears twice"),
        ("struct<>", "at least one field"),
        ("map<int, string>", "keys are strings"),
        ("array<string", "ends too early"),
        ("string extra", "unexpected"),
        ("array<string>>", "unexpected"),
    ],
)
def test_bad_ddl_types_say_why(text: str, message: str) -> None:
    with pytest.raises(sql_text.SqlTextError, match=message):
        sql_text.parse_type(text)


def test_expressions_name_their_function_calls() -> None:
    calls = sql_text.check_expression(
        "aggregate(items, 0, (acc, i) -> acc + i.qty) + CAST(x AS INT) + upper('reflect(')"
    )
    assert calls == ["aggregate", "upper"]
    assert sql_text.check_expression("a IN (1, 2) AND NOT (b)") == []
    assert sql_text.check_expression("merchant.current_date = 1") == []  # a field


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("reflect('java.lang.System', 'exit', 0)", "reaches outside SQL"),
        ("`java_method`('a', 'b')", "reaches outside SQL"),
        ("rand() > 0.5", "gives another answer"),
        ("current_timestamp", "gives another answer"),
        ("uuid()", "gives another answer"),
        ("(SELECT max(x) FROM t)", "subquery"),
        ("1; DROP TABLE x", "one expression"),
        ("   ", "is empty"),
        ("a /* open", "comment that does not end"),
        # Ways around the list a tokenizer could miss (each seen in review).
        ("1 -- x\r + unix_micros(current_timestamp())", "gives another answer"),
        ("r'\\' || string(current_date()) -- '\n", "gives another answer"),
        ("TIMESTAMP 'now'", "the current one"),
        ("CAST(' Today ' AS DATE)", "the current one"),
        ("unix_timestamp()", "without an argument"),
        ("aes_encrypt(x, k)", "gives another answer"),
        ("system.builtin.current_timestamp()", "gives another answer"),
        ("CURRENT_TIMESTAMP", "gives another answer"),
        ("x |> WHERE y", "one expression"),
        # Spark continues a -- comment past a backslash at the line's end: what the
        # text took for a string there is code to Spark.
        ("x -- \\\n'\n|| string(current_date()) -- '", "gives another answer"),
        # Spelled so that only the literal's value (escapes undone, adjacent
        # literals joined, as Spark's parser reads them) is the special word.
        ("to_date('\\u0074oday')", "the current one"),
        ("to_date('to' 'day')", "the current one"),
        ("to_timestamp('n' \"ow\")", "the current one"),
        ("to_timestamp_ntz(r'now')", "the current one"),
    ],
)
def test_expressions_that_may_not_run_are_refused(expr: str, message: str) -> None:
    with pytest.raises(sql_text.SqlTextError, match=message):
        sql_text.check_expression(expr)


def test_what_users_write_reads_as_sql() -> None:
    for expr in [
        "X'0A' = kafka.key",
        "1L + 2BD + 1.5e3 + .5",
        "x::int + 1",
        "'it''s' || 'a \\'quoted\\' word' || r'C:\\path'",
        "transform(items, i -> i.qty * 2)",
        "CASE WHEN a THEN 1 ELSE 2 END",
        "unix_timestamp(created_at)",
        "status = 'tomorrow''s'",
    ]:
        sql_text.check_expression(expr)


def test_a_cosmetic_edit_is_no_change_and_spark_types_do_not_change_it() -> None:
    from jobs import resolution

    v1 = parse_pipeline(orders(), "v1")
    spaced = orders(derived=[{**d, "expr": f"  {d['expr']}  -- note"} for d in ORDERS["derived"]])
    assert parse_pipeline(spaced, "v1 spaced").definition == v1.definition
    numeric = orders(
        derived=[*ORDERS["derived"], {"name": "t", "expr": "amount_cents"}],
        event_time={"field": "t"},
    )
    pipeline = parse_pipeline(numeric, "v1")
    resolved = resolution.of(pipeline, {"t": "bigint"}, {}, False)
    assert resolved.column_type("t") == "bigint" and pipeline.column_type("t") is None
    assert resolved.pipeline.definition == pipeline.definition


def test_the_orders_pipeline_loads() -> None:
    pipeline = load_pipeline("orders_revenue", PIPELINES)
    assert [d.name for d in pipeline.derived] == ["merchant_id", "amount", "units"]
    assert pipeline.filter == "status = 'paid' AND merchant.country <> 'XX'"
    assert pipeline.event_time.column == "created_at" and pipeline.event_time.unit is None
    assert pipeline.column_type("merchant") == "struct<`id`:string,`country`:string>"
    assert pipeline.column_type("kafka.key") == "string"
    assert pipeline.column_type("amount") is None  # Spark's to say
    assert pipeline.value_columns[-2:] == ("_sketch_buyers", "_records")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"filter": "rand() < 0.1"}, "filter: calls rand()"),
        (
            {"derived": [{"name": "m", "expr": "java_method('a', 'b')"}]},
            "derived[0].expr: calls java_method()",
        ),
        (
            {"derived": [{"name": "status", "expr": "1"}]},
            "derived[0].name: 'status' must be a new identifier",
        ),
        (
            {"derived": [{"name": "a", "expr": "1"}, {"name": "A", "expr": "2"}]},
            "derived[1].name: 'A' must be a new identifier",
        ),
        ({"derived": [{"name": "_x", "expr": "1"}]}, "derived[0].name"),
        (
            {"derived": [{"name": "x", "expr": "1", "field": "amount"}]},
            "derived[0]: unknown field(s) field",
        ),
        ({"derived": [{"name": "x"}]}, "derived[0].expr: is required"),
        ({"keys": ["kafka.key"]}, "keys: key 'kafka.key': name a column"),
        ({"keys": ["merchant"]}, "key 'merchant' is a struct<"),
        ({"keys": ["nope"]}, "key 'nope' is not a field of the schema or a derived column"),
        ({"schema": {"_id": "string"}}, "names starting with '_' are the platform's"),
        ({"schema": {"Kafka": "string"}}, "'Kafka' is reserved"),
        ({"event_time": {"field": "created_at", "unit": "seconds"}}, "unit applies to numbers"),
        ({"event_time": {"field": "kafka.key"}}, "event_time.field"),
        ({"event_time": {"field": "status"}}, "event time must be a timestamp"),
        (
            {"aggregations": [{"name": "n", "function": "sum", "field": "status"}]},
            "sum of 'status' needs a numeric column, got string",
        ),
        (
            {"aggregations": [{"name": "n", "function": "max", "field": "items"}]},
            "needs a number, string, date or timestamp",
        ),
        (
            {"aggregations": [{"name": "n", "function": "approx_count_distinct"}]},
            "needs a field",
        ),
        (
            {"aggregations": [{"name": "n", "function": "avg", "field": "kafka.nope"}]},
            "needs a field",
        ),
    ],
)
def test_bad_sql_definitions_name_the_file_and_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_pipeline(orders(**changes), "orders.yaml")
    assert str(error.value).startswith("orders.yaml: ")
    assert message in str(error.value)


def test_a_decimal_sum_keeps_its_scale_within_bounds() -> None:
    data = orders(
        schema={**ORDERS["schema"], "fine": "decimal(30,20)"},
        aggregations=[{"name": "f", "function": "sum", "field": "fine"}],
    )
    with pytest.raises(ConfigError, match="at most 18 digits after the point"):
        parse_pipeline(data, "orders.yaml")


def test_headers_are_refused_with_the_raw_archive() -> None:
    data = orders(derived=[*ORDERS["derived"], {"name": "h", "expr": "size(kafka.headers)"}])
    data["source"] = {**data["source"], "archive": True}
    with pytest.raises(ConfigError, match="does not keep Kafka headers"):
        parse_pipeline(data, "orders.yaml")
    assert parse_pipeline(orders(), "o").uses_headers is False
    spelled = orders(derived=[*ORDERS["derived"], {"name": "h", "expr": "kafka['head' 'ers']"}])
    assert parse_pipeline(spelled, "o").uses_headers is True
    named = orders(
        schema={**ORDERS["schema"], "req_headers": "string"},
        derived=[*ORDERS["derived"], {"name": "h", "expr": "upper(req_headers)"}],
    )
    assert parse_pipeline(named, "o").uses_headers is False


def test_a_definition_changed_under_the_same_version_is_refused(tmp_path: Path) -> None:
    v1 = parse_pipeline(orders(), "v1")
    changed = parse_pipeline(orders(filter="status = 'paid'"), "v1 changed")
    assert definition_changes(recorded_definition(v1), changed) == ["filter"]
    assert definition_changes(recorded_definition(v1), v1) == []
    bumped = parse_pipeline(orders(filter="status = 'paid'", version=2), "v2")
    assert definition_changes(recorded_definition(v1), bumped) == []
    # Operational settings are not the definition.
    tuned = parse_pipeline(orders(shuffle_partitions=4, schedule_minutes=1), "tuned")
    assert definition_changes(recorded_definition(v1), tuned) == []

    layout = AppLayout(tmp_path, "orders_revenue")
    cut = Cut(0, {}, "pipeline", definition=recorded_definition(v1))
    write_cut(layout, cut)
    check_pipeline(layout, v1, cut, shape=False)
    check_pipeline(layout, bumped, cut, shape=False)
    with pytest.raises(ConfigError) as error:
        check_pipeline(layout, changed, cut, shape=False)
    assert str(error.value) == (
        "pipeline orders_revenue: version 1 was recorded with another definition (epoch 0's "
        "cut): filter differs; set version: 2 (results of another logic need another "
        "version; python -m jobs backfill --pipeline orders_revenue ... then republishes "
        "earlier results under it)"
    )
    # Version 2 began epoch 1; a file that says version 1 again with another
    # filter is refused against epoch 0's record, not only the newest one.
    v2 = parse_pipeline(orders(version=2, derived=[*ORDERS["derived"]]), "v2")
    later = Cut(1, {}, "backfill", definition=recorded_definition(v2))
    write_cut(layout, later)
    with pytest.raises(ConfigError, match=r"version 1 was recorded .*epoch 0's cut.*version: 3"):
        check_pipeline(layout, changed, later, shape=False)
