"""The cut an epoch starts from: a state snapshot, the offsets it is exact for, and
the epoch number. Every start of an application is one of these.

    <warehouse>/<app>/_checkpoints/epoch=<n>.json          the offsets (and the seed)
    <warehouse>/<app>/_checkpoints/epoch=<n>.seed.parquet  the state snapshot, if any

A new application's first cut has no snapshot and the pipeline's starting offsets;
rebuild, rewind and backfill write the next epoch's cut before they bump the epoch
(see ``jobs/operations``), so a crash in between leaves an inert file, never an
epoch without its cut.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jobs.delta.layout import AppLayout


@dataclass(frozen=True)
class Cut:
    epoch: int
    starting_offsets: dict[str, dict[str, int]]
    origin: str  # "pipeline" or the operation that made it
    seed_rows: int | None = None  # rows in the seed file; None: start from empty state

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def cut_file(layout: AppLayout, epoch: int) -> Path:
    return layout.checkpoints / f"epoch={epoch}.json"


def seed_file(layout: AppLayout, epoch: int) -> Path:
    return layout.checkpoints / f"epoch={epoch}.seed.parquet"


def read_cut(layout: AppLayout, epoch: int) -> Cut | None:
    path = cut_file(layout, epoch)
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return Cut(
        epoch=int(data["epoch"]),
        starting_offsets=data["starting_offsets"],
        origin=str(data.get("origin", "pipeline")),
        seed_rows=data.get("seed_rows"),
    )


def write_cut(layout: AppLayout, cut: Cut) -> None:
    path = cut_file(layout, cut.epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cut.to_json())
    tmp.rename(path)  # atomic: a crash leaves either no file or a whole one
