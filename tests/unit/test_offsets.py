"""Offset planning: pure functions, no broker."""

from __future__ import annotations

import pytest

from jobs.errors import ConfigError, SourceError
from jobs.kafka_source import offsets as plan

PARTS = {"a": [0, 1], "b": [0]}
MARKS = {("a", 0): (5, 100), ("a", 1): (0, 40), ("b", 0): (0, 0)}


def test_parse_keywords_and_json() -> None:
    assert plan.parse_starting_offsets("earliest") == "earliest"
    assert plan.parse_starting_offsets(" latest ") == "latest"
    assert plan.parse_starting_offsets('{"a": {"0": 7, "1": -2}}') == {("a", 0): 7, ("a", 1): -2}


@pytest.mark.parametrize("spec", ["oldest", "{", '{"a": 3}', '{"a": {"x": 1}}', '{"a": {"0": -3}}'])
def test_parse_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigError):
        plan.parse_starting_offsets(spec)


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


def test_plan_end_reads_everything_without_limit() -> None:
    start = {("a", 0): 10, ("a", 1): 40, ("b", 0): 0}
    assert plan.plan_end(start, MARKS, None) == {("a", 0): 100, ("a", 1): 40, ("b", 0): 0}


def test_plan_end_shares_the_limit_by_lag_exactly() -> None:
    marks = {("a", 0): (0, 1000), ("a", 1): (0, 300), ("b", 0): (0, 1)}
    start = {("a", 0): 0, ("a", 1): 0, ("b", 0): 0}
    end = plan.plan_end(start, marks, 100)
    assert sum(end[tp] - start[tp] for tp in start) == 100
    assert end[("a", 0)] > end[("a", 1)] > 0
    assert all(end[tp] <= marks[tp][1] for tp in end)
    # Deterministic: the same inputs plan the same batch.
    assert plan.plan_end(start, marks, 100) == end


def test_plan_end_never_goes_backwards_or_past_the_end() -> None:
    marks = {("a", 0): (0, 10)}
    assert plan.plan_end({("a", 0): 10}, marks, 5) == {("a", 0): 10}
    assert plan.plan_end({("a", 0): 8}, marks, 5) == {("a", 0): 10}


def test_new_partitions_join_at_their_log_start_without_reading() -> None:
    marks = {("a", 0): (0, 10), ("a", 1): (3, 20)}
    end = plan.plan_end({("a", 0): 4}, marks, None)
    assert end == {("a", 0): 10, ("a", 1): 3}


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
        plan.plan_end({("a", 0): 10}, {("a", 0): (0, 3)}, None)


def test_a_vanished_partition_is_an_error_not_dropped() -> None:
    with pytest.raises(SourceError, match=r"partition a\[1\] was processed up to offset 7"):
        plan.plan_end({("a", 0): 1, ("a", 1): 7}, {("a", 0): (0, 5)}, None)
