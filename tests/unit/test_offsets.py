"""Offset planning: pure functions, no broker."""

from __future__ import annotations

import pytest

from jobs.errors import ConfigError, SourceError
from jobs.kafka_source import offsets as plan

PARTS = {"a": [0, 1], "b": [0]}
MARKS = {("a", 0): (5, 100), ("a", 1): (0, 40), ("b", 0): (0, 0)}


def test_resolve_earliest_latest_and_json() -> None:
    assert plan.resolve_starting_offsets("earliest", PARTS, MARKS) == {
        ("a", 0): 5,
        ("a", 1): 0,
        ("b", 0): 0,
    }
    assert plan.resolve_starting_offsets("latest", PARTS, MARKS) == {
        ("a", 0): 100,
        ("a", 1): 40,
        ("b", 0): 0,
    }
    spec = {("a", 0): -2, ("a", 1): -1, ("b", 0): 0}
    assert plan.resolve_starting_offsets(spec, PARTS, MARKS) == {
        ("a", 0): 5,
        ("a", 1): 40,
        ("b", 0): 0,
    }


def test_resolve_json_must_name_every_partition_and_only_real_ones() -> None:
    with pytest.raises(ConfigError, match="does not give an offset"):
        plan.resolve_starting_offsets({("a", 0): 1}, PARTS, MARKS)
    with pytest.raises(ConfigError, match="do not exist"):
        plan.resolve_starting_offsets(
            {("a", 0): 1, ("a", 1): 1, ("b", 0): 0, ("c", 0): 0}, PARTS, MARKS
        )
    with pytest.raises(ConfigError, match="beyond the end"):
        plan.resolve_starting_offsets({("a", 0): 101, ("a", 1): 1, ("b", 0): 0}, PARTS, MARKS)


def test_timestamp_lookup_wins() -> None:
    by_ts = {("a", 0): 50, ("a", 1): 40, ("b", 0): 0}
    assert plan.resolve_starting_offsets("earliest", PARTS, MARKS, by_ts) == by_ts


def test_expired_offsets_are_an_error_not_a_skip() -> None:
    with pytest.raises(SourceError, match=r"offsets 2\.\.4 of a\[0\] are no longer on the broker"):
        plan.check_not_expired({("a", 0): 2}, MARKS)
    plan.check_not_expired({("a", 0): 5}, MARKS)


def test_json_round_trip() -> None:
    offsets = {("b", 0): 1, ("a", 10): 2, ("a", 2): 3}
    data = plan.to_json_dict(offsets)
    assert data == {"a": {"10": 2, "2": 3}, "b": {"0": 1}}
    assert plan.from_json_dict(data) == offsets


def test_log_end_below_the_committed_offset_is_an_error_not_zero_lag() -> None:
    # The topic was deleted and recreated: its end (3) is below what was processed (10).
    with pytest.raises(
        SourceError, match=r"a\[0\] ends at offset 3, below the committed offset 10"
    ):
        plan.check_continuity({("a", 0): 10}, {("a", 0): (0, 3)})


def test_a_vanished_partition_is_an_error_not_dropped() -> None:
    with pytest.raises(SourceError, match=r"partition a\[1\] was processed up to offset 7"):
        plan.check_continuity({("a", 0): 1, ("a", 1): 7}, {("a", 0): (0, 5)})
