"""An existing table whose columns differ from what the pipeline writes (a name, or
a type under the same name) is refused before anything is written: files of the
new type would make the table unreadable."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

from jobs import resolution
from jobs.delta.layout import AppLayout, column_problems, ensure_tables, state_redefined
from jobs.errors import ConfigError
from jobs.pipeline.parser import parse_pipeline as parse_definition
from jobs.resolution import Resolved
from jobs.settings import REPO_ROOT

INVENTORY = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())


def parse_pipeline(data: dict[str, object], origin: str) -> Resolved:
    """inventory as Spark resolves it: ``signed_qty`` (a CASE over ``qty``) has qty's type."""
    pipeline = parse_definition(data, origin)
    return resolution.of(pipeline, {"signed_qty": pipeline.schema["qty"]}, {}, False)


def parse_unresolved(data: dict[str, object], origin: str) -> Resolved:
    """inventory as a process without Spark (and no stored copy) sees it."""
    return resolution.of(parse_definition(data, origin))


def test_without_spark_a_derived_type_fits_what_the_table_has(tmp_path: Path) -> None:
    """Planners run without a JVM: a column whose type only Spark knows fits the
    existing table's type, and no table is created with it."""
    layout = AppLayout(tmp_path, "inventory")
    unresolved = parse_unresolved(INVENTORY, "v1")
    ensure_tables(layout, unresolved)
    assert not DeltaTable.is_deltatable(str(layout.table("state")))
    assert DeltaTable.is_deltatable(str(layout.table("_ledger")))
    ensure_tables(layout, parse_pipeline(INVENTORY, "v1"))
    ensure_tables(layout, unresolved)  # quantity: bigint in the table, fits
    assert not state_redefined(layout, unresolved)
    renamed = copy.deepcopy(INVENTORY)
    renamed["aggregations"][0]["name"] = "stock"
    with pytest.raises(ConfigError, match=r"lacks stock \(any type\)"):
        ensure_tables(layout, parse_unresolved(renamed, "v2"))


def test_a_type_changed_under_the_same_name_is_refused(tmp_path: Path) -> None:
    layout = AppLayout(tmp_path, "inventory")
    ensure_tables(layout, parse_pipeline(INVENTORY, "v1"))
    ensure_tables(layout, parse_pipeline(INVENTORY, "v1 again"))  # unchanged: fine
    changed = copy.deepcopy(INVENTORY)
    changed["schema"]["qty"] = "double"  # the quantity sum becomes a double
    with pytest.raises(ConfigError, match=r"quantity long.*needs.*quantity double"):
        ensure_tables(layout, parse_pipeline(changed, "v2"))


def test_a_new_definition_is_refused_outside_a_backfill_and_fits_after_it(
    tmp_path: Path,
) -> None:
    layout = AppLayout(tmp_path, "inventory")
    ensure_tables(layout, parse_pipeline(INVENTORY, "v1"))
    added = copy.deepcopy(INVENTORY)
    added["aggregations"].append({"name": "largest", "function": "max", "field": "qty"})
    v2 = parse_pipeline(added, "v2")
    with pytest.raises(ConfigError, match=r"lacks largest long.*backfill --pipeline inventory"):
        ensure_tables(layout, v2)
    ensure_tables(layout, v2, republishing=True)  # the backfill makes them fit
    assert state_redefined(layout, v2) and not state_redefined(
        layout, parse_pipeline(INVENTORY, "v1")
    )
    # The changelog after the backfill: the new column added, the old ones kept.
    changelog = layout.table("changelog")
    rows = pa.Table.from_pylist([], schema=v2.changelog_schema)
    write_deltalake(str(changelog), rows, mode="append", schema_mode="merge")
    state = pa.Table.from_pylist([], schema=v2.state_schema)
    write_deltalake(str(layout.table("state")), state, mode="overwrite", schema_mode="overwrite")
    ensure_tables(layout, v2)
    removed = copy.deepcopy(added)
    removed["aggregations"] = [a for a in removed["aggregations"] if a["name"] != "movements"]
    with pytest.raises(ConfigError, match="has columns"):  # state: exactly its columns
        ensure_tables(layout, parse_pipeline(removed, "v3"))


def test_a_changelog_column_new_rows_cannot_leave_empty_is_refused(tmp_path: Path) -> None:
    layout = AppLayout(tmp_path, "inventory")
    two_keys = copy.deepcopy(INVENTORY)
    two_keys["keys"] = ["sku", "kind"]
    ensure_tables(layout, parse_pipeline(two_keys, "v1"))
    with pytest.raises(ConfigError, match=r"has kind not null.*needs a new application id"):
        ensure_tables(layout, parse_pipeline(INVENTORY, "v2"), republishing=True)


def test_a_key_added_to_the_changelog_stays_nullable_and_compactable(tmp_path: Path) -> None:
    from jobs.delta.writer import OperationFence
    from jobs.operations.backfill import append_new_definition

    layout = AppLayout(tmp_path, "inventory")
    v1 = parse_pipeline(INVENTORY, "v1")
    ensure_tables(layout, v1)
    changelog = layout.table("changelog")
    old = {"sku": "S1", "quantity": 3, "movements": 1, "_records": 1, "epoch": 0, "batch_id": 0}
    row = {**old, "commit_time": 0}
    write_deltalake(
        str(changelog), pa.Table.from_pylist([row], schema=v1.changelog_schema), mode="append"
    )
    two_keys = copy.deepcopy(INVENTORY)
    two_keys["keys"] = ["sku", "kind"]
    v2 = parse_pipeline(two_keys, "v2")
    rows = pa.Table.from_pylist([{**row, "kind": "sale"}], schema=v2.changelog_schema)
    append_new_definition(changelog, rows, OperationFence("app", 0, "backfill"))
    table = DeltaTable(str(changelog))
    assert {f.name: f.nullable for f in table.schema().fields}["kind"]
    table.optimize.compact()  # old files lack the column: it must be nullable
    assert sorted(str(r["kind"]) for r in table.to_pyarrow_table().to_pylist()) == [
        "None",
        "sale",
    ]
    # The stream under v2 writes into it.
    assert not column_problems(
        "changelog", DeltaTable(str(changelog)).schema(), v2.changelog_schema
    )


def test_a_ledger_from_before_filters_gains_the_column_for_every_writer(tmp_path: Path) -> None:
    """An older platform's ledger lacks ``filtered``: an audit row (verify, maintain,
    a refused plan) fits it after the upgrade, and old rows read as null."""
    from jobs.audit import append_audit, audit_row
    from jobs.delta import layout as tables
    from jobs.ledger import current_ledger

    layout = AppLayout(tmp_path, "inventory")
    old = pa.schema([f for f in tables.LEDGER_SCHEMA if f.name != "filtered"])
    DeltaTable.create(str(layout.table(tables.LEDGER)), old)
    before = current_ledger(layout)
    assert before is not None and before.rows(["filtered"]).num_rows == 0  # readable as it is
    pipeline = parse_definition(INVENTORY, "v1")
    append_audit(layout, audit_row(pipeline, "verify", 0, {"result": "ok"}))
    rows = DeltaTable(str(layout.table(tables.LEDGER))).to_pyarrow_table()
    assert rows.schema.names == tables.LEDGER_SCHEMA.names
    ledger_now = current_ledger(layout)
    assert ledger_now is not None
    assert ledger_now.rows(["entry_type", "filtered"]).to_pylist() == [
        {"entry_type": "verify", "filtered": None}
    ]
