"""Reading an application's ledger and status (no Spark: Delta via delta-rs)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from airflow.sdk import BaseHook

from jobs.pipeline import Pipeline, load_pipeline
from jobs.settings import Settings, load_settings


class PlatformHook(BaseHook):
    """Status of one application, as ``python -m jobs status`` reports it."""

    def __init__(self, bootstrap_servers: str | None = None, warehouse: str | None = None) -> None:
        super().__init__()
        settings = load_settings()
        if bootstrap_servers:
            settings = dataclasses.replace(settings, bootstrap_servers=bootstrap_servers)
        if warehouse:
            from jobs.settings import warehouse_location

            settings = dataclasses.replace(settings, warehouse=warehouse_location(warehouse))
        self.settings: Settings = settings

    def pipeline(self, name: str) -> Pipeline:
        return load_pipeline(name, self.settings.pipelines_dir)

    def status(self, name: str) -> dict[str, Any]:
        from jobs.status import application_status

        return application_status(self.pipeline(name), self.settings).to_dict()

    def health(self, name: str) -> dict[str, Any]:
        """Age of the last committed batch (seconds, None before the first) and total lag
        (bounded memory: only the newest batch row is read, on every poke)."""
        from jobs.status import application_status

        status = application_status(self.pipeline(name), self.settings, audit=False).to_dict()
        last = status["last_batch"]
        age = None
        if last is not None:
            from datetime import datetime

            committed = datetime.fromisoformat(last["commit_time"])
            age = time.time() - committed.timestamp()
        lags = [p["lag"] for p in status["partitions"] if p["lag"] is not None]
        return {
            "last_batch_age_s": age,
            "lag": sum(lags) if lags else None,
            "problems": status["problems"],
            "epoch": status["epoch"],
        }
