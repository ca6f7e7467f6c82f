"""What one ``state`` version changed, per (key, window): the rows to publish.

Every change to ``state`` is a version: a batch's merge, and an operation's
restore, delete or merge. The net change of a version is, per state key, its new
row (an insert or update post-image that is not identical to the row it
replaced) or, for a key the version removed, a deletion. A restore re-adds whole
files (``jobs/delta/cdf.py``), so its unchanged rows cancel out here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from jobs.delta.cdf import AFTER, BEFORE, rows_of, version_changes
from jobs.delta.log import commit_infos as log_commit_infos
from jobs.errors import ConsistencyError
from jobs.resolution import Resolved
from jobs.warehouse import Location

Kind = Literal["change", "correction", "snapshot"]


@dataclass(frozen=True)
class VersionChanges:
    version: int
    kind: Kind  # change: a batch's; correction: an operation's; snapshot: whole state
    operation: str  # the commit's platform_operation ("batch", "rewind", ...)
    epoch: int
    batch_id: int  # -1: not a batch
    pipeline_version: str
    upserts: pa.Table  # state rows (state schema)
    deletes: pa.Table  # state keys only

    @property
    def num_records(self) -> int:
        return int(self.upserts.num_rows) + int(self.deletes.num_rows)


def commit_infos(path: Location, first: int, last: int) -> dict[int, dict[str, Any]]:
    """The commit info of versions ``first..last`` (the newest commits of the log)."""
    found = log_commit_infos(path, first, last)
    missing = [v for v in range(first, last + 1) if v not in found]
    if missing:
        raise ConsistencyError(
            f"{path}: the log no longer has version(s) {missing[0]}..{missing[-1]}"
        )
    return found


def net_changes(
    resolved: Resolved, path: Location, version: int, info: dict[str, Any]
) -> VersionChanges:
    pipeline = resolved.pipeline
    columns = list(resolved.state_schema.names)
    keys = list(pipeline.state_keys)
    feed = version_changes(path, version)
    after = rows_of(feed, AFTER, columns)
    before = rows_of(feed, BEFORE, columns)
    if after.group_by(keys).aggregate([]).num_rows != after.num_rows:
        raise ConsistencyError(
            f"{path} version {version} has two new rows for one key: the state table is "
            "damaged (repair: python -m jobs backfill --from-earliest)"
        )
    deletes = before.select(keys).join(after.select(keys), keys=keys, join_type="left anti")
    deletes = deletes.group_by(keys).aggregate([])
    if before.num_rows and after.num_rows:
        # A row removed and added back as it was (a restore's whole files): no change.
        after = without_unchanged(after, before, keys, columns)
    operation = str(info.get("platform_operation", info.get("operation", "unknown")))
    return VersionChanges(
        version=version,
        kind="change" if operation == "batch" else "correction",
        operation=operation,
        epoch=int(info.get("epoch", -1)),
        batch_id=int(info.get("batch_id", -1)) if operation == "batch" else -1,
        pipeline_version=str(info.get("pipeline_version", pipeline.version)),
        upserts=after.select(columns),
        deletes=deletes.select(keys),
    )


def without_unchanged(
    after: pa.Table, before: pa.Table, keys: list[str], columns: list[str]
) -> pa.Table:
    """``after`` without the rows identical to their key's ``before`` row. Compared
    column by column, NULL equal to NULL and NaN to NaN (a join on all columns
    never matches a NULL, so a restore would re-send every row holding one)."""
    values = [c for c in columns if c not in keys]
    renamed = [f"{c}\0before" for c in values]
    pairs = after.select(keys + values).join(
        before.select(keys + values).rename_columns(keys + renamed), keys, join_type="inner"
    )
    if not pairs.num_rows:
        return after
    same = pa.array([True] * pairs.num_rows)
    for column, other in zip(values, renamed, strict=True):
        same = pc.and_(same, _equal(pairs[column], pairs[other]))
    unchanged = pairs.filter(same).select(keys)
    return after.join(unchanged, keys, join_type="left anti")


def _equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    equal = pc.equal(a, b)
    if pa.types.is_floating(a.type):
        equal = pc.or_kleene(equal, pc.and_kleene(pc.is_nan(a), pc.is_nan(b)))
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    return pc.fill_null(pc.or_kleene(equal, both_null), False)


def snapshot(resolved: Resolved, path: Location, version: int, epoch: int) -> VersionChanges:
    """The whole state at ``version``, as one snapshot."""
    pipeline = resolved.pipeline
    columns = list(resolved.state_schema.names)
    rows = DeltaTable(str(path), version=version).to_pyarrow_table(columns=columns)
    keys = list(pipeline.state_keys)
    return VersionChanges(
        version=version,
        kind="snapshot",
        operation="snapshot",
        epoch=epoch,
        batch_id=-1,
        pipeline_version=str(pipeline.version),
        upserts=rows,
        deletes=rows.select(keys).slice(0, 0),
    )
