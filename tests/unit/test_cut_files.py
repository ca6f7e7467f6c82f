"""An epoch's cut and seed are never overwritten under a running epoch: a cut is
created put-if-absent, replaced only while no attempt has fenced its epoch (its
writer died or is paused before its bump), and checked again after the bump; a
seed is named by its content and the cut names it. A paused operation that wakes
after another took over cannot change what the new epoch starts from (real
files and Delta tables; no Spark)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from jobs import cut as cuts
from jobs.audit import audit_row
from jobs.cut import (
    Cut,
    StateAction,
    StateChange,
    apply_cut,
    claim_first_cut,
    cut_file,
    read_cut,
    seed_file,
    write_cut,
    write_seed,
)
from jobs.delta.writer import bump_epoch
from jobs.errors import FencedError
from tests import ledger_rows
from tests.output_tables import StateWriter, clicks_pipeline


def a_cut(epoch: int, offset: int) -> Cut:
    return Cut(epoch, {"clicks": {"0": offset}}, "rewind")


@pytest.fixture
def writer(tmp_path: Path) -> StateWriter:
    writer = StateWriter(tmp_path / "warehouse", clicks_pipeline())
    committed = writer.batch({"u1": 3})
    ledger_rows.append(writer.layout, [ledger_rows.batch_row(0, 0, 0, 4, committed)])
    return writer


def test_a_cut_of_an_epoch_not_begun_is_replaced_and_of_a_begun_one_never(
    writer: StateWriter,
) -> None:
    layout = writer.layout
    write_cut(layout, a_cut(1, 10))  # an attempt that died (or is paused) before its bump
    write_cut(layout, a_cut(1, 10))  # the same cut again: a retry of it
    write_cut(layout, a_cut(1, 20))  # another attempt, the epoch still not begun
    assert read_cut(layout, 1) == a_cut(1, 20)
    tables = [layout.table(n) for n in ("_ledger", "state")]
    bump_epoch(tables, layout.application_id, 1, "that attempt's bump")
    with pytest.raises(FencedError, match="epoch 1 of user_clicks began with another cut"):
        write_cut(layout, a_cut(1, 30))  # a paused attempt, woken
    assert read_cut(layout, 1) == a_cut(1, 20)
    write_cut(layout, a_cut(1, 20))  # its own cut, again: nothing to do


def test_the_first_cut_is_claimed_once_and_every_run_agrees(writer: StateWriter) -> None:
    layout = writer.layout
    first = claim_first_cut(layout, Cut(0, {"clicks": {"0": 5}}, "pipeline"))
    later = claim_first_cut(layout, Cut(0, {"clicks": {"0": 9}}, "pipeline"))  # 'latest' moved
    assert first == later == read_cut(layout, 0) == Cut(0, {"clicks": {"0": 5}}, "pipeline")


def test_a_cut_replaced_under_the_bump_stops_the_operation_after_it(
    writer: StateWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt whose bump won, but whose cut another attempt replaced meanwhile,
    stops: its epoch would start from a cut it did not write."""
    layout, pipeline = writer.layout, writer.pipeline
    bump = cuts.bump_epoch

    def replaced_while_paused(paths: list[Any], *args: Any, **kwargs: Any) -> None:
        cut_file(layout, 1).write_text(a_cut(1, 99).to_json())  # the other attempt's
        bump(paths, *args, **kwargs)

    monkeypatch.setattr(cuts, "bump_epoch", replaced_while_paused)
    cut = ledger_rows.rebuild_cut(pipeline)
    state_before = DeltaTable(str(writer.path)).version()
    audit = audit_row(pipeline, "rebuild", 1, {"phase": "started", "reason": "test"})
    with pytest.raises(FencedError, match="another attempt replaced it"):
        apply_cut(
            layout, pipeline, cut, {}, "test", audit, None, [], StateChange(StateAction.EMPTY)
        )
    assert DeltaTable(str(writer.path)).to_pyarrow_table().num_rows == 1  # not emptied
    assert DeltaTable(str(writer.path)).version() == state_before + 1  # the bump only


def test_a_seed_is_named_by_its_content_and_never_overwritten(writer: StateWriter) -> None:
    layout = writer.layout
    first = write_seed(pa.table({"n": [1, 2]}), layout, 1)
    other = write_seed(pa.table({"n": [3]}), layout, 1)  # another attempt of epoch 1
    assert first != other
    for digest in (first, other):
        stored = seed_file(layout, 1, digest).read_bytes()
        assert hashlib.sha256(stored).hexdigest().startswith(digest)
    assert pq.read_table(seed_file(layout, 1, first).path).column("n").to_pylist() == [1, 2]
    assert write_seed(pa.table({"n": [1, 2]}), layout, 1) == first  # the same, again
