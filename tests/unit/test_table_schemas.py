"""An existing table whose columns differ from what the pipeline writes (a name, or
a type under the same name) is refused before anything is written: files of the
new type would make the table unreadable."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from jobs.delta.layout import AppLayout, ensure_tables
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
