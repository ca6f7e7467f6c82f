"""Offset planning for the Kafka source: pure functions, no broker access.

Offsets have the shape of Spark's own Kafka source: ``{topic: {partition: offset}}``
where ``offset`` is the next offset to read. In a starting-offsets JSON, -2 means
earliest and -1 means latest, as in Spark.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from jobs.errors import ConfigError, KafkaUnavailableError, SourceError

EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]
Watermarks = Mapping[TopicPartition, tuple[int, int]]


def to_json_dict(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Offsets as Spark stores them: JSON-safe, string partition keys, sorted."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def from_json_dict(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    try:
        return {
            (str(topic), int(partition)): int(offset)
            for topic, parts in data.items()
            for partition, offset in parts.items()
        }
    except (AttributeError, TypeError, ValueError) as exc:
        raise ConfigError(f"offsets must map topic -> partition -> offset, got {data!r}") from exc


def resolve_starting_offsets(
    spec: str | Offsets,
    partitions: Mapping[str, list[int]],
    marks: Watermarks,
    by_timestamp: Mapping[TopicPartition, int] | None = None,
) -> Offsets:
    """Concrete first offsets for every subscribed partition.

    ``by_timestamp`` (from ``startingTimestamp``) wins over ``spec``. A JSON spec must
    name every partition of the subscribed topics, so nothing is read by accident.
    """
    every = [(topic, p) for topic, parts in partitions.items() for p in parts]
    if by_timestamp is not None:
        return {tp: by_timestamp[tp] for tp in every}
    if spec == "earliest":
        return {tp: marks[tp][0] for tp in every}
    if spec == "latest":
        return {tp: marks[tp][1] for tp in every}
    assert isinstance(spec, dict)
    unknown = sorted(set(spec) - set(every))
    if unknown:
        raise ConfigError(f"startingOffsets names partitions that do not exist: {unknown}")
    missing = sorted(set(every) - set(spec))
    if missing:
        raise ConfigError(f"startingOffsets does not give an offset for {missing}")
    resolved: Offsets = {}
    for tp in every:
        offset = spec[tp]
        low, high = marks[tp]
        if offset == EARLIEST:
            offset = low
        elif offset == LATEST:
            offset = high
        elif offset > high:
            raise ConfigError(f"startingOffsets {tp[0]}[{tp[1]}]={offset} is beyond the end {high}")
        resolved[tp] = offset
    return resolved


def check_not_expired(start: Offsets, marks: Watermarks) -> None:
    """An offset below the log start means records were deleted: never skip silently."""
    for tp, offset in sorted(start.items()):
        low = marks[tp][0]
        if offset < low:
            raise SourceError(
                f"offsets {offset}..{low - 1} of {tp[0]}[{tp[1]}] are no longer on the broker "
                f"(log start is {low}, deleted by retention); rewind or backfill from an archive"
            )


def check_continuity(
    current: Offsets, marks: Watermarks, same_topics: Collection[str] = ()
) -> None:
    """The committed position must still exist on the broker: a partition that
    vanished, or a log end below the committed offset (the topic was deleted and
    recreated, or truncated), means the next records are not the ones that follow
    what was processed. Never skip or wait: stop and name the repair.

    ``same_topics``: topics whose id is known unchanged. Kafka never removes a
    partition, so one of theirs missing is a broker behind on metadata, not a
    recreated topic (whose repair would read it again from its start)."""
    for tp, offset in sorted(current.items()):
        if tp not in marks and tp[0] in same_topics:
            raise KafkaUnavailableError(
                f"the broker does not list {tp[0]}[{tp[1]}], processed up to offset {offset}, "
                "and the topic's id is unchanged: a broker behind on metadata; run again"
            )
        if tp not in marks:
            raise SourceError(
                f"partition {tp[0]}[{tp[1]}] was processed up to offset {offset} but no longer "
                "exists on the broker (topic deleted or recreated with fewer partitions); "
                f"repair: python -m jobs rewind --to-earliest --topics {tp[0]} --mode skip "
                "--reason ... (keeps the state, reads the topic from its start)"
            )
        high = marks[tp][1]
        if high < offset:
            raise SourceError(
                f"{tp[0]}[{tp[1]}] ends at offset {high}, below the committed offset {offset}: "
                "the topic was deleted and recreated (or truncated) under the application; "
                f"repair: python -m jobs rewind --to-earliest --topics {tp[0]} --mode skip "
                "--reason ... (keeps the state, reads the topic from its start)"
            )
