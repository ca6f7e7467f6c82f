"""An existing table whose columns differ from what the pipeline writes (a name, or
a type under the same name) is refused before anything is written: files of the
new type would make the table unreadable."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from jobs.delta.layout import (
    AppLayout,
    changelog_schema,
    ensure_tables,
    state_redefined,
    state_schema,
)
from jobs.errors import ConfigError
from jobs.pipeline import parse_pipeline
from jobs.settings import REPO_ROOT

INVENTORY = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())


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
    rows = pa.Table.from_pylist([], schema=changelog_schema(v2))
    write_deltalake(str(changelog), rows, mode="append", schema_mode="merge")
    state = pa.Table.from_pylist([], schema=state_schema(v2))
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
