"""The backfill preview: changes by key ranked by size, a histogram of the
differences, and its plot as a PNG (no Spark)."""

from __future__ import annotations

import math
from pathlib import Path

from jobs import resolution
from jobs.cut import StateAction
from jobs.operations.backfill import preview
from jobs.operations.plan import Plan
from jobs.operations.preview_plot import write_plot
from jobs.operations.verify import close
from tests.output_tables import clicks_pipeline, state_rows

PNG = b"\x89PNG\r\n\x1a\n"


def aggregates(counts: dict[str, int]):  # type: ignore[no-untyped-def]
    pipeline = clicks_pipeline()
    return state_rows(pipeline, counts, 0).select(resolution.of(pipeline).aggregate_schema.names)


def test_changes_ranked_by_size_with_a_histogram() -> None:
    before = aggregates({"a": 1, "b": 10, "c": 5, "gone": 3})
    after = aggregates({"a": 2, "b": 40, "c": 5, "new": 7})
    report = preview(clicks_pipeline(), before, after)
    assert (report["keys_changed"], report["keys_added"], report["keys_removed"]) == (2, 1, 1)
    # b moved by 30, new by 7 (from nothing), gone by -3, a by 1; c did not change.
    assert [s["user_id"] for s in report["samples"]] == ["b", "new", "gone", "a"]
    assert report["samples"][0]["before"]["clicks"] == 10
    assert report["samples"][0]["after"]["clicks"] == 40
    hist = report["differences"]["clicks"]
    assert sum(hist["counts"]) == 4
    assert math.isclose(hist["edges"][0], -3) and math.isclose(hist["edges"][-1], 30)


def test_values_within_a_tolerance_are_the_same_for_verify() -> None:
    assert close(0.1 + 0.2, 0.3) and not close(0.3, 0.31) and close(3, 3) and not close(3, 4)


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    report = preview(clicks_pipeline(), aggregates({"a": 1}), aggregates({"a": 4, "b": 2}))
    plan = Plan(
        operation="backfill",
        application_id="user_clicks",
        reason="fix",
        epoch_before=0,
        epoch_after=1,
        current_offsets={},
        target_offsets={},
        seed_state_version=None,
        state_action=StateAction.PUBLISH,
    )
    path = write_plot(plan, report, tmp_path / "preview.png")
    assert path.read_bytes().startswith(PNG) and path.stat().st_size > 5_000
    empty = preview(clicks_pipeline(), aggregates({"a": 1}), aggregates({"a": 1}))
    assert write_plot(plan, empty, tmp_path / "none.png").read_bytes().startswith(PNG)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_non_finite_difference_is_left_out_of_the_histogram() -> None:
    from jobs.operations.backfill import histogram

    assert histogram([float("nan"), float("inf")]) is None
    assert sum(histogram([1.0, float("nan"), 2.0])["counts"]) == 2  # type: ignore[index]
