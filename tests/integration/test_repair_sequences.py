"""Seeded random sequences of operations on the real broker and Spark, each step
checked against a plain-Python model (``tests/sequences.py``; longer runs:
``python -m benchmarks.sequences --count N --seed S``)."""

from __future__ import annotations

import pytest

from tests.conftest import run_jobs, run_with_fault
from tests.sequences import run_sequence

pytestmark = pytest.mark.integration
SEEDS = [11, 12, 13, 14, 15, 16]
STEPS = 4


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_sequence_of_repairs_keeps_the_state_exact(  # type: ignore[no-untyped-def]
    seed, spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    done = run_sequence(
        seed,
        STEPS,
        spark=spark,
        settings=settings,
        kafka_config=kafka_config,
        topic=new_topic(2),
        directory=tmp_path,
        run_jobs=run_jobs,
        run_with_fault=run_with_fault,
    )
    print(f"seed {seed}: {done}")
