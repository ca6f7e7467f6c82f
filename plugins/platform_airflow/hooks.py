"""The platform's hooks: an application's ledger and status (no Spark: Delta via
delta-rs), and the object store the warehouse is on (an ``aws`` connection)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from airflow.sdk import BaseHook

from jobs.errors import ConfigError
from jobs.pipeline.model import Pipeline
from jobs.pipeline.parser import load_pipeline
from jobs.settings import Settings, load_settings


class ObjectStorageHook(BaseHook):
    """The warehouse's object store from an Airflow connection of the Amazon
    provider's ``aws`` type (``PLATFORM_AWS_CONN_ID``): the access key as its login,
    the secret as its password, and in its extra ``endpoint_url`` (an S3-compatible
    store; also read from ``service_config.s3``), ``region_name`` and
    ``aws_session_token``. As the standard AWS variables: what the jobs it starts
    and every client of the warehouse read."""

    conn_name_attr = "aws_conn_id"
    conn_type = "aws"
    hook_name = "Amazon Web Services (the platform's warehouse)"

    def __init__(self, aws_conn_id: str) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id

    def environment(self) -> dict[str, str]:
        conn = self.get_connection(self.aws_conn_id)
        if conn.conn_type != self.conn_type:
            raise ConfigError(
                f"Airflow connection {self.aws_conn_id!r} is of type {conn.conn_type!r}, not "
                "'aws' (PLATFORM_AWS_CONN_ID names the warehouse's object store)"
            )
        extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
        s3 = (extra.get("service_config") or {}).get("s3") or {}
        values = {
            "AWS_ACCESS_KEY_ID": conn.login or extra.get("aws_access_key_id"),
            "AWS_SECRET_ACCESS_KEY": conn.password or extra.get("aws_secret_access_key"),
            "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
            "AWS_ENDPOINT_URL": s3.get("endpoint_url") or extra.get("endpoint_url"),
            "AWS_REGION": extra.get("region_name"),
        }
        found = {name: str(value) for name, value in values.items() if value}
        endpoint = found.get("AWS_ENDPOINT_URL", "")
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"Airflow connection {self.aws_conn_id!r}: endpoint_url must be http(s)://host"
                f"[:port], got {json.dumps(endpoint)}"
            )
        if endpoint.startswith("http://"):
            found["AWS_ALLOW_HTTP"] = "true"  # a store on premises without TLS
        return found


def storage_environment(settings: Settings) -> dict[str, str]:
    """The AWS variables of ``PLATFORM_AWS_CONN_ID``'s connection ({} without one:
    the worker's own variables, or an instance profile, apply)."""
    if settings.aws_conn_id is None:
        return {}
    return ObjectStorageHook(settings.aws_conn_id).environment()


def use_storage_connection(settings: Settings) -> None:
    """This task's own reads and writes of the warehouse (a hook's status, a
    rejection recorded) go through the connection's store: a task runs in a
    process of its own, whose environment the warehouse's clients read."""
    os.environ.update(storage_environment(settings))


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
        use_storage_connection(settings)
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
