"""The resolved pipeline: every column's type and table's schema, and the copy a run
stores for the tools that run without Spark."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import yaml
from deltalake import DeltaTable

from jobs import resolution
from jobs.delta.layout import AppLayout, ensure_tables
from jobs.pipeline.parser import parse_pipeline
from jobs.resolution import DimensionTable
from jobs.settings import REPO_ROOT

INVENTORY = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())
MERCHANTS = DimensionTable("/w/dims/merchants", '{"type":"struct","fields":[]}', "string")


def test_without_spark_a_derived_column_s_type_is_unknown() -> None:
    resolved = resolution.of(parse_pipeline(INVENTORY, "v1"))
    assert not resolved.analysed
    assert resolved.column_type("qty") == "bigint"
    assert resolved.column_type("kafka.offset") == "bigint"
    assert resolved.column_type("signed_qty") is None
    assert resolved.value_type("quantity") is None  # a sum of the derived column
    assert resolved.value_type("movements") == "bigint"
    assert resolved.state_schema.field("quantity").type == pa.null()


def test_spark_s_answers_decide_every_schema() -> None:
    resolved = resolution.of(parse_pipeline(INVENTORY, "v1"), {"signed_qty": "bigint"}, {}, False)
    assert resolved.analysed
    assert resolved.state_schema.names == [
        "sku",
        "quantity",
        "movements",
        "_records",
        "epoch",
        "batch_id",
        "updated_at",
    ]
    assert resolved.state_schema.field("quantity").type == pa.int64()
    assert resolved.changelog_schema.names[-1] == "commit_time"
    assert resolved.aggregate_schema.names == ["sku", "quantity", "movements", "_records"]
    assert list(resolved.tables) == ["dead_letter", "changelog", "state", "_ledger"]
    assert resolved.contributions == {
        "_in_quantity": "bigint",
        "_in_movements": "bigint",
        "_in__records": "bigint",
    }
    assert resolved.seed_ddl.startswith("`sku` string, `_event_time` timestamp, ")


def test_the_stored_copy_gives_tools_without_spark_the_same_types(tmp_path: Path) -> None:
    pipeline = parse_pipeline(INVENTORY, "v1")
    layout = AppLayout(tmp_path, pipeline.application_id)
    assert not resolution.load_stored(layout, pipeline).analysed  # no run yet
    ran = resolution.of(pipeline, {"signed_qty": "bigint"}, {"m": MERCHANTS}, True)
    resolution.store(layout, ran)
    loaded = resolution.load_stored(layout, pipeline)
    assert loaded == ran
    assert loaded.dimensions == {"m": MERCHANTS} and loaded.uses_headers


def test_a_stored_copy_of_another_definition_is_not_used(tmp_path: Path) -> None:
    pipeline = parse_pipeline(INVENTORY, "v1")
    layout = AppLayout(tmp_path, pipeline.application_id)
    resolution.store(layout, resolution.of(pipeline, {"signed_qty": "bigint"}, {}, False))
    edited = copy.deepcopy(INVENTORY)
    edited["derived"][0]["expr"] = "CAST(qty AS DOUBLE)"  # same version, other definition
    assert not resolution.load_stored(layout, parse_pipeline(edited, "v1 edited")).analysed
    resolution.stored_file(layout, 1).write_text("{not json")
    assert not resolution.load_stored(layout, pipeline).analysed  # damaged: as without a run


def test_a_planner_creates_the_tables_from_the_stored_copy(tmp_path: Path) -> None:
    """Without a copy a planner cannot create ``state`` (a column's type is Spark's
    to say); with the copy a run stored, it creates it with the run's types."""
    pipeline = parse_pipeline(INVENTORY, "v1")
    layout = AppLayout(tmp_path, pipeline.application_id)
    ensure_tables(layout, resolution.load_stored(layout, pipeline))
    assert not DeltaTable.is_deltatable(str(layout.table("state")))
    resolution.store(layout, resolution.of(pipeline, {"signed_qty": "bigint"}, {}, False))
    ensure_tables(layout, resolution.load_stored(layout, pipeline))
    fields = {f.name: str(f.type) for f in DeltaTable(str(layout.table("state"))).schema().fields}
    assert fields["quantity"] == 'PrimitiveType("long")'


def test_the_sql_settings_are_stored_and_a_definition_computed_otherwise_refused(
    tmp_path: Path,
) -> None:
    import json

    import pytest

    from jobs import sql_settings
    from jobs.errors import ConfigError

    layout = AppLayout(tmp_path, "inventory")
    pipeline = parse_pipeline(INVENTORY, "v1")
    pinned = dict(sql_settings.PINNED)
    resolution.store(layout, resolution.of(pipeline, {"signed_qty": "bigint"}, {}, False, pinned))
    assert resolution.load_stored(layout, pipeline).sql_settings == pinned
    # An older platform computed this definition with ANSI mode off.
    path = resolution.stored_file(layout, pipeline.version)
    stored = json.loads(path.read_text())
    stored["sql_settings"]["spark.sql.ansi.enabled"] = "false"
    path.write_text(json.dumps(stored))
    with pytest.raises(ConfigError) as error:
        resolution.store(
            layout, resolution.of(pipeline, {"signed_qty": "bigint"}, {}, False, pinned)
        )
    assert "computed with spark.sql.ansi.enabled=false" in str(error.value)
    assert "\n" not in str(error.value)
    # A copy from before the settings were recorded: nothing to compare, now recorded.
    del stored["sql_settings"]
    path.write_text(json.dumps(stored))
    resolution.store(layout, resolution.of(pipeline, {"signed_qty": "bigint"}, {}, False, pinned))
    assert json.loads(path.read_text())["sql_settings"] == pinned


def test_a_session_that_computes_otherwise_is_refused() -> None:
    import re

    import pytest

    from jobs import sql_settings
    from jobs.errors import ConfigError

    sql_settings.check_session(dict(sql_settings.PINNED), {})
    for key in sql_settings.PINNED:
        with pytest.raises(ConfigError, match=re.escape(f"has {key}=x: the platform computes")):
            sql_settings.check_session({**sql_settings.PINNED, key: "x"}, {})
    with pytest.raises(
        ConfigError, match=r"sets spark\.sql\.legacy\.setopsPrecedence\.enabled=true"
    ):
        legacy = {"spark.sql.legacy.setopsPrecedence.enabled": "true"}
        sql_settings.check_session(dict(sql_settings.PINNED), legacy)
