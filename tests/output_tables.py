"""A ``user_clicks``-shaped state table written with the platform's own writer,
version by version, for output tests that need no Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import yaml

from jobs import resolution
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import BatchWriter
from jobs.pipeline.model import Pipeline
from jobs.pipeline.parser import parse_pipeline
from jobs.settings import REPO_ROOT

START = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


def clicks_pipeline(output: str | None = None, partitions: int = 3) -> Pipeline:
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "user_clicks.yaml").read_text())
    if output is not None:
        data["output"] = {"topic": output, "partitions": partitions}
    return parse_pipeline(data, "user_clicks.yaml")


def state_rows(pipeline: Pipeline, counts: dict[str, int | None], batch_id: int) -> pa.Table:
    """One row per user, all in the window starting at ``START`` (a count of None: a
    NULL aggregate from one record)."""
    end = START.replace(minute=1)
    rows = [
        {
            "user_id": user,
            "window_start": START,
            "window_end": end,
            "clicks": n,
            "_records": 1 if n is None else n,
            "epoch": 0,
            "batch_id": batch_id,
            "updated_at": START,
        }
        for user, n in counts.items()
    ]
    return pa.Table.from_pylist(rows, resolution.of(pipeline).state_schema)


class StateWriter:
    def __init__(self, warehouse: Path, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.layout = AppLayout(warehouse, pipeline.application_id)
        tables.ensure_tables(self.layout, resolution.of(pipeline))
        self.writer = BatchWriter(pipeline.application_id, 0)
        self.batch_id = 0

    @property
    def path(self) -> Path:
        return self.layout.table("state")

    def batch(self, counts: dict[str, int | None]) -> int:
        """A batch's merge of these users' new counts; returns the state version."""
        version = self.writer.merge(
            self.path,
            self.batch_id,
            state_rows(self.pipeline, counts, self.batch_id),
            self.pipeline.state_keys,
            {"platform_operation": "batch", "pipeline_version": "1"},
        )
        self.batch_id += 1
        assert version is not None
        return version
