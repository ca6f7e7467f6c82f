"""A batch's rows never pass through the driver: Spark's tasks write the data files
and the driver commits them. Spark's own limit on what tasks may send the driver
(``spark.driver.maxResultSize``, at its minimum of 1 MB) is far below the batch's
changelog, and the run is exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.conftest import pipeline_file, produce, recent_clicks, run_jobs
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration

EVENTS = 60_000


def test_a_batch_larger_than_the_driver_may_collect(  # type: ignore[no-untyped-def]
    settings, kafka_config, new_topic, tmp_path: Path
) -> None:
    topic = new_topic(2)
    path = pipeline_file(tmp_path, "user_clicks", topic, archive=True)
    values = recent_clicks(EVENTS, 0, users=EVENTS)  # one state row per event
    produce(kafka_config, topic, values)

    # Collecting the changelog would send the driver several MB (Arrow, per row:
    # a user id, a window, counts, stamps): Spark would fail the job.
    limit = {"PYSPARK_SUBMIT_ARGS": "--conf spark.driver.maxResultSize=1m pyspark-shell"}
    result = run_jobs(path, settings, "run", env=limit)
    assert result.returncode == 0, result.stderr[-3000:]

    app = Path(settings.warehouse / "user_clicks")
    expected, _dead, _late = clicks_per_window([values])
    state = DeltaTable(str(app / "state")).to_pyarrow_table()
    assert state.num_rows == len(expected) >= EVENTS
    assert state_as_counter(state.to_pylist(), "clicks") == expected
    changelog = DeltaTable(str(app / "changelog"))
    assert changelog.to_pyarrow_table().num_rows == len(expected)
    raw = DeltaTable(str(app / "raw")).to_pyarrow_table()
    offsets: dict[int, list[int]] = {}
    for part, offset in zip(raw["partition"].to_pylist(), raw["offset"].to_pylist(), strict=True):
        offsets.setdefault(part, []).append(offset)
    assert sum(map(len, offsets.values())) == EVENTS
    assert all(sorted(found) == list(range(len(found))) for found in offsets.values())
    # Each table's files on disk are exactly the committed ones, one per task (the
    # changelog's output partitions, the source's ranges), and nothing stays staged.
    for name in ("changelog", "raw"):
        table = DeltaTable(str(app / name))
        on_disk = {f.name for f in (app / name).glob("part-*.parquet")}
        assert on_disk == {Path(uri).name for uri in table.file_uris()}, name
        assert not list((app / name / "_staging").iterdir()), name
