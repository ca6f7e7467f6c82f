"""Platform settings: one place, one environment prefix (``PLATFORM_``).

Command-line flags override these; these override the built-in defaults, which
are the embedded local stack (loopback broker, local Spark, local warehouse).
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from jobs import kafka_settings
from jobs.errors import ConfigError

ENV_PREFIX = "PLATFORM_"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Kafka client settings users may pass through (security included), e.g.
# PLATFORM_KAFKA_SECURITY_PROTOCOL=SASL_SSL -> security.protocol=SASL_SSL.
KAFKA_CLIENT_ENV_PREFIX = ENV_PREFIX + "KAFKA_"


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str
    warehouse: Path
    spark_master: str
    spark_driver_memory: str
    # The Python that executors run (None: the driver's own on local masters,
    # ``python3`` on a cluster, whose workers need not have the driver's path).
    spark_python: str | None
    spark_conn_id: str  # the Airflow connection SparkSubmitOperator uses
    pipelines_dir: Path
    dimensions_dir: Path  # include/dimensions: the dimension tables the batch half keeps
    broker_data_dir: Path
    broker_port: int
    local_airflow_home: Path
    local_airflow_port: int
    kafka_client: dict[str, str] = field(default_factory=dict)
    # A warm driver (``python -m jobs serve``) that available-now runs are sent to,
    # and the port ``serve`` listens on (loopback). ``PLATFORM_DRIVER_URL=off``: the
    # DAGs' operator never looks for one (unset: it tries this machine's port).
    driver_url: str | None = None
    driver_port: int = 18090
    driver_off: bool = False
    # Prometheus: a continuous run serves /metrics on this port (None: off), bound
    # to this address; scheduled runs and operations push to this Pushgateway.
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    pushgateway_url: str | None = None
    # Airflow users who may approve a repair plan (empty: anyone who can see it).
    approvers: tuple[str, ...] = ()
    # The largest enrichment table a run joins, as the JSON rows the driver keeps and
    # every batch broadcasts (``PinnedDeltaSource``): past it a run stops with an error.
    dimension_max_bytes: int = 64 * 2**20
    # How long a continuous run waits for Kafka to answer again before it stops
    # (``jobs/streaming/outage.py``; 0: it stops at once).
    outage_wait_s: int = 300

    @property
    def scheduled_driver_url(self) -> str | None:
        """Where Airflow sends an available-now run first: ``PLATFORM_DRIVER_URL``,
        else a warm driver on this machine's ``PLATFORM_DRIVER_PORT``, if one runs
        (None: ``off``). ``run`` by hand uses ``driver_url`` only."""
        if self.driver_off:
            return None
        return self.driver_url or f"http://127.0.0.1:{self.driver_port}"


# Every variable the platform reads (besides PLATFORM_KAFKA_*), for docs and checks.
ENV_NAMES = tuple(
    ENV_PREFIX + name
    for name in (
        "BOOTSTRAP_SERVERS",
        "WAREHOUSE",
        "SPARK_MASTER",
        "SPARK_DRIVER_MEMORY",
        "SPARK_PYTHON",
        "SPARK_CDS",
        "JARS_DIR",
        "SPARK_CONN_ID",
        "PIPELINES_DIR",
        "DIMENSIONS_DIR",
        "BROKER_DATA_DIR",
        "BROKER_PORT",
        "AIRFLOW_HOME",
        "AIRFLOW_PORT",
        "DRIVER_URL",
        "DRIVER_PORT",
        "DRIVER_TOKEN",
        "METRICS_PORT",
        "METRICS_ADDRESS",
        "PUSHGATEWAY_URL",
        "APPROVERS",
        "DIMENSION_MAX_BYTES",
        "OUTAGE_WAIT_SECONDS",
    )
)
# Loopback only: runs (and the token) never cross a network in clear text.
DRIVER_URL = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\]):\d{1,5}$")
DRIVER_OFF = "off"


def _env(name: str, default: str) -> str:
    assert ENV_PREFIX + name in ENV_NAMES, name
    return os.environ.get(ENV_PREFIX + name, default)


def _port(raw: str, name: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ConfigError(f"{ENV_PREFIX}{name} must be a port number 1-65535, got {raw!r}")
    return int(raw)


def platform_environment() -> dict[str, str]:
    """The PLATFORM_* variables of this process, to hand to a job started elsewhere."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}


def load_settings() -> Settings:
    """Read the settings from the environment, validating every value."""
    broker_port = _port(_env("BROKER_PORT", "19092"), "BROKER_PORT")
    kafka_client = {
        key[len(KAFKA_CLIENT_ENV_PREFIX) :].lower().replace("_", "."): value
        for key, value in os.environ.items()
        if key.startswith(KAFKA_CLIENT_ENV_PREFIX)
    }
    kafka_settings.for_java(kafka_client)  # a setting Spark's client cannot be given fails now
    return Settings(
        bootstrap_servers=_env("BOOTSTRAP_SERVERS", f"127.0.0.1:{broker_port}"),
        warehouse=Path(_env("WAREHOUSE", str(REPO_ROOT / "warehouse"))).resolve(),
        spark_master=_env("SPARK_MASTER", "local[2]"),
        spark_driver_memory=_env("SPARK_DRIVER_MEMORY", "2g"),
        spark_python=_env("SPARK_PYTHON", "").strip() or None,
        spark_conn_id=_env("SPARK_CONN_ID", "spark_default"),
        pipelines_dir=Path(_env("PIPELINES_DIR", str(REPO_ROOT / "include" / "pipelines"))),
        dimensions_dir=Path(_env("DIMENSIONS_DIR", str(REPO_ROOT / "include" / "dimensions"))),
        broker_data_dir=Path(_env("BROKER_DATA_DIR", str(REPO_ROOT / ".broker"))).resolve(),
        broker_port=broker_port,
        local_airflow_home=Path(
            _env("AIRFLOW_HOME", str(REPO_ROOT / ".local" / "airflow"))
        ).resolve(),
        local_airflow_port=_port(_env("AIRFLOW_PORT", "8085"), "AIRFLOW_PORT"),
        kafka_client=kafka_client,
        driver_url=_driver_url(_env("DRIVER_URL", "").strip()),
        driver_off=_env("DRIVER_URL", "").strip() == DRIVER_OFF,
        driver_port=_port(_env("DRIVER_PORT", "18090"), "DRIVER_PORT"),
        metrics_port=_optional_port(_env("METRICS_PORT", "").strip(), "METRICS_PORT"),
        metrics_address=_address(_env("METRICS_ADDRESS", "127.0.0.1").strip()),
        pushgateway_url=_pushgateway_url(_env("PUSHGATEWAY_URL", "").strip()),
        approvers=_approvers(_env("APPROVERS", "")),
        dimension_max_bytes=_size(_env("DIMENSION_MAX_BYTES", "64m"), "DIMENSION_MAX_BYTES"),
        outage_wait_s=_seconds(_env("OUTAGE_WAIT_SECONDS", "300"), "OUTAGE_WAIT_SECONDS"),
    )


def _seconds(raw: str, name: str) -> int:
    if not (raw.strip().isascii() and raw.strip().isdigit()) or int(raw) > 7 * 24 * 3600:
        raise ConfigError(f"{ENV_PREFIX}{name} must be whole seconds 0-604800, got {raw!r}")
    return int(raw)


SIZE = re.compile(r"^(\d{1,12})([kmg]?)$", re.ASCII)
# The table is one Java string on the driver: well under its 2 GiB bound.
MAX_SIZE = 2**30
SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def size_text(size: int) -> str:
    """``size`` bytes for a message: ``64 MiB``, ``4 KiB``, ``512 bytes``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} bytes"


def _size(raw: str, name: str) -> int:
    """Bytes, as Spark writes sizes: ``65536``, ``64k``, ``64m``, ``1g``."""
    found = SIZE.match(raw.strip().lower())
    size = int(found.group(1)) * SIZE_UNITS[found.group(2)] if found else 0
    if not 0 < size <= MAX_SIZE:
        raise ConfigError(
            f"{ENV_PREFIX}{name} must be a size in bytes up to 1g, e.g. 67108864 or 64m; "
            f"got {raw!r}"
        )
    return size


USER_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def _approvers(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    bad = [n for n in names if not USER_NAME.match(n)]
    if bad:
        raise ConfigError(
            f"{ENV_PREFIX}APPROVERS must be a comma list of Airflow user names (letters, "
            f"digits, _ . @ -), got {bad[0]!r}"
        )
    return names


def _optional_port(raw: str, name: str) -> int | None:
    return _port(raw, name) if raw else None


def _address(raw: str) -> str:
    """An IP address to bind to (0.0.0.0 in a container that Prometheus scrapes)."""
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        raise ConfigError(
            f"{ENV_PREFIX}METRICS_ADDRESS must be an IP address, got {raw!r}"
        ) from None
    return raw


PUSHGATEWAY_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?/?$")


def _pushgateway_url(raw: str) -> str | None:
    if not raw:
        return None
    if not PUSHGATEWAY_URL.match(raw):
        raise ConfigError(f"{ENV_PREFIX}PUSHGATEWAY_URL must be http(s)://HOST[:PORT], got {raw!r}")
    return raw.rstrip("/")


def _driver_url(raw: str) -> str | None:
    if not raw or raw == DRIVER_OFF:
        return None
    if not DRIVER_URL.match(raw):
        raise ConfigError(
            f"{ENV_PREFIX}DRIVER_URL must be http://127.0.0.1:PORT (loopback) or "
            f"{DRIVER_OFF!r}, got {raw!r}"
        )
    return raw
