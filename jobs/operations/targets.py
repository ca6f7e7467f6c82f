"""Target offsets for a rewind, as Kafka's reset tool names them."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from confluent_kafka import Consumer, TopicPartition

from jobs import kafka_admin
from jobs.errors import ConfigError
from jobs.kafka_source import offsets as kafka_offsets

Offsets = kafka_offsets.Offsets
DURATION = re.compile(r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$")


TargetKind = Literal["earliest", "latest", "offset", "datetime", "duration", "shift"]


@dataclass(frozen=True)
class TargetSpec:
    kind: TargetKind
    value: str | None = None


def parse_duration(text: str) -> timedelta:
    match = DURATION.match(text)
    if not match or not any(match.groupdict().values()):
        raise ConfigError(f"--by-duration must look like PnDTnHnMnS (e.g. PT1H), got {text!r}")
    parts = {k: int(v or 0) for k, v in match.groupdict().items()}
    return timedelta(days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])


def parse_datetime(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(f"--to-datetime must be ISO 8601, got {text!r}") from exc
    if moment.tzinfo is None:
        raise ConfigError(f"--to-datetime needs a time zone (e.g. 2026-11-21T10:00:00Z): {text!r}")
    return moment


def resolve_targets(
    spec: TargetSpec,
    current: Offsets,
    marks: Mapping[tuple[str, int], tuple[int, int]],
    config: Mapping[str, str],
) -> Offsets:
    """Target offset per partition in ``marks`` (the selected topics)."""
    parts = sorted(marks)
    if spec.kind == "earliest":
        target = {tp: marks[tp][0] for tp in parts}
    elif spec.kind == "latest":
        target = {tp: marks[tp][1] for tp in parts}
    elif spec.kind == "shift":
        try:
            shift = int(spec.value or "")
        except ValueError as exc:
            raise ConfigError(f"--shift-by must be an integer, got {spec.value!r}") from exc
        target = {
            tp: min(max(current.get(tp, marks[tp][0]) + shift, marks[tp][0]), marks[tp][1])
            for tp in parts
        }
    elif spec.kind == "offset":
        target = _offset_spec(spec.value or "", parts)
    else:
        if spec.kind == "datetime":
            moment = parse_datetime(spec.value or "")
            millis = int(moment.timestamp() * 1000)
        else:
            millis = int((time.time() - parse_duration(spec.value or "").total_seconds()) * 1000)
        target = _offsets_for_time(config, parts, marks, millis)
    for tp, offset in target.items():
        low, high = marks[tp]
        if offset < low:
            raise ConfigError(
                f"target {tp[0]}[{tp[1]}]={offset} is below the log start {low}: those records "
                "were deleted by retention (backfill from the raw archive instead)"
            )
        if offset > high:
            raise ConfigError(f"target {tp[0]}[{tp[1]}]={offset} is beyond the log end {high}")
    return target


def _offset_spec(text: str, parts: list[tuple[str, int]]) -> Offsets:
    text = text.strip()
    if text.isdigit():
        return {tp: int(text) for tp in parts}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--to-offset must be a number or JSON topic -> partition -> offset, got {text!r}"
        ) from exc
    given = kafka_offsets.from_json_dict(data)
    missing = sorted(set(parts) - set(given))
    unknown = sorted(set(given) - set(parts))
    if missing or unknown:
        raise ConfigError(
            f"--to-offset must name exactly {parts}; missing {missing}, unknown {unknown}"
        )
    return given


def _offsets_for_time(
    config: Mapping[str, str],
    parts: list[tuple[str, int]],
    marks: Mapping[tuple[str, int], tuple[int, int]],
    millis: int,
) -> Offsets:
    consumer = Consumer({**config, "group.id": "platform-operations"})
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(t, p, millis) for t, p in parts], timeout=kafka_admin.REQUEST_TIMEOUT_S
        )
    finally:
        consumer.close()
    return {
        (tp.topic, tp.partition): tp.offset
        if tp.offset >= 0
        else marks[(tp.topic, tp.partition)][1]
        for tp in found
    }
