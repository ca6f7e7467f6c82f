"""A librdkafka call that ignores its own timeout (librdkafka issues 5456, 5511:
``send_offsets_to_transaction`` waiting for a group coordinator that moved) is
given up on, so the publisher can fence it with a new producer."""

from __future__ import annotations

import threading

import pytest

from jobs.output import publisher


def test_a_call_past_its_timeout_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher, "TIMEOUT_S", 0.1)
    monkeypatch.setattr(publisher, "STUCK_GRACE_S", 0.1)
    release = threading.Event()
    with pytest.raises(publisher._Stuck):
        publisher._bounded(lambda: release.wait(30))
    release.set()


def test_a_call_s_own_error_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher, "TIMEOUT_S", 1.0)

    def refused() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        publisher._bounded(refused)
    publisher._bounded(lambda: None)  # a call that returns in time returns
