"""Platform settings: one place, one environment prefix (``PLATFORM_``).

Command-line flags override these; these override the built-in defaults, which
are the embedded local stack (loopback broker, local Spark, local warehouse).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import shlex
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from jobs import faults, kafka_settings
from jobs.errors import refused
from jobs.lease import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S
from jobs.warehouse import Location

ENV_PREFIX = "PLATFORM_"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Kafka client settings users may pass through (security included), e.g.
# PLATFORM_KAFKA_SECURITY_PROTOCOL=SASL_SSL -> security.protocol=SASL_SSL.
KAFKA_CLIENT_ENV_PREFIX = ENV_PREFIX + "KAFKA_"


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str
    warehouse: Location
    spark_master: str
    spark_driver_memory: str
    # The Python that executors run (None: the driver's own on local masters,
    # ``python3`` on a cluster, whose workers need not have the driver's path).
    spark_python: str | None
    spark_conn_id: str  # the Airflow connection SparkSubmitOperator uses
    # An Airflow connection of type aws: the object store's keys and endpoint for the
    # jobs Airflow starts and its own reads (None: the worker's AWS_* variables).
    aws_conn_id: str | None
    pipelines_dir: Path
    dimensions_dir: Path  # include/dimensions: the dimension tables the batch half keeps
    broker_data_dir: Path
    broker_port: int
    storage_data_dir: Path
    storage_port: int
    local_airflow_home: Path
    local_airflow_port: int
    kafka_client: dict[str, str] = field(default_factory=dict)
    # A warm driver (``python -m jobs serve``) that available-now runs are sent to,
    # and the port ``serve`` listens on (loopback). ``PLATFORM_DRIVER_URL=off``: the
    # DAGs' operator never looks for one (unset: it tries this machine's port).
    driver_url: str | None = None
    driver_port: int = 18090
    driver_off: bool = False
    # Synthetic events a new warm driver trains its JIT on before it serves (0: none;
    # ``jobs/driver_training.py``).
    driver_train_events: int = 0
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

    def __post_init__(self) -> None:
        # A Path or text given (``dataclasses.replace(settings, warehouse=path)``) is
        # parsed as the environment's value is.
        if not isinstance(self.warehouse, Location):
            object.__setattr__(self, "warehouse", warehouse_location(str(self.warehouse)))

    @property
    def scheduled_driver_url(self) -> str | None:
        """Where Airflow sends an available-now run first: ``PLATFORM_DRIVER_URL``,
        else a warm driver on this machine's ``PLATFORM_DRIVER_PORT``, if one runs
        (None: ``off``). ``run`` by hand uses ``driver_url`` only."""
        if self.driver_off:
            return None
        return self.driver_url or f"http://127.0.0.1:{self.driver_port}"


# Every variable the platform reads (besides PLATFORM_KAFKA_*), for docs and checks;
# load_settings checks each value, so a bad one stops any command at its start.
ENV_NAMES = tuple(
    ENV_PREFIX + name
    for name in (
        "BOOTSTRAP_SERVERS",
        "WAREHOUSE",
        "SPARK_MASTER",
        "SPARK_DRIVER_MEMORY",
        "SPARK_PYTHON",
        "SPARK_CDS",
        "SPARK_JAVA_OPTIONS",
        "JARS_DIR",
        "SPARK_CONN_ID",
        "AWS_CONN_ID",
        "PIPELINES_DIR",
        "DIMENSIONS_DIR",
        "BROKER_DATA_DIR",
        "BROKER_PORT",
        "BROKER_JAVA_OPTIONS",
        "STORAGE_DATA_DIR",
        "STORAGE_PORT",
        "LEASE_SECONDS",
        "AIRFLOW_HOME",
        "AIRFLOW_PORT",
        "DRIVER_URL",
        "DRIVER_PORT",
        "DRIVER_TOKEN",
        "DRIVER_TRAIN_EVENTS",
        "METRICS_PORT",
        "METRICS_ADDRESS",
        "PUSHGATEWAY_URL",
        "APPROVERS",
        "DIMENSION_MAX_BYTES",
        "OUTAGE_WAIT_SECONDS",
        "FAULT",
        "PAUSE",
        "TRIGGERED_BY",
    )
)
# Loopback only: runs (and the token) never cross a network in clear text.
DRIVER_URL = re.compile(r"^http://(?:127\.0\.0\.1|localhost):(?P<port>[^:]*)$")
DRIVER_OFF = "off"
# HOST:PORT (a name, an IPv4 address or a bracketed IPv6 one), as Kafka takes them.
HOST_PORT = re.compile(r"^(?:[A-Za-z0-9._\-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[^:\]]*)$")
SPARK_MASTER = re.compile(
    r"^(?:local(?:\[(?:[1-9][0-9]*|\*)(?:,[1-9][0-9]*)?\])?"
    r"|local-cluster\[[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*\]"
    r"|yarn|(?:spark|k8s|mesos)://\S+)$"
)
# Spark's launcher gives the driver -Xmx<value>: a bare number would be bytes to the
# JVM, and "2gb" is refused by it.
JVM_MEMORY = re.compile(r"^([1-9][0-9]{0,9})([kmgt])$", re.ASCII | re.IGNORECASE)
# Spark refuses a driver with less heap than 450 MiB (1.5x its 300 MiB reserve).
MIN_DRIVER_MEMORY_MIB = 512
MIB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
CONN_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,250}$")
TOKEN = re.compile(r"^[!-~]{1,4096}$")  # visible ASCII: the same bytes on both sides
SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def _env(name: str, default: str) -> str:
    assert ENV_PREFIX + name in ENV_NAMES, name
    return os.environ.get(ENV_PREFIX + name, default)


def _port(raw: str, name: str) -> int:
    port = _port_number(raw)
    if port is None:
        raise refused(ENV_PREFIX + name, "a port number 1-65535", raw)
    return port


def _port_number(raw: str) -> int | None:
    """``raw`` as a TCP port (None: it is not one)."""
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 65535:
        return int(raw)
    return None


def platform_environment() -> dict[str, str]:
    """The PLATFORM_* variables of this process, to hand to a job started elsewhere."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}


def load_settings() -> Settings:
    """Read the settings from the environment, validating every value (those that
    other modules read too: ``spark_cds``, ``java_options``, ``jars_dir``,
    ``configured_driver_token``, ``lease_seconds``, ``faults.spec``)."""
    broker_port = _port(_env("BROKER_PORT", "19092"), "BROKER_PORT")
    spark_cds()
    lease_seconds()
    java_options("SPARK_JAVA_OPTIONS")
    java_options("BROKER_JAVA_OPTIONS")
    jars_dir()
    configured_driver_token()
    faults.spec()
    faults.spec(faults.PAUSE_ENV)
    kafka_client = {
        key[len(KAFKA_CLIENT_ENV_PREFIX) :].lower().replace("_", "."): value
        for key, value in os.environ.items()
        if key.startswith(KAFKA_CLIENT_ENV_PREFIX)
    }
    kafka_settings.for_java(kafka_client)  # a setting Spark's client cannot be given fails now
    return Settings(
        bootstrap_servers=bootstrap_servers(
            _env("BOOTSTRAP_SERVERS", f"127.0.0.1:{broker_port}"),
            ENV_PREFIX + "BOOTSTRAP_SERVERS",
        ),
        warehouse=warehouse_location(_env("WAREHOUSE", str(REPO_ROOT / "warehouse"))),
        spark_master=_spark_master(_env("SPARK_MASTER", "local[2]")),
        spark_driver_memory=_memory(_env("SPARK_DRIVER_MEMORY", "2g"), "SPARK_DRIVER_MEMORY"),
        spark_python=_env("SPARK_PYTHON", "").strip() or None,
        spark_conn_id=_conn_id(_env("SPARK_CONN_ID", "spark_default"), "SPARK_CONN_ID"),
        aws_conn_id=_conn_id(_env("AWS_CONN_ID", ""), "AWS_CONN_ID") or None,
        pipelines_dir=_directory("PIPELINES_DIR", REPO_ROOT / "include" / "pipelines"),
        dimensions_dir=_directory("DIMENSIONS_DIR", REPO_ROOT / "include" / "dimensions"),
        broker_data_dir=_directory("BROKER_DATA_DIR", REPO_ROOT / ".broker").resolve(),
        broker_port=broker_port,
        storage_data_dir=_directory("STORAGE_DATA_DIR", REPO_ROOT / ".storage").resolve(),
        storage_port=_port(_env("STORAGE_PORT", "19333"), "STORAGE_PORT"),
        local_airflow_home=_directory("AIRFLOW_HOME", REPO_ROOT / ".local" / "airflow").resolve(),
        local_airflow_port=_port(_env("AIRFLOW_PORT", "8085"), "AIRFLOW_PORT"),
        kafka_client=kafka_client,
        driver_url=_driver_url(_env("DRIVER_URL", "").strip()),
        driver_off=_env("DRIVER_URL", "").strip() == DRIVER_OFF,
        driver_port=_port(_env("DRIVER_PORT", "18090"), "DRIVER_PORT"),
        driver_train_events=_train_events(_env("DRIVER_TRAIN_EVENTS", "0")),
        metrics_port=_optional_port(_env("METRICS_PORT", "").strip(), "METRICS_PORT"),
        metrics_address=_address(_env("METRICS_ADDRESS", "127.0.0.1").strip()),
        pushgateway_url=_pushgateway_url(_env("PUSHGATEWAY_URL", "").strip()),
        approvers=_approvers(_env("APPROVERS", "")),
        dimension_max_bytes=_size(_env("DIMENSION_MAX_BYTES", "64m"), "DIMENSION_MAX_BYTES"),
        outage_wait_s=_seconds(_env("OUTAGE_WAIT_SECONDS", "300"), "OUTAGE_WAIT_SECONDS"),
    )


MAX_TRAIN_EVENTS = 50_000_000


def _train_events(raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_TRAIN_EVENTS:
        raise refused(ENV_PREFIX + "DRIVER_TRAIN_EVENTS", f"0-{MAX_TRAIN_EVENTS}", raw)
    return int(text)


def _seconds(raw: str, name: str) -> int:
    if not (raw.strip().isascii() and raw.strip().isdigit()) or int(raw) > 7 * 24 * 3600:
        raise refused(ENV_PREFIX + name, "whole seconds 0-604800", raw)
    return int(raw)


def bootstrap_servers(raw: str, what: str) -> str:
    """Kafka's bootstrap servers, ``HOST:PORT[,HOST:PORT]`` (``what``: where they
    were given, for the message)."""
    # (A trailing comma is no server: Kafka's clients skip it too.)
    entries = [entry.strip() for entry in raw.split(",") if entry.strip()]
    found = [HOST_PORT.fullmatch(entry) for entry in entries]
    if not found or not all(f is not None and _port_number(f["port"]) for f in found):
        raise refused(what, "HOST:PORT[,HOST:PORT] with ports 1-65535", raw)
    return ",".join(entries)


def warehouse_location(raw: str, name: str = ENV_PREFIX + "WAREHOUSE") -> Location:
    """The warehouse: a local folder (it may not exist yet; a file there is no
    folder) or s3://bucket/prefix."""
    if not raw.strip() or (os.path.exists(raw) and not os.path.isdir(raw)):
        raise refused(name, "the path of a directory or s3://bucket/prefix", raw)
    return Location.parse(raw, name)


def _directory(name: str, default: Path) -> Path:
    """A folder's path (it may not exist yet; a file there is no folder)."""
    raw = _env(name, str(default))
    if not raw.strip() or (os.path.exists(raw) and not os.path.isdir(raw)):
        raise refused(ENV_PREFIX + name, "the path of a directory", raw)
    return Path(raw)


def jars_dir() -> Path:
    """Where ``make setup`` put the jars (``PLATFORM_JARS_DIR``, else ``.jvm``)."""
    default = REPO_ROOT / ".jvm"
    given = ENV_PREFIX + "JARS_DIR" in os.environ  # set, even to "": it must be a path
    return _directory("JARS_DIR", default).resolve() if given else default


def _spark_master(raw: str) -> str:
    if not SPARK_MASTER.fullmatch(raw):
        raise refused(
            ENV_PREFIX + "SPARK_MASTER",
            "a Spark master URL: local, local[N], local[*], spark://HOST:PORT, yarn or k8s://URL",
            raw,
        )
    return raw


def _memory(raw: str, name: str) -> str:
    found = JVM_MEMORY.fullmatch(raw)
    mib = 0.0 if found is None else int(found[1]) * MIB_PER_UNIT[found[2].lower()]
    if mib < MIN_DRIVER_MEMORY_MIB:
        raise refused(
            ENV_PREFIX + name,
            f"a JVM memory size with its unit (k, m, g, t), at least {MIN_DRIVER_MEMORY_MIB}m, "
            "e.g. 2g",
            raw,
        )
    return raw


def _conn_id(raw: str, name: str) -> str:
    if not CONN_ID.fullmatch(raw) and not (name == "AWS_CONN_ID" and raw == ""):
        raise refused(ENV_PREFIX + name, "an Airflow connection id (letters, digits, _ . -)", raw)
    return raw


def spark_cds() -> bool:
    """Whether the driver JVM uses a class-data-sharing archive (``jobs/streaming/jvm.py``)."""
    raw = _env("SPARK_CDS", "on")
    if raw.strip().lower() not in SWITCH:
        raise refused(ENV_PREFIX + "SPARK_CDS", "on or off", raw)
    return SWITCH[raw.strip().lower()]


def lease_seconds() -> float:
    """How long an application's lease on object storage lasts unrenewed
    (``jobs/lease.py``): a killed holder's is taken over after 1-2 times it."""
    raw = _env("LEASE_SECONDS", str(int(DEFAULT_TTL_S)))
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and MIN_TTL_S <= value <= MAX_TTL_S):
        raise refused(
            ENV_PREFIX + "LEASE_SECONDS", f"seconds from {MIN_TTL_S:.0f} to {MAX_TTL_S:.0f}", raw
        )
    return value


def java_options(name: str) -> str:
    """More JVM options of the user's (``SPARK_JAVA_OPTIONS``, ``BROKER_JAVA_OPTIONS``):
    each one an option, in shell quoting (else the JVM takes a word for its main
    class, or an open quote swallows the rest)."""
    raw = _env(name, "")
    try:
        options = shlex.split(raw)
    except ValueError:
        options = [""]
    # The java launcher's module options take their value as the next word.
    valued = {"--add-opens", "--add-exports", "--add-reads", "--add-modules", "--patch-module"}
    values = {i + 1 for i, option in enumerate(options) if option in valued}
    if not all(option.startswith("-") or i in values for i, option in enumerate(options)):
        raise refused(
            ENV_PREFIX + name,
            "JVM options, each starting with -, e.g. -XX:TieredStopAtLevel=1",
            raw,
        )
    return raw.strip()


def configured_driver_token() -> str | None:
    """The token a warm driver and its clients share, when given (``jobs/warm_driver.py``)."""
    raw = _env("DRIVER_TOKEN", "")
    if raw and not TOKEN.fullmatch(raw):
        raise refused(
            ENV_PREFIX + "DRIVER_TOKEN", "1-4096 visible ASCII characters, no spaces", raw
        )
    return raw or None


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
    found = SIZE.fullmatch(raw.strip().lower())
    size = int(found.group(1)) * SIZE_UNITS[found.group(2)] if found else 0
    if not 0 < size <= MAX_SIZE:
        raise refused(ENV_PREFIX + name, "a size in bytes up to 1g, e.g. 67108864 or 64m", raw)
    return size


USER_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def _approvers(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    bad = [n for n in names if not USER_NAME.fullmatch(n)]
    if bad:
        raise refused(
            ENV_PREFIX + "APPROVERS",
            f"a comma list of Airflow user names (letters, digits, _ . @ -; not {bad[0]!r})",
            raw,
        )
    return names


def _optional_port(raw: str, name: str) -> int | None:
    return _port(raw, name) if raw else None


def _address(raw: str) -> str:
    """An IP address to bind to (0.0.0.0 in a container that Prometheus scrapes)."""
    if not _is_ip_address(raw):
        raise refused(ENV_PREFIX + "METRICS_ADDRESS", "an IP address", raw)
    return raw


PUSHGATEWAY_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+/?$")
# A host name's labels: letters, digits and inner hyphens, dot-separated.
HOST_NAME = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"  # a fully qualified name's dot
)


def _pushgateway_url(raw: str) -> str | None:
    if not raw:
        return None
    parts = urllib.parse.urlsplit(raw)
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = 0
    host = parts.hostname or ""
    if (
        not PUSHGATEWAY_URL.fullmatch(raw)
        or (port is not None and not 1 <= port <= 65535)
        or not (HOST_NAME.fullmatch(host) or _is_ip_address(host))
    ):
        raise refused(ENV_PREFIX + "PUSHGATEWAY_URL", "http(s)://HOST[:PORT], PORT 1-65535", raw)
    return raw.rstrip("/")


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _driver_url(raw: str) -> str | None:
    if not raw or raw == DRIVER_OFF:
        return None
    found = DRIVER_URL.fullmatch(raw)
    if not found or _port_number(found["port"]) is None:
        raise refused(
            ENV_PREFIX + "DRIVER_URL",
            "http://127.0.0.1:PORT or http://localhost:PORT (loopback, "
            f"PORT 1-65535), or {DRIVER_OFF!r}",
            raw,
        )
    return raw
