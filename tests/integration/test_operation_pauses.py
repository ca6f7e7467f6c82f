"""Each operation paused with SIGSTOP at each of its named points in turn, past its
lease, while another machine takes the application over and completes it, writes
nothing once resumed and stops with one error line; the results stay exact
(tests/pause_harness.py)."""

from __future__ import annotations

import pytest

from tests.conftest import jobs_args, pipeline_file, recent_clicks
from tests.pause_harness import (
    BAD,
    OPERATION_POINTS,
    STREAM_POINTS,
    UNHELD_POINTS,
    assert_no_write_after,
    assert_stopped_by_its_lease,
    check_exact,
    end,
    paused_machine,
    produce_all,
    resume_and_end,
    run_here,
    stopped,
)

pytestmark = pytest.mark.integration

OPERATIONS = {
    "rebuild": ["rebuild", "--reason", "pause"],
    "rewind": ["rewind", "--to-earliest", "--mode", "reprocess", "--reason", "pause"],
    "backfill": ["backfill", "--from-earliest", "--reason", "pause"],
}


@pytest.fixture
def machine(s3_server, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    with paused_machine(s3_server, tmp_path, monkeypatch) as found:
        yield found


@pytest.mark.parametrize("operation", list(OPERATION_POINTS))
def test_an_operation_paused_past_its_lease_writes_nothing_once_another_took_over(  # type: ignore[no-untyped-def]
    operation: str, spark, machine, broker, kafka_config, new_topic, s3_warehouse, tmp_path
) -> None:
    topic = new_topic(2)
    values = produce_all(kafka_config, topic, recent_clicks(600, 3) + BAD)
    path = pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=300)
    run = jobs_args(path, broker.bootstrap_servers, s3_warehouse, "run", "--quiet")
    repair = jobs_args(path, broker.bootstrap_servers, s3_warehouse, *OPERATIONS[operation])
    run_here(spark, run)
    for cycle, point in enumerate(OPERATION_POINTS[operation]):
        paused = machine.start(repair, point)
        try:
            stopped(paused)
            run_here(spark, repair)  # completes the paused one's epoch, if it fenced
            values += produce_all(kafka_config, topic, recent_clicks(300, 4 + cycle))
            woke, err = resume_and_end(paused)
        finally:
            end(paused)
        assert_stopped_by_its_lease(paused, err)
        assert_no_write_after(machine.proxy, woke, err)
        run_here(spark, run)
    check_exact(s3_warehouse, topic, kafka_config, values)


def test_every_operation_point_is_paused_at() -> None:
    from jobs.faults import POINTS

    covered = {p for points in OPERATION_POINTS.values() for p in points}
    assert covered == set(POINTS) - set(STREAM_POINTS) - set(UNHELD_POINTS)
