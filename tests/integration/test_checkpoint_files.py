"""Spark's checkpoint files on object storage are created put-if-absent: of two
drivers that plan the same batch (a paused holder woken after a takeover), the
store refuses the second ``offsets/N``; a probe followed by a plain PUT would let
the last writer win, and the ledger would name offsets Spark did not process."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.warehouse import Location

pytestmark = pytest.mark.integration
MANAGER = "platform.streaming.AbortableCheckpointFileManager"


def checkpoint_manager(spark: Any, folder: Location) -> Any:
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(folder.spark_uri)
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    return getattr(jvm, MANAGER)(path, conf), path


def test_two_writers_of_one_batch_file_the_second_is_refused_by_the_store(  # type: ignore[no-untyped-def]
    spark, s3_warehouse: Location
) -> None:
    folder = s3_warehouse / "checkpoint" / "offsets"
    manager, path = checkpoint_manager(spark, folder)
    batch = spark._jvm.org.apache.hadoop.fs.Path(path, "7")
    # Both open before either closes: each passed any probe for "not there yet".
    first = manager.createAtomic(batch, False)
    second = manager.createAtomic(batch, False)
    first.write(b"first driver")
    second.write(b"second driver")
    first.close()
    with pytest.raises(Exception, match=r"FileAlreadyExists|PreconditionFailed|412"):
        second.close()
    assert (folder / "7").read_bytes() == b"first driver"
    # Spark's own overwrite (state store files) still replaces.
    again = manager.createAtomic(batch, True)
    again.write(b"replaced")
    again.close()
    assert (folder / "7").read_bytes() == b"replaced"


def test_an_abandoned_write_leaves_nothing(spark, s3_warehouse: Location) -> None:  # type: ignore[no-untyped-def]
    folder = s3_warehouse / "checkpoint" / "commits"
    manager, path = checkpoint_manager(spark, folder)
    batch = spark._jvm.org.apache.hadoop.fs.Path(path, "3")
    abandoned = manager.createAtomic(batch, False)
    abandoned.write(b"half")
    abandoned.cancel()
    assert not (folder / "3").exists()
    written = manager.createAtomic(batch, False)
    written.write(b"whole")
    written.close()
    assert (folder / "3").read_bytes() == b"whole"
