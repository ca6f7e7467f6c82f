"""Pipeline definitions: the reference pipelines load; bad ones fail clearly."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.errors import ConfigError
from jobs.pipeline.parser import list_pipelines, load_pipeline, parse_pipeline
from jobs.settings import REPO_ROOT

PIPELINES = REPO_ROOT / "include" / "pipelines"
BASE: dict[str, Any] = yaml.safe_load((PIPELINES / "user_clicks.yaml").read_text())


def variant(**changes: Any) -> dict[str, Any]:
    return changed(BASE, **changes)


def changed(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of a pipeline definition with top-level fields replaced (None: removed)."""
    data = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def test_reference_pipelines_load() -> None:
    names = {p.application_id for p in list_pipelines(PIPELINES)}
    assert {"user_clicks", "inventory"} <= names
    clicks = load_pipeline("user_clicks", PIPELINES)
    assert clicks.state_keys == ("user_id", "window_start", "window_end")
    assert clicks.window is not None and clicks.window.size_seconds == 60
    assert clicks.watermark_seconds == 600
    assert clicks.exactly_once
    inventory = load_pipeline("inventory", PIPELINES)
    assert inventory.window is None
    assert "WHEN 'return' THEN -qty" in inventory.derived[0].expr  # version 1's known bug


def test_maintenance_defaults() -> None:
    clicks = load_pipeline("user_clicks", PIPELINES)
    assert clicks.rewind_horizon_seconds == 7 * 86400 and clicks.reader_grace_hours == 1
    custom = parse_pipeline(
        variant(maintenance={"rewind_horizon": "2 days", "reader_grace_hours": 0}), "x"
    )
    assert custom.rewind_horizon_seconds == 2 * 86400 and custom.reader_grace_hours == 0


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(variant(application_id="mine")))
    assert load_pipeline(str(path), PIPELINES).application_id == "mine"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"application_id": "../etc"}, "application_id: must be 1-63 characters"),
        ({"application_id": "Clicks"}, "application_id"),
        # a trailing newline: `$` matches before it, and the id names folders
        ({"application_id": "clicks\n"}, "application_id: must be 1-63 characters"),
        ({"output": {"topic": "out\n"}}, "output.topic: must be a Kafka topic name"),
        ({"keys": ["user_id\n"]}, "keys"),
        ({"aggregations": [{"name": "n\n", "function": "count"}]}, "aggregations[0].name"),
        ({"application_id": None}, "application_id: is required"),
        ({"keys": ["nope"]}, "keys: key 'nope' is not a field"),
        (
            {"schema": {"user_id": "varchar", "timestamp": "long"}},
            "type of 'user_id': unknown type 'varchar'",
        ),
        ({"watermark": None}, "watermark: is required with a window"),
        ({"watermark": "ten minutes"}, "watermark: must be a positive duration"),
        ({"window": {"type": "sliding", "size": "1 minute"}}, "window.type"),
        ({"window": {"type": "hopping", "size": "1 minute", "slide": "7 seconds"}}, "slide"),
        ({"aggregations": [{"name": "n", "function": "median"}]}, "function: must be one of"),
        ({"aggregations": [{"name": "s", "function": "sum", "field": "user_id"}]}, "numeric"),
        ({"aggregations": [{"name": "window_start", "function": "count"}]}, "reserved"),
        ({"processing_guarantee": "maybe"}, "processing_guarantee"),
        ({"shuffle_partitions": 0}, "shuffle_partitions"),
        ({"shuffle_partitions": True}, "shuffle_partitions: must be an integer"),
        ({"colour": "blue"}, "unknown field(s) colour"),
        ({"trigger": {"mode": "sometimes"}}, "trigger.mode"),
        ({"event_time": {"field": "user_id", "unit": "seconds"}}, "event time must be a timestamp"),
        ({"event_time": {"field": "timestamp", "unit": "fortnights"}}, "event_time.unit"),
        ({"event_time": {"field": "timestamp", "max_ahead": "soon"}}, "event_time.max_ahead"),
        ({"event_time": {"field": "timestamp", "not_before": "last year"}}, "not_before"),
        ({"keys": [["user_id"]]}, "keys: each key must be a field name"),
        ({"maintenance": {"rewind_horizon": "forever"}}, "maintenance.rewind_horizon"),
        ({"maintenance": {"rewind_horizon": "400 days"}}, "at most 365 days"),
        ({"maintenance": {"reader_grace_hours": -1}}, "maintenance.reader_grace_hours"),
        ({"maintenance": {"vacuum": True}}, "unknown field(s) vacuum"),
        ({"output": {"topic": "bad topic!"}}, "output.topic: must be a Kafka topic name"),
        ({"output": {"topic": "clicks"}}, "output.topic: 'clicks' is a source topic"),
        ({"output": {"topic": "out", "partitions": 0}}, "output.partitions"),
        ({"output": {"topic": "out", "key": "x"}}, "unknown field(s) key"),
        ({"output": "user_counts"}, "output: must be a mapping"),
        ({"aggregations": [{"name": "updated_at", "function": "count"}]}, "reserved"),
        ({"aggregations": [{"name": "Epoch", "function": "count"}]}, "reserved"),
        ({"aggregations": [{"name": "Window_Start", "function": "count"}]}, "reserved"),
        ({"schema": {"user_id": "string", "timestamp": "long", "epoch": "long"}}, "reserved"),
        (
            {
                "aggregations": [
                    {"name": "clicks", "function": "count"},
                    {"name": "Clicks", "function": "count"},
                ]
            },
            "differ only in case",
        ),
        (
            {
                "aggregations": [
                    {"name": "m", "function": "avg", "field": "timestamp"},
                    {"name": "_sum_m", "function": "count"},
                ]
            },
            "aggregations[1].name: '_sum_m' must be an identifier",
        ),
    ],
)
def test_bad_definitions_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_pipeline(variant(**changes), "p.yaml")
    assert message in str(error.value)
    assert str(error.value).startswith("p.yaml: ")


@pytest.mark.parametrize("topic", ["bad topic!", "clicks\n"])
def test_source_topics_validated(topic: str) -> None:
    data = variant()
    data["source"] = {"topics": [topic]}
    with pytest.raises(ConfigError, match=r"source\.topics"):
        parse_pipeline(data, "p.yaml")


def test_unknown_pipeline_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"defined pipelines: .*user_clicks"):
        load_pipeline("no_such", PIPELINES)
    with pytest.raises(ConfigError, match="not a valid application id"):
        load_pipeline("../../etc/passwd", PIPELINES)


def test_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("a: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(str(path), PIPELINES)


def test_event_time_bounds_default_to_one_day_ahead_and_parse_dates() -> None:
    assert parse_pipeline(variant(), "p.yaml").max_ahead_seconds == 86400
    assert parse_pipeline(variant(), "p.yaml").not_before_us is None
    bounded = variant(
        event_time={"field": "timestamp", "max_ahead": "5 minutes", "not_before": "2020-01-01"}
    )
    pipeline = parse_pipeline(bounded, "p.yaml")
    assert pipeline.max_ahead_seconds == 300
    assert pipeline.not_before_us == 1577836800 * 1_000_000


def test_output_topic_is_optional() -> None:
    assert parse_pipeline(variant(), "p.yaml").output is None
    output = parse_pipeline(variant(output={"topic": "user_counts"}), "p.yaml").output
    assert output is not None and (output.topic, output.partitions) == ("user_counts", 1)


def test_state_shape_changes_are_named() -> None:
    from jobs.pipeline.checks import shape_changes

    before = parse_pipeline(variant(), "p.yaml").state_shape
    wider = parse_pipeline(
        variant(window={"type": "tumbling", "size": "2 minutes"}, shuffle_partitions=4), "p.yaml"
    ).state_shape
    assert shape_changes(before, before) == []
    assert shape_changes(before, wider) == [
        "window [size, slide] (seconds) [60, 60] -> [120, 120]",
        "shuffle_partitions 2 -> 4",
    ]
    # A new version that only fixes a derived sign or the watermark keeps the shape.
    later = parse_pipeline(variant(version=2, watermark="20 minutes"), "p.yaml").state_shape
    assert shape_changes(before, later) == []
