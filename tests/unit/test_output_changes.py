"""A state version's net changes and their output records (real delta-rs tables)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs import resolution
from jobs.errors import ConsistencyError
from jobs.output.changes import commit_infos, net_changes
from jobs.output.encoding import encode, headers, partition_of
from tests.output_tables import StateWriter, clicks_pipeline


def changes_of(writer: StateWriter, version: int):  # type: ignore[no-untyped-def]
    info = commit_infos(writer.path, version, version)[version]
    return net_changes(resolution.of(writer.pipeline), writer.path, version, info)


def users(table: pa.Table) -> dict[str, int | None]:
    return {r["user_id"]: r.get("clicks") for r in table.to_pylist()}


def test_a_batch_publishes_every_row_it_merged(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    writer.batch({"a": 1, "b": 1})
    second = writer.batch({"a": 2, "c": 1})
    changes = changes_of(writer, second)
    assert (changes.kind, changes.operation, changes.batch_id) == ("change", "batch", 1)
    assert users(changes.upserts) == {"a": 2, "c": 1}
    assert changes.deletes.num_rows == 0


def test_a_restore_is_a_correction_of_only_what_it_changed(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    first = writer.batch({"a": 1, "b": 1})
    writer.batch({"a": 2, "c": 1})
    DeltaTable(str(writer.path)).restore(first)
    restored = DeltaTable(str(writer.path)).version()
    changes = changes_of(writer, restored)
    assert changes.kind == "correction"
    # b was removed and added back unchanged (whole files): no record for it.
    assert users(changes.upserts) == {"a": 1}
    assert users(changes.deletes) == {"c": None}


def test_a_restore_does_not_resend_unchanged_rows_holding_null(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    first = writer.batch({"a": 1, "n": None})
    writer.batch({"a": 2})
    DeltaTable(str(writer.path)).restore(first)
    changes = changes_of(writer, DeltaTable(str(writer.path)).version())
    # n's row (a NULL aggregate) was removed and added back as it was.
    assert users(changes.upserts) == {"a": 1}
    assert changes.deletes.num_rows == 0


def test_emptying_the_state_removes_every_key(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    writer.batch({"a": 1, "b": 1})
    DeltaTable(str(writer.path)).delete()
    changes = changes_of(writer, DeltaTable(str(writer.path)).version())
    assert changes.upserts.num_rows == 0
    assert sorted(users(changes.deletes)) == ["a", "b"]


def test_records_carry_the_key_window_aggregates_and_headers(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    first = writer.batch({"a": 3})
    DeltaTable(str(writer.path)).delete()
    deleted = DeltaTable(str(writer.path)).version()
    pipeline = writer.pipeline
    [(key, value, partition)] = list(encode(pipeline, changes_of(writer, first), 3))
    assert json.loads(key) == {
        "user_id": "a",
        "window_start": "2026-11-23T10:00:00.000000Z",
        "window_end": "2026-11-23T10:01:00.000000Z",
    }
    assert value is not None
    assert json.loads(value) == {
        "window": {"start": "2026-11-23T10:00:00.000000Z", "end": "2026-11-23T10:01:00.000000Z"},
        "aggregates": {"clicks": 3},
        "updated_at": "2026-11-23T10:00:00.000000Z",
    }
    [(tomb_key, tomb_value, tomb_partition)] = list(
        encode(pipeline, changes_of(writer, deleted), 3)
    )
    assert (tomb_key, tomb_value, tomb_partition) == (key, None, partition)
    assert dict(headers("user_clicks", changes_of(writer, first))) == {
        "platform.application": b"user_clicks",
        "platform.kind": b"change",
        "platform.operation": b"batch",
        "platform.epoch": b"0",
        "platform.batch": b"0",
        "platform.pipeline_version": b"1",
        "platform.state_version": str(first).encode(),
    }


def test_every_window_of_a_key_goes_to_one_partition() -> None:
    pipeline = clicks_pipeline()
    partitions = {
        partition_of(pipeline, {"user_id": "u7", "window_start": w}, 12) for w in range(50)
    }
    assert len(partitions) == 1
    spread = {partition_of(pipeline, {"user_id": f"u{i}"}, 12) for i in range(200)}
    assert len(spread) == 12


def test_a_non_finite_aggregate_stops_publishing_by_name(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    version = writer.batch({"a": 1})
    changes = changes_of(writer, version)
    bad = changes.upserts.set_column(
        changes.upserts.schema.get_field_index("clicks"),
        "clicks",
        pa.array([float("inf")]),
    )
    broken = type(changes)(**{**changes.__dict__, "upserts": bad})
    with pytest.raises(ConsistencyError, match=r"clicks of user_id='a'.* is inf"):
        list(encode(writer.pipeline, broken, 1))


def test_the_change_feeds_views_are_read_as_plain_strings_and_bytes() -> None:
    """A distinct count's sketch comes back from delta-rs's change data feed as
    binary_view, which ``take`` (a filter) refuses: a backfill of a pipeline with
    one could not publish (found by the hopping-window backfill test)."""
    import pyarrow as pa

    from jobs.delta.cdf import AFTER, CHANGE_TYPE, plain_strings, rows_of

    feed = pa.table(
        {
            "user": pa.array(["a", "b"], pa.string_view()),
            "_sketch_items": pa.array([b"\x01", b"\x02"], pa.binary_view()),
            CHANGE_TYPE: pa.array(["update_preimage", "update_postimage"], pa.string_view()),
        }
    )
    after = rows_of(plain_strings(feed), AFTER, ["user", "_sketch_items"])
    assert after.to_pylist() == [{"user": "b", "_sketch_items": b"\x02"}]
    assert after.schema.field("_sketch_items").type == pa.binary()
