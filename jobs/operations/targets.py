"""Target offsets for a rewind, as Kafka's reset tool names them."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from confluent_kafka import Consumer, KafkaException, TopicPartition

from jobs import kafka_admin
from jobs.errors import ConfigError
from jobs.kafka_source import offsets as kafka_offsets

Offsets = kafka_offsets.Offsets
DURATION = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?", re.ASCII
)
# Beyond these a value cannot name a record: Kafka's offsets are signed 64-bit, and
# a duration longer than Kafka has existed reaches no record a shorter one does not.
MAX_OFFSET = 2**63 - 1
MAX_DURATION = timedelta(days=36_500)


TargetKind = Literal["earliest", "latest", "offset", "datetime", "duration", "shift"]

# The option each kind is given with in a rewind; a backfill names its own (``flag``).
REWIND_FLAGS: dict[TargetKind, str] = {
    "earliest": "--to-earliest",
    "latest": "--to-latest",
    "offset": "--to-offset",
    "datetime": "--to-datetime",
    "duration": "--by-duration",
    "shift": "--shift-by",
}


@dataclass(frozen=True)
class TargetSpec:
    """Where an operation's input goes, as the user gave it. Its value is checked
    when it is made, so a command refuses bad input before any work; errors name
    ``flag``, the option it came from (default: the rewind's)."""

    kind: TargetKind
    value: str | None = None
    flag: str = ""

    def __post_init__(self) -> None:
        if not self.flag:
            object.__setattr__(self, "flag", REWIND_FLAGS[self.kind])
        if self.kind in ("earliest", "latest"):
            return
        if self.value is None or not self.value.strip():
            raise ConfigError(f"{self.flag} needs a value")
        if self.kind == "shift":
            parse_shift(self.value, self.flag)
        elif self.kind == "offset":
            _offset_spec(self.value, self.flag)
        elif self.kind == "datetime":
            parse_datetime(self.value, self.flag)
        else:
            parse_duration(self.value, self.flag)


def parse_shift(text: str, flag: str = "--shift-by") -> int:
    if not re.fullmatch(r"[+-]?[0-9]{1,19}", text.strip()) or abs(int(text)) > MAX_OFFSET:
        raise ConfigError(f"{flag} must be an integer (records), got {text!r}")
    return int(text)


def parse_duration(text: str, flag: str = "--by-duration") -> timedelta:
    match = DURATION.fullmatch(text.strip())
    if not match or not any(match.groupdict().values()):
        raise ConfigError(f"{flag} must look like PnDTnHnMnS (e.g. PT1H), got {text!r}")
    parts = {k: int(v or 0) for k, v in match.groupdict().items()}
    seconds = parts["d"] * 86_400 + parts["h"] * 3_600 + parts["m"] * 60 + parts["s"]
    if seconds > MAX_DURATION.total_seconds():
        raise ConfigError(f"{flag} must be at most P{MAX_DURATION.days}D, got {text!r}")
    return timedelta(seconds=seconds)


def parse_datetime(text: str, flag: str = "--to-datetime") -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ConfigError(f"{flag} must be ISO 8601, got {text!r}") from exc
    if moment.tzinfo is None:
        raise ConfigError(f"{flag} needs a time zone (e.g. 2026-11-21T10:00:00Z): {text!r}")
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
        shift = parse_shift(spec.value or "", spec.flag)
        target = {
            tp: min(max(current.get(tp, marks[tp][0]) + shift, marks[tp][0]), marks[tp][1])
            for tp in parts
        }
    elif spec.kind == "offset":
        target = _named_partitions(_offset_spec(spec.value or "", spec.flag), parts, spec.flag)
    else:
        if spec.kind == "datetime":
            moment = parse_datetime(spec.value or "", spec.flag)
            millis = int(moment.timestamp() * 1000)
        else:
            ago = parse_duration(spec.value or "", spec.flag).total_seconds()
            millis = int((time.time() - ago) * 1000)
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


def _offset_spec(text: str, flag: str) -> int | Offsets:
    """One offset for every partition, or JSON topic -> partition -> offset: whole
    numbers from 0 (JSON's 1.9 or true would be read as 1 otherwise)."""
    text = text.strip()
    if re.fullmatch(r"[0-9]{1,19}", text) and int(text) <= MAX_OFFSET:
        return int(text)
    shape = f"{flag} must be a number or JSON topic -> partition -> offset, got {text!r}"
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ConfigError(shape) from exc
    if not _whole_offsets(data):
        raise ConfigError(f"{shape}; offsets are whole numbers from 0")
    return kafka_offsets.from_json_dict(data)


def _whole_offsets(data: object) -> bool:
    """Topic -> partition -> offset, each offset a whole number from 0 (not a bool)."""
    if not isinstance(data, dict) or not data:
        return False
    for parts in data.values():
        if not isinstance(parts, dict) or not parts:
            return False
        for partition, offset in parts.items():
            if not re.fullmatch(r"[0-9]{1,10}", partition) or type(offset) is not int:
                return False
            if not 0 <= offset <= MAX_OFFSET:
                return False
    return True


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not an offset")


def _named_partitions(given: int | Offsets, parts: list[tuple[str, int]], flag: str) -> Offsets:
    if isinstance(given, int):
        return {tp: given for tp in parts}
    missing = sorted(set(parts) - set(given))
    unknown = sorted(set(given) - set(parts))
    if missing or unknown:
        raise ConfigError(f"{flag} must name exactly {parts}; missing {missing}, unknown {unknown}")
    return given


def _offsets_for_time(
    config: Mapping[str, str],
    parts: list[tuple[str, int]],
    marks: Mapping[tuple[str, int], tuple[int, int]],
    millis: int,
) -> Offsets:
    consumer = Consumer({**config, "group.id": "platform-operations"})
    what = f"cannot find the offsets of a time in {', '.join(sorted({t for t, _ in parts}))}"
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(t, p, millis) for t, p in parts], timeout=kafka_admin.REQUEST_TIMEOUT_S
        )
    except KafkaException as exc:
        raise kafka_admin.kafka_error(what, exc) from exc
    finally:
        consumer.close()
    # A partition the broker could not answer for keeps the time in place of its offset.
    for tp in found:
        if tp.error is not None:
            where = f"cannot find the offset of a time in {tp.topic}[{tp.partition}]"
            raise kafka_admin.kafka_error(where, KafkaException(tp.error))
    return {
        (tp.topic, tp.partition): tp.offset
        if tp.offset >= 0
        else marks[(tp.topic, tp.partition)][1]
        for tp in found
    }
