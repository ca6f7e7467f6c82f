"""A rewind's or backfill's arguments are checked before any work: no Spark session,
no broker, no table or file is touched by a command that then refuses its input.
The Airflow forms send empty strings for values left blank, so "" is input too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobs import cli
from jobs.errors import ConfigError
from jobs.operations import restart, runner
from jobs.operations.targets import TargetSpec, resolve_targets
from jobs.streaming import spark

REWIND = ["rewind", "--pipeline", "user_clicks", "--reason", "a check"]
BACKFILL = ["backfill", "--pipeline", "user_clicks", "--reason", "a check"]


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    started: list[str] = []

    def work(name: str):  # type: ignore[no-untyped-def]
        def started_work(*_args: object, **_kwargs: object) -> None:
            started.append(name)
            raise AssertionError(f"{name} started before the arguments were checked")

        return started_work

    monkeypatch.setattr(spark, "command_session", work("a Spark session"))
    monkeypatch.setattr(restart, "plan_rewind", work("a rewind's plan"))
    monkeypatch.setattr(runner, "dry_run_operation", work("a dry run"))
    monkeypatch.setattr(runner, "run_operation", work("an operation"))
    monkeypatch.setenv("PLATFORM_WAREHOUSE", str(tmp_path))
    yield started
    assert not started


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # values left blank (the forms' defaults)
        ([*REWIND, "--to-offset", ""], "--to-offset needs a value"),
        ([*REWIND, "--shift-by", ""], "--shift-by needs a value"),
        ([*REWIND, "--to-datetime", " "], "--to-datetime needs a value"),
        ([*REWIND, "--by-duration", ""], "--by-duration needs a value"),
        ([*BACKFILL, "--from-datetime", ""], "--from-datetime needs a value"),
        ([*BACKFILL, "--from-offset", ""], "--from-offset needs a value"),
        ([*REWIND, "--to-latest", "--topics", ""], "--topics needs a value"),
        ([*REWIND, "--to-latest", "--topics", " , "], "--topics needs a value"),
        # values that are not what they name
        ([*BACKFILL, "--from-datetime", "2026-01-01T00:00"], "--from-datetime needs a time zone"),
        ([*BACKFILL, "--from-datetime", "yesterday"], "--from-datetime must be ISO 8601"),
        ([*REWIND, "--to-offset", '{"clicks": {"0": 1.9}}'], "--to-offset"),
        ([*REWIND, "--to-offset", '{"clicks": {"0": true}}'], "--to-offset"),
        ([*REWIND, "--to-offset", '{"clicks": {"0": -1}}'], "--to-offset"),
        ([*REWIND, "--to-offset", '{"clicks": {"0": Infinity}}'], "--to-offset"),
        ([*REWIND, "--to-offset", "\u00b2"], "--to-offset"),
        ([*REWIND, "--to-offset", "1" * 30], "--to-offset"),
        ([*BACKFILL, "--from-offset", '{"clicks": []}'], "--from-offset"),
        ([*REWIND, "--shift-by", "\u00b2"], "--shift-by must be an integer"),
        ([*REWIND, "--shift-by", "1" * 30], "--shift-by"),
        ([*REWIND, "--by-duration", "P99999999999D"], "--by-duration"),
        ([*REWIND, "--by-duration", "PT1H30"], "--by-duration must look like PnDTnHnMnS"),
        # a plan id that could not be saved, found before the plan is made
        ([*REWIND, "--to-latest", "--dry-run", "--save-plan", "../x"], "a plan id looks like"),
        ([*REWIND, "--to-latest", "--dry-run", "--save-plan", ""], "a plan id looks like"),
        ([*BACKFILL, "--from-earliest", "--preview", "--save-plan", "x"], "a plan id looks like"),
    ],
)
def test_a_bad_value_is_refused_before_any_work(
    argv: list[str], message: str, no_work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: ")
    assert message in error[0]


MARKS = {("clicks", 0): (0, 10), ("clicks", 1): (0, 10)}


@pytest.mark.parametrize(
    "value", ['{"clicks": {"0": 1.9, "1": 2}}', '{"clicks": {"0": true, "1": 2}}']
)
def test_an_offset_is_a_whole_number_not_one_rounded_down(value: str) -> None:
    # json.loads gives 1.9 and True; int() of them is 1, a rewind to an offset never asked for
    with pytest.raises(ConfigError, match="--to-offset"):
        resolve_targets(TargetSpec("offset", value), {}, MARKS, {})


def test_good_values_still_resolve() -> None:
    assert resolve_targets(TargetSpec("offset", " 7 "), {}, MARKS, {}) == {
        ("clicks", 0): 7,
        ("clicks", 1): 7,
    }
    spec = TargetSpec("offset", '{"clicks": {"0": 3, "1": 10}}', flag="--from-offset")
    assert resolve_targets(spec, {}, MARKS, {}) == {("clicks", 0): 3, ("clicks", 1): 10}
    shifted = resolve_targets(TargetSpec("shift", "-4"), {("clicks", 0): 6}, MARKS, {})
    assert shifted == {("clicks", 0): 2, ("clicks", 1): 0}


@pytest.mark.parametrize("failure", ["partition", "call"])
def test_a_time_target_a_broker_could_not_answer_is_unavailable_not_a_bad_target(
    monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    # A partition without a leader comes back with its error set and the asked
    # timestamp still in place of an offset ("target ... is beyond the log end").
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from jobs.errors import KafkaUnavailableError
    from jobs.operations import targets

    class Consumer:
        def __init__(self, _config: object) -> None:
            pass

        def offsets_for_times(self, asked: list[TopicPartition], timeout: float) -> list[Any]:
            if failure == "call":
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
            leaderless = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
            return [
                SimpleNamespace(topic="clicks", partition=0, offset=4, error=None),
                SimpleNamespace(
                    topic="clicks", partition=1, offset=asked[1].offset, error=leaderless
                ),
            ]

        def close(self) -> None:
            pass

    monkeypatch.setattr(targets, "Consumer", Consumer)
    spec = TargetSpec("datetime", "2026-11-29T10:00:00Z")
    with pytest.raises(KafkaUnavailableError, match=r"clicks"):
        resolve_targets(spec, {}, MARKS, {})
