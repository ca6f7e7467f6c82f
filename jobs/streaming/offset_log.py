"""Reading a Spark checkpoint's offset and commit logs (plain files).

``offsets/<n>`` is written before batch n runs: a version line, a metadata JSON
line (with the batch watermark) and one line per source with its end offsets.
``commits/<n>`` is written after batch n's sink returned. The ledger, not this,
is the platform's record; these files tell what Spark itself will do next.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jobs.errors import ConsistencyError
from jobs.warehouse import Location


@dataclass(frozen=True)
class OffsetLogEntry:
    batch_id: int
    end_offsets: dict[str, Any]
    watermark_ms: int
    batch_timestamp_ms: int


def _batch_ids(directory: Location) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def offset_batches(checkpoint: Location) -> list[int]:
    return _batch_ids(checkpoint / "offsets")


def committed_batches(checkpoint: Location) -> list[int]:
    return _batch_ids(checkpoint / "commits")


def read_offsets(checkpoint: Location, batch_id: int) -> OffsetLogEntry:
    path = checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
        metadata = json.loads(lines[1])
        end = json.loads(lines[2])
    except (OSError, IndexError, json.JSONDecodeError) as exc:
        raise ConsistencyError(f"unreadable offset log entry {path}: {exc}") from exc
    return OffsetLogEntry(
        batch_id=batch_id,
        end_offsets=end,
        watermark_ms=int(metadata.get("batchWatermarkMs", 0)),
        batch_timestamp_ms=int(metadata.get("batchTimestampMs", 0)),
    )


def next_watermark(checkpoint: Location, batch_id: int) -> int:
    """The watermark Spark runs the batch after ``batch_id`` with, from that batch's
    commit log entry (a version line, then ``{"nextBatchWatermarkMs": ...}``)."""
    path = checkpoint / "commits" / str(batch_id)
    try:
        metadata = json.loads(path.read_text().splitlines()[1])
    except (OSError, IndexError, json.JSONDecodeError) as exc:
        raise ConsistencyError(f"unreadable commit log entry {path}: {exc}") from exc
    return int(metadata.get("nextBatchWatermarkMs", 0))


def batch_start(previous_end: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """A batch's start offsets: the previous batch's end, and for a partition that
    appeared since (added to the topic), 0: Spark's Kafka source reads a new
    partition from its earliest offset and, with ``failOnDataLoss``, fails the batch
    unless that is 0. The offset log's previous entry does not name it."""
    start = {topic: dict(parts) for topic, parts in previous_end.items()}
    for topic, parts in end.items():
        for part in parts:
            start.setdefault(topic, {}).setdefault(part, 0)
    return start
