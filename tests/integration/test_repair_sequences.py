"""Seeded random sequences of operations on the real broker and Spark, each step
checked against a plain-Python model (``tests/sequences.py``; longer runs:
``python -m benchmarks.sequences --count N --seed S``)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from jobs.warehouse import Location
from tests.conftest import rotating, run_jobs, run_with_fault
from tests.sequences import Sequence, run_sequence

pytestmark = pytest.mark.integration
# (seed, windowed): one on a windowed pipeline, whose records arrive out of order
# and some late. More seeds and longer sequences: python -m benchmarks.sequences.
SEEDS = [(11, False), (15, True)]
STEPS = 4


@pytest.fixture
def context(spark, settings, kafka_config, new_topic, tmp_path) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """What a sequence drives: a new 2-partition topic, the shared session and broker."""
    return {
        "spark": spark,
        "settings": settings,
        "kafka_config": kafka_config,
        "topic": new_topic(2),
        "directory": tmp_path,
        "run_jobs": run_jobs,
        "run_with_fault": run_with_fault,
    }


@pytest.mark.parametrize(("seed", "windowed"), rotating(SEEDS))
def test_a_random_sequence_of_repairs_keeps_the_state_exact(
    seed: int, windowed: bool, context: dict[str, Any]
) -> None:
    done = run_sequence(seed, STEPS, windowed=windowed, **context)
    print(f"seed {seed}: {done}")


# Enriched from two dimension tables that are loaded, deleted and loaded again, and
# re-pointed, added and removed by new pipeline versions (issue 42).
# A seed from a long run (docs/benchmarks.md) that reloads a table under a replay
# (refused runs, rewinds and rebuilds) and changes enrich:; the long runs
# (python -m benchmarks.sequences) cover the rest.
ENRICHED_SEEDS = [205]


@pytest.mark.parametrize("seed", ENRICHED_SEEDS)
def test_a_random_sequence_with_dimension_changes_keeps_the_state_exact(
    seed: int, context: dict[str, Any]
) -> None:
    done = run_sequence(seed, 8, enriched=True, **context)
    print(f"seed {seed}: {done}")


class Scripted(random.Random):
    """Draws ``queue``'s values first: a sequence's choices, fixed."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.queue: list[float] = []

    def random(self) -> float:
        return self.queue.pop(0) if self.queue else super().random()


def test_recomputations_after_a_topic_is_recreated_keep_the_deleted_logs_judgments(
    context: dict[str, Any],
) -> None:
    """Found by the random sequences: after the repair of a recreated topic, a
    backfill from the earliest offsets dropped the deleted log's judgments (and from
    the archive counted its records at the new log's offsets), and verify reported
    the state that kept them as drift; maintain removed that state's files.
    (``rebuild --from-source`` and backfills from Kafka after a recreation: the
    random sequences.)"""
    rng = Scripted(7)
    rng.queue = [0.1]  # the raw archive on
    sequence = Sequence(
        rng=rng,
        **context,
        # maintain keeps no boundary but the last: the repair's state only as the floor
        maintenance={"rewind_horizon": "1 second", "reader_grace_hours": 0},
    )
    script: list[tuple[Callable[[], None], list[float]]] = [
        (sequence.produce, []),
        (sequence.run, []),
        (sequence.recreate_topic, []),
        (sequence.produce, []),
        (sequence.run, []),
        (sequence.maintain, []),
        (sequence.backfill, [0.9, 0.1]),  # from the earliest offsets, from the archive
        (sequence.verify, []),
    ]
    for operation, draws in script:
        rng.queue = list(draws)
        operation()
        if sequence.points:  # once there is a state
            sequence.check()


# On object storage (the embedded S3 server): the same operations, with crashes
# between commits, through the lease, S3A and jobs/warehouse.py. Seeds chosen to
# cover a crashed run and a crashed operation, rewinds, a rebuild and a backfill.
S3_SEEDS = [(31, False), (32, True)]


@pytest.mark.parametrize(("seed", "windowed"), rotating(S3_SEEDS))
def test_a_random_sequence_on_object_storage_keeps_the_state_exact(
    seed: int,
    windowed: bool,
    context: dict[str, Any],
    s3_warehouse: Location,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A killed holder's lease is taken over after 2-4 s, not 30-60 s.
    monkeypatch.setenv("PLATFORM_LEASE_SECONDS", "2")
    context["settings"] = dataclasses.replace(context["settings"], warehouse=s3_warehouse)
    done = run_sequence(seed, 8, windowed=windowed, **context)
    print(f"seed {seed}: {done}")
