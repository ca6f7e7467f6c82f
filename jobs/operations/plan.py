"""What an operation will do, computed before it does anything (``--dry-run`` prints it).

A plan picks the cut: the offsets the new epoch starts from and the Delta state
version Spark is seeded from, and says what happens to the published ``state``
table (kept, time-travelled back, or emptied) and which writers are fenced.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from jobs.cut import StateAction
from jobs.kafka_source import offsets as kafka_offsets
from jobs.lineage import Boundary, Pin, partition_of

Offsets = kafka_offsets.Offsets


@dataclass
class Plan:
    operation: str
    application_id: str
    reason: str
    epoch_before: int
    epoch_after: int
    current_offsets: Offsets
    target_offsets: Offsets
    seed_state_version: int | None  # None: Spark starts from empty state
    state_action: StateAction
    boundary: Boundary | None = None
    restore_version: int | None = None  # with StateAction.RESTORE
    records_to_replay: int = 0
    skipped: dict[str, list[int]] = field(default_factory=dict)  # "topic[p]" -> [from, to)
    source: str = "kafka"  # where a backfill reads: "kafka" or "archive" (the raw table)
    # Which version of each enrichment's table a backfill joins: "recorded" (the one
    # each batch joined) or "newest" (after a fix of the table).
    dimensions: str = "recorded"
    # With "newest": the table each enrichment joins, fixed when planned (what a
    # reviewed plan showed is what it applies, and what the ledger records): its
    # ``Pin.to_json`` (a bare version in plans saved before tables were pinned).
    dimension_versions: dict[str, Any] = field(default_factory=dict)
    read_from: Offsets = field(default_factory=dict)  # a backfill's first offsets
    # What a backfill reads: the judged offsets after its boundary ("topic[p]" ->
    # [[begin, end), ...]; None: a plan saved before they were); a skipped range is
    # not among them.
    read_ranges: dict[str, list[list[int]]] | None = None
    # Topics a rewind points at their current log: they may have been recreated.
    reset_topics: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plan_id: str | None = None  # a saved plan's id (``saved_plans.py``), when it was reviewed

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The inverse of ``to_dict`` (a saved plan, applied exactly)."""
        fields = dict(data)
        fields.pop("records_skipped", None)
        for name in ("current_offsets", "target_offsets", "read_from"):
            fields[name] = kafka_offsets.from_json_dict(fields.get(name) or {})
        fields["state_action"] = StateAction(fields["state_action"])
        if fields.get("boundary") is not None:
            boundary = dict(fields["boundary"])
            boundary["end_offsets"] = kafka_offsets.from_json_dict(boundary["end_offsets"])
            fields["boundary"] = Boundary(**boundary)
        return cls(**fields)

    @property
    def republishes(self) -> bool:
        """A backfill: it may publish the state under a new definition (new columns)."""
        return self.state_action is StateAction.PUBLISH

    def pins(self) -> dict[str, Pin] | None:
        """``dimension_versions`` as pins (None: the recorded tables)."""
        found = {n: p for n, v in self.dimension_versions.items() if (p := Pin.of(v)) is not None}
        return found or None

    def ranges(self) -> dict[tuple[str, int], list[tuple[int, int]]]:
        """``read_ranges`` by partition; a plan saved without them: [read_from, target)."""
        if self.read_ranges is None:
            return {
                tp: [(self.read_from.get(tp, end), end)]
                for tp, end in self.target_offsets.items()
                if end > self.read_from.get(tp, end)
            }
        return {
            partition_of(name): [(int(b), int(e)) for b, e in spans]
            for name, spans in self.read_ranges.items()
        }

    @property
    def records_skipped(self) -> int:
        return sum(end - start for start, end in self.skipped.values())

    def audit(self, dry_run: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """What the ledger's audit row of this plan records: its details, and the
        current and target offsets (``audit.audit_row``'s last three arguments)."""
        details = {
            "reason": self.reason,
            "plan": self.to_dict(),
            "dry_run": dry_run,
            "epoch_before": self.epoch_before,
            "epoch_after": self.epoch_before if dry_run else self.epoch_after,
        }
        current = kafka_offsets.to_json_dict(self.current_offsets)
        return details, current, kafka_offsets.to_json_dict(self.target_offsets)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["current_offsets"] = kafka_offsets.to_json_dict(self.current_offsets)
        data["target_offsets"] = kafka_offsets.to_json_dict(self.target_offsets)
        data["read_from"] = kafka_offsets.to_json_dict(self.read_from)
        if self.boundary is not None:
            data["boundary"]["end_offsets"] = kafka_offsets.to_json_dict(self.boundary.end_offsets)
        data["records_skipped"] = self.records_skipped
        data["state_action"] = self.state_action.value
        return data

    def describe(self) -> str:
        lines = [
            f"{self.operation} of {self.application_id}: {self.reason}",
            "  partition            current ->   target",
        ]
        for tp in sorted(set(self.current_offsets) | set(self.target_offsets)):
            name = f"{tp[0]}[{tp[1]}]"
            now = self.current_offsets.get(tp, "-")
            then = self.target_offsets.get(tp, "-")
            lines.append(f"  {name:<20} {now!s:>7} -> {then!s:>8}")
        if self.boundary is not None:
            b = self.boundary
            where = (
                f"the cut of epoch {b.epoch} (the state its operation left)"
                if b.batch_id < 0
                else f"epoch {b.epoch} batch {b.batch_id}"
            )
            lines.append(f"  batch boundary: {where} (state table version {b.state_version})")
        seed = (
            "empty state"
            if self.seed_state_version is None
            else f"Delta state version {self.seed_state_version}"
        )
        lines.append(f"  Spark state is seeded from: {seed}")
        action = self.state_action.value
        if self.restore_version is not None:
            action += f" to version {self.restore_version}"
        lines.append(f"  published state table: {action}")
        lines.append(f"  records to replay: {self.records_to_replay}")
        if self.skipped:
            ranges = ", ".join(f"{k} {v[0]}..{v[1] - 1}" for k, v in sorted(self.skipped.items()))
            lines.append(f"  records skipped: {self.records_skipped} ({ranges})")
        lines.append(
            f"  fenced: every writer of epoch {self.epoch_before} (a running stream of it "
            f"stops at its next commit); the application restarts in epoch {self.epoch_after}"
        )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)


def header(
    operation: str, application_id: str, reason: str, epoch: int, current: Offsets
) -> dict[str, Any]:
    """The fields every plan starts with: from the current epoch to the next."""
    return {
        "operation": operation,
        "application_id": application_id,
        "reason": reason,
        "epoch_before": epoch,
        "epoch_after": epoch + 1,
        "current_offsets": current,
    }
