"""The warm driver's training (``jobs/driver_training.py``): what it refuses, and that
a failed training leaves nothing behind and the driver serving."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from jobs import driver_training, faults
from jobs.errors import ConfigError
from jobs.settings import MAX_TRAIN_EVENTS


@pytest.mark.parametrize("events", [-1, MAX_TRAIN_EVENTS + 1, 10**18])
def test_an_absurd_number_of_events_is_refused(events: int) -> None:
    with pytest.raises(ConfigError, match="--train-events must be 0-50,000,000"):
        driver_training.check(events, "local[2]")


def test_a_cluster_master_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="needs a local Spark master, not spark://m:7077"):
        driver_training.check(1000, "spark://m:7077")
    assert driver_training.check(0, "spark://m:7077") == 0  # no training: any master


def test_armed_faults_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "during_task")
    with pytest.raises(ConfigError, match="would crash the training"):
        driver_training.check(1000, "local[2]")


def test_a_failed_training_leaves_no_folder_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    started: list[Path] = []

    def no_broker(data_dir: Path, port: int) -> Any:
        started.append(data_dir)
        data_dir.mkdir(parents=True)
        raise driver_training.broker.BrokerError("no Kafka distribution")

    monkeypatch.setattr(driver_training.broker, "start", no_broker)

    class Session:
        def newSession(self) -> Session:
            return self

    assert not driver_training.train(Session(), None, 1000, threading.Event())  # type: ignore[arg-type]
    assert started and not started[0].parent.exists()
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert out.startswith("warning: the driver serves untrained, its training failed: ")
    assert "no Kafka distribution" in out


def test_no_events_is_no_training() -> None:
    assert driver_training.train(None, None, 0, threading.Event())  # type: ignore[arg-type]


def test_a_stop_before_the_training_starts_no_broker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver's signal handler set ``stop`` (a SIGTERM while Spark started)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(driver_training.broker, "start", lambda *_: pytest.fail("started"))

    class Session:
        class streams:
            active: tuple[Any, ...] = ()

        def newSession(self) -> Session:
            return self

    stop = threading.Event()
    stop.set()
    assert not driver_training.train(Session(), None, 1000, stop)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out.startswith("training stopped after ")


def test_the_click_records_are_the_users_and_span_they_say() -> None:
    import json

    records = list(driver_training.click_records(5000, 1))
    values = [json.loads(v) for _k, v, _t in records]
    assert len({v["user_id"] for v in values}) == driver_training.USERS
    stamps = [v["timestamp"] for v in values]
    assert max(stamps) - min(stamps) == driver_training.SPAN_S - 1
    assert all(k == v["user_id"].encode() for (k, _v, _t), v in zip(records, values, strict=True))
