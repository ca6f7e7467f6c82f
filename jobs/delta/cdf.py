"""The ``state`` table's change data feed, one version at a time.

``state`` is created with ``delta.enableChangeDataFeed``. A merge writes its
changes as update pre/post images and inserts; a restore or a delete has no
change files, so delta-rs reads the files the commit removed as deletes and the
files it added as inserts (measured with deltalake 1.6: a restore re-adds whole
files, so an unchanged row shows up as a delete and an identical insert).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from jobs.warehouse import Location

CHANGE_TYPE = "_change_type"
AFTER = ("insert", "update_postimage")
BEFORE = ("delete", "update_preimage")


def version_changes(path: Location, version: int) -> pa.Table:
    """Every change row of one version, with ``_change_type``."""
    feed = DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version)
    return plain_strings(pa.table(feed.read_all()))


def rows_of(changes: pa.Table, kinds: tuple[str, ...], columns: list[str]) -> pa.Table:
    """The change rows of ``kinds`` (``AFTER`` or ``BEFORE``), as table rows."""
    return changes.filter(pc.is_in(changes[CHANGE_TYPE], pa.array(kinds))).select(columns)


def plain_strings(table: pa.Table) -> pa.Table:
    """The change data feed reads strings as string_view and bytes (a distinct
    count's sketch) as binary_view, which few kernels take (``take`` does not)."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    schema = pa.schema(
        [pa.field(f.name, plain.get(f.type, f.type), f.nullable) for f in table.schema]
    )
    return table.cast(schema)
