"""A stream paused with SIGSTOP at each named point past its lease, while another
machine takes the application over and runs it, writes nothing once resumed and
stops with one error line; the tables and the output topic stay exact
(tests/pause_harness.py)."""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from urllib.parse import unquote

import pytest
import yaml

from tests.conftest import jobs_args, pipeline_file, recent_clicks, rotating
from tests.output_topic import assert_each_change_once, expected_counts, last_values, read_output
from tests.pause_harness import (
    BAD,
    FIXED_SEED,
    NEW_RUNS,
    NEW_SEED_POINTS,
    SEED,
    STREAM_POINTS,
    assert_no_write_after,
    assert_stopped_by_its_lease,
    check_exact,
    end,
    next_batch,
    paused_machine,
    produce_all,
    quick_trigger,
    resume_and_end,
    run_here,
    stopped,
    stream_schedule,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def machine(s3_server, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    with paused_machine(s3_server, tmp_path, monkeypatch) as found:
        yield found


# "new-<i>": this run's own seeds (chosen in the worker that runs it: the test's id
# is the same in every worker, as pytest-xdist requires).
@pytest.mark.parametrize("seed", ["fixed", *(f"new-{i}" for i in range(NEW_RUNS))])
def test_a_stream_paused_past_its_lease_writes_nothing_once_another_took_over(  # type: ignore[no-untyped-def]
    seed: str, spark, machine, broker, kafka_config, new_topic, s3_warehouse, tmp_path
) -> None:
    number, points = (
        (FIXED_SEED, len(STREAM_POINTS))
        if seed == "fixed"
        else (SEED + int(seed.removeprefix("new-")), NEW_SEED_POINTS)
    )
    schedule = stream_schedule(number, points)
    if seed == "fixed":  # every other point of it per commit: all 7 over two
        schedule = rotating(schedule)
    print(f"PLATFORM_PAUSE_SEED={number}: {schedule}")
    topic = new_topic(2)
    path = quick_trigger(pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=300))
    definition = yaml.safe_load(path.read_text())
    definition["output"] = {"topic": f"{topic}-out", "partitions": 2}
    path.write_text(yaml.safe_dump(definition))
    args = jobs_args(path, broker.bootstrap_servers, s3_warehouse, "run", "--quiet")
    values: list[bytes] = []
    for cycle, (point, later) in enumerate(schedule):
        values += produce_all(kafka_config, topic, recent_clicks(450, cycle) + BAD)
        began = time.monotonic()
        paused = machine.start(
            [*args, "--trigger", "continuous"], f"{point}@{next_batch(s3_warehouse) + later}"
        )
        try:
            stopped(paused)
            laps = [time.monotonic()]
            run_here(spark, args)  # takes the lease over once it expired, and runs
            laps.append(time.monotonic())
            woke, err = resume_and_end(paused)
            laps.append(time.monotonic())
        finally:
            end(paused)
        spent = [round(b - a, 1) for a, b in itertools.pairwise([began, *laps])]
        print(f"cycle {cycle}: {point} woke at {woke}; paused, taken over, ended after {spent} s")
        assert_stopped_by_its_lease(paused, err)
        assert_no_write_after(machine.proxy, woke, err)
    run_here(spark, args)
    check_exact(s3_warehouse, topic, kafka_config, values)
    published = read_output(kafka_config, f"{topic}-out")
    assert_each_change_once(published)
    assert last_values(published) == expected_counts(values)


def test_the_fixed_seed_pauses_at_every_stream_point_and_a_new_one_at_some() -> None:
    assert sorted(p for p, _ in stream_schedule(FIXED_SEED, len(STREAM_POINTS))) == sorted(
        STREAM_POINTS
    )
    assert len({p for p, _ in stream_schedule(SEED, NEW_SEED_POINTS)}) == NEW_SEED_POINTS


def test_a_held_offsets_write_of_a_paused_stream_is_refused_by_the_store(  # type: ignore[no-untyped-def]
    spark, machine, broker, kafka_config, new_topic, s3_warehouse, tmp_path
) -> None:
    """Spark's ``offsets/N`` held at the proxy (sent, not yet at the store) while its
    driver is paused past its lease and another machine plans and runs batch N:
    released after the wake, the store refuses it (S3A's conditional create), the
    woken driver stops with one line, and the results stay exact."""
    topic = new_topic(2)
    values = produce_all(kafka_config, topic, recent_clicks(450, 0) + BAD)
    path = quick_trigger(pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=300))
    args = jobs_args(path, broker.bootstrap_servers, s3_warehouse, "run", "--quiet")
    run_here(spark, args)
    values += produce_all(kafka_config, topic, recent_clicks(450, 1) + BAD)
    batch = next_batch(s3_warehouse)
    offsets = re.compile(rf"/offsets/{batch}$")
    machine.proxy.hold = offsets
    paused = machine.start([*args, "--trigger", "continuous"], None)
    try:
        assert machine.proxy.holding.wait(180), "the driver never wrote offsets/N"
        os.killpg(paused.pid, signal.SIGSTOP)
        run_here(spark, args)  # takes the lease over once it expired; writes offsets/N
        woke = time.time()
        machine.proxy.release.set()
        os.killpg(paused.pid, signal.SIGCONT)
        _, err = paused.communicate(timeout=180)
    finally:
        end(paused)
    assert_stopped_by_its_lease(paused, err)
    held = [status for _at, _m, p, status in machine.proxy.writes if offsets.search(unquote(p))]
    assert held == [412], held  # the held write reached the store, which refused it
    assert_no_write_after(machine.proxy, woke, err)
    run_here(spark, args)
    check_exact(s3_warehouse, topic, kafka_config, values)
