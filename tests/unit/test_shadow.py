"""What a backfill computed beside the running stream reads at each step
(``jobs/operations/shadow.py``), against a plain-Python model of offsets (no Spark):
every offset the final plan reads is read exactly once over all the steps, and a
plan that is not a later head of the shadow's own is recomputed whole."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from jobs.cut import StateAction
from jobs.lineage import Boundary
from jobs.operations.plan import Plan
from jobs.operations.shadow import Shadow, advanced, new_ranges

TP = ("clicks", 0)
TP2 = ("clicks", 1)


def plan(ranges: dict[tuple[str, int], list[tuple[int, int]]], **changed: object) -> Plan:
    base = Plan(
        operation="backfill",
        application_id="app",
        reason="fix",
        epoch_before=1,
        epoch_after=2,
        current_offsets={},
        target_offsets={tp: spans[-1][1] for tp, spans in ranges.items() if spans},
        seed_state_version=3,
        state_action=StateAction.PUBLISH,
        boundary=Boundary(1, 4, {TP: 0}, 3, 0, 0),
        read_ranges={f"{t}[{p}]": [list(s) for s in spans] for (t, p), spans in ranges.items()},
    )
    return dataclasses.replace(base, **changed)  # type: ignore[arg-type]


def offsets(ranges: dict[tuple[str, int], list[tuple[int, int]]]) -> set[tuple[object, int]]:
    return {(tp, o) for tp, spans in ranges.items() for b, e in spans for o in range(b, e)}


# A stream's judged ranges growing batch by batch (a skip leaves a hole), per partition.
heads = st.lists(
    st.tuples(st.sampled_from([TP, TP2]), st.integers(1, 50), st.booleans()), max_size=12
)


@given(heads, st.lists(st.integers(0, 12), min_size=1, max_size=4))
def test_the_steps_read_every_offset_of_the_final_plan_once(
    batches: list[tuple[tuple[str, int], int, bool]], cuts: list[int]
) -> None:
    judged: list[dict[tuple[str, int], list[tuple[int, int]]]] = []
    ends = {TP: 0, TP2: 0}
    ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
    judged.append({})
    for tp, size, skipped in batches:
        if not skipped:
            ranges = {**ranges, tp: [*ranges.get(tp, []), (ends[tp], ends[tp] + size)]}
        ends[tp] += size
        judged.append({k: list(v) for k, v in ranges.items()})
    reads: list[tuple[object, int]] = []

    def recompute(p: Plan, added: object, onto: Shadow | None) -> tuple[pa.Table, pa.Table]:
        wanted = p.ranges() if added is None else added
        reads.extend(offsets(wanted))  # type: ignore[arg-type]
        return pa.table({"n": [len(reads)]}), pa.table({"n": [0]})

    shadow = None
    for i in sorted(min(c, len(judged) - 1) for c in cuts):
        shadow = advanced(recompute, shadow, plan(judged[i]))
    shadow = advanced(recompute, shadow, plan(judged[-1]))
    assert sorted(reads, key=str) == sorted(offsets(judged[-1]), key=str)
    assert len(reads) == len(set(reads))


def test_a_plan_that_is_not_a_later_head_is_recomputed_whole() -> None:
    shadow = Shadow(plan({TP: [(0, 10)]}), pa.table({}), pa.table({}))
    assert new_ranges(plan({TP: [(0, 15)]}), shadow) == {TP: [(10, 15)]}
    assert new_ranges(plan({TP: [(0, 10)]}), shadow) == {}
    assert new_ranges(plan({TP: [(0, 5)]}), shadow) is None  # something read is not wanted
    assert new_ranges(plan({TP: [(0, 15)]}, seed_state_version=4), shadow) is None
    assert new_ranges(plan({TP: [(0, 15)]}, source="archive"), shadow) is None
    other = Boundary(1, 5, {TP: 0}, 3, 0, 0)
    assert new_ranges(plan({TP: [(0, 15)]}, boundary=other), shadow) is None
    pinned = {"dims": {"version": 2, "path": ""}}
    assert new_ranges(plan({TP: [(0, 15)]}, dimension_versions=pinned), shadow) is None
