"""The operation runner around the fence, without Spark or a broker: a real state
table and ledger (delta-rs), a stand-in for the running stream's lock."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.cut import read_cut
from jobs.errors import ConfigError
from jobs.ledger import current_epoch, unfinished_operation
from jobs.operations import restart, runner
from jobs.operations.plan import Plan
from jobs.settings import Settings, load_settings
from tests import ledger_rows as ledger
from tests.output_tables import StateWriter, clicks_pipeline


@pytest.fixture
def stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[StateWriter, Settings]:
    """Two batches committed (state and ledger); the stream holds the application
    until it is fenced (the first look at the lock sees it, later ones do not)."""
    state = StateWriter(tmp_path, clicks_pipeline())
    versions = [state.batch(counts) for counts in ({"a": 1, "b": 2}, {"a": 3})]
    ledger.append(
        state.layout,
        [ledger.batch_row(0, b, 100 * b, 100 * (b + 1), v) for b, v in enumerate(versions)],
    )
    looks = iter([{"purpose": "run --trigger continuous", "pid": 1}])
    monkeypatch.setattr(runner, "holder", lambda _layout: next(looks, None))
    monkeypatch.setattr(kafka_admin, "topic_ids", lambda *_a: {})
    return state, dataclasses.replace(load_settings(), warehouse=tmp_path)


def state_rows(state: StateWriter) -> list[tuple[str, int]]:
    table = DeltaTable(str(state.path)).to_pyarrow_table(columns=["user_id", "clicks"])
    return sorted(zip(table["user_id"].to_pylist(), table["clicks"].to_pylist(), strict=True))


def test_a_plan_refused_after_the_fence_leaves_the_stream_resumable(stream) -> None:  # type: ignore[no-untyped-def]
    state, settings = stream
    pipeline, layout = state.pipeline, state.layout
    before = state_rows(state)
    plans = iter([restart.plan_rebuild(pipeline, settings, "stand-in", from_source=False)])

    def make_plan() -> Plan:
        # The first plan holds; the one under the lock (after the fence) is refused,
        # as a skip rewind is when the stream committed past its target meanwhile.
        found = next(plans, None)
        if found is None:
            raise ConfigError("--mode skip only moves forward")
        return found

    with pytest.raises(ConfigError, match=r"only moves forward.*nothing was changed"):
        runner.run_operation(pipeline, settings, make_plan, echo=lambda _m: None)
    # Not stuck: nothing unfinished, the new epoch has a cut at the stream's position,
    # and the state is as the ledger has it.
    assert unfinished_operation(layout) is None
    epoch = current_epoch(layout)
    assert epoch == 2  # the fence, then the epoch that resumes the stream
    cut = read_cut(layout, epoch)
    assert cut is not None and cut.offsets() == {("clicks", 0): 200}
    assert state_rows(state) == before == [("a", 3), ("b", 2)]


def test_a_check_refused_before_the_bump_leaves_the_stream_resumable(stream) -> None:  # type: ignore[no-untyped-def]
    state, settings = stream
    pipeline, layout = state.pipeline, state.layout
    before = state_rows(state)

    def make_plan() -> Plan:
        return restart.plan_rebuild(pipeline, settings, "stand-in", from_source=False)

    def apply(_plan: Plan) -> dict[str, Any]:
        # As apply_plan's checks before its bump refuse (a state shape the new
        # pipeline file cannot continue, a topic recreated under the stream).
        raise ConfigError("the pipeline changes what Spark's state holds")

    with pytest.raises(ConfigError, match=r"state holds.*nothing was changed"):
        runner.run_operation(pipeline, settings, make_plan, echo=lambda _m: None, apply=apply)
    assert unfinished_operation(layout) is None
    assert current_epoch(layout) == 2
    assert state_rows(state) == before
