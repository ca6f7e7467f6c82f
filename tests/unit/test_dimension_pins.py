"""A recorded dimension table (a ``Pin``: version, Delta table id, location) is read
again only when it is still that table at that version (``cut.check_readable``),
on real Delta tables written with delta-rs (no Spark)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.cut import check_readable
from jobs.errors import ConfigError
from jobs.lineage import Pin

ROWS = pa.table({"sku": ["a"], "factor": pa.array([2], pa.int64())})


def loaded(path: Path, versions: int) -> Pin:
    """The table written ``versions`` times; its newest version's pin."""
    for _ in range(versions):
        write_deltalake(str(path), ROWS, mode="overwrite")
    table = DeltaTable(str(path))
    return Pin(table.version(), table.metadata().id, str(path))


def test_the_recorded_table_at_its_version_is_readable(tmp_path: Path) -> None:
    pin = loaded(tmp_path / "dims" / "m", 3)
    check_readable("app", "m", str(tmp_path / "other"), {pin, Pin(0, pin.table_id, pin.path)})


@pytest.mark.parametrize("versions", [1, 3])
def test_a_table_deleted_and_loaded_again_is_named_as_such(tmp_path: Path, versions: int) -> None:
    """Also when the recorded version is past the new table's first (the reloaded
    table starts again at 0): not "its files were removed"."""
    path = tmp_path / "dims" / "m"
    pin = loaded(path, versions)
    shutil.rmtree(path)
    loaded(path, 1)
    with pytest.raises(
        ConfigError, match=r"deleted and loaded again.*backfill --dimensions newest"
    ):
        check_readable("app", "m", str(path), {pin})


def test_a_version_gone_from_the_same_table_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "dims" / "m"
    pin = loaded(path, 2)
    for log in (path / "_delta_log").glob("*.json"):
        if log.name.startswith("00000000000000000001"):
            log.unlink()
    with pytest.raises(ConfigError, match=r"version 1, which a replay joins.*no longer be read"):
        check_readable("app", "m", str(path), {pin})


def test_a_pin_recorded_before_identity_is_read_at_the_enrichments_table(tmp_path: Path) -> None:
    path = tmp_path / "dims" / "m"
    loaded(path, 2)
    check_readable("app", "m", str(path), {Pin(1)})
    with pytest.raises(ConfigError, match="version 5"):
        check_readable("app", "m", str(path), {Pin(5)})
