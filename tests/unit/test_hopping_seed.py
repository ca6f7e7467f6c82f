"""Seeding hopping windows, without Spark: each window's state row is seeded at its
last pane, which Spark's state keys that window by (``query.aggregate``), and the
``window_key`` marker keeps a checkpoint keyed the old way from continuing."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from jobs.cut import Cut, check_state_shape
from jobs.delta.layout import TIMESTAMP, AppLayout
from jobs.errors import ConfigError
from jobs.pipeline.checks import shape_changes
from jobs.pipeline.model import Pipeline
from jobs.pipeline.parser import parse_pipeline
from jobs.state_seed import RECORDS, open_windows, seed_rows

SIZE, SLIDE, DELAY = 180, 60, 600
PAYMENTS: dict[str, Any] = {
    "application_id": "payments",
    "version": 1,
    "source": {"topics": ["payments"]},
    "schema": {"user": "string", "cents": "long", "item": "string", "ts": "long"},
    "keys": ["user"],
    "event_time": {"field": "ts", "unit": "seconds"},
    "window": {"type": "hopping", "size": "3 minutes", "slide": "1 minute"},
    "watermark": "10 minutes",
    "aggregations": [
        {"name": "payments", "function": "count"},
        {"name": "total", "function": "sum", "field": "cents"},
        {"name": "mean", "function": "avg", "field": "cents"},
        {"name": "smallest", "function": "min", "field": "cents"},
        {"name": "items", "function": "approx_count_distinct", "field": "item"},
    ],
}


def pipeline(**changes: Any) -> Pipeline:
    """``PAYMENTS`` with top-level fields replaced (None: removed)."""
    data = copy.deepcopy(PAYMENTS)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return parse_pipeline(data, "payments.yaml")


def moment(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def state(windows: list[tuple[str, int]], size: int = SIZE) -> pa.Table:
    """State rows of ``PAYMENTS`` for (user, window start), values made up per row."""
    rows = [
        {
            "user": user,
            "window_start": moment(start),
            "window_end": moment(start + size),
            "payments": i + 1,
            "total": 100 * (i + 1),
            "mean": 100.0,
            "smallest": i,
            "items": 1,
            "_sum_mean": 100 * (i + 1),
            "_sketch_items": bytes([i]),
            "_records": i + 1,
        }
        for i, (user, start) in enumerate(windows)
    ]
    schema = pa.schema(
        [
            ("user", pa.string()),
            ("window_start", TIMESTAMP),
            ("window_end", TIMESTAMP),
            ("payments", pa.int64()),
            ("total", pa.int64()),
            ("mean", pa.float64()),
            ("smallest", pa.int64()),
            ("items", pa.int64()),
            ("_sum_mean", pa.int64()),
            ("_sketch_items", pa.binary()),
            ("_records", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema)


def keyed_window(seed_time: datetime, size: int, slide: int) -> tuple[int, int]:
    """The window ``query.aggregate`` counts a row at ``seed_time`` into: the one
    whose last pane (a tumbling window of one slide) holds it."""
    t = int(seed_time.timestamp())
    end = t - t % slide + slide
    return end - size, end


def test_each_hopping_window_is_seeded_into_itself_only() -> None:
    hopping = pipeline()
    base = 1_700_000_040  # a whole minute
    # Overlapping windows of one user (every pane of a record's three windows), and another's.
    windows = [("a", base + k * SLIDE) for k in range(-2, 3)] + [("b", base)]
    seeded = seed_rows(state(windows), hopping)

    assert seeded.num_rows == len(windows)  # one seed row per window, none per pane
    assert seeded.schema.field("_event_time").type == TIMESTAMP
    times = seeded["_event_time"].to_pylist()
    assert [t.timestamp() for t in times] == [start + SIZE - SLIDE for _, start in windows]
    landed = [keyed_window(t, SIZE, SLIDE) for t in times]
    assert landed == [(start, start + SIZE) for _, start in windows]
    # The stored values go in as they are: what the window holds, once.
    assert seeded["_in_payments"].to_pylist() == [1, 2, 3, 4, 5, 6]
    assert seeded["_in_mean"].to_pylist() == seeded["_in_total"].to_pylist()
    assert seeded["_in_items"].to_pylist() == [bytes([i]) for i in range(6)]
    assert seeded["_value_items"].null_count == len(windows)
    assert seeded[RECORDS].to_pylist() == [1, 2, 3, 4, 5, 6]


def test_a_window_start_would_land_in_several_hopping_windows() -> None:
    """Why the seed time moved: Spark's hopping assignment puts a window's start in
    every window containing it, SIZE / SLIDE of them; its last pane is in one key."""
    start = 1_700_000_040
    containing = [s for s in range(start - SIZE, start + SIZE, SLIDE) if s <= start < s + SIZE]
    assert len(containing) == SIZE // SLIDE
    seeded = seed_rows(state([("a", start)]), pipeline())
    assert keyed_window(seeded["_event_time"][0].as_py(), SIZE, SLIDE) == (start, start + SIZE)


def test_two_windows_per_record_and_an_empty_state() -> None:
    halves = pipeline(window={"type": "hopping", "size": "10 minutes", "slide": "5 minutes"})
    seeded = seed_rows(state([("a", 1_700_000_100)], size=600), halves)
    assert seeded["_event_time"][0].as_py() == moment(1_700_000_100 + 300)
    assert keyed_window(seeded["_event_time"][0].as_py(), 600, 300) == (
        1_700_000_100,
        1_700_000_700,
    )
    empty = seed_rows(state([]), pipeline())
    assert empty.num_rows == 0 and empty.schema.field("_event_time").type == TIMESTAMP


def test_tumbling_windows_are_seeded_at_their_start_as_before() -> None:
    tumbling = pipeline(window={"type": "tumbling", "size": "1 minute"})
    one_pane = pipeline(window={"type": "hopping", "size": "1 minute", "slide": "1 minute"})
    rows = state([("a", 1_700_000_040), ("b", 1_700_000_100)], size=60)
    for same in (tumbling, one_pane):
        seeded = seed_rows(rows, same)
        assert seeded["_event_time"].to_pylist() == rows["window_start"].to_pylist()


def test_open_windows_are_those_the_seeded_watermark_keeps() -> None:
    """Spark's watermark after the seed is the newest seed time minus its delay,
    DELAY + SIZE - SLIDE for a hopping window: the newest window start minus DELAY,
    as ``open_windows`` assumes; a window stays seeded iff it ends after it."""
    hopping = pipeline()
    base = 1_700_000_040
    starts = [base - 900, base - 780, base - 720, base - 600, base]
    rows = state([("a", s) for s in starts])
    seeded = seed_rows(rows, hopping)
    newest = max(int(t.timestamp()) for t in seeded["_event_time"].to_pylist())
    watermark = newest - (DELAY + SIZE - SLIDE)
    assert watermark == base - DELAY
    kept = open_windows(rows, hopping)
    assert [int(t.timestamp()) for t in kept["window_start"].to_pylist()] == [
        s for s in starts if s + SIZE > watermark
    ]
    assert kept.num_rows == 3


def test_only_hopping_windows_carry_the_window_key() -> None:
    assert pipeline().state_shape["window_key"] == "last_pane"
    tumbling = pipeline(window={"type": "tumbling", "size": "1 minute"})
    one_pane = pipeline(window={"type": "hopping", "size": "1 minute", "slide": "1 minute"})
    unwindowed = pipeline(window=None, watermark=None)
    for other in (tumbling, one_pane, unwindowed):
        assert "window_key" not in other.state_shape
    # Not part of the definition: the window's digest is the one earlier batches
    # recorded ([size, slide] only), so no new version is needed for it.
    digest = hashlib.sha256(json.dumps([SIZE, SLIDE]).encode()).hexdigest()[:12]
    assert pipeline().definition["window"] == digest


def test_shape_changes_name_the_window_key() -> None:
    now = pipeline().state_shape
    before = {k: v for k, v in now.items() if k != "window_key"}  # an older platform's cut
    assert shape_changes(now, now) == []
    assert shape_changes(before, now) == [
        "window_key (Spark's key of a hopping window; None: its start) None -> last_pane"
    ]
    tumbling = pipeline(window={"type": "tumbling", "size": "3 minutes"}).state_shape
    assert shape_changes(tumbling, now) == [
        "window [size, slide] (seconds) [180, 180] -> [180, 60]",
        "window_key (Spark's key of a hopping window; None: its start) None -> last_pane",
    ]
    assert shape_changes(tumbling, tumbling) == []


def old_cut(hopping: Pipeline) -> Cut:
    """A cut an older platform made for ``hopping``: no ``window_key`` in its shape."""
    shape = {k: v for k, v in hopping.state_shape.items() if k != "window_key"}
    return Cut(
        epoch=3, starting_offsets={"payments": {"0": 10}}, origin="rebuild", state_shape=shape
    )


def test_an_old_hopping_checkpoint_cannot_continue(tmp_path: Path) -> None:
    hopping = pipeline()
    where = AppLayout(tmp_path, hopping.application_id)
    with pytest.raises(ConfigError, match=r"window_key .* None -> last_pane.*cannot continue"):
        check_state_shape(where, hopping, old_cut(hopping))
    check_state_shape(where, hopping, replace(old_cut(hopping), state_shape=hopping.state_shape))


def test_an_old_hopping_state_seeds_a_new_checkpoint(tmp_path: Path) -> None:
    hopping = pipeline()
    where = AppLayout(tmp_path, hopping.application_id)
    check_state_shape(where, hopping, old_cut(hopping), new_checkpoint=True)
