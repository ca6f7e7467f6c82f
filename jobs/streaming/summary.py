"""What a run did, batch by batch: what ``run_pipeline`` returns, a warm driver
sends its client, and ``run`` prints. Plain data, so that a warm driver's client
imports no Spark."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchResult:
    batch_id: int
    skipped: bool
    ledger: dict[str, Any]


@dataclass
class RunSummary:
    application_id: str
    epoch: int
    batches: list[BatchResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def records_in(self) -> int:
        return sum(int(b.ledger.get("records_in", 0)) for b in self.batches if not b.skipped)
