"""A stream paused with SIGSTOP at each named point past its lease, while another
machine takes the application over and runs it, writes nothing once resumed and
stops with one error line; the results stay exact (tests/pause_harness.py)."""

from __future__ import annotations

import pytest

from tests.conftest import jobs_args, pipeline_file, recent_clicks
from tests.pause_harness import (
    BAD,
    FIXED_SEEDS,
    SEED,
    STREAM_POINTS,
    assert_no_write_after,
    assert_stopped_by_its_lease,
    check_exact,
    end,
    paused_machine,
    produce_all,
    random_point,
    resume_and_end,
    run_here,
    stopped,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def machine(s3_server, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    with paused_machine(s3_server, tmp_path, monkeypatch) as found:
        yield found


# "new": this run's own seed (chosen in the worker that runs it: the test's id is the
# same in every worker, as pytest-xdist requires).
@pytest.mark.parametrize("seed", [*FIXED_SEEDS, "new"])
def test_a_stream_paused_past_its_lease_writes_nothing_once_another_took_over(  # type: ignore[no-untyped-def]
    seed: int | str, spark, machine, broker, kafka_config, new_topic, s3_warehouse, tmp_path
) -> None:
    seed = SEED if seed == "new" else int(seed)
    point = random_point(seed)
    print(f"PLATFORM_PAUSE_SEED={seed}: PLATFORM_PAUSE={point}")
    topic = new_topic(2)
    values = produce_all(kafka_config, topic, recent_clicks(900, 1) + BAD)
    path = pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=300)
    args = jobs_args(path, broker.bootstrap_servers, s3_warehouse, "run", "--quiet")
    paused = machine.start([*args, "--trigger", "continuous"], point)
    try:
        stopped(paused)
        run_here(spark, args)  # takes the lease over once it expired, and runs
        values += produce_all(kafka_config, topic, recent_clicks(400, 2))  # for the next
        woke, err = resume_and_end(paused)
    finally:
        end(paused)
    assert_stopped_by_its_lease(paused, err)
    assert_no_write_after(machine.proxy, woke)
    run_here(spark, args)
    check_exact(s3_warehouse, topic, kafka_config, values)


def test_the_fixed_seeds_pause_at_every_stream_point() -> None:
    points = {random_point(seed).split("@")[0] for seed in FIXED_SEEDS}
    assert len(points) == len(FIXED_SEEDS) and points <= {p.split("@")[0] for p in STREAM_POINTS}
