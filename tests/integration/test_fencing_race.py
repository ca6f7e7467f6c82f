"""An epoch bump racing a delta-spark append, many times: the append either
commits before the bump or is refused, never after it, never half.
``RACE_TRIALS`` sets how many (100 by default: each costs an append, ~0.7 s)."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from jobs.delta.writer import BatchWriter, bump_epoch
from jobs.errors import FencedError

pytestmark = pytest.mark.integration

APP = "race"
TRIALS = int(os.environ.get("RACE_TRIALS", "100"))


def test_a_bump_racing_an_append_fences_it_atomically(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "changelog"
    schema = pa.schema([("k", pa.string()), ("epoch", pa.int64()), ("batch_id", pa.int64())])
    write_deltalake(str(path), pa.Table.from_pylist([], schema))
    rng = random.Random(7)
    outcomes = {"committed": 0, "fenced": 0}
    for epoch in range(TRIALS):
        frame = spark.range(5).select(
            F.col("id").cast("string").alias("k"),
            F.lit(epoch).cast("long").alias("epoch"),
            F.lit(0).cast("long").alias("batch_id"),
        )
        writer = BatchWriter(APP, epoch)
        bumped: list[int] = []

        def bump(delay: float, new_epoch: int, bumped: list[int]) -> None:
            time.sleep(delay)
            bump_epoch([path], APP, new_epoch, "race")
            bumped.append(DeltaTable(str(path)).version())

        racer = threading.Thread(target=bump, args=(rng.uniform(0.0, 1.0), epoch + 1, bumped))
        racer.start()
        try:
            version, _ran = writer.append_frame(path, 0, frame)
        except FencedError:
            version = None
        racer.join()
        rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        mine = [r for r in rows if r["epoch"] == epoch]
        if version is None:
            outcomes["fenced"] += 1
            assert mine == [], f"trial {epoch}: refused, yet its rows are in the table"
        else:
            outcomes["committed"] += 1
            assert len(mine) == 5, f"trial {epoch}: committed {len(mine)} of 5 rows"
            assert version < bumped[0], f"trial {epoch}: committed after the bump"
        # The fenced writer can never commit later either.
        with pytest.raises(FencedError):
            writer.append_frame(path, 1, frame)
    # Both sides of the race happened, many times.
    assert min(outcomes.values()) >= TRIALS // 10, outcomes
