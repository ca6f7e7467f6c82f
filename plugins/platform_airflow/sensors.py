"""Waiting on an application: lag under a threshold and/or a recent last batch."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseSensorOperator

from platform_airflow.hooks import PlatformHook


class ApplicationHealthSensor(BaseSensorOperator):
    """Succeeds once the application is healthy; times out (fails) when it is stuck.

    Healthy: total lag <= ``max_lag`` (if given) and the last committed batch is
    at most ``max_batch_age_s`` old (if given), and ``status`` sees no problem.
    """

    template_fields = ("pipeline",)

    def __init__(
        self,
        *,
        pipeline: str,
        max_lag: int | None = None,
        max_batch_age_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if max_lag is None and max_batch_age_s is None:
            raise ValueError("give max_lag, max_batch_age_s or both")
        self.pipeline = pipeline
        self.max_lag = max_lag
        self.max_batch_age_s = max_batch_age_s

    def poke(self, context: Any) -> bool:
        health = PlatformHook().health(self.pipeline)
        self.log.info("health of %s: %s", self.pipeline, health)
        if health["problems"]:
            self.log.warning("problems: %s", health["problems"])
            return False
        if self.max_lag is not None and (health["lag"] is None or health["lag"] > self.max_lag):
            return False
        age = health["last_batch_age_s"]
        return not (
            self.max_batch_age_s is not None and (age is None or age > self.max_batch_age_s)
        )
