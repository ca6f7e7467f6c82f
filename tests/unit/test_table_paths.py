"""Paths are data: a folder's name with spaces, '#', '%' or Unicode reaches Delta
as it is, and one delta-rs would read as another is refused with one line."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.delta.layout import AppLayout, check_table_path, file_location
from jobs.errors import ConfigError


def test_data_files_of_a_table_in_an_odd_folder_are_found(tmp_path: Path) -> None:
    table = tmp_path / "ware house 50% #1 é" / "state"
    write_deltalake(str(table), pa.table({"x": [1]}))
    (uri,) = DeltaTable(str(table)).file_uris()
    assert file_location(uri).exists() and Path(file_location(uri).parent) == table


@pytest.mark.parametrize("name", ["h%25y", "caf%C3%A9", "a%41"])
def test_a_folder_delta_rs_would_read_as_another_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError) as error:
        AppLayout(tmp_path / name, "app")
    assert "delta-rs reads as an escaped character" in str(error.value)
    assert "\n" not in str(error.value)
    check_table_path(tmp_path / "50% off", "the warehouse")  # no escape: fine
