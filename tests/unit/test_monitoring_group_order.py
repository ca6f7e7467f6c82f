"""Commits to the monitoring group reach Kafka in the order the process sent them:
a run that stopped during an outage left a commit unanswered, and the restarted
run's newer commit must not be overwritten when the old one lands (issue 42)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from jobs import monitoring_group
from jobs.monitoring_group import MonitoringGroup

GROUP: dict[int, int] = {}  # what the fake coordinator holds: partition -> offset


class FakeConsumer:
    """A connection whose commits wait while the coordinator is down; each is
    applied, in its connection's order, once it is up (when polled or closed)."""

    up = threading.Event()

    def __init__(self, config: dict[str, Any]) -> None:
        self.on_commit = config["on_commit"]
        self.queued: list[list[Any]] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.queued.append(offsets)

    def poll(self, timeout: float) -> None:
        if self.up.is_set():
            while self.queued:
                offsets = self.queued.pop(0)
                GROUP.update({p.partition: p.offset for p in offsets})
                self.on_commit(None, offsets)

    def close(self) -> None:
        self.up.wait(5)
        self.poll(0)


def test_a_late_commit_of_an_earlier_run_does_not_move_the_group_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(monitoring_group, "Consumer", FakeConsumer)
    monkeypatch.setattr(monitoring_group, "_MEMBERS", {}, raising=False)
    FakeConsumer.up.clear()
    GROUP.clear()
    run_a = MonitoringGroup({"bootstrap.servers": "x:1"}, "app")
    run_a.commit({"t": {"0": 100}})
    run_a.close(timeout_s=0.1)
    run_b = MonitoringGroup({"bootstrap.servers": "x:1"}, "app")
    run_b.commit({"t": {"0": 150}})
    FakeConsumer.up.set()
    run_b.close(timeout_s=1)
    getattr(monitoring_group, "_let_go", lambda: None)()  # as the process ends
    for thread in threading.enumerate():
        if thread.name == "monitoring-group":
            thread.join(5)
    assert GROUP == {0: 150}
